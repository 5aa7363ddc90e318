// The dialect on AMD GPUs through clang -x hip. Works with the real HIP headers and with
// -nogpuinc (the minimal shim of shared/reference/toolchains.md: only clang builtins are used).
// Included by k3/compat.h only.
#ifndef K3_DETAIL_TARGET_HIP_H
#define K3_DETAIL_TARGET_HIP_H

#if K3_WARP_SIZE != 64 && K3_WARP_SIZE != 32
#error "K3_WARP_SIZE must be 32 or 64"
#endif

#define K3_KERNEL extern "C" __attribute__((global))
#define K3_DEVICE __attribute__((device)) inline
#define K3_RESTRICT __restrict__
#define K3_SHARED(T, name, dims) __attribute__((shared)) __attribute__((aligned(16))) T name dims
#define K3_EXPORT(kernel) static_assert(true, "")

K3_BEGIN

constexpr int kWarpSize = K3_WARP_SIZE;
#if K3_WARP_SIZE == 64
typedef unsigned long long lane_mask_t;
#else
typedef unsigned int lane_mask_t;
#endif
constexpr lane_mask_t kFullMask = static_cast<lane_mask_t>(~static_cast<lane_mask_t>(0));

K3_DEVICE unsigned thread_idx_x() { return __builtin_amdgcn_workitem_id_x(); }
// thread_idx_x() through an empty asm statement, which LLVM may neither hoist nor merge: what a
// kernel derives from it is computed where it is used, not once in the prologue and held in
// VGPRs across an outer loop (k3/compat.h). The assumption keeps its unsigned range.
K3_DEVICE unsigned thread_idx_x_unhoisted() {
  unsigned t = __builtin_amdgcn_workitem_id_x();
  asm volatile("" : "+v"(t));
  __builtin_assume(t < 1024u);
  return t;
}
K3_DEVICE unsigned thread_idx_y() { return __builtin_amdgcn_workitem_id_y(); }
K3_DEVICE unsigned thread_idx_z() { return __builtin_amdgcn_workitem_id_z(); }
K3_DEVICE unsigned block_idx_x() { return __builtin_amdgcn_workgroup_id_x(); }
K3_DEVICE unsigned block_idx_y() { return __builtin_amdgcn_workgroup_id_y(); }
K3_DEVICE unsigned block_idx_z() { return __builtin_amdgcn_workgroup_id_z(); }
K3_DEVICE unsigned block_dim_x() { return __builtin_amdgcn_workgroup_size_x(); }
K3_DEVICE unsigned block_dim_y() { return __builtin_amdgcn_workgroup_size_y(); }
K3_DEVICE unsigned block_dim_z() { return __builtin_amdgcn_workgroup_size_z(); }
// grid_size is counted in work-items.
K3_DEVICE unsigned grid_dim_x() { return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(); }
K3_DEVICE unsigned grid_dim_y() { return __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(); }
K3_DEVICE unsigned grid_dim_z() { return __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z(); }
K3_DEVICE unsigned lane_id() {
#if K3_WARP_SIZE == 64
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
#else
  return __builtin_amdgcn_mbcnt_lo(~0u, 0u);
#endif
}
K3_DEVICE unsigned warp_id() {
  return ((thread_idx_z() * block_dim_y() + thread_idx_y()) * block_dim_x() + thread_idx_x()) / kWarpSize;
}

K3_DEVICE void sync_threads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

namespace detail {
// CUDA shuffle semantics (see shfl_* below) computed in software, moved with ds_bpermute.
K3_DEVICE int source_lane(int kind, int lane, int arg, int width) {
  int base = lane & ~(width - 1);
  switch (kind) {
    case 0: return base + (arg & (width - 1));
    case 1: return (lane - base) >= arg ? lane - arg : lane;
    case 2: return (lane - base) + arg < width ? lane + arg : lane;
    default: {
      int j = lane ^ arg;
      return j < base + width ? j : lane;
    }
  }
}
template <class T>
K3_DEVICE T shfl(int kind, T v, int arg, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
  int addr = source_lane(kind, static_cast<int>(lane_id()), arg, width) << 2;
  if constexpr (sizeof(T) == 4) {
    int b = __builtin_bit_cast(int, v);
    return __builtin_bit_cast(T, __builtin_amdgcn_ds_bpermute(addr, b));
  } else {
    unsigned long long b = __builtin_bit_cast(unsigned long long, v);
    int lo = __builtin_amdgcn_ds_bpermute(addr, static_cast<int>(b & 0xffffffffu));
    int hi = __builtin_amdgcn_ds_bpermute(addr, static_cast<int>(b >> 32));
    return __builtin_bit_cast(T, (static_cast<unsigned long long>(static_cast<unsigned>(hi)) << 32) | static_cast<unsigned>(lo));
  }
}
}  // namespace detail

// Masks are not passed to the hardware: every lane named in `mask` must be active, as on CUDA.
template <class T>
K3_DEVICE T shfl_sync(lane_mask_t, T v, int src_lane, int width = kWarpSize) {
  return detail::shfl(0, v, src_lane, width);
}
template <class T>
K3_DEVICE T shfl_up_sync(lane_mask_t, T v, unsigned delta, int width = kWarpSize) {
  return detail::shfl(1, v, static_cast<int>(delta), width);
}
template <class T>
K3_DEVICE T shfl_down_sync(lane_mask_t, T v, unsigned delta, int width = kWarpSize) {
  return detail::shfl(2, v, static_cast<int>(delta), width);
}
template <class T>
K3_DEVICE T shfl_xor_sync(lane_mask_t, T v, int lane_mask, int width = kWarpSize) {
  return detail::shfl(3, v, lane_mask, width);
}
K3_DEVICE lane_mask_t ballot_sync(lane_mask_t mask, bool pred) {
#if K3_WARP_SIZE == 64
  return __builtin_amdgcn_ballot_w64(pred) & mask;
#else
  return __builtin_amdgcn_ballot_w32(pred) & mask;
#endif
}
K3_DEVICE void sync_warp(lane_mask_t = kFullMask) { __builtin_amdgcn_wave_barrier(); }

// Number of set bits of a lane mask.
K3_DEVICE int popc(lane_mask_t m) { return __builtin_popcountll(static_cast<unsigned long long>(m)); }

K3_DEVICE int atomic_add(int* p, int v) { return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
K3_DEVICE unsigned atomic_add(unsigned* p, unsigned v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
K3_DEVICE float atomic_add(float* p, float v) { return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
K3_DEVICE int atomic_max(int* p, int v) { return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
// Stores desired if *p == expected; returns the old value.
K3_DEVICE int atomic_cas(int* p, int expected, int desired) {
  __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  return expected;
}
K3_DEVICE void thread_fence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

template <class T>
K3_DEVICE T* dynamic_shared() {
  extern __attribute__((shared)) __attribute__((aligned(16))) unsigned char k3_dynamic_smem[];
  return reinterpret_cast<T*>(k3_dynamic_smem);
}

[[noreturn]] K3_DEVICE void trap(const char* = "k3::trap") { __builtin_trap(); }

K3_DEVICE uint32_t float_as_uint(float f) { return __builtin_bit_cast(uint32_t, f); }
K3_DEVICE float uint_as_float(uint32_t u) { return __builtin_bit_cast(float, u); }

K3_END

#endif  // K3_DETAIL_TARGET_HIP_H
