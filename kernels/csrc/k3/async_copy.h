// Asynchronous global -> shared copies of 16 bytes per thread, in commit groups (the cp.async
// model): a thread issues copies, closes them into a group with commit(), and wait<N>() returns
// once at most the N most recently committed groups of THIS thread are still in flight. Other
// threads see the data only after a barrier that follows their writers' waits (as on the GPU).
//
//   k3::AsyncCopy<kMaxPending> cp;          // per thread, a local object
//   cp.copy_16b(smem_dst, gmem_src);        // 16 B, both 16-B aligned
//   cp.copy_16b_or_zero(smem_dst, src, ok); // !ok: 16 zero bytes (src is not read)
//   cp.commit();
//   cp.wait<1>();                           // all but the newest group landed
//   k3::sync_threads();
//
//   target      form
//   CUDA sm_80+ cp.async.cg.shared.global 16 (L2 only: streamed weights do not pollute L1), with
//               src-size 0 for the zero fill; cp.async.commit_group; cp.async.wait_group N
//   HIP gfx9    a 16-B register load (global_load_dwordx4) and a 16-B LDS store at issue time;
//               commit and wait are no-ops. gfx942 has no 16-B LDS-direct load (buffer/global
//               load ... lds moves at most a dword per lane there), and gfx950's
//               global_load_lds_dwordx4 writes each lane's 16 B at M0 + lane * 16, one
//               contiguous run per wave, not to a per-lane address: kernels that want overlap on
//               AMD stage through registers across their own barrier (see moe_gemm.cu).
//   SIMT        copies are DEFERRED: issue records (dst, src), and they happen only in the wait
//               that retires their group (oldest first). A kernel that reads shared memory
//               without the wait (or waits for too few groups) reads stale data, so the emulator
//               makes a missing wait visible; more than kMaxPending copies outstanding, or
//               uncommitted copies left at destruction, trap.
//
// Capacity: kMaxPending bounds the copies a thread has issued and not yet retired (SIMT only;
// the GPU forms keep no state). Included by k3/compat.h (after k3/vec.h).
#ifndef K3_ASYNC_COPY_H
#define K3_ASYNC_COPY_H

K3_BEGIN

template <int kMaxPending>
struct AsyncCopy {
  static_assert(kMaxPending >= 1, "room for at least one copy");

#if K3_TARGET_SIMT
  struct Pending {
    void* dst;
    const void* src;  // nullptr: zero fill
    int group;
  };
  Pending pending[kMaxPending];
  int count = 0;      // issued, not yet retired (pending[0..count), oldest first)
  int committed = 0;  // groups closed so far; copies issued after the last commit carry this id

  AsyncCopy() = default;
  AsyncCopy(const AsyncCopy&) = delete;
  AsyncCopy& operator=(const AsyncCopy&) = delete;
  ~AsyncCopy() {
    if (count != 0 && pending[count - 1].group >= committed) trap("k3::AsyncCopy: copies issued but never committed");
  }

  K3_DEVICE void issue(void* dst, const void* src) {
    if (count == kMaxPending) trap("k3::AsyncCopy: more copies in flight than kMaxPending");
    pending[count++] = Pending{dst, src, committed};
  }
  K3_DEVICE void copy_16b(void* dst, const void* src) { issue(dst, src); }
  K3_DEVICE void copy_16b_or_zero(void* dst, const void* src, bool ok) { issue(dst, ok ? src : nullptr); }
  K3_DEVICE void commit() { ++committed; }
  template <int N>
  K3_DEVICE void wait() {
    static_assert(N >= 0, "a group count");
    // Groups with id < committed - N must have landed; younger ones and uncommitted copies stay.
    const int done = committed - N;
    int kept = 0;
    for (int i = 0; i < count; ++i) {
      const Pending& c = pending[i];
      if (c.group < done) {
        if (c.src != nullptr) {
          memcpy(c.dst, c.src, 16);
        } else {
          memset(c.dst, 0, 16);
        }
      } else {
        pending[kept++] = c;
      }
    }
    count = kept;
  }

#elif K3_TARGET_CUDA
  K3_DEVICE void copy_16b(void* dst, const void* src) { copy_16b_or_zero(dst, src, true); }
  K3_DEVICE void copy_16b_or_zero(void* dst, const void* src, bool ok) {
    unsigned s;  // the shared-window address of dst
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
  }
  K3_DEVICE void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int N>
  K3_DEVICE void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }

#else  // HIP: synchronous 16-B copies through registers (see the header comment)
  K3_DEVICE void copy_16b(void* dst, const void* src) { store_16b(dst, load_16b(src)); }
  K3_DEVICE void copy_16b_or_zero(void* dst, const void* src, bool ok) {
    const u32x4 zero = {{0u, 0u, 0u, 0u}};
    store_16b(dst, ok ? load_16b(src) : zero);
  }
  K3_DEVICE void commit() {}
  template <int N>
  K3_DEVICE void wait() {}
#endif
};

K3_END

#endif  // K3_ASYNC_COPY_H
