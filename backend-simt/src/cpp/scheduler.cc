// Running one block: the ready queue, barriers, warp-collective rendezvous, thread exit, the
// runtime checks (barrier divergence, divergent collectives, exited or missing lanes in a mask,
// deadlock) and the seeded resume order.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "asan.h"
#include "runtime.h"

namespace k3 {
namespace simt {

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return std::string(buf);
}

namespace {

Block& cur_block() { return t_worker->block; }

void queue_push(Block& b, Fiber* f) {
  size_t cap = b.queue.size();
  b.queue[(b.qhead + b.qcount) % cap] = f;
  ++b.qcount;
}

Fiber* queue_pop(Block& b) {
  if (b.qcount == 0) return nullptr;
  Fiber* f = b.queue[b.qhead];
  b.qhead = static_cast<unsigned>((b.qhead + 1) % b.queue.size());
  --b.qcount;
  return f;
}

void shuffle(Block& b, Fiber** a, unsigned n) {
  for (unsigned i = n; i > 1; --i) {
    unsigned j = b.rng.below(i);
    Fiber* t = a[i - 1];
    a[i - 1] = a[j];
    a[j] = t;
  }
}

bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || (f1 != nullptr && f2 != nullptr && strcmp(f1, f2) == 0));
}

const char* site_file(const char* f) { return f ? f : "?"; }

void release_barrier(Fiber* releaser) {
  Block& b = cur_block();
  unsigned n = b.bar_count;
  b.bar_count = 0;
  // The releaser is the last waiter when it arrived last; when an exit releases, it is not one.
  if (n > 0 && b.bar_waiters[n - 1] == releaser) {
    releaser->state = FiberState::Running;
    --n;
  }
  release_fibers(releaser, b.bar_waiters.data(), n);
}

uint64_t seed_block(uint64_t seed, uint64_t block) {
  Rng r{seed ^ (block * 0xd1b54a32d192ed03ull)};
  r.next();
  return r.next();
}

std::string deadlock_report(const Block& b) {
  unsigned at_barrier = 0, at_coll = 0, exited = 0;
  for (unsigned t = 0; t < b.nthreads; ++t) {
    const Fiber* f = t_worker->fibers[t];
    if (f->state == FiberState::AtBarrier) ++at_barrier;
    if (f->state == FiberState::AtCollective) ++at_coll;
    if (f->state == FiberState::Exited) ++exited;
  }
  std::string s = format("deadlock: %u of %u threads wait at a barrier", at_barrier, b.nthreads);
  if (at_barrier > 0) s += format(" (%s:%d)", site_file(b.bar_file), b.bar_line);
  s += format(", %u wait in warp collectives, %u exited", at_coll, exited);
  int shown = 0;
  for (unsigned wi = 0; wi < b.nwarps && shown < 4; ++wi) {
    const Warp& w = b.warps[wi];
    for (int g = 0; g < w.ngroups && shown < 4; ++g, ++shown) {
      const CollGroup& c = w.groups[g];
      s += format("; warp %u: %s at %s:%d with mask %#llx has lanes %#llx", wi, coll_name(c.op, c.sub), site_file(c.file),
                  c.line, static_cast<unsigned long long>(c.mask), static_cast<unsigned long long>(c.arrived));
    }
  }
  return s;
}

}  // namespace

ThreadName thread_name(const Fiber* f) {
  ThreadName n;
  snprintf(n.s, sizeof n.s, "thread (%u,%u,%u) [warp %u lane %u]", f->info.thread_idx.x, f->info.thread_idx.y,
           f->info.thread_idx.z, f->info.warp, f->info.lane);
  return n;
}

void fail(const char* fmt, ...) {
  Block& b = cur_block();
  if (!b.failed) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b.failed = true;
    b.error = format("kernel `%s` block (%u,%u,%u): %s", b.launch->kernel->name, b.info.block_idx.x,
                     b.info.block_idx.y, b.info.block_idx.z, msg);
  }
  abandon_to_worker(t_fiber);
}

void wait_and_run_next(Fiber* me) {
  Block& b = cur_block();
  Fiber* next = queue_pop(b);
  if (next == me) {
    me->state = FiberState::Running;
    return;
  }
  switch_to(me, next);  // next == nullptr: back to the worker (finished, deadlocked)
}

void release_fibers(Fiber* self, Fiber** batch, unsigned n) {
  Block& b = cur_block();
  if (!b.randomized) {
    // Deterministic: the releaser keeps running; the others resume in arrival order.
    for (unsigned i = 0; i < n; ++i) {
      batch[i]->state = FiberState::Ready;
      queue_push(b, batch[i]);
    }
    return;
  }
  bool self_runs = self->state == FiberState::Running;
  if (self_runs) batch[n++] = self;
  shuffle(b, batch, n);
  for (unsigned i = 0; i < n; ++i) {
    batch[i]->state = FiberState::Ready;
    queue_push(b, batch[i]);
  }
  if (self_runs) wait_and_run_next(self);
}

