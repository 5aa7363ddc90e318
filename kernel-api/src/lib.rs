//! # kernel-api: the k3-kernels contract
//!
//! - [`formats`]: bf16/f16, fp8 flavours (`F8E4M3Fn`, `F8E4M3Fnuz`, `F8E5M2`), `E8M0`, packed
//!   `F4E2M1x2`, MXFP4/MXFP8 blocks, with explicit saturation and scale rounding.
//! - [`backend`]: the [`Backend`] trait (memory, streams, device description).
//! - [`ops`]: one trait per op family, FlashInfer-style `plan` / `workspace_size` / `run`.
//! - [`cpu`]: the CPU reference backend, the executable spec of every op.
//! - [`cost`], [`hardware`]: the speed-of-light model (bytes and FLOPs per op, GPU peaks, floors).
//! - [`tolerance`]: the comparison metric and per-dtype thresholds, with their reasons.
//! - [`conformance`]: the suite every backend instantiates with [`conformance_suite!`].

pub mod backend;
pub mod compose;
pub mod conformance;
pub mod cost;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod formats;
pub mod hardware;
pub mod ops;
pub mod tensor;
pub mod tolerance;

pub use backend::{Backend, BackendExt, BackendKind, DeviceInfo, DeviceTensor, Fp8Native};
pub use dtype::DType;
pub use error::{Error, Reason, Result};
pub use tensor::{Dim, HostTensor, Layout, TensorMut, TensorRef};
pub use tolerance::Tolerance;
