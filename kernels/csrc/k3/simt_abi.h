// The interface between kernels compiled for the SIMT emulator (K3_SIMT) and its runtime
// (backend-simt/src/cpp). Kernels never use it directly: k3/detail/target_simt.h maps the
// dialect onto it. It does not depend on the warp size, so one runtime serves kernels compiled
// at warp 32 and at warp 64.
#ifndef K3_SIMT_ABI_H
#define K3_SIMT_ABI_H

#include <stddef.h>
#include <stdint.h>

namespace k3 {
namespace simt {

struct Dim3u {
  unsigned x, y, z;
};

// Per block, set by the runtime when the block starts.
struct BlockInfo {
  Dim3u block_idx;
  Dim3u block_dim;
  Dim3u grid_dim;
};

// Per emulated thread, rewritten by the runtime on each fiber switch (never a macro).
struct ThreadInfo {
  Dim3u thread_idx;
  unsigned linear;  // x + y*bx + z*bx*by
  unsigned lane;    // linear % warp size
  unsigned warp;    // linear / warp size
  const BlockInfo* block;
};

// The thread the calling fiber emulates. Fibers never migrate between OS threads, so a cached
// TLS address stays valid; the value must be re-read after any runtime call (it is: those
// calls are opaque to the compiler).
extern __thread const ThreadInfo* t_current;

// Static shared memory: one slot per declaration and OS worker. The first thread of a block to
// reach the declaration allocates from the worker's per-block arena (poisoned, filled with 0xFF
// or seeded random bytes); the others get the same address.
struct SharedSlot {
  uint64_t epoch;
  void* ptr;
};
void* shared_alloc(SharedSlot* slot, size_t bytes, size_t align, const char* file, int line);
// The block's dynamic shared memory (the launch's shared_bytes).
void* dynamic_shared();

// Block barrier; the call site identifies the barrier (divergence is an error).
void sync_threads(const char* file, int line);

// Warp collectives. Masks are 64-bit here whatever the warp size.
enum ShflKind : int { kShflIdx = 0, kShflUp = 1, kShflDown = 2, kShflXor = 3 };
uint64_t warp_shfl(int kind, uint64_t mask, uint64_t value, int arg, int width, const char* file, int line);
uint64_t warp_ballot(uint64_t mask, int pred, const char* file, int line);
void warp_sync(uint64_t mask, const char* file, int line);
// D = A*B + C for shape `shape` (k3::layout::*::kId); a/b are bf16 bit patterns in slot order.
void warp_mma(int shape, const uint16_t* a, const uint16_t* b, const float* c, float* d, const char* file,
              int line);

// Aborts the block with an error naming the call site (k3::trap).
[[noreturn]] void trap(const char* what, const char* file, int line);

// Kernel registration (K3_EXPORT): a thunk unpacks cuLaunchKernel-style parameter pointers.
typedef void (*Thunk)(void** params);
// One byte per kernel parameter, from the kernel's C++ signature: the size in bytes (low 7 bits),
// with kParamPointer set for a pointer. The driver stand-ins (crate k3-standin) use it to copy
// parameter values into graphs and to check every pointer parameter against the allocations.
typedef uint8_t ParamDesc;
constexpr ParamDesc kParamPointer = 0x80;
struct Registrar {
  Registrar(const char* name, int warp_size, Thunk thunk, int nparams, const ParamDesc* params, const char* file);
};

}  // namespace simt
}  // namespace k3

#endif  // K3_SIMT_ABI_H
