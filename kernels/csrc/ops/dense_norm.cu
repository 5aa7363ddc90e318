// Norms (kernel-api ops/norm.rs is the spec): weighted RMSNorm, gated per-head RMSNorm, L2 norm.
// Statistics in f32 from inputs decoded exactly; one rounding to the output dtype (plus the HF
// intermediate rounding for RmsWeightOrder::CastBeforeWeight).
//
// - dense_rms_norm: one block per row (model-width rows, D up to 7168): strided sum of squares,
//   warp + shared-memory reduction, then a second pass over the (cache-resident) row.
// - dense_gated_rms_norm, dense_l2_norm: one warp per row (head-dim rows of 128), several rows
//   per block; warp shuffles only, no shared memory or barriers.
#include "k3/compat.h"
#include "dense_reduce.cuh"

// x [rows, d] with row stride x_rs, w [d], out [rows, d] contiguous. Grid: rows.
K3_KERNEL void dense_rms_norm(const void* x, int x_dt, int64_t x_rs, const void* w, int w_dt, void* out, int out_dt,
                              int d, float eps, int cast_before_weight) {
  K3_SHARED(float, scratch, [DENSE_MAX_WARPS]);
  const int64_t row = k3::block_idx_x();
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int threads = static_cast<int>(k3::block_dim_x());
  const int64_t base = row * x_rs;
  float ss = 0.0f;
  for (int i = tid; i < d; i += threads) {
    const float v = k3::load_f32(x, x_dt, base + i);
    ss += v * v;
  }
  ss = dense_block_sum(ss, scratch);
  const float r = 1.0f / k3::sqrt_f32(ss / static_cast<float>(d) + eps);
  for (int i = tid; i < d; i += threads) {
    float nv = k3::load_f32(x, x_dt, base + i) * r;
    // HF KimiRMSNorm: the normalised value is cast to the activation dtype before the weight.
    if (cast_before_weight) nv = dense_round_through(x_dt, nv);
    k3::store_f32(out, out_dt, row * d + i, k3::load_f32(w, w_dt, i) * nv);
  }
}
K3_EXPORT(dense_rms_norm);

// o, gate [m, heads, dh] with strides (s0, s1, 1); w [dh]; out contiguous. One warp per
// (token, head); rows = m * heads. Grid: ceil(rows / warps per block).
K3_KERNEL void dense_gated_rms_norm(const void* o, int o_dt, int64_t o_s0, int64_t o_s1, const void* gate, int g_dt,
                                    int64_t g_s0, int64_t g_s1, const void* w, int w_dt, void* out, int out_dt,
                                    int rows, int heads, int dh, float eps) {
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  const int row = static_cast<int>(k3::block_idx_x()) * warps + static_cast<int>(k3::warp_id());
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = static_cast<int>(k3::lane_id());
  const int64_t t = row / heads, h = row % heads;
  const int64_t ob = t * o_s0 + h * o_s1, gb = t * g_s0 + h * g_s1;
  float ss = 0.0f;
  for (int i = lane; i < dh; i += k3::kWarpSize) {
    const float v = k3::load_f32(o, o_dt, ob + i);
    ss += v * v;
  }
  ss = k3::warp_reduce_sum(ss);
  const float r = 1.0f / k3::sqrt_f32(ss / static_cast<float>(dh) + eps);
  for (int i = lane; i < dh; i += k3::kWarpSize) {
    const float v = k3::load_f32(o, o_dt, ob + i) * r;
    const float g = k3::sigmoid_f32(k3::load_f32(gate, g_dt, gb + i));
    k3::store_f32(out, out_dt, static_cast<int64_t>(row) * dh + i, k3::load_f32(w, w_dt, i) * v * g);
  }
}
K3_EXPORT(dense_gated_rms_norm);

// x [rows, d] with row stride x_rs; out contiguous: x / sqrt(sum x^2 + eps). One warp per row.
K3_KERNEL void dense_l2_norm(const void* x, int x_dt, int64_t x_rs, void* out, int out_dt, int rows, int d, float eps) {
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  const int row = static_cast<int>(k3::block_idx_x()) * warps + static_cast<int>(k3::warp_id());
  if (row >= rows) return;
  const int lane = static_cast<int>(k3::lane_id());
  const int64_t base = static_cast<int64_t>(row) * x_rs;
  float ss = 0.0f;
  for (int i = lane; i < d; i += k3::kWarpSize) {
    const float v = k3::load_f32(x, x_dt, base + i);
    ss += v * v;
  }
  ss = k3::warp_reduce_sum(ss);
  const float inv = 1.0f / k3::sqrt_f32(ss + eps);
  for (int i = lane; i < d; i += k3::kWarpSize) {
    k3::store_f32(out, out_dt, static_cast<int64_t>(row) * d + i, k3::load_f32(x, x_dt, base + i) * inv);
  }
}
K3_EXPORT(dense_l2_norm);
