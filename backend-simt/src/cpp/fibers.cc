// Fiber stacks, (re)initialisation and the switch with its ASan annotations.
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "asan.h"
#include "runtime.h"

namespace k3 {
namespace simt {

__thread Worker* t_worker = nullptr;
__thread Fiber* t_fiber = nullptr;
__thread const ThreadInfo* t_current = nullptr;

namespace {

size_t page_size() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}

// A fiber's whole life: run the kernel once per block, then park in thread_exit (which
// returns when the fiber is resumed for the next block).
void fiber_main(void* arg) {
  asan_finish_switch(nullptr);
  Fiber* self = static_cast<Fiber*>(arg);
  for (;;) {
    Block& b = t_worker->block;
    b.launch->kernel->thunk(b.launch->params);
    // Mark the exit, wake barrier waiters if this was the last thread they waited for, and hand
    // the OS thread to the next ready fiber.
    thread_exit(self);
  }
}

}  // namespace

Fiber* fiber_create(size_t stack_size) {
  size_t page = page_size();
  size_t stack = (stack_size + page - 1) / page * page;
  size_t total = stack + page;  // + guard page below the stack
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  if (mprotect(m, page, PROT_NONE) != 0) {
    munmap(m, total);
    return nullptr;
  }
  Fiber* f = new Fiber();
  f->map = static_cast<char*>(m);
  f->map_size = total;
  f->stack_lo = f->map + page;
  f->stack_size = stack;
  f->needs_reset = true;
  return f;
}

void fiber_destroy(Fiber* f) {
  if (f == nullptr) return;
  asan_unpoison(f->stack_lo, f->stack_size);
  munmap(f->map, f->map_size);
  delete f;
}

void fiber_prepare(Fiber* f) {
  if (!f->needs_reset) return;
  // A fiber abandoned mid-kernel leaves ASan poison (stack redzones) behind on its stack.
  asan_unpoison(f->stack_lo, f->stack_size);
  f->asan_fake_stack = nullptr;
  context_init(&f->ctx, f->stack_lo, f->stack_size, fiber_main, f);
  f->needs_reset = false;
}

void switch_to(Fiber* from, Fiber* to) {
  Worker* w = t_worker;
  Context* from_ctx = from ? &from->ctx : &w->main_ctx;
  Context* to_ctx = to ? &to->ctx : &w->main_ctx;
  void** fake = from ? &from->asan_fake_stack : &w->main_fake_stack;
  const void* bottom = to ? static_cast<const void*>(to->stack_lo) : w->main_stack_lo;
  size_t size = to ? to->stack_size : w->main_stack_size;
  t_fiber = to;
  t_current = to ? &to->info : nullptr;
  if (to) to->state = FiberState::Running;
  asan_start_switch(fake, bottom, size);
  context_switch(from_ctx, to_ctx);
  asan_finish_switch(*fake);
}

void abandon_to_worker(Fiber* from) {
  Worker* w = t_worker;
  from->needs_reset = true;
  t_fiber = nullptr;
  t_current = nullptr;
  // `from` never runs again from here: nullptr lets ASan drop its fake stack.
  asan_start_switch(nullptr, w->main_stack_lo, w->main_stack_size);
  context_switch(&from->ctx, &w->main_ctx);
  __builtin_trap();  // unreachable: the context is rebuilt before the fiber runs again
}

void worker_init_stack_bounds(Worker* w) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* lo = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attr, &lo, &size) == 0) {
      w->main_stack_lo = lo;
      w->main_stack_size = size;
    }
    pthread_attr_destroy(&attr);
  }
}

}  // namespace simt
}  // namespace k3
