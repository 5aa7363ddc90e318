// The emulated warp MMA: lookup tables built from the fragment formulas of k3/mma_layout.h (the
// same ones the dialect's loads and stores use), and the rendezvous step that gathers A, B and C
// from every lane, computes D = A*B + C in f32 and scatters D back.
#include <string.h>

#include <vector>

#include "k3/mma_layout.h"
#include "runtime.h"

namespace k3 {
namespace simt {

namespace {

struct MmaPayload {
  const uint16_t* a;
  const uint16_t* b;
  const float* c;
  float* d;
};

// For each operand: element index (row * cols + col) of lane l, slot s at [l * slots + s].
struct ShapeTables {
  int M, N, K, warp, a_slots, b_slots, c_slots;
  std::vector<int> a, b, c;
};

template <class S>
ShapeTables build() {
  ShapeTables t{S::M, S::N, S::K, S::kWarp, S::kASlots, S::kBSlots, S::kCSlots, {}, {}, {}};
  for (int l = 0; l < S::kWarp; ++l) {
    for (int s = 0; s < S::kASlots; ++s) {
      layout::RC rc = S::a(l, s);
      t.a.push_back(rc.row * S::K + rc.col);
    }
    for (int s = 0; s < S::kBSlots; ++s) {
      layout::RC rc = S::b(l, s);
      t.b.push_back(rc.row * S::N + rc.col);
    }
    for (int s = 0; s < S::kCSlots; ++s) {
      layout::RC rc = S::c(l, s);
      t.c.push_back(rc.row * S::N + rc.col);
    }
  }
  return t;
}

const ShapeTables* tables(int shape) {
  static const ShapeTables all[3] = {build<layout::M16N8K16>(), build<layout::M32N32K8>(),
                                     build<layout::M16N16K16>()};
  return shape >= 0 && shape < 3 ? &all[shape] : nullptr;
}

float bf16_bits_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

}  // namespace

bool mma_layout(int shape, int operand, int lane, int slot, int* row, int* col) {
  const ShapeTables* t = tables(shape);
  if (t == nullptr || lane < 0 || lane >= t->warp || slot < 0) return false;
  const std::vector<int>* tab;
  int slots, cols;
  switch (operand) {
    case 0: tab = &t->a; slots = t->a_slots; cols = t->K; break;
    case 1: tab = &t->b; slots = t->b_slots; cols = t->N; break;
    case 2: tab = &t->c; slots = t->c_slots; cols = t->N; break;
    default: return false;
  }
  if (slot >= slots) return false;
  int idx = (*tab)[lane * slots + slot];
  *row = idx / cols;
  *col = idx % cols;
  return true;
}

void mma_gather_compute_scatter(Block& b, Warp& w, int shape) {
  const ShapeTables& t = *tables(shape);  // checked by warp_mma
  float* A = b.mma_a;
  float* B = b.mma_b;
  float* C = b.mma_c;
  for (int l = 0; l < t.warp; ++l) {
    const MmaPayload* p = static_cast<const MmaPayload*>(w.lanes[l]->coll_payload);
    for (int s = 0; s < t.a_slots; ++s) A[t.a[l * t.a_slots + s]] = bf16_bits_to_f32(p->a[s]);
    for (int s = 0; s < t.b_slots; ++s) B[t.b[l * t.b_slots + s]] = bf16_bits_to_f32(p->b[s]);
    for (int s = 0; s < t.c_slots; ++s) C[t.c[l * t.c_slots + s]] = p->c[s];
  }
  // D = A*B + C: bf16 products are exact in f32; sums run in ascending k starting from C.
  for (int m = 0; m < t.M; ++m) {
    for (int n = 0; n < t.N; ++n) {
      float acc = C[m * t.N + n];
      for (int k = 0; k < t.K; ++k) acc += A[m * t.K + k] * B[k * t.N + n];
      C[m * t.N + n] = acc;
    }
  }
  // All lanes' C were read above, so D may alias C.
  for (int l = 0; l < t.warp; ++l) {
    const MmaPayload* p = static_cast<const MmaPayload*>(w.lanes[l]->coll_payload);
    for (int s = 0; s < t.c_slots; ++s) p->d[s] = C[t.c[l * t.c_slots + s]];
  }
}

void warp_mma(int shape, const uint16_t* a, const uint16_t* b, const float* c, float* d, const char* file, int line) {
  Block& blk = t_worker->block;
  const ShapeTables* t = tables(shape);
  if (t == nullptr || t->warp != static_cast<int>(blk.warp_size)) {
    fail("mma_sync at %s:%d: shape %d does not exist at warp size %u", file, line, shape, blk.warp_size);
  }
  MmaPayload p{a, b, c, d};
  // .aligned / wave-wide: every lane of the warp takes part.
  uint64_t full = blk.warp_size == 64 ? ~uint64_t(0) : (uint64_t(1) << blk.warp_size) - 1;
  collective(kCollMma, shape, 0, full, &p, file, line);
}

}  // namespace simt
}  // namespace k3
