// x86-64 System V fiber switch for the SIMT runtime (see context.h).
//
// void k3_simt_switch(void** save_sp, void* new_sp)
//   pushes the callee-saved registers, MXCSR and the x87 control word on the current stack,
//   stores rsp into *save_sp, loads new_sp and pops the same frame from there.
// A fresh fiber's frame (built by context_init) "returns" into k3_simt_trampoline with
// r12 = entry and r13 = arg.
#if defined(__x86_64__) && !defined(K3_SIMT_UCONTEXT)
        .text
        .globl  k3_simt_switch
        .type   k3_simt_switch, @function
        .p2align 4
k3_simt_switch:
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   k3_simt_switch, .-k3_simt_switch

        .globl  k3_simt_trampoline
        .type   k3_simt_trampoline, @function
        .p2align 4
k3_simt_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        movq    %r13, %rdi
        callq   *%r12
        ud2
        .cfi_endproc
        .size   k3_simt_trampoline, .-k3_simt_trampoline
#endif
        .section .note.GNU-stack,"",@progbits
