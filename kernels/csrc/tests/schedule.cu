// Kernels whose results depend on the schedule unless they synchronise correctly.
#include "k3/compat.h"

// y[i] = x[i] - x[i-1] within each block (x[-1] taken as 0), through shared memory.
// With kBarrier = false the barrier between the write and the read of the neighbour is missing:
// on a GPU that is a race; the emulator's ascending order (seed 0) happens to hide it, seeded
// orders expose it.
template <bool kBarrier>
K3_DEVICE void adjacent_diff(const float* x, float* y) {
  K3_SHARED(float, s, [1024]);
  const unsigned t = k3::thread_idx_x();
  const unsigned i = k3::block_idx_x() * k3::block_dim_x() + t;
  s[t] = x[i];
  if (kBarrier) k3::sync_threads();
  y[i] = s[t] - (t > 0 ? s[t - 1] : 0.0f);
}

K3_KERNEL void adjacent_diff_synced(const float* x, float* y) { adjacent_diff<true>(x, y); }
K3_EXPORT(adjacent_diff_synced);

K3_KERNEL void adjacent_diff_missing_barrier(const float* x, float* y) { adjacent_diff<false>(x, y); }
K3_EXPORT(adjacent_diff_missing_barrier);

// Reads shared memory nobody wrote: 0xFF bytes at seed 0, seeded random bytes otherwise.
K3_KERNEL void read_uninitialized_shared(uint32_t* out) {
  K3_SHARED(uint32_t, s, [256]);
  out[k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x()] = s[k3::thread_idx_x()];
}
K3_EXPORT(read_uninitialized_shared);

// out[block] = sum of x over the block, staged through dynamic shared memory (launch bytes >=
// block_dim * 4); thread 0 adds in ascending order.
K3_KERNEL void dynamic_shared_sum(const float* x, float* out) {
  float* s = k3::dynamic_shared<float>();
  const unsigned t = k3::thread_idx_x();
  s[t] = x[k3::block_idx_x() * k3::block_dim_x() + t];
  k3::sync_threads();
  if (t == 0) {
    float acc = 0.0f;
    for (unsigned j = 0; j < k3::block_dim_x(); ++j) acc += s[j];
    out[k3::block_idx_x()] = acc;
  }
}
K3_EXPORT(dynamic_shared_sum);
