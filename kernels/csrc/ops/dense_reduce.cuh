// Helpers shared by the dense family's kernels: loop unrolling, block sums, dtype round trips.
#ifndef K3_OPS_DENSE_REDUCE_CUH
#define K3_OPS_DENSE_REDUCE_CUH

#include "k3/compat.h"

// Most warps a block can have (1024 threads at warp 32).
#define DENSE_MAX_WARPS 32

// Sum of v over the whole block; every thread gets the same value (each thread adds the warp
// partials in the same order). `scratch` holds DENSE_MAX_WARPS floats of shared memory; the
// trailing barrier lets the caller reuse it at once.
K3_DEVICE float dense_block_sum(float v, float* scratch) {
  v = k3::warp_reduce_sum(v);
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  if (k3::lane_id() == 0) scratch[k3::warp_id()] = v;
  k3::sync_threads();
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  k3::sync_threads();
  return total;
}

// v rounded through the storage dtype `dt` (bf16 or f16; f32 is returned unchanged).
K3_DEVICE float dense_round_through(int dt, float v) {
  if (dt == k3::kBF16) return k3::bf16_to_f32(k3::f32_to_bf16(v));
  if (dt == k3::kF16) return k3::f16_bits_to_f32(k3::f32_to_f16_bits(v));
  return v;
}

#endif  // K3_OPS_DENSE_REDUCE_CUH
