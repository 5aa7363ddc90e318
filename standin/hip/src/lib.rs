//! # libk3_standin_hip.so: the HIP stand-in
//!
//! The HIP runtime and hipBLASLt functions `backend-rocm` calls (the helpers' shared contract,
//! HIP 5.2 signatures), executing on the emulated device of `k3-standin` with the SIMT
//! emulator at warp 64 and the personality of `K3_STANDIN_ARCH` (`gfx942` = MI300X, default;
//! `gfx950` = MI355X). One library serves both APIs, so hipBLASLt calls share the runtime's
//! memory, streams and captures; `scripts/standin-env.sh rocm ARCH` points `K3_HIP_LIBRARY`
//! and `K3_HIPBLASLT_LIBRARY` at it (the second through a `libk3_standin_hipblaslt.so` link).
//! No hiprtc: the stand-in runs the emulator's kernels, so the embedded code objects suffice.

// The exports are C entry points: their pointer arguments carry the driver APIs' contracts
// (valid for the call), which callers in C cannot be asked to acknowledge with `unsafe`.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod blaslt;
pub mod codes;
pub mod props;
pub mod runtime;
