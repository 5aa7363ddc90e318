// Fiber contexts: the x86-64 assembly switch, or the ucontext fallback (see context.h).
#include "context.h"

#include <stdint.h>
#include <string.h>

namespace k3 {
namespace simt {

#if defined(K3_SIMT_UCONTEXT)

namespace {
// makecontext passes int arguments only: each pointer travels as two 32-bit halves.
void ucontext_start(unsigned entry_hi, unsigned entry_lo, unsigned arg_hi, unsigned arg_lo) {
  uintptr_t e = (static_cast<uintptr_t>(entry_hi) << 32) | entry_lo;
  uintptr_t a = (static_cast<uintptr_t>(arg_hi) << 32) | arg_lo;
  reinterpret_cast<ContextEntry>(e)(reinterpret_cast<void*>(a));
  __builtin_trap();
}
}  // namespace

void context_init(Context* c, char* stack_lo, size_t stack_size, ContextEntry entry, void* arg) {
  memset(&c->uc, 0, sizeof(c->uc));
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack_lo;
  c->uc.uc_stack.ss_size = stack_size;
  c->uc.uc_link = nullptr;
  uintptr_t e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(ucontext_start), 4, static_cast<unsigned>(e >> 32),
              static_cast<unsigned>(e), static_cast<unsigned>(a >> 32), static_cast<unsigned>(a));
}

void context_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }

const char* context_backend() { return "ucontext"; }

#else

extern "C" void k3_simt_switch(void** save_sp, void* new_sp);
extern "C" void k3_simt_trampoline();

void context_init(Context* c, char* stack_lo, size_t stack_size, ContextEntry entry, void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + stack_size) & ~uintptr_t(15);
  // After the switch's `ret` pops the trampoline address, rsp = top - 16: 16-byte aligned, so
  // the trampoline's `call` enters `entry` with the ABI's alignment.
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 16);
  *--sp = reinterpret_cast<uint64_t>(&k3_simt_trampoline);  // return address
  *--sp = 0;                                                // rbp
  *--sp = 0;                                                // rbx
  *--sp = reinterpret_cast<uint64_t>(entry);                // r12
  *--sp = reinterpret_cast<uint64_t>(arg);                  // r13
  *--sp = 0;                                                // r14
  *--sp = 0;                                                // r15
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fpucw) << 32);
  c->sp = sp;
}

void context_switch(Context* from, Context* to) { k3_simt_switch(&from->sp, to->sp); }

const char* context_backend() { return "x86_64-asm"; }

#endif

}  // namespace simt
}  // namespace k3
