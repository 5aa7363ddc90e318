//! # k3-backend-rocm: the k3-kernels [`Runtime`](k3_kernels::Runtime) on AMD GPUs
//!
//! HIP, hiprtc and hipBLASLt are opened with libloading at run time: this crate builds and its
//! tests run on machines with no ROCm at all. Every entry point checks for the library and
//! every symbol it will call before calling any, so a missing library, a machine with no
//! device, a runtime too old or one lacking a symbol becomes `Error::Unavailable { why }` naming
//! what was searched and what is missing, never a panic.
//!
//! - [`RocmRuntime`]: memory, copies, modules (HSA code objects), kernel lookup, launches with
//!   `hipModuleLaunchKernel`'s `kernelParams`, explicit streams and timing events
//!   (`RocmRuntime::new(ordinal)` is the device probe; [`device`] says how the arch name is
//!   read on ROCm 5, 6 and 7).
//! - [`RocmRuntime::kernels`]: the kernels of `kernels/csrc/{ops,tests}` for this device: the
//!   clang code object embedded at build time for the device's processor (`K3_HIP_ARCHS`,
//!   default `gfx942,gfx950`; features such as `:sramecc+:xnack-` are not part of the match),
//!   else hiprtc compiles the embedded sources for that processor and caches the code object
//!   in `K3_KERNEL_CACHE_DIR` ([`hiprtc`]).
//! - Dense GEMM through hipBLASLt for the generic GPU backend's `Gemm` ([`blaslt`]), through the
//!   same vendor-GEMM hook as cuBLASLt on CUDA.
//! - [`RocmRuntime::begin_capture`] / `end_capture` / `replay`: HIP graphs ([`graph`]).
//!
//! Environment: `K3_HIP_ARCHS`, `K3_HIP_CLANG`, `K3_ZIG` (build time); `K3_HIP_LIBRARY`,
//! `K3_HIPBLASLT_LIBRARY`, `ROCM_PATH`/`HIP_PATH`, `K3_ROCM_KERNELS=auto|embedded|jit`,
//! `K3_ROCM_GEMM=auto|hipblaslt|kernels`, `K3_KERNEL_CACHE_DIR` at run time.

pub mod arch;
mod backend;
pub mod blaslt;
pub mod device;
mod dylib;
mod env;
pub mod graph;
pub mod hip;
pub mod hiprtc;
pub mod kernels;
mod runtime;
pub mod sys;

pub use backend::{rocm_backend, RocmBackend};
pub use blaslt::GemmRoute;
pub use graph::RocmGraph;
pub use kernels::KernelSet;
pub use runtime::{KernelOrigin, KernelSource, RocmBuffer, RocmEvent, RocmKernel, RocmModule, RocmRuntime, RocmStream};

/// Whether a HIP runtime library can be opened here (no device needed, never panics).
pub fn runtime_present() -> bool {
    hip::library_present()
}
