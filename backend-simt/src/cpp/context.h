// Execution contexts for fibers behind one two-function interface:
//   context_init(ctx, stack_lo, stack_size, entry, arg)  a fresh context that calls entry(arg)
//   context_switch(from, to)                              save into from, resume to
// Default: a hand-written x86-64 switch (context_x86_64.S: saves rbp, rbx, r12-r15, MXCSR and
// the x87 control word, swaps rsp; ~10 ns). Fallback: glibc ucontext (K3_SIMT_UCONTEXT, and on
// every other architecture; ~20x slower because swapcontext makes a sigprocmask syscall).
#ifndef K3_SIMT_CONTEXT_H
#define K3_SIMT_CONTEXT_H

#include <stddef.h>

#if !defined(K3_SIMT_UCONTEXT) && !defined(__x86_64__)
#define K3_SIMT_UCONTEXT 1
#endif

#if defined(K3_SIMT_UCONTEXT)
#include <ucontext.h>
#endif

namespace k3 {
namespace simt {

struct Context {
#if defined(K3_SIMT_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
};

typedef void (*ContextEntry)(void* arg);

// entry must never return.
void context_init(Context* c, char* stack_lo, size_t stack_size, ContextEntry entry, void* arg);
void context_switch(Context* from, Context* to);
const char* context_backend();

}  // namespace simt
}  // namespace k3

#endif  // K3_SIMT_CONTEXT_H
