// The kernel registry, the persistent worker pool, launches and the C API used from Rust.
//
// Launches are serialised by one mutex (cargo test runs tests on parallel threads); a launch
// hands its blocks to the workers through an atomic counter and returns when all are done.
// The pool is a function-local static: its destructor (at process exit) stops and joins the
// workers and frees their fibers and arenas, so LeakSanitizer sees no runtime bookkeeping.
#include <stdlib.h>
#include <string.h>

#include <condition_variable>
#include <thread>

#include "asan.h"
#include "runtime.h"

namespace k3 {
namespace simt {

namespace {

std::vector<KernelEntry>& registry() {
  static std::vector<KernelEntry> r;
  return r;
}

long env_long(const char* name, long dflt, long lo, long hi) {
  const char* v = getenv(name);
  if (v == nullptr || *v == 0) return dflt;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (end == v || *end != 0 || x < lo || x > hi) return dflt;
  return x;
}

class Pool {
 public:
  Pool() {
    nworkers_ = static_cast<int>(env_long("K3_SIMT_WORKERS", 2, 1, 64));
    long min_kb = kAsan ? 32 : 16;
    stack_size_ = static_cast<size_t>(env_long("K3_SIMT_STACK_KB", 64, min_kb, 8192)) * 1024;
    for (int i = 0; i < nworkers_; ++i) threads_.emplace_back([this] { worker_main(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return nworkers_; }

  void run(Launch* l) {
    std::unique_lock<std::mutex> lk(mu_);
    cur_ = l;
    running_ = nworkers_;
    ++gen_;
    cv_.notify_all();
    done_cv_.wait(lk, [this] { return running_ == 0; });
    cur_ = nullptr;
  }

 private:
  void worker_main() {
    Worker w;
    t_worker = &w;
    w.stack_size = stack_size_;
    worker_init_stack_bounds(&w);
    uint64_t seen = 0;
    for (;;) {
      Launch* l;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
        if (stop_) break;
        seen = gen_;
        l = cur_;
      }
      while (!l->failed.load(std::memory_order_relaxed)) {
        uint64_t blk = l->next_block.fetch_add(1, std::memory_order_relaxed);
        if (blk >= l->nblocks) break;
        run_block(&w, l, blk);
        if (w.block.failed) {
          std::lock_guard<std::mutex> lk(l->err_mu);
          if (blk < l->err_block) {
            l->err_block = blk;
            l->error = w.block.error;
          }
          l->failed.store(true, std::memory_order_relaxed);
        }
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--running_ == 0) done_cv_.notify_all();
      }
    }
    for (Fiber* f : w.fibers) fiber_destroy(f);
    w.fibers.clear();
    arena_release(w.arena);
    t_worker = nullptr;
  }

  int nworkers_ = 2;
  size_t stack_size_ = 64 * 1024;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t gen_ = 0;
  int running_ = 0;
  bool stop_ = false;
  Launch* cur_ = nullptr;
  std::vector<std::thread> threads_;
};

Pool& pool() {
  static Pool p;
  return p;
}

std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

void write_err(char* err, size_t err_len, const std::string& msg) {
  if (err == nullptr || err_len == 0) return;
  size_t n = msg.size() < err_len - 1 ? msg.size() : err_len - 1;
  memcpy(err, msg.data(), n);
  err[n] = 0;
}

}  // namespace

Registrar::Registrar(const char* name, int warp_size, Thunk thunk, int nparams, const ParamDesc* params,
                     const char* file) {
  registry().push_back(KernelEntry{name, warp_size, thunk, nparams, params, file});
}

}  // namespace simt
}  // namespace k3

using k3::simt::KernelEntry;

extern "C" {

// Status codes of the C API.
enum { SIMT_OK = 0, SIMT_INVALID = 1, SIMT_KERNEL_ERROR = 2, SIMT_NOT_FOUND = 3, SIMT_DUPLICATE = 4 };

// Looks a kernel up by exported name and warp size.
int simt_get_function(const char* name, int warp_size, const void** out) {
  const KernelEntry* found = nullptr;
  for (const KernelEntry& e : k3::simt::registry()) {
    if (e.warp_size == warp_size && strcmp(e.name, name) == 0) {
      if (found != nullptr) return SIMT_DUPLICATE;
      found = &e;
    }
  }
  if (found == nullptr) return SIMT_NOT_FOUND;
  *out = found;
  return SIMT_OK;
}

size_t simt_kernel_count() { return k3::simt::registry().size(); }

int simt_kernel_info(size_t i, const char** name, int* warp_size, int* nparams, const char** file) {
  auto& r = k3::simt::registry();
  if (i >= r.size()) return SIMT_NOT_FOUND;
  *name = r[i].name;
  *warp_size = r[i].warp_size;
  *nparams = r[i].nparams;
  *file = r[i].file;
  return SIMT_OK;
}

// The parameter descriptions of a kernel handle (see ParamDesc in k3/simt_abi.h).
int simt_kernel_params(const void* f, const uint8_t** descs, int* nparams) {
  const KernelEntry* k = static_cast<const KernelEntry*>(f);
  if (k == nullptr) return SIMT_INVALID;
  *descs = k->params;
  *nparams = k->nparams;
  return SIMT_OK;
}

// Runs a kernel to completion. On SIMT_INVALID, err holds "<field>\n<why>"; on
// SIMT_KERNEL_ERROR, the runtime check that stopped the first failing block.
int simt_launch_kernel(const void* f, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                       void** params, size_t nparams, uint64_t seed, uint64_t shared_limit, char* err,
                       size_t err_len) {
  using k3::simt::format;
  const KernelEntry* k = static_cast<const KernelEntry*>(f);
  if (k == nullptr) {
    k3::simt::write_err(err, err_len, "kernel\nnull kernel handle");
    return SIMT_INVALID;
  }
  uint64_t threads = uint64_t(block[0]) * block[1] * block[2];
  if (block[0] == 0 || block[1] == 0 || block[2] == 0 || threads > k3::simt::kMaxThreadsPerBlock || block[2] > 64) {
    k3::simt::write_err(err, err_len,
              format("launch.block\n(%u,%u,%u) is not a block of 1..%u threads with z <= 64", block[0], block[1],
                     block[2], k3::simt::kMaxThreadsPerBlock));
    return SIMT_INVALID;
  }
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[0] > 0x7fffffffu || grid[1] > 65535 || grid[2] > 65535) {
    k3::simt::write_err(err, err_len,
              format("launch.grid\n(%u,%u,%u) is outside 1..2^31-1 x 1..65535 x 1..65535", grid[0], grid[1], grid[2]));
    return SIMT_INVALID;
  }
  if (shared_limit > k3::simt::kMaxSharedLimit) {
    k3::simt::write_err(err, err_len,
              format("shared_limit\n%llu bytes is above the emulator's maximum of %zu",
                     static_cast<unsigned long long>(shared_limit), k3::simt::kMaxSharedLimit));
    return SIMT_INVALID;
  }
  if (shared_bytes > shared_limit) {
    k3::simt::write_err(err, err_len,
              format("launch.shared_bytes\n%u bytes of dynamic shared memory exceed the %llu-byte limit", shared_bytes,
                     static_cast<unsigned long long>(shared_limit)));
    return SIMT_INVALID;
  }
  if (nparams != static_cast<size_t>(k->nparams)) {
    k3::simt::write_err(err, err_len,
              format("params\nkernel `%s` takes %d parameters, %zu given", k->name, k->nparams, nparams));
    return SIMT_INVALID;
  }
  std::lock_guard<std::mutex> lk(k3::simt::launch_mutex());
  k3::simt::Launch l;
  l.kernel = k;
  l.params = params;
  l.grid = k3::simt::Dim3u{grid[0], grid[1], grid[2]};
  l.block = k3::simt::Dim3u{block[0], block[1], block[2]};
  l.dyn_smem = shared_bytes;
  l.shared_limit = shared_limit;
  l.seed = seed;
  l.nblocks = uint64_t(grid[0]) * grid[1] * grid[2];
  k3::simt::pool().run(&l);
  if (l.failed.load()) {
    k3::simt::write_err(err, err_len, l.error);
    return SIMT_KERNEL_ERROR;
  }
  return SIMT_OK;
}

// (row, col) of lane/slot in operand 0 = A, 1 = B, 2 = C/D of an MMA shape, read from the
// emulator's own lookup tables. Returns 0 on success.
int simt_mma_layout(int shape, int operand, int lane, int slot, int* row, int* col) {
  return k3::simt::mma_layout(shape, operand, lane, slot, row, col) ? SIMT_OK : SIMT_NOT_FOUND;
}

int simt_asan_enabled() { return k3::simt::kAsan ? 1 : 0; }

const char* simt_context_backend() { return k3::simt::context_backend(); }

int simt_worker_count() { return k3::simt::pool().workers(); }

}  // extern "C"
