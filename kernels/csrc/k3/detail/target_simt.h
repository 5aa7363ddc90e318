// The dialect on the SIMT emulator: host C++, threads are fibers of backend-simt's runtime.
// Included by k3/compat.h only (K3_TARGET_SIMT, K3_WARP_SIZE set, K3_BEGIN/K3_END defined).
#ifndef K3_DETAIL_TARGET_SIMT_H
#define K3_DETAIL_TARGET_SIMT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

#include "k3/simt_abi.h"

#if K3_WARP_SIZE != 32 && K3_WARP_SIZE != 64
#error "K3_WARP_SIZE must be 32 or 64"
#endif

#define K3_KERNEL
#define K3_DEVICE inline
#define K3_RESTRICT __restrict__

// Static shared memory from the per-block arena (see simt_abi.h). `dims` is the array part of
// the declarator, possibly empty: K3_SHARED(float, tile, [16][17]); K3_SHARED(int, count, );
#define K3_SHARED(T, name, dims)                                                        \
  static thread_local ::k3::simt::SharedSlot K3_CAT(k3_shared_slot_, name);             \
  T(&name) dims = *reinterpret_cast<T(*) dims>(::k3::simt::shared_alloc(                \
      &K3_CAT(k3_shared_slot_, name), sizeof(T dims), alignof(T), __FILE__, __LINE__))

namespace k3 {
namespace simt {
// Unpacks cuLaunchKernel-style parameter pointers into a call of the kernel.
template <class T>
constexpr ParamDesc param_desc() {
  static_assert(std::is_pointer<T>::value || std::is_arithmetic<T>::value || std::is_enum<T>::value,
                "kernel parameters are pointers or scalars");
  static_assert(sizeof(T) < kParamPointer, "a kernel parameter's size must fit 7 bits");
  return static_cast<ParamDesc>(sizeof(T) | (std::is_pointer<T>::value ? kParamPointer : 0));
}
template <class F>
struct KernelThunk;
template <class... A>
struct KernelThunk<void (*)(A...)> {
  static constexpr int kParams = static_cast<int>(sizeof...(A));
  // One entry per parameter (plus a terminator, so a kernel without parameters has an array).
  static constexpr ParamDesc kDescs[sizeof...(A) + 1] = {param_desc<A>()..., 0};
  template <void (*F)(A...), size_t... I>
  static void call(void** p, std::index_sequence<I...>) {
    (void)p;
    F(*static_cast<typename std::remove_reference<A>::type*>(p[I])...);
  }
  template <void (*F)(A...)>
  static void entry(void** p) {
    call<F>(p, std::index_sequence_for<A...>{});
  }
};
}  // namespace simt
}  // namespace k3

// Makes a kernel launchable by name (a no-op on CUDA/HIP, where `extern "C"` does it).
#define K3_EXPORT(kernel)                                                                          \
  static const ::k3::simt::Registrar K3_CAT(k3_registrar_, kernel)(                                \
      #kernel, K3_WARP_SIZE, &::k3::simt::KernelThunk<decltype(&kernel)>::template entry<&kernel>, \
      ::k3::simt::KernelThunk<decltype(&kernel)>::kParams, ::k3::simt::KernelThunk<decltype(&kernel)>::kDescs, \
      __FILE__)

K3_BEGIN

constexpr int kWarpSize = K3_WARP_SIZE;
typedef std::conditional<K3_WARP_SIZE == 32, uint32_t, uint64_t>::type lane_mask_t;
constexpr lane_mask_t kFullMask = static_cast<lane_mask_t>(~static_cast<lane_mask_t>(0));

