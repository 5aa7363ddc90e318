// LSE merge of partial attention outputs (kernel-api ops/lse_merge.rs is the spec).
// One block per (token, head) row; threads stride over the head dim. f32 math.
#include "k3/compat.h"

K3_KERNEL void lse_merge(const void* parts, int parts_dt, int64_t po_sp, int64_t po_st, int64_t po_sh,
                         const float* lses, int64_t pl_sp, int64_t pl_st, int64_t pl_sh, void* out, int out_dt,
                         int64_t out_st, int64_t out_sh, float* lse_out, int64_t lo_st, int64_t lo_sh, int num_parts,
                         int heads, int dim) {
  const int row = static_cast<int>(k3::block_idx_x());
  const int t = row / heads;
  const int h = row % heads;
  const float neg_inf = k3::uint_as_float(0xff800000u);
  float m = neg_inf;
  for (int p = 0; p < num_parts; ++p) m = k3::max_f32(m, lses[p * pl_sp + t * pl_st + h * pl_sh]);
  float total = 0.0f;
  if (m != neg_inf) {
    for (int p = 0; p < num_parts; ++p) total += k3::exp_f32(lses[p * pl_sp + t * pl_st + h * pl_sh] - m);
  }
  for (int i = static_cast<int>(k3::thread_idx_x()); i < dim; i += static_cast<int>(k3::block_dim_x())) {
    float acc = 0.0f;
    if (m != neg_inf) {
      for (int p = 0; p < num_parts; ++p) {
        const float w = k3::exp_f32(lses[p * pl_sp + t * pl_st + h * pl_sh] - m) / total;
        acc += w * k3::load_f32(parts, parts_dt, p * po_sp + t * po_st + h * po_sh + i);
      }
    }
    k3::store_f32(out, out_dt, t * out_st + h * out_sh + i, acc);
  }
  if (lse_out != nullptr && k3::thread_idx_x() == 0) {
    lse_out[t * lo_st + h * lo_sh] = m == neg_inf ? neg_inf : m + k3::log_f32(total);
  }
}
K3_EXPORT(lse_merge);
