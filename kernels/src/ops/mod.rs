//! Launchers: one file per op family, each implementing the family's `kernel-api` trait for
//! [`crate::GpuBackend`] over any runtime. `run` re-checks the arguments against the plan (no
//! device data is read), then launches from the plan's metadata only.

mod kda;
mod lse_merge;
mod pending;
mod tensor_ops;