void sync_threads(const char* file, int line) {
  Fiber* me = t_fiber;
  Block& b = cur_block();
  if (b.bar_count == 0) {
    b.bar_file = file;
    b.bar_line = line;
  } else if (!same_site(file, line, b.bar_file, b.bar_line)) {
    fail("barrier divergence: %s waits at %s:%d while %u thread(s) wait at %s:%d", thread_name(me).s,
                site_file(file), line, b.bar_count, site_file(b.bar_file), b.bar_line);
  }
  me->wait_file = file;
  me->wait_line = line;
  me->state = FiberState::AtBarrier;
  b.bar_waiters[b.bar_count++] = me;
  if (b.bar_count + b.nexited == b.nthreads) {
    release_barrier(me);
  } else {
    wait_and_run_next(me);
  }
}

void thread_exit(Fiber* me) {
  Block& b = cur_block();
  Warp& w = b.warps[me->info.warp];
  uint64_t bit = uint64_t(1) << me->info.lane;
  for (int g = 0; g < w.ngroups; ++g) {
    const CollGroup& c = w.groups[g];
    if (c.mask & bit) {
      fail("%s exited while lanes %#llx wait in %s at %s:%d with mask %#llx, which includes the exited lane",
                  thread_name(me).s, static_cast<unsigned long long>(c.arrived), coll_name(c.op, c.sub),
                  site_file(c.file), c.line, static_cast<unsigned long long>(c.mask));
    }
  }
  me->state = FiberState::Exited;
  w.exited |= bit;
  ++b.nexited;
  // Exited threads count as arrived at later barriers (as on hardware).
  if (b.bar_count > 0 && b.bar_count + b.nexited == b.nthreads) release_barrier(me);
  wait_and_run_next(me);
}

// The rendezvous of every warp collective: checks, grouping by mask, and the last lane's work.
void collective(int op, int sub, int width, uint64_t mask, void* payload, const char* file, int line) {
  Fiber* me = t_fiber;
  Block& b = cur_block();
  Warp& w = b.warps[me->info.warp];
  const uint64_t bit = uint64_t(1) << me->info.lane;
  const unsigned long long m = mask;
  if ((mask & bit) == 0) {
    fail("%s calls %s at %s:%d with mask %#llx, which does not include its own lane", thread_name(me).s,
                coll_name(op, sub), site_file(file), line, m);
  }
  if (mask & ~w.exists) {
    fail("%s calls %s at %s:%d with mask %#llx naming lanes that do not exist (warp %u has lanes %#llx)",
                thread_name(me).s, coll_name(op, sub), site_file(file), line, m, me->info.warp,
                static_cast<unsigned long long>(w.exists));
  }
  if (mask & w.exited) {
    fail("%s calls %s at %s:%d with mask %#llx naming exited lane(s) %#llx", thread_name(me).s,
                coll_name(op, sub), site_file(file), line, m, static_cast<unsigned long long>(mask & w.exited));
  }
  // Lanes rendezvous by mask: a pending group with the same mask must be the same collective
  // (op, kind, width). Groups with other masks may overlap: a lane can reach its next
  // collective while its warp-mates still finish a sub-warp one (independent thread
  // scheduling); inconsistent masks that can never complete end as a reported deadlock.
  CollGroup* g = nullptr;
  for (int i = 0; i < w.ngroups; ++i) {
    if (w.groups[i].mask == mask) {
      g = &w.groups[i];
      break;
    }
  }
  if (g != nullptr) {
    if (g->op != op || g->sub != sub || g->width != width) {
      fail("divergent warp collective: %s calls %s (mask %#llx, width %d) at %s:%d while lanes %#llx wait in %s "
                  "(mask %#llx, width %d) at %s:%d",
                  thread_name(me).s, coll_name(op, sub), m, width, site_file(file), line,
                  static_cast<unsigned long long>(g->arrived), coll_name(g->op, g->sub),
                  static_cast<unsigned long long>(g->mask), g->width, site_file(g->file), g->line);
    }
  } else {
    g = &w.groups[w.ngroups++];
    *g = CollGroup{op, sub, width, mask, 0, file, line};
  }
  me->coll_payload = payload;
  me->wait_file = file;
  me->wait_line = line;
  g->arrived |= bit;
  if (g->arrived != mask) {
    me->state = FiberState::AtCollective;
    wait_and_run_next(me);
    return;
  }
  CollGroup done = *g;
  *g = w.groups[--w.ngroups];
  run_collective(b, w, done);
  Fiber* wake[kMaxWarpSize + 1];
  unsigned n = 0;
  for (unsigned l = 0; l < b.warp_size; ++l) {
    if ((mask >> l & 1) && l != me->info.lane) wake[n++] = w.lanes[l];
  }
  release_fibers(me, wake, n);
}

