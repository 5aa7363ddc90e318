// k3 kernel dialect: one vocabulary for CUDA (nvcc / NVRTC), HIP (clang -x hip, also with
// -nogpuinc) and the host SIMT emulator (K3_SIMT with K3_WARP_SIZE 32 or 64).
//
// Kernels include this header (and their own .cuh helpers) and nothing else, so that NVRTC,
// hipRTC and the emulator can all compile them. What it provides, all in namespace k3:
//   qualifiers     K3_KERNEL (an exported kernel), K3_DEVICE (a device helper), K3_RESTRICT,
//                  K3_EXPORT(kernel) after each kernel (registers it with the emulator)
//   indices        thread_idx_x/y/z(), block_idx_*(), block_dim_*(), grid_dim_*(), lane_id(),
//                  warp_id() (functions, never macros named threadIdx); thread_idx_x_unhoisted()
//                  where what a loop derives from the index must not be held across an outer
//                  loop (on AMD LLVM hoists it to the prologue: registers for the whole kernel)
//   shared memory  K3_SHARED(T, name, dims) static shared; dynamic_shared<T>() (launch bytes)
//   barrier        sync_threads()
//   warps          kWarpSize (compile time: 32 on CUDA, 64 on HIP gfx9, K3_WARP_SIZE in SIMT),
//                  lane_mask_t, kFullMask, shfl/shfl_up/shfl_down/shfl_xor (width), their
//                  _sync forms with a mask, ballot(_sync), any/all, popc, sync_warp,
//                  warp_reduce_sum/max (k3/warp.h)
//   atomics        atomic_add (int, unsigned, float), atomic_max (int), atomic_cas (int), thread_fence()
//   index checks   k3/checks.h: the device error record and the bound checks every kernel
//                  applies to index data it reads from device memory (see the rule there)
//   conversions    bf16 <-> f32 (bit-identical to Rust half::bf16), fp8 e4m3fn / e4m3fnuz / e5m2
//                  encode (round to nearest even, saturating) and decode (k3/convert.h); packed
//                  hardware forms for hot loops: bf16x2 packing, fp8x2 -> f32/f16/bf16 (k3/convert_hw.h)
//   matrix tiles   k3::mma fragments for bf16 MMA with f32 accumulate (k3/mma.h)
//   async copies   k3::AsyncCopy: 16-B global -> shared copies in commit/wait groups (k3/async_copy.h)
//   loops          K3_UNROLL (full unrolling, for loops over register arrays), K3_NO_UNROLL
//                  (keep a loop rolled where unrolling costs registers)
//   inlining       K3_AMD_INLINE (large helpers inlined on AMD, where a call costs a scratch stack)
//   trap()         device-side assertion failure
//
// Rules for kernel sources (so that the emulator can compile each file at both warp sizes into
// its own namespace): include only k3/ headers and local .cuh files, never open namespace k3,
// mark every launchable kernel K3_KERNEL and list it with K3_EXPORT(name), use kWarpSize (never
// a literal 32 or 64) and k3::lane_mask_t for masks.
#ifndef K3_COMPAT_H
#define K3_COMPAT_H

#include "k3/detail/qualifiers.h"

#if K3_TARGET_CUDA
#ifndef K3_WARP_SIZE
#define K3_WARP_SIZE 32
#endif
#elif K3_TARGET_HIP
#ifndef K3_WARP_SIZE
#define K3_WARP_SIZE 64  // gfx9 (CDNA) wavefronts; wave32 targets must define K3_WARP_SIZE=32
#endif
#elif !defined(K3_WARP_SIZE)
#error "SIMT build: define K3_WARP_SIZE (32 or 64)"
#endif

// Everything warp-size dependent lives in an inline namespace named after the warp size, so the
// emulator can link kernels compiled at warp 32 and at warp 64 into one binary without two
// different definitions of one inline function.
#define K3_ABI_NS K3_CAT(w, K3_WARP_SIZE)
#define K3_BEGIN        \
  namespace k3 {        \
  inline namespace K3_ABI_NS {
#define K3_END \
  }            \
  }

#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
#elif defined(__HIPCC_RTC__)
// hiprtc predefines the 32- and 64-bit types itself (int64_t as long long, which a host
// <stdint.h> would contradict); the narrower ones are the same types everywhere.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef signed char int8_t;
typedef short int16_t;
#elif !K3_TARGET_SIMT
#include <stdint.h>
#endif

// Call-site parameters: in the emulator, collectives and barriers record where they were called
// from (for error messages); on GPUs they take no such parameters.
#if K3_TARGET_SIMT
#define K3_SITE_PARAMS , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define K3_SITE_ARGS , file, line
#else
#define K3_SITE_PARAMS
#define K3_SITE_ARGS
#endif

// Unrolling hints matter on the GPUs only; the host SIMT build has no such pragma (and g++
// -Wall would warn about it).
#if K3_TARGET_SIMT
#define K3_UNROLL
#define K3_NO_UNROLL
#else
#define K3_UNROLL _Pragma("unroll")
#define K3_NO_UNROLL _Pragma("unroll 1")
#endif

// K3_AMD_INLINE forces a device helper inline on AMD: clang may call a large helper out of line,
// and every such call goes through a scratch stack (arguments and callee-saved registers around
// s_swappc). nvcc inlines these helpers already, and the SIMT build has no use for it.
#if K3_TARGET_HIP
#define K3_AMD_INLINE __attribute__((always_inline))
#else
#define K3_AMD_INLINE
#endif

#if K3_TARGET_CUDA
#include "k3/detail/target_cuda.h"
#elif K3_TARGET_HIP
#include "k3/detail/target_hip.h"
#else
#include "k3/detail/target_simt.h"
#endif

#include "k3/convert.h"
#include "k3/convert_hw.h"
#include "k3/mma.h"
#include "k3/warp.h"
#include "k3/math.h"
#include "k3/tensor.h"
#include "k3/vec.h"
#include "k3/async_copy.h"
#include "k3/checks.h"

#endif  // K3_COMPAT_H
