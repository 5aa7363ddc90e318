// Internal structures of the SIMT runtime: fibers, blocks, warps, workers, launches.
//
// Execution model: a launch's blocks are spread over a persistent pool of worker OS threads.
// A block runs entirely on one worker; its threads are fibers owned by that worker (created once,
// reused by every later block, never moved to another OS thread). Scheduling is cooperative
// and direct: a fiber that waits (barrier, warp collective, exit) switches straight to the next
// ready fiber of the block, and back to the worker only when none is ready (block finished,
// deadlocked or failed).
#ifndef K3_SIMT_RUNTIME_H
#define K3_SIMT_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "context.h"
#include "k3/simt_abi.h"

namespace k3 {
namespace simt {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxWarpSize = 64;
constexpr size_t kMaxSharedLimit = size_t(16) << 20;

struct KernelEntry {
  const char* name;
  int warp_size;
  Thunk thunk;
  int nparams;
  const ParamDesc* params;  // nparams entries
  const char* file;
};

// What a fiber is doing, for the scheduler and for deadlock reports.
enum class FiberState : uint8_t { Ready, Running, AtBarrier, AtCollective, Exited };

struct Worker;

struct Fiber {
  Context ctx;
  char* map = nullptr;  // mmap'd region: guard page + stack
  size_t map_size = 0;
  char* stack_lo = nullptr;
  size_t stack_size = 0;
  void* asan_fake_stack = nullptr;
  bool needs_reset = true;  // context must be rebuilt before the next run (new, or abandoned mid-kernel)
  FiberState state = FiberState::Exited;
  ThreadInfo info{};
  void* coll_payload = nullptr;  // this lane's data in the pending warp collective
  const char* wait_file = nullptr;
  int wait_line = 0;
};

// Kinds of warp collective; each group of lanes rendezvous on one (op, sub, width, mask).
enum CollOp : int { kCollShfl = 0, kCollBallot = 1, kCollSyncWarp = 2, kCollMma = 3 };

struct CollGroup {
  int op;
  int sub;    // shuffle kind or MMA shape
  int width;  // shuffle width
  uint64_t mask;
  uint64_t arrived;
  const char* file;
  int line;
};

struct Warp {
  Fiber* lanes[kMaxWarpSize];
  uint64_t exists;  // lanes that exist in this block (the last warp may be partial)
  uint64_t exited;
  CollGroup groups[kMaxWarpSize];  // pending collectives, disjoint masks
  int ngroups;
};

// splitmix64: tiny, seedable, good enough for shuffles and poison bytes.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) * n >> 32); }
};

struct Launch;

// Per-block state, owned by the worker running the block (reused from block to block).
struct Block {
  const Launch* launch = nullptr;
  uint64_t linear = 0;
  BlockInfo info{};
  unsigned nthreads = 0;
  unsigned warp_size = 0;
  unsigned nwarps = 0;
  bool randomized = false;
  Rng rng{0};
  // ready queue (ring buffer of capacity kMaxThreadsPerBlock + 1)
  std::vector<Fiber*> queue;
  unsigned qhead = 0, qcount = 0;
  // barrier
  std::vector<Fiber*> bar_waiters;
  unsigned bar_count = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  unsigned nexited = 0;
  std::vector<Warp> warps;
  // failure
  bool failed = false;
  std::string error;
  // shared memory
  void* dyn_smem = nullptr;
  // MMA scratch (the largest shape: A 32x8 / 16x16, B 8x32 / 16x16, C 32x32)
  float mma_a[256], mma_b[256], mma_c[1024];
};

// Per-worker arena for static and dynamic shared memory of the running block.
struct Arena {
  char* base = nullptr;
  size_t capacity = 0;
  size_t offset = 0;  // next free byte (allocations are separated by redzones)
  size_t used = 0;    // payload bytes, counted against the launch's limit
};

struct Worker {
  Context main_ctx;
  const void* main_stack_lo = nullptr;
  size_t main_stack_size = 0;
  void* main_fake_stack = nullptr;
  std::vector<Fiber*> fibers;
  size_t stack_size = 0;
  Arena arena;
  uint64_t epoch = 0;  // increments per block: identifies the block to SharedSlot
  Block block;
};

// One kernel launch, shared by all workers.
struct Launch {
  const KernelEntry* kernel = nullptr;
  void** params = nullptr;
  Dim3u grid{}, block{};
  unsigned dyn_smem = 0;
  size_t shared_limit = 0;
  uint64_t seed = 0;
  uint64_t nblocks = 0;
  std::atomic<uint64_t> next_block{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  uint64_t err_block = UINT64_MAX;
  std::string error;
};

extern __thread Worker* t_worker;
extern __thread Fiber* t_fiber;

// scheduler.cc
void run_block(Worker* w, const Launch* l, uint64_t block_linear);
// Stops the block with an error (first one wins) and abandons the calling fiber. The message is
// formatted into a fixed buffer: the fiber's frames are never unwound, so nothing on them may own
// heap memory.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
struct ThreadName {
  char s[96];
};
ThreadName thread_name(const Fiber* f);
// Makes `batch[0..n)` ready. `batch` must have room for n + 1 entries: in randomised mode the
// releasing fiber joins the shuffled batch and yields.
void release_fibers(Fiber* self, Fiber** batch, unsigned n);
void wait_and_run_next(Fiber* me);
void thread_exit(Fiber* me);
void collective(int op, int sub, int width, uint64_t mask, void* payload, const char* file, int line);

// collectives.cc
void run_collective(Block& b, Warp& w, const CollGroup& g);
// A collective's name for messages (`sub` distinguishes the shuffle kinds).
const char* coll_name(int op, int sub);

// shared_arena.cc
bool arena_reset(Arena& a, size_t limit);
void arena_release(Arena& a);
// nullptr when the launch's limit or the arena's capacity would be exceeded.
void* arena_alloc(Worker* w, size_t bytes, size_t align);

// fibers.cc
Fiber* fiber_create(size_t stack_size);
void fiber_destroy(Fiber* f);
void fiber_prepare(Fiber* f);  // (re)builds a fresh context if needs_reset
void switch_to(Fiber* from, Fiber* to);
[[noreturn]] void abandon_to_worker(Fiber* from);
void worker_init_stack_bounds(Worker* w);

// mma.cc
void mma_gather_compute_scatter(Block& b, Warp& w, int shape);
bool mma_layout(int shape, int operand, int lane, int slot, int* row, int* col);

// util
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace simt
}  // namespace k3

#endif  // K3_SIMT_RUNTIME_H