void run_block(Worker* w, const Launch* l, uint64_t lin) {
  Block& b = w->block;
  b.launch = l;
  b.linear = lin;
  b.info.grid_dim = l->grid;
  b.info.block_dim = l->block;
  b.info.block_idx = Dim3u{static_cast<unsigned>(lin % l->grid.x), static_cast<unsigned>(lin / l->grid.x % l->grid.y),
                           static_cast<unsigned>(lin / (uint64_t(l->grid.x) * l->grid.y))};
  b.nthreads = l->block.x * l->block.y * l->block.z;
  b.warp_size = static_cast<unsigned>(l->kernel->warp_size);
  b.nwarps = (b.nthreads + b.warp_size - 1) / b.warp_size;
  b.randomized = l->seed != 0;
  b.rng = Rng{seed_block(l->seed, lin)};
  if (b.queue.size() != kMaxThreadsPerBlock + 1) {
    b.queue.assign(kMaxThreadsPerBlock + 1, nullptr);
    b.bar_waiters.assign(kMaxThreadsPerBlock + 1, nullptr);
    b.warps.resize(kMaxThreadsPerBlock / 32);
  }
  b.qhead = b.qcount = 0;
  b.bar_count = 0;
  b.bar_file = nullptr;
  b.nexited = 0;
  b.failed = false;
  b.error.clear();
  ++w->epoch;

  if (!arena_reset(w->arena, l->shared_limit)) {
    b.failed = true;
    b.error = format("kernel `%s`: cannot map a %zu-byte shared memory arena", l->kernel->name, l->shared_limit);
    return;
  }
  while (w->fibers.size() < b.nthreads) {
    Fiber* f = fiber_create(w->stack_size);
    if (f == nullptr) {
      b.failed = true;
      b.error = format("kernel `%s`: cannot map fiber stacks for %u threads", l->kernel->name, b.nthreads);
      return;
    }
    w->fibers.push_back(f);
  }
  for (unsigned wi = 0; wi < b.nwarps; ++wi) {
    Warp& wp = b.warps[wi];
    unsigned lanes = b.nthreads - wi * b.warp_size;
    if (lanes > b.warp_size) lanes = b.warp_size;
    wp.exists = lanes == 64 ? ~uint64_t(0) : (uint64_t(1) << lanes) - 1;
    wp.exited = 0;
    wp.ngroups = 0;
  }
  const unsigned bx = l->block.x, bxy = l->block.x * l->block.y;
  for (unsigned t = 0; t < b.nthreads; ++t) {
    Fiber* f = w->fibers[t];
    fiber_prepare(f);
    f->info.thread_idx = Dim3u{t % bx, t / bx % l->block.y, t / bxy};
    f->info.linear = t;
    f->info.lane = t % b.warp_size;
    f->info.warp = t / b.warp_size;
    f->info.block = &b.info;
    f->state = FiberState::Ready;
    f->coll_payload = nullptr;
    b.warps[f->info.warp].lanes[f->info.lane] = f;
    b.bar_waiters[t] = f;
  }
  // Start order: ascending, or shuffled in randomised mode.
  if (b.randomized) shuffle(b, b.bar_waiters.data(), b.nthreads);
  for (unsigned t = 0; t < b.nthreads; ++t) queue_push(b, b.bar_waiters[t]);
  // The block's dynamic shared memory comes first in the arena (its size was checked at launch).
  b.dyn_smem = l->dyn_smem > 0 ? arena_alloc(w, l->dyn_smem, 16) : w->arena.base;

  switch_to(nullptr, queue_pop(b));

  if (!b.failed && b.nexited != b.nthreads) {
    b.failed = true;
    b.error = format("kernel `%s` block (%u,%u,%u): ", l->kernel->name, b.info.block_idx.x, b.info.block_idx.y,
                     b.info.block_idx.z) +
              deadlock_report(b);
  }
  if (b.failed) {
    // Fibers stopped mid-kernel cannot be resumed: rebuild them before their next block.
    for (unsigned t = 0; t < b.nthreads; ++t) {
      if (w->fibers[t]->state != FiberState::Exited) w->fibers[t]->needs_reset = true;
    }
  }
}

// ---- the ABI entry points kernels call (simt_abi.h) ----

void trap(const char* what, const char* file, int line) {
  fail("%s at %s:%d in %s", what ? what : "trap", site_file(file), line, thread_name(t_fiber).s);
}

}  // namespace simt
}  // namespace k3
