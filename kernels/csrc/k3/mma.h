// Warp-level matrix tiles: bf16 x bf16 -> f32 MMA through opaque per-lane fragments.
//
//   shape            target         instruction
//   M16N8K16         CUDA, SIMT 32  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//   M16N16K16        HIP,  SIMT 64  __builtin_amdgcn_mfma_f32_16x16x16bf16_1k
//   M32N32K8         HIP,  SIMT 64  __builtin_amdgcn_mfma_f32_32x32x8bf16_1k
//
// k3::mma::Bf16Shape is the default shape of the target (M16N8K16 at warp 32, M16N16K16 at
// warp 64). Which element a lane holds in which slot is a function (a_coord/b_coord/c_coord,
// from k3/mma_layout.h), so loads, stores and epilogues are written once for every shape. The
// emulator gathers the fragments of all lanes through exactly these maps, computes D = A*B + C in
// f32 (products are exact; sums in ascending k, starting from C) and scatters D back. Hardware
// does not promise that summation order, so compare GPU results with K-scaled tolerances.
// Included by k3/compat.h.
#ifndef K3_MMA_H
#define K3_MMA_H

#include "k3/mma_layout.h"

K3_BEGIN
namespace mma {

using layout::M16N16K16;
using layout::M16N8K16;
using layout::M32N32K8;
using layout::RC;

#if K3_WARP_SIZE == 32
typedef M16N8K16 Bf16Shape;
#else
typedef M16N16K16 Bf16Shape;
#endif

// Per-lane fragments: bf16 bit patterns (A, B) and f32 accumulators (C, D), in slot order.
template <class S>
struct FragA {
  uint16_t x[S::kASlots];
};
template <class S>
struct FragB {
  uint16_t x[S::kBSlots];
};
template <class S>
struct FragC {
  float x[S::kCSlots];
};

// The (row, col) of this lane's slot in A (MxK), B (KxN) and C/D (MxN).
template <class S>
K3_DEVICE RC a_coord(int slot) {
  static_assert(S::kWarp == kWarpSize, "this MMA shape needs another warp size");
  return S::a(static_cast<int>(lane_id()), slot);
}
template <class S>
K3_DEVICE RC b_coord(int slot) {
  static_assert(S::kWarp == kWarpSize, "this MMA shape needs another warp size");
  return S::b(static_cast<int>(lane_id()), slot);
}
template <class S>
K3_DEVICE RC c_coord(int slot) {
  static_assert(S::kWarp == kWarpSize, "this MMA shape needs another warp size");
  return S::c(static_cast<int>(lane_id()), slot);
}

// Whether every lane's C slots come in pairs (2i, 2i + 1) of adjacent columns of one row, the even
// column first (m16n8k16: yes; MFMA, whose slots run down a column: no): an epilogue may then store
// each pair as one 2-element vector (k3::store_f32x2).
template <class S>
K3_HOST_DEVICE constexpr bool c_pairs_adjacent() {
  for (int lane = 0; lane < S::kWarp; ++lane) {
    for (int i = 0; i < S::kCSlots; i += 2) {
      const RC a = S::c(lane, i), b = S::c(lane, i + 1);
      if (a.col % 2 != 0 || b.row != a.row || b.col != a.col + 1) return false;
    }
  }
  return true;
}
static_assert(c_pairs_adjacent<M16N8K16>() && !c_pairs_adjacent<M16N16K16>(), "C slot pairs as the PTX / CDNA figures give them");

// A tile at `a` of a row-major matrix with leading dimension lda (elements).
template <class S>
K3_DEVICE void load_a(FragA<S>& f, const bf16* a, int lda) {
  for (int s = 0; s < S::kASlots; ++s) {
    RC rc = a_coord<S>(s);
    f.x[s] = a[rc.row * lda + rc.col].bits;
  }
}
// B tile at `b` of a row-major KxN matrix.
template <class S>
K3_DEVICE void load_b(FragB<S>& f, const bf16* b, int ldb) {
  for (int s = 0; s < S::kBSlots; ++s) {
    RC rc = b_coord<S>(s);
    f.x[s] = b[rc.row * ldb + rc.col].bits;
  }
}
// B tile given transposed: `bt` is a row-major NxK matrix (B[k][n] = bt[n*ldbt + k]).
template <class S>
K3_DEVICE void load_b_transposed(FragB<S>& f, const bf16* bt, int ldbt) {
  for (int s = 0; s < S::kBSlots; ++s) {
    RC rc = b_coord<S>(s);
    f.x[s] = bt[rc.col * ldbt + rc.row].bits;
  }
}
template <class S>
K3_DEVICE void fill(FragC<S>& f, float v) {
  for (int s = 0; s < S::kCSlots; ++s) f.x[s] = v;
}
template <class S>
K3_DEVICE void load_c(FragC<S>& f, const float* c, int ldc) {
  for (int s = 0; s < S::kCSlots; ++s) {
    RC rc = c_coord<S>(s);
    f.x[s] = c[rc.row * ldc + rc.col];
  }
}
template <class S>
K3_DEVICE void store_c(const FragC<S>& f, float* c, int ldc) {
  for (int s = 0; s < S::kCSlots; ++s) {
    RC rc = c_coord<S>(s);
    c[rc.row * ldc + rc.col] = f.x[s];
  }
}

// d = a*b + c for the whole warp (every lane of the warp must call it; d may alias c).
#if K3_TARGET_CUDA
K3_DEVICE void mma_sync(FragC<M16N8K16>& d, const FragA<M16N8K16>& a, const FragB<M16N8K16>& b,
                        const FragC<M16N8K16>& c) {
  uint32_t ar[4], br[2];
  for (int i = 0; i < 4; ++i) ar[i] = a.x[2 * i] | (static_cast<uint32_t>(a.x[2 * i + 1]) << 16);
  for (int i = 0; i < 2; ++i) br[i] = b.x[2 * i] | (static_cast<uint32_t>(b.x[2 * i + 1]) << 16);
  float c0 = c.x[0], c1 = c.x[1], c2 = c.x[2], c3 = c.x[3];
  float d0, d1, d2, d3;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
      : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "f"(c0), "f"(c1), "f"(c2),
        "f"(c3));
  d.x[0] = d0;
  d.x[1] = d1;
  d.x[2] = d2;
  d.x[3] = d3;
}
#elif K3_TARGET_HIP
typedef short k3_v4i16 __attribute__((ext_vector_type(4)));
typedef float k3_v4f32 __attribute__((ext_vector_type(4)));
typedef float k3_v16f32 __attribute__((ext_vector_type(16)));
K3_DEVICE void mma_sync(FragC<M16N16K16>& d, const FragA<M16N16K16>& a, const FragB<M16N16K16>& b,
                        const FragC<M16N16K16>& c) {
  k3_v4i16 av, bv;
  k3_v4f32 cv;
  for (int i = 0; i < 4; ++i) {
    av[i] = static_cast<short>(a.x[i]);
    bv[i] = static_cast<short>(b.x[i]);
    cv[i] = c.x[i];
  }
  cv = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, cv, 0, 0, 0);
  for (int i = 0; i < 4; ++i) d.x[i] = cv[i];
}
K3_DEVICE void mma_sync(FragC<M32N32K8>& d, const FragA<M32N32K8>& a, const FragB<M32N32K8>& b,
                        const FragC<M32N32K8>& c) {
  k3_v4i16 av, bv;
  k3_v16f32 cv;
  for (int i = 0; i < 4; ++i) {
    av[i] = static_cast<short>(a.x[i]);
    bv[i] = static_cast<short>(b.x[i]);
  }
  for (int i = 0; i < 16; ++i) cv[i] = c.x[i];
  cv = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(av, bv, cv, 0, 0, 0);
  for (int i = 0; i < 16; ++i) d.x[i] = cv[i];
}
// Any other shape (e.g. M16N8K16, the default at K3_WARP_SIZE 32 on wave32 RDNA targets) has no
// MFMA instruction: fail at compile time with a message instead of "no matching function".
template <class S>
K3_DEVICE void mma_sync(FragC<S>&, const FragA<S>&, const FragB<S>&, const FragC<S>&) {
  static_assert(sizeof(S) == 0, "k3::mma: no MFMA instruction for this shape on HIP (wave64 gfx9 only)");
}
#else
template <class S>
K3_DEVICE void mma_sync(FragC<S>& d, const FragA<S>& a, const FragB<S>& b, const FragC<S>& c K3_SITE_PARAMS) {
  static_assert(S::kWarp == kWarpSize, "this MMA shape needs another warp size");
  simt::warp_mma(S::kId, a.x, b.x, c.x, d.x, file, line);
}
#endif

}  // namespace mma
K3_END

#endif  // K3_MMA_H
