// Shared memory: one arena per worker, reset for every block. Allocations (the block's dynamic
// shared memory first, then each K3_SHARED declaration the first time a thread of the block
// reaches it) are 16-byte aligned, separated by 64-byte redzones, ASan-poisoned outside what
// was handed out, and filled with 0xFF (seed 0) or seeded random bytes, so reads of shared
// memory nobody wrote show up as NaN / -1 or as seed-dependent results.
#include <string.h>
#include <sys/mman.h>

#include "asan.h"
#include "runtime.h"

namespace k3 {
namespace simt {

namespace {
constexpr size_t kRedzone = 64;
constexpr size_t kRedzoneSpace = 64 * 1024;  // room for ~1000 allocations per block
}  // namespace

bool arena_reset(Arena& a, size_t limit) {
  size_t need = limit + kRedzoneSpace;
  if (a.capacity < need) {
    arena_release(a);
    void* m = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    a.base = static_cast<char*>(m);
    a.capacity = need;
  }
  a.offset = 0;
  a.used = 0;
  asan_poison(a.base, a.capacity);
  return true;
}

void arena_release(Arena& a) {
  if (a.base != nullptr) {
    asan_unpoison(a.base, a.capacity);
    munmap(a.base, a.capacity);
  }
  a.base = nullptr;
  a.capacity = 0;
}

void* arena_alloc(Worker* w, size_t bytes, size_t align) {
  Arena& a = w->arena;
  Block& b = w->block;
  if (align < 16) align = 16;
  if (bytes > b.launch->shared_limit - a.used) return nullptr;
  size_t off = a.offset == 0 ? 0 : a.offset + kRedzone;
  off = (off + align - 1) / align * align;
  if (off > a.capacity || bytes > a.capacity - off) return nullptr;
  char* p = a.base + off;
  asan_unpoison(p, bytes);
  if (b.randomized) {
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t r = b.rng.next();
      memcpy(p + i, &r, 8);
    }
    uint64_t r = b.rng.next();
    memcpy(p + i, &r, bytes - i);
  } else {
    memset(p, 0xFF, bytes);
  }
  a.offset = off + bytes;
  a.used += bytes;
  return p;
}

void* shared_alloc(SharedSlot* slot, size_t bytes, size_t align, const char* file, int line) {
  Worker* w = t_worker;
  if (slot->epoch == w->epoch) return slot->ptr;
  void* p = arena_alloc(w, bytes, align);
  if (p == nullptr) {
    fail("shared memory limit exceeded: %s:%d declares %zu bytes; the block already uses %zu of its %zu-byte "
                "limit (%u dynamic)",
                file ? file : "?", line, bytes, w->arena.used, w->block.launch->shared_limit,
                w->block.launch->dyn_smem);
  }
  slot->epoch = w->epoch;
  slot->ptr = p;
  return p;
}

void* dynamic_shared() { return t_worker->block.dyn_smem; }

}  // namespace simt
}  // namespace k3
