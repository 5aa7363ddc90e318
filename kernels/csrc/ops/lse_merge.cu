// LSE merge of partial attention outputs (kernel-api ops/lse_merge.rs is the spec).
// One block per (token, head) row; threads stride over the head dim. f32 math.
//
// The merge weights exp(lse_p - m) / total are computed once per part, kWeightChunk parts at a
// time, into shared memory (before, every thread computed an exp and a division per element per
// part). Every thread runs the same (uniform) trip counts over head-dim batches and part chunks,
// so the barriers around a chunk's weights are reached by the whole block; with at most
// kWeightChunk parts (every split count in practice) the weights are written once per row. The
// values and the summation order (ascending parts) are unchanged.
#include "k3/compat.h"

namespace {
constexpr int kWeightChunk = 128;
}

K3_KERNEL void lse_merge(const void* parts, int parts_dt, int64_t po_sp, int64_t po_st, int64_t po_sh,
                         const float* lses, int64_t pl_sp, int64_t pl_st, int64_t pl_sh, void* out, int out_dt,
                         int64_t out_st, int64_t out_sh, float* lse_out, int64_t lo_st, int64_t lo_sh, int num_parts,
                         int heads, int dim) {
  K3_SHARED(float, weight, [kWeightChunk]);
  const int row = static_cast<int>(k3::block_idx_x());
  const int t = row / heads;
  const int h = row % heads;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int threads = static_cast<int>(k3::block_dim_x());
  const float* lse_row = lses + t * pl_st + h * pl_sh;
  const float neg_inf = k3::uint_as_float(0xff800000u);
  float m = neg_inf;
  for (int p = 0; p < num_parts; ++p) m = k3::max_f32(m, lse_row[p * pl_sp]);
  float total = 0.0f;
  if (m != neg_inf) {
    for (int p = 0; p < num_parts; ++p) total += k3::exp_f32(lse_row[p * pl_sp] - m);
  }
  const bool one_chunk = num_parts <= kWeightChunk;
  for (int i0 = 0; i0 < dim; i0 += threads) {  // the same trip count in every thread
    const int i = i0 + tid;
    float acc = 0.0f;
    if (m != neg_inf) {  // block-uniform
      for (int c0 = 0; c0 < num_parts; c0 += kWeightChunk) {
        const int n = num_parts - c0 < kWeightChunk ? num_parts - c0 : kWeightChunk;
        if (!one_chunk || i0 == 0) {
          if (!one_chunk) k3::sync_threads();  // every thread is done with the previous chunk
          for (int p = tid; p < n; p += threads) weight[p] = k3::exp_f32(lse_row[(c0 + p) * pl_sp] - m) / total;
          k3::sync_threads();
        }
        if (i < dim) {
          const int64_t at = c0 * po_sp + t * po_st + h * po_sh + i;
          for (int p = 0; p < n; ++p) acc += weight[p] * k3::load_f32(parts, parts_dt, at + p * po_sp);
        }
      }
    }
    if (i < dim) k3::store_f32(out, out_dt, t * out_st + h * out_sh + i, acc);
  }
  if (lse_out != nullptr && tid == 0) {
    lse_out[t * lo_st + h * lo_sh] = m == neg_inf ? neg_inf : m + k3::log_f32(total);
  }
}
K3_EXPORT(lse_merge);
