// The dialect on NVIDIA GPUs (nvcc or NVRTC). Included by k3/compat.h only.
#ifndef K3_DETAIL_TARGET_CUDA_H
#define K3_DETAIL_TARGET_CUDA_H

#if K3_WARP_SIZE != 32
#error "CUDA warps have 32 threads"
#endif

#define K3_KERNEL extern "C" __global__
#define K3_DEVICE __device__ inline
#define K3_RESTRICT __restrict__
#define K3_SHARED(T, name, dims) __shared__ __align__(16) T name dims
#define K3_EXPORT(kernel) static_assert(true, "")

K3_BEGIN

constexpr int kWarpSize = 32;
typedef unsigned int lane_mask_t;
constexpr lane_mask_t kFullMask = 0xffffffffu;

K3_DEVICE unsigned thread_idx_x() { return threadIdx.x; }
K3_DEVICE unsigned thread_idx_x_unhoisted() { return thread_idx_x(); }  // the HIP form: target_hip.h
K3_DEVICE unsigned thread_idx_y() { return threadIdx.y; }
K3_DEVICE unsigned thread_idx_z() { return threadIdx.z; }
K3_DEVICE unsigned block_idx_x() { return blockIdx.x; }
K3_DEVICE unsigned block_idx_y() { return blockIdx.y; }
K3_DEVICE unsigned block_idx_z() { return blockIdx.z; }
K3_DEVICE unsigned block_dim_x() { return blockDim.x; }
K3_DEVICE unsigned block_dim_y() { return blockDim.y; }
K3_DEVICE unsigned block_dim_z() { return blockDim.z; }
K3_DEVICE unsigned grid_dim_x() { return gridDim.x; }
K3_DEVICE unsigned grid_dim_y() { return gridDim.y; }
K3_DEVICE unsigned grid_dim_z() { return gridDim.z; }
K3_DEVICE unsigned linear_thread_idx() { return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x; }
K3_DEVICE unsigned lane_id() { return linear_thread_idx() % 32u; }
K3_DEVICE unsigned warp_id() { return linear_thread_idx() / 32u; }

K3_DEVICE void sync_threads() { __syncthreads(); }

namespace detail {
template <class T>
K3_DEVICE T shfl(int kind, lane_mask_t mask, T v, int arg, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
  if constexpr (sizeof(T) == 4) {
    int b = __builtin_bit_cast(int, v);
    b = kind == 0   ? __shfl_sync(mask, b, arg, width)
        : kind == 1 ? __shfl_up_sync(mask, b, static_cast<unsigned>(arg), width)
        : kind == 2 ? __shfl_down_sync(mask, b, static_cast<unsigned>(arg), width)
                    : __shfl_xor_sync(mask, b, arg, width);
    return __builtin_bit_cast(T, b);
  } else {
    long long b = __builtin_bit_cast(long long, v);
    b = kind == 0   ? __shfl_sync(mask, b, arg, width)
        : kind == 1 ? __shfl_up_sync(mask, b, static_cast<unsigned>(arg), width)
        : kind == 2 ? __shfl_down_sync(mask, b, static_cast<unsigned>(arg), width)
                    : __shfl_xor_sync(mask, b, arg, width);
    return __builtin_bit_cast(T, b);
  }
}
}  // namespace detail

template <class T>
K3_DEVICE T shfl_sync(lane_mask_t mask, T v, int src_lane, int width = kWarpSize) {
  return detail::shfl(0, mask, v, src_lane, width);
}
template <class T>
K3_DEVICE T shfl_up_sync(lane_mask_t mask, T v, unsigned delta, int width = kWarpSize) {
  return detail::shfl(1, mask, v, static_cast<int>(delta), width);
}
template <class T>
K3_DEVICE T shfl_down_sync(lane_mask_t mask, T v, unsigned delta, int width = kWarpSize) {
  return detail::shfl(2, mask, v, static_cast<int>(delta), width);
}
template <class T>
K3_DEVICE T shfl_xor_sync(lane_mask_t mask, T v, int lane_mask, int width = kWarpSize) {
  return detail::shfl(3, mask, v, lane_mask, width);
}
K3_DEVICE lane_mask_t ballot_sync(lane_mask_t mask, bool pred) { return __ballot_sync(mask, pred); }
K3_DEVICE void sync_warp(lane_mask_t mask = kFullMask) { __syncwarp(mask); }

// Number of set bits of a lane mask.
K3_DEVICE int popc(lane_mask_t m) { return __popc(m); }

K3_DEVICE int atomic_add(int* p, int v) { return atomicAdd(p, v); }
K3_DEVICE unsigned atomic_add(unsigned* p, unsigned v) { return atomicAdd(p, v); }
K3_DEVICE float atomic_add(float* p, float v) { return atomicAdd(p, v); }
K3_DEVICE int atomic_max(int* p, int v) { return atomicMax(p, v); }
// Stores desired if *p == expected; returns the old value.
K3_DEVICE int atomic_cas(int* p, int expected, int desired) { return atomicCAS(p, expected, desired); }
K3_DEVICE void thread_fence() { __threadfence(); }

template <class T>
K3_DEVICE T* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char k3_dynamic_smem[];
  return reinterpret_cast<T*>(k3_dynamic_smem);
}

[[noreturn]] K3_DEVICE void trap(const char* = "k3::trap") {
  __trap();
  __builtin_unreachable();
}

K3_DEVICE uint32_t float_as_uint(float f) { return __float_as_uint(f); }
K3_DEVICE float uint_as_float(uint32_t u) { return __uint_as_float(u); }

K3_END

#endif  // K3_DETAIL_TARGET_CUDA_H
