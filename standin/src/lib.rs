//! # k3-standin: an emulated GPU behind CUDA- and HIP-shaped C libraries
//!
//! The device model shared by the stand-in libraries (`standin/cuda`: libcuda + cuBLASLt,
//! `standin/hip`: libamdhip64 + hipBLASLt), which let `k3-backend-cuda` and `k3-backend-rocm`
//! run their whole host path on a machine without a GPU: launches run the SIMT emulator's build
//! of the same kernels (warp 32 for CUDA, 64 for HIP). See README.md.
//!
//! - [`personality`]: which GPU it claims to be (`K3_STANDIN_ARCH`), with its limits;
//! - [`memory`]: device memory as never-reused host pages, with the allocation table every
//!   copy, launch parameter and free is checked against;
//! - [`image`]: cubins, PTX and AMD code objects: target, kernel names, registers, parameters;
//! - [`device`]: the process's device, modules and functions;
//! - [`graph`]: work items, launches with copied parameters, their execution;
//! - [`stream`]: streams, events, capture and graph replay;
//! - [`gemm`]: the BLAS-Lt descriptors and the matmul on the CPU reference GEMM;
//! - [`error`]: vendor-neutral errors, logged once, kept for the error-string calls.

pub mod device;
pub mod error;
pub mod gemm;
pub mod gemm_abi;
pub mod graph;
pub mod handles;
pub mod image;
pub mod memory;
pub mod personality;
pub mod stream;

pub use device::{device, Device};
pub use error::{Error, Kind, Result};
pub use personality::{Personality, Vendor};
pub use stream::{CaptureMode, StreamRef};
