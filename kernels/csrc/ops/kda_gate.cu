// Standalone KDA gate activation (kernel-api ops/kda_gate.rs is the spec): g_out[t,h,i] =
// gate(g_raw[t,h,i], A_log[h], dt_bias[h·K+i]). Elementwise, grid-stride over T·H·K with the
// channel index innermost, so consecutive threads read and write consecutive addresses.
#include "k3/compat.h"
#include "kda_gate.cuh"

K3_KERNEL void kda_gate_activate(const void* g_raw, int g_dt, int64_t g_st, int64_t g_sh, const float* a_log,
                                 int64_t a_s, const float* dt_bias, int64_t d_s, float* out, int64_t o_st,
                                 int64_t o_sh, int64_t total, int heads, int kd, int mode, float lower_bound) {
  const int64_t stride = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t e = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); e < total;
       e += stride) {
    const int i = static_cast<int>(e % kd);
    const int64_t row = e / kd;
    const int h = static_cast<int>(row % heads);
    const int64_t t = row / heads;
    const float f = k3::load_f32(g_raw, g_dt, t * g_st + h * g_sh + i);
    const bool params = mode != kKdaGatePrecomputed;
    const float a = params ? a_log[h * a_s] : 0.0f;
    const float b = params ? dt_bias[(static_cast<int64_t>(h) * kd + i) * d_s] : 0.0f;
    out[t * o_st + h * o_sh + i] = kda_gate_value(mode, f, a, b, lower_bound);
  }
}
K3_EXPORT(kda_gate_activate);
