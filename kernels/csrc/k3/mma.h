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
// ---- ldmatrix: 8x8 matrices of 16-bit elements from shared memory ----
// Lane l gives the address of row l % 8 of matrix l / 8 (lanes 0..8*kCount-1; the others'
// addresses are not read). Lane l receives in register i the 32-bit word of matrix i at row
// l / 4, columns 2 (l % 4) and +1 (low half first): the register of an m16n8k16 fragment slot
// pair. kTrans: the matrix is transposed on the way, register i holds (row 2 (l % 4), column
// l / 4) in its low half and (row 2 (l % 4) + 1, column l / 4) in its high half.
//   CUDA       ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16
//   SIMT 32    the row addresses go through shfl and each lane reads its own halves; a row
//              address off a 16-byte boundary traps (the GPU faults on it)
//   HIP        none (wave64 MFMA fragments have another layout): a compile-time error
// Every lane of the warp must call it, with rows in shared memory.
template <int kCount, bool kTrans>
K3_DEVICE void ldmatrix(uint32_t (&r)[kCount], const void* row) {
  static_assert(kCount == 1 || kCount == 2 || kCount == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if K3_TARGET_CUDA
  // The shared-window address by the intrinsic (an address-space cast the compiler folds
  // constant offsets through), not by a cvta in asm: one base register serves every fragment.
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kCount == 4 && kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  } else if constexpr (kCount == 4) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  } else if constexpr (kCount == 2 && kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (kCount == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  }
#elif K3_TARGET_SIMT
  static_assert(kCount > 0 && kWarpSize == 32, "ldmatrix is a warp-32 instruction");
  const uint64_t mine = reinterpret_cast<uintptr_t>(row);
  const int lane = static_cast<int>(lane_id());
  for (int i = 0; i < kCount; ++i) {
    // Every lane takes part in both shuffles (they are warp-wide), whichever rows it reads.
    const uint64_t r0 = shfl_sync(kFullMask, mine, 8 * i + (kTrans ? 2 * (lane & 3) : lane >> 2));
    const uint64_t r1 = shfl_sync(kFullMask, mine, 8 * i + (kTrans ? 2 * (lane & 3) + 1 : lane >> 2));
    if (r0 % 16 != 0 || r1 % 16 != 0) trap("k3::mma::ldmatrix: a row address off a 16-byte boundary");
    uint16_t lo, hi;
    if constexpr (kTrans) {
      memcpy(&lo, reinterpret_cast<const void*>(r0 + 2 * (lane >> 2)), 2);
      memcpy(&hi, reinterpret_cast<const void*>(r1 + 2 * (lane >> 2)), 2);
    } else {
      memcpy(&lo, reinterpret_cast<const void*>(r0 + 4 * (lane & 3)), 2);
      memcpy(&hi, reinterpret_cast<const void*>(r0 + 4 * (lane & 3) + 2), 2);
    }
    r[i] = lo | (static_cast<uint32_t>(hi) << 16);
  }
#else
  static_assert(kCount < 0, "k3::mma::ldmatrix: no such instruction on this target");
  (void)r;
  (void)row;
#endif
}