K3_DEVICE unsigned thread_idx_x() { return simt::t_current->thread_idx.x; }
K3_DEVICE unsigned thread_idx_x_unhoisted() { return thread_idx_x(); }  // the HIP form: target_hip.h
K3_DEVICE unsigned thread_idx_y() { return simt::t_current->thread_idx.y; }
K3_DEVICE unsigned thread_idx_z() { return simt::t_current->thread_idx.z; }
K3_DEVICE unsigned block_idx_x() { return simt::t_current->block->block_idx.x; }
K3_DEVICE unsigned block_idx_y() { return simt::t_current->block->block_idx.y; }
K3_DEVICE unsigned block_idx_z() { return simt::t_current->block->block_idx.z; }
K3_DEVICE unsigned block_dim_x() { return simt::t_current->block->block_dim.x; }
K3_DEVICE unsigned block_dim_y() { return simt::t_current->block->block_dim.y; }
K3_DEVICE unsigned block_dim_z() { return simt::t_current->block->block_dim.z; }
K3_DEVICE unsigned grid_dim_x() { return simt::t_current->block->grid_dim.x; }
K3_DEVICE unsigned grid_dim_y() { return simt::t_current->block->grid_dim.y; }
K3_DEVICE unsigned grid_dim_z() { return simt::t_current->block->grid_dim.z; }
K3_DEVICE unsigned lane_id() { return simt::t_current->lane; }
K3_DEVICE unsigned warp_id() { return simt::t_current->warp; }

K3_DEVICE void sync_threads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  simt::sync_threads(file, line);
}

namespace detail {
template <class T>
K3_DEVICE uint64_t to_bits(T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
  static_assert(std::is_trivially_copyable<T>::value, "warp shuffles move trivially copyable values");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
K3_DEVICE T from_bits(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}
template <class T>
K3_DEVICE T shfl(int kind, lane_mask_t mask, T v, int arg, int width, const char* file, int line) {
  return from_bits<T>(simt::warp_shfl(kind, static_cast<uint64_t>(mask), to_bits(v), arg, width, file, line));
}
}  // namespace detail

template <class T>
K3_DEVICE T shfl_sync(lane_mask_t mask, T v, int src_lane, int width = kWarpSize,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shfl(simt::kShflIdx, mask, v, src_lane, width, file, line);
}
template <class T>
K3_DEVICE T shfl_up_sync(lane_mask_t mask, T v, unsigned delta, int width = kWarpSize,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shfl(simt::kShflUp, mask, v, static_cast<int>(delta), width, file, line);
}
template <class T>
K3_DEVICE T shfl_down_sync(lane_mask_t mask, T v, unsigned delta, int width = kWarpSize,
                           const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shfl(simt::kShflDown, mask, v, static_cast<int>(delta), width, file, line);
}
template <class T>
K3_DEVICE T shfl_xor_sync(lane_mask_t mask, T v, int lane_mask, int width = kWarpSize,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return detail::shfl(simt::kShflXor, mask, v, lane_mask, width, file, line);
}
K3_DEVICE lane_mask_t ballot_sync(lane_mask_t mask, bool pred, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
  return static_cast<lane_mask_t>(simt::warp_ballot(static_cast<uint64_t>(mask), pred ? 1 : 0, file, line));
}
K3_DEVICE void sync_warp(lane_mask_t mask = kFullMask, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  simt::warp_sync(static_cast<uint64_t>(mask), file, line);
}

// Relaxed device-scope atomics. Blocks run concurrently on several OS threads, so these are real
// atomic instructions; threads of one block are fibers of one OS thread.
// Number of set bits of a lane mask.
K3_DEVICE int popc(lane_mask_t m) { return __builtin_popcountll(static_cast<unsigned long long>(m)); }

K3_DEVICE int atomic_add(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
K3_DEVICE unsigned atomic_add(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
K3_DEVICE float atomic_add(float* p, float v) {
  uint32_t* w = reinterpret_cast<uint32_t*>(p);
  uint32_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
  for (;;) {
    float f;
    memcpy(&f, &old, 4);
    f += v;
    uint32_t nw;
    memcpy(&nw, &f, 4);
    if (__atomic_compare_exchange_n(w, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      memcpy(&f, &old, 4);
      return f;
    }
  }
}
K3_DEVICE int atomic_max(int* p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
// Stores desired if *p == expected; returns the old value.
K3_DEVICE int atomic_cas(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
K3_DEVICE void thread_fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T>
K3_DEVICE T* dynamic_shared() {
  return static_cast<T*>(simt::dynamic_shared());
}

// Stops the block with an error naming the call site (device-side assertion failure).
[[noreturn]] K3_DEVICE void trap(const char* what = "k3::trap", const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  simt::trap(what, file, line);
}

K3_DEVICE uint32_t float_as_uint(float f) { return __builtin_bit_cast(uint32_t, f); }
K3_DEVICE float uint_as_float(uint32_t u) { return __builtin_bit_cast(float, u); }

K3_END

#endif  // K3_DETAIL_TARGET_SIMT_H
