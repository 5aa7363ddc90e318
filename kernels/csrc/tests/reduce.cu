// Block reduction: shared-memory tree with barriers, a warp-shuffle finish, ballots and atomics.
#include "k3/compat.h"

// For a block of B threads (a power of two, kWarpSize <= B <= 1024) over x[block*B ..][..B]
// (elements past n read as 0):
//   block_sums[block] = sum of the block's elements
//   *total           += that sum                      (atomic_add f32)
//   *positives       += number of elements > 0        (ballot + popc + atomic_add i32)
//   *max_val          = max over int(element)          (warp_reduce_max + atomic_max i32)
K3_KERNEL void block_reduce(const float* x, int n, float* block_sums, float* total, int* positives, int* max_val) {
  K3_SHARED(float, partial, [1024]);
  const unsigned tid = k3::thread_idx_x();
  const unsigned bdim = k3::block_dim_x();
  const unsigned i = k3::block_idx_x() * bdim + tid;
  const float v = i < static_cast<unsigned>(n) ? x[i] : 0.0f;
  partial[tid] = v;
  k3::sync_threads();
  for (unsigned s = bdim / 2; s >= static_cast<unsigned>(k3::kWarpSize); s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    k3::sync_threads();
  }
  if (tid < static_cast<unsigned>(k3::kWarpSize)) {
    const float w = k3::warp_reduce_sum(partial[tid]);
    if (tid == 0) {
      block_sums[k3::block_idx_x()] = w;
      k3::atomic_add(total, w);
    }
  }
  const k3::lane_mask_t pos = k3::ballot(v > 0.0f);
  const int mx = k3::warp_reduce_max(static_cast<int>(v));
  if (k3::lane_id() == 0) {
    k3::atomic_add(positives, k3::popc(pos));
    k3::atomic_max(max_val, mx);
  }
}
K3_EXPORT(block_reduce);
