// k3/async_copy.h: a two-group pipeline through shared memory. Each thread copies chunk t of
// stage 0 and of stage 1 (16 B each; chunks with t % 3 == 2 zero-filled), commits each stage as a
// group, waits, and after a barrier reads the chunk of its neighbour (t + 1) % threads, so the
// result needs both the wait and the barrier.
//   mode 0: wait<1> before stage 0 is read, wait<0> before stage 1 (correct);
//   mode 1: wait<2> before stage 0 (one wait too few: on the emulator the copies are still
//           deferred, so stage 0 reads the sentinel the block wrote first).
// out[s * threads + t] = the 16 B thread t read from stage s.
#include "k3/compat.h"

K3_KERNEL void async_copy_pipeline(const k3::u32x4* src, k3::u32x4* out, int mode) {
  K3_SHARED(k3::u32x4, stage, [2][256]);
  const int t = static_cast<int>(k3::thread_idx_x());
  const int threads = static_cast<int>(k3::block_dim_x());
  const k3::u32x4 sentinel = {{0xabababab, 0xabababab, 0xabababab, 0xabababab}};
  stage[0][t] = sentinel;
  stage[1][t] = sentinel;
  k3::sync_threads();

  k3::AsyncCopy<2> cp;
  for (int s = 0; s < 2; ++s) {
    cp.copy_16b_or_zero(&stage[s][t], src + s * threads + t, t % 3 != 2);
    cp.commit();
  }
  const int from = (t + 1) % threads;
  if (mode == 0) {
    cp.wait<1>();
  } else {
    cp.wait<2>();
  }
  k3::sync_threads();
  out[t] = stage[0][from];
  k3::sync_threads();  // every stage-0 read is done before any thread retires its last group
  cp.wait<0>();
  k3::sync_threads();
  out[threads + t] = stage[1][from];
}
K3_EXPORT(async_copy_pipeline);
