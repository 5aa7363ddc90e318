// Kernels with planted bugs: each must make the emulator report an error (or, for the
// out-of-bounds writes, AddressSanitizer). The Rust tests find the marker comments to know the
// expected line numbers.
#include "k3/compat.h"

// Threads of the first warp and the others wait at two different barriers.
K3_KERNEL void barrier_divergence(int* out) {
  if (k3::warp_id() == 0) {
    k3::sync_threads();  // BARRIER-A
  } else {
    k3::sync_threads();  // BARRIER-B
  }
  out[k3::thread_idx_x()] = 1;
}
K3_EXPORT(barrier_divergence);

// Even lanes shuffle by index, odd lanes by xor, with the same mask.
K3_KERNEL void divergent_collective(int* out) {
  int v = static_cast<int>(k3::thread_idx_x());
  if (k3::lane_id() % 2 == 0) {
    v = k3::shfl(v, 0);  // COLLECTIVE-A
  } else {
    v = k3::shfl_xor(v, 1);  // COLLECTIVE-B
  }
  out[k3::thread_idx_x()] = v;
}
K3_EXPORT(divergent_collective);

// Lane 3 exits; the others shuffle with the full mask, which names it.
K3_KERNEL void exited_lane_in_mask(int* out) {
  if (k3::lane_id() == 3) return;
  out[k3::thread_idx_x()] = k3::shfl(static_cast<int>(k3::thread_idx_x()), 0);
}
K3_EXPORT(exited_lane_in_mask);

// Lane 0 of each warp waits at a barrier; its warp-mates wait for it in a shuffle.
K3_KERNEL void deadlock(int* out) {
  if (k3::lane_id() == 0) k3::sync_threads();
  out[k3::thread_idx_x()] = k3::shfl(static_cast<int>(k3::thread_idx_x()), 0);
}
K3_EXPORT(deadlock);

// Declares 64 KiB of static shared memory.
K3_KERNEL void shared_limit_exceeded(float* out) {
  K3_SHARED(float, big, [16384]);  // BIG-SHARED
  big[k3::thread_idx_x()] = 1.0f;
  out[k3::thread_idx_x()] = big[k3::thread_idx_x()];
}
K3_EXPORT(shared_limit_exceeded);

// Thread 5 stops the block with a device-side assertion.
K3_KERNEL void trap_in_thread_5(int* out) {
  if (k3::thread_idx_x() == 5) k3::trap("index out of range");  // TRAP
  out[k3::thread_idx_x()] = 1;
}
K3_EXPORT(trap_in_thread_5);

// Writes s[t + offset] of a 64-float shared array: offset 1 makes thread 63 write one element
// past the end (into the arena's poisoned redzone).
K3_KERNEL void shared_oob_write(float* out, int offset) {
  K3_SHARED(float, s, [64]);
  const unsigned t = k3::thread_idx_x();
  s[static_cast<int>(t) + offset] = 1.0f;  // SHARED-OOB
  k3::sync_threads();
  out[t] = s[t];
}
K3_EXPORT(shared_oob_write);

// Every thread writes out[thread]: launched with more threads than out holds, a heap overflow.
K3_KERNEL void global_oob_write(float* out) {
  out[k3::thread_idx_x()] = 1.0f;  // GLOBAL-OOB
}
K3_EXPORT(global_oob_write);
