// AttnRes depth mix (kernel-api ops/attn_res.rs is the spec), one block per row m:
//   1. warp i takes sources i, i + warps, ...: the dot with the score vector and the sum of
//      squares over D in one strided pass, two warp reductions, s_i = dot / rms into shared;
//   2. one barrier; threads i < S turn the scores into softmax weights (each thread computes the
//      max and the normaliser over the S <= 64 scores itself, in the same order);
//   3. one barrier; threads stride over D: out[m, j] = sum_i pi_i * v[i, m, j] (raw values).
// All f32; S = 1 gives pi = exp(0) / 1 = 1 exactly, so the source comes back bit for bit.
#include "k3/compat.h"

#define DENSE_ATTN_RES_MAX_SOURCES 64

// sources [S, M, D] with strides (s_s, s_m, 1); w [D] f32; out [M, D] contiguous. Grid: M.
K3_KERNEL void dense_attn_res_mix(const void* src, int src_dt, int64_t s_s, int64_t s_m, const float* w, void* out,
                                  int out_dt, int sources, int d, float eps) {
  K3_SHARED(float, score, [DENSE_ATTN_RES_MAX_SOURCES]);
  K3_SHARED(float, pi, [DENSE_ATTN_RES_MAX_SOURCES]);
  const int64_t m = k3::block_idx_x();
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int threads = static_cast<int>(k3::block_dim_x());
  const int warps = threads / k3::kWarpSize;
  const int lane = static_cast<int>(k3::lane_id());

  for (int i = static_cast<int>(k3::warp_id()); i < sources; i += warps) {
    const int64_t base = i * s_s + m * s_m;
    float dot = 0.0f, ss = 0.0f;
    for (int j = lane; j < d; j += k3::kWarpSize) {
      const float v = k3::load_f32(src, src_dt, base + j);
      dot += w[j] * v;
      ss += v * v;
    }
    dot = k3::warp_reduce_sum(dot);
    ss = k3::warp_reduce_sum(ss);
    // Score on the RMS-normalised source: (sum_j w_j v_j) * r, the weight folded into w.
    if (lane == 0) score[i] = dot * (1.0f / k3::sqrt_f32(ss / static_cast<float>(d) + eps));
  }
  k3::sync_threads();

  if (tid < sources) {
    float mx = score[0];
    for (int i = 1; i < sources; ++i) mx = k3::max_f32(mx, score[i]);
    float z = 0.0f;
    for (int i = 0; i < sources; ++i) z += k3::exp_f32(score[i] - mx);
    pi[tid] = k3::exp_f32(score[tid] - mx) / z;
  }
  k3::sync_threads();

  for (int j = tid; j < d; j += threads) {
    float acc = 0.0f;
    for (int i = 0; i < sources; ++i) acc += pi[i] * k3::load_f32(src, src_dt, i * s_s + m * s_m + j);
    k3::store_f32(out, out_dt, m * d + j, acc);
  }
}
K3_EXPORT(dense_attn_res_mix);