// The fragment loads above from shared-memory rows that start on 16-byte boundaries (the tile's
// address and its leading dimension in bytes multiples of 16): one ldmatrix per fragment on
// m16n8k16 (A: x4; B: x2, transposed for a row-major KxN B) where K3_MMA_LDMATRIX is set, the
// per-slot loads elsewhere. The slots come out as load_a / load_b / load_b_transposed give them
// (the kernel `ldmatrix_fragments` of kernels/csrc/tests checks it bit for bit). Every lane must
// call them.
// K3_MMA_LDMATRIX: sm_100a/103a (same registers as the per-slot loads there) and the emulator;
// not sm_90a, where nvcc 13.5 gave the MoE and dense GEMMs more registers for it (the 16-row
// MoE kernel spilled at its 128-register bound; benches/kernel-resources.md, BENCHMARKS.md).
#if K3_TARGET_SIMT || (K3_TARGET_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000)
#define K3_MMA_LDMATRIX 1
#else
#define K3_MMA_LDMATRIX 0
#endif
namespace detail {
// ldmatrix registers into fragment slots (slot pairs, low half first).
K3_DEVICE void unpack_pairs(uint16_t* x, const uint32_t* r, int regs) {
  for (int i = 0; i < regs; ++i) {
    x[2 * i] = static_cast<uint16_t>(r[i]);
    x[2 * i + 1] = static_cast<uint16_t>(r[i] >> 16);
  }
}
}  // namespace detail
template <class S>
K3_DEVICE void load_a_ldsm(FragA<S>& f, const bf16* a, int lda) {
  if constexpr (K3_MMA_LDMATRIX && S::kId == M16N8K16::kId) {
    // Matrices: rows 0-7 / 8-15 x columns 0-7, then the same rows x columns 8-15 (slot order).
    const int l = static_cast<int>(lane_id());
    uint32_t r[4];
    ldmatrix<4, false>(r, a + ((l & 7) + 8 * ((l >> 3) & 1)) * lda + 8 * (l >> 4));
    detail::unpack_pairs(f.x, r, 4);
  } else {
    load_a(f, a, lda);
  }
}
template <class S>
K3_DEVICE void load_b_ldsm(FragB<S>& f, const bf16* b, int ldb) {
  if constexpr (K3_MMA_LDMATRIX && S::kId == M16N8K16::kId) {
    // k rows 0-7 and 8-15, each transposed into (n = l / 4, k pair).
    const int l = static_cast<int>(lane_id());
    uint32_t r[2];
    ldmatrix<2, true>(r, b + (l & 15) * ldb);
    detail::unpack_pairs(f.x, r, 2);
  } else {
    load_b(f, b, ldb);
  }
}
template <class S>
K3_DEVICE void load_b_transposed_ldsm(FragB<S>& f, const bf16* bt, int ldbt) {
  if constexpr (K3_MMA_LDMATRIX && S::kId == M16N8K16::kId) {
    // n rows 0-7 x k columns 0-7, then 8-15.
    const int l = static_cast<int>(lane_id());
    uint32_t r[2];
    ldmatrix<2, false>(r, bt + (l & 7) * ldbt + 8 * ((l >> 3) & 1));
    detail::unpack_pairs(f.x, r, 2);
  } else {
    load_b_transposed(f, bt, ldbt);
  }
}

// ---- k-permuted fragment loads ----
// k_perm<S>(k): the column of a K step that logical k of the A and B fragments reads in the
// *_kperm loads. An MMA sums over k, so loading both of its operands through one permutation of
// the step's columns gives the same product (the order the hardware adds in is unspecified
// anyway). The permutation puts each lane's B slots on adjacent columns: on m16n8k16 (k = 2q,
// 2q + 1, 2q + 8, 2q + 9 -> 4q .. 4q + 3) a B fragment is then one 8-byte shared load and an A
// fragment two, where the slot pairs took two and four (or one ldmatrix each); the MFMA shapes'
// slots are adjacent already (the identity: the same loads as load_a / load_b_transposed). Rows
// must start on 8-byte boundaries (tile address and leading dimension in bytes multiples of 8).
template <class S>
K3_HOST_DEVICE constexpr int k_perm(int k) {
  return S::kId == M16N8K16::kId ? (k % 8) / 2 * 4 + k / 8 * 2 + k % 2 : k;
}
template <class S>
K3_HOST_DEVICE constexpr bool k_perm_puts_b_slots_adjacent() {
  for (int k = 0; k < S::K; ++k) {  // a bijection of the step's columns
    if (k_perm<S>(k) < 0 || k_perm<S>(k) >= S::K) return false;
    for (int j = 0; j < k; ++j) {
      if (k_perm<S>(j) == k_perm<S>(k)) return false;
    }
  }
  for (int lane = 0; lane < S::kWarp; ++lane) {
    const int c0 = k_perm<S>(S::b(lane, 0).row);
    if (S::kBSlots != 4 || c0 % 4 != 0) return false;
    for (int i = 0; i < S::kBSlots; ++i) {
      if (k_perm<S>(S::b(lane, i).row) != c0 + i || S::b(lane, i).col != S::b(lane, 0).col) return false;
    }
  }
  return true;
}
static_assert(k_perm_puts_b_slots_adjacent<M16N8K16>() && k_perm_puts_b_slots_adjacent<M16N16K16>() &&
                  k_perm_puts_b_slots_adjacent<M32N32K8>(),
              "k_perm: each lane's four B slots on four adjacent columns");
