//! # k3-backend-cuda: the k3-kernels [`Runtime`](k3_kernels::Runtime) on NVIDIA GPUs
//!
//! Built on cudarc with `dynamic-loading`: this crate compiles and its tests run on machines
//! with no CUDA at all. Every entry point checks for the driver, NVRTC and cuBLASLt libraries
//! and the symbols it needs before cudarc touches them, so a missing library, a machine with no
//! device or a driver too old becomes `Error::Unavailable { why }` naming what is missing, never
//! a panic.
//!
//! - [`CudaRuntime`]: memory, copies, modules (PTX/cubin/fatbin), kernel lookup, launches with
//!   cuLaunchKernel parameter arrays, explicit streams and timing events
//!   (`CudaRuntime::new(ordinal)` is the device probe).
//! - [`CudaRuntime::kernels`]: the kernels of `kernels/csrc/{ops,tests}` for this device: the
//!   nvcc cubin embedded at build time for the device's arch (`K3_CUDA_ARCHS`,
//!   default `90a,100a,103a`), else NVRTC compiles the embedded sources for the device's own
//!   `sm_XYa` and caches the cubin in `K3_KERNEL_CACHE_DIR` ([`nvrtc`]).
//! - [`CudaRuntime::gemm_blaslt`]: dense GEMM through cuBLASLt for the generic GPU backend's
//!   `Gemm` ([`blaslt`]).
//!
//! Environment: `K3_CUDA_ARCHS`, `CUDA_HOME`/`CUDA_PATH`/`NVCC` (build time);
//! `K3_CUDA_KERNELS=auto|embedded|jit`, `K3_KERNEL_CACHE_DIR` (`off` disables), `CUDA_HOME`
//! (where NVRTC and cuBLASLt are looked for besides the loader's path) at run time.

mod backend;
pub mod blaslt;
mod driver;
mod dylib;
mod env;
mod graph;
pub mod kernels;
pub mod nvrtc;
mod runtime;

pub use backend::{cuda_backend, CudaBackend};
pub use blaslt::{BlasLtArgs, BlasLtGemm, GemmRoute, Operand, BLASLT_WORKSPACE_BYTES};
pub use graph::CudaGraph;
pub use kernels::{Arch, KernelSet};
pub use runtime::{CudaBuffer, CudaEvent, CudaKernel, CudaModule, CudaRuntime, CudaStream, KernelOrigin, KernelSource};

/// Whether the CUDA driver library can be loaded here (no device needed, never panics).
pub fn driver_present() -> bool {
    driver::driver_lib().is_ok()
}
