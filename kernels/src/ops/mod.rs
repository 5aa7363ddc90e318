//! Launchers: one file per op family, each implementing the family's `kernel-api` trait for
//! [`crate::GpuBackend`] over any runtime. `run` re-checks the arguments against the plan (no
//! device data is read), then launches from the plan's metadata only.

mod causal_conv1d;
mod dense_elementwise;
mod dense_gemm;
mod dense_norm;
mod kda;
mod kda_decode;
mod lse_merge;
mod mla_cache_write;
mod mla_decode;
mod mla_format;
mod mla_prefill;
mod moe_align;
mod moe_gemm;
mod moe_router;
mod tensor_ops;