// The m16n8k16 A slots load_a_kperm assumes: lane (g = l / 4, q = l % 4), slots 0, 1, 4, 5 at row
// g and 2, 3, 6, 7 at row g + 8, at permuted columns 4q + 2 (s / 4) + s % 2.
K3_HOST_DEVICE constexpr bool m16n8k16_a_kperm_rows() {
  for (int lane = 0; lane < 32; ++lane) {
    for (int s = 0; s < 8; ++s) {
      const RC rc = M16N8K16::a(lane, s);
      if (rc.row != lane / 4 + 8 * ((s / 2) % 2) || k_perm<M16N8K16>(rc.col) != 4 * (lane % 4) + 2 * (s / 4) + s % 2) return false;
    }
  }
  return true;
}
static_assert(m16n8k16_a_kperm_rows(), "load_a_kperm's slot map");

// A lane's A slots read through k_perm lie in groups of four on one row at four adjacent columns
// (m16n8k16: slots 0, 1, 4, 5 on row g and 2, 3, 6, 7 on row g + 8; the MFMA shapes: slots 4g ..
// 4g + 3): slot a_group_slot(g, i) holds value i of group g. An f32 A operand then comes in one
// 16-byte load per group (the f32 queries of MLA, the MoE GEMMs' f32 activations).
template <class S>
K3_HOST_DEVICE constexpr int a_groups() {
  return S::kASlots / 4;
}
template <class S>
K3_HOST_DEVICE constexpr int a_group_slot(int g, int i) {
  return S::kId == M16N8K16::kId ? 2 * g + (i / 2) * 4 + i % 2 : 4 * g + i;
}
template <class S>
K3_HOST_DEVICE constexpr bool a_groups_hold() {
  for (int lane = 0; lane < S::kWarp; ++lane) {
    for (int g = 0; g < a_groups<S>(); ++g) {
      const RC r0 = S::a(lane, a_group_slot<S>(g, 0));
      if (k_perm<S>(r0.col) % 4 != 0) return false;
      for (int i = 0; i < 4; ++i) {
        const RC rc = S::a(lane, a_group_slot<S>(g, i));
        if (rc.row != r0.row || k_perm<S>(rc.col) != k_perm<S>(r0.col) + i) return false;
      }
    }
  }
  return S::kASlots % 4 == 0;
}
static_assert(a_groups_hold<M16N8K16>() && a_groups_hold<M16N16K16>(),
              "a lane's A slots: groups of four adjacent k_perm columns on one row");

// A tile (row-major, lda elements) with its columns read through k_perm.
template <class S>
K3_DEVICE void load_a_kperm(FragA<S>& f, const bf16* a, int lda) {
  if constexpr (S::kId == M16N8K16::kId) {
    const int l = static_cast<int>(lane_id());
    const uint16_t* p = &a[(l >> 2) * lda + 4 * (l & 3)].bits;
    const uint64_t r0 = *reinterpret_cast<const uint64_t*>(p);            // row g: slots 0, 1, 4, 5
    const uint64_t r1 = *reinterpret_cast<const uint64_t*>(p + 8 * lda);  // row g + 8: slots 2, 3, 6, 7
    const int row_slot[4] = {0, 1, 4, 5};
    for (int j = 0; j < 4; ++j) {
      f.x[row_slot[j]] = static_cast<uint16_t>(r0 >> (16 * j));
      f.x[row_slot[j] + 2] = static_cast<uint16_t>(r1 >> (16 * j));
    }
  } else {
    for (int s = 0; s < S::kASlots; ++s) {
      RC rc = a_coord<S>(s);
      f.x[s] = a[rc.row * lda + k_perm<S>(rc.col)].bits;
    }
  }
}
// B given transposed (bt row-major N x K, B[k][n] = bt[n * ldbt + k]) with its k read through
// k_perm: one 8-byte load of the lane's four adjacent columns.
template <class S>
K3_DEVICE void load_b_transposed_kperm(FragB<S>& f, const bf16* bt, int ldbt) {
  const RC rc = b_coord<S>(0);
  const uint64_t r = *reinterpret_cast<const uint64_t*>(&bt[rc.col * ldbt + k_perm<S>(rc.row)].bits);
  for (int i = 0; i < S::kBSlots; ++i) f.x[i] = static_cast<uint16_t>(r >> (16 * i));
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
