// Target detection and the qualifiers shared by every k3 header.
//
// Exactly one of K3_TARGET_CUDA, K3_TARGET_HIP, K3_TARGET_SIMT is defined to 1:
//   - HIP: clang -x hip (also with -nogpuinc and the shim in target_hip.h);
//   - CUDA: nvcc or NVRTC;
//   - SIMT: host C++ with K3_SIMT defined (the backend-simt emulator).
#ifndef K3_DETAIL_QUALIFIERS_H
#define K3_DETAIL_QUALIFIERS_H

#if defined(__HIP__)
#define K3_TARGET_HIP 1
#define K3_HOST_DEVICE __attribute__((host)) __attribute__((device))
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define K3_TARGET_CUDA 1
#define K3_HOST_DEVICE __host__ __device__
#elif defined(K3_SIMT)
#define K3_TARGET_SIMT 1
#define K3_HOST_DEVICE
#else
#error "k3 dialect: compile with nvcc/NVRTC, clang -x hip, or define K3_SIMT for the host SIMT emulator"
#endif

#define K3_CAT_(a, b) a##b
#define K3_CAT(a, b) K3_CAT_(a, b)

#endif  // K3_DETAIL_QUALIFIERS_H
