//! # libk3_standin_cuda.so: the CUDA driver stand-in (soname `libcuda.so`)
//!
//! The driver entry points cudarc and `k3-backend-cuda` call, executing on the emulated device
//! of `k3-standin` with the SIMT emulator at warp 32 and the personality of `K3_STANDIN_ARCH`
//! (`sm_90a` = H200, default; `sm_100a` = B200; `sm_103a` = B300), plus the cuBLASLt
//! implementation the cuBLASLt stand-in (`standin/cublaslt`) forwards to. Selected only by
//! `K3_CUDA_DRIVER_LIBRARY` (backend-cuda opens that path first; cudarc then finds this
//! library by its soname); see `scripts/standin-env.sh` and the crate README.

// The exports are C entry points: their pointer arguments carry the driver APIs' contracts
// (valid for the call), which callers in C cannot be asked to acknowledge with `unsafe`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod blaslt;
pub mod codes;
pub mod driver;
