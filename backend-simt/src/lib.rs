//! # k3-backend-simt: the GPU kernel sources, run on the CPU
//!
//! A [`k3_kernels::Runtime`] that executes the kernels of `kernels/csrc` (compiled for the host
//! with `K3_SIMT`, once at warp 32 and once at warp 64) under an emulated SIMT machine: each
//! thread of a block is a fiber, blocks are spread over a persistent worker pool, warp
//! collectives and the MMA fragments are emulated by rendezvous, shared memory comes from a
//! poisoned per-block arena, and the runtime checks what GPUs leave undefined (barrier
//! divergence, divergent collectives, exited lanes in masks, deadlocks, shared-memory limits),
//! returning them as errors. Seeded schedules (`K3_SIMT_SEED`) expose missing barriers, and a
//! `K3_SIMT_ASAN=1` build runs everything under AddressSanitizer. See README.md.
//!
//! - [`SimtRuntime`]: the `Runtime` (`SimtRuntime::new(32)` or `(64)`);
//! - [`SimtBackend`]: `kernel_api::Backend` over it (`simt32`, `simt64`);
//! - [`kernels`], [`asan_enabled`], [`context_backend`], [`worker_count`], [`mma_layout`]:
//!   introspection for tests and reports.

mod backend;
mod ffi;
mod runtime;

pub use backend::{simt_backend, simt_backend_from, SimtBackend};
pub use runtime::{
    asan_enabled, context_backend, kernels, mma_layout, worker_count, KernelInfo, MmaOperand, MmaShape, ParamKind, SimtBuffer,
    SimtEvent, SimtKernel, SimtModule, SimtRuntime, SimtStream, MAX_SHARED_LIMIT,
};
