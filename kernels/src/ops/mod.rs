//! Launchers: one file per op family, each implementing the family's `kernel-api` trait for
//! [`crate::GpuBackend`] over any runtime. `run` re-checks the arguments against the plan (no
//! device data is read), then launches from the plan's metadata only.

mod lse_merge;
mod mla_cache_write;
mod mla_decode;
mod mla_format;
mod mla_prefill;
mod pending;
mod tensor_ops;
