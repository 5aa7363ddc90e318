//! # k3-kernels: the GPU kernels and the runtime contract they are launched through
//!
//! - `csrc/` holds every GPU kernel, written once in the dialect of `csrc/k3/compat.h`, which
//!   compiles three ways: CUDA (nvcc / NVRTC), HIP (clang `-x hip`) and host C++ for the SIMT
//!   emulator (`K3_SIMT`, with `K3_WARP_SIZE` 32 or 64). `csrc/tests/` are the dialect's own
//!   test kernels.
//! - [`runtime`]: the [`Runtime`] trait every GPU-ish backend implements (memory, copies,
//!   modules, launches by kernel name with cuLaunchKernel-style parameters, streams, events,
//!   and an optional vendor-BLAS hook for the dense GEMM: cuBLASLt on CUDA, hipBLASLt on ROCm;
//!   [`vendor_gemm`] holds what both hooks share). Op launchers are
//!   written once against it and shared by CUDA, ROCm and SIMT.
//! - [`device_checks`]: checked launches. Kernels bound-check the index data they read from
//!   device memory and record the first violation per stream; the backend reports it as a typed
//!   error at the next synchronising call (`K3_DEVICE_CHECKS=off` opts out).
//! - [`recording`]: a [`Runtime`] that runs nothing and records every launch, for reading the
//!   launch configurations of any op at any shape without a GPU.
//!
//! - [`csrc`]: the sources embedded as text, the kernel sets a backend loads as one module, and
//!   the kernel names each file registers.
//! - [`jit_cache`]: the on-disk cache of kernels compiled at run time (NVRTC, hiprtc).
//!
//! This crate depends on no toolkit: backends compile or load the sources themselves.

pub mod csrc;
pub mod device_checks;
pub mod gpu_backend;
pub mod jit_cache;
mod ops;
pub mod recording;
pub mod runtime;
pub mod vendor_gemm;

pub use device_checks::{DeviceChecks, DeviceViolation};
pub use gpu_backend::{dtype_code, GpuBackend};
pub use recording::{RecordedLaunch, RecordingRuntime};
pub use runtime::{
    check_range, DevicePtr, Dim3, ImageFormat, KernelArg, KernelArgs, LaunchConfig, MatrixOperand, ModuleImage, Runtime,
    VendorGemmArgs,
};

/// Absolute path of the kernel sources (`csrc/`), for backends' build scripts and JIT paths.
pub const CSRC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/csrc");
