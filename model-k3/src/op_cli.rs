//! `k3 op`: runs ONE kernel-api op on tensors read from a safetensors file and writes its
//! outputs to a safetensors file, a minimal reproduction package to compare with any Python
//! reference. The command's full description (keys and defaults per op) is in
//! `model-k3/README.md`; the rules:
//!
//! - **Inputs** are named exactly as the op's `Args` fields (`q`, `kv_cache`, `block_table`, ...).
//!   safetensors dtypes map to kernel dtypes: BF16, F16, F32, U8, I32, I64, F8_E4M3 (e4m3fn),
//!   F8_E5M2, F8_E4M3FNUZ, F8_E8M0 and F4 (two codes per byte: the last dim is halved to give
//!   packed `f4e2m1x2`). A format the writer cannot express (e4m3fnuz from an older
//!   safetensors, e8m0, packed fp4) is stored as U8 and named in the params:
//!   `"dtypes": {"kv": "f8e4m3fnuz"}` reinterprets those bytes (same element size only).
//!   Optional args are optional; a tensor the op does not take is an error naming it.
//! - **In-place** tensors (state pools, caches, accumulators) are read from the inputs file and
//!   written back to the outputs file under the same name and safetensors dtype. **Pure outputs**
//!   are allocated zero-filled with the shapes the op requires; where their dtype is a choice it
//!   comes from `"out_dtypes": {"out": "f32"}`, by default the dtype of the op's main input.
//!   Optional outputs (`lse`) are always produced. An allocation above max(1 GiB, 16 x the input
//!   bytes) is refused (a mistyped dimension must be an error, not an out-of-memory abort).
//! - **Params** JSON: the op's `Params` struct fields by name (nested structs as objects, enums as
//!   strings or one-key objects); dimensions default to the tensors' shapes. Host batch metadata
//!   (`cu_seqlens`, `seq_lens`, `block_table`, `slot_mapping`, `state_indices`,
//!   `checkpoint_offsets`, `ids`) defaults to the values of the same-named input tensor; an
//!   integer array under that key in the params overrides it (to reproduce a host/device mismatch).
//!   A key the op does not read is an error naming it.
//! - Every failure is an [`OpError`] naming the op and the tensor, key or field; nothing panics.
//!
//! Outputs carry metadata: `k3.op` and `k3.dtype.<name>` (the kernel dtype of each tensor, which
//! tells e4m3fnuz bytes stored as U8 apart).

mod call;
mod dense;
mod json;
mod kda;
mod mla;
mod moe;
pub mod tensors;

pub use call::Outputs;
pub use tensors::{read_safetensors, write_safetensors, StoredTensor};

use crate::files::{check_replaceable, read_text_capped};
use crate::limits::PARAMS_FILE_MAX;
use kernel_api::conformance::{AllOps, ALL_OPS, COMPOSITIONS};
use kernel_api::HostTensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every op `k3 op` runs: the conformance registry's ops, compositions left out.
pub fn op_names() -> Vec<&'static str> {
    ALL_OPS.iter().copied().filter(|o| !COMPOSITIONS.contains(o)).collect()
}

/// Why `k3 op` failed. Each variant names what was wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    #[error("unknown op `{op}` (known ops: {})", op_names().join(", "))]
    UnknownOp { op: String },
    /// A file cannot be read or written, or is not valid safetensors / JSON.
    #[error("{}: {why}", path.display())]
    File { path: PathBuf, why: String },
    /// An input tensor is missing, unknown, or unusable before the op sees it.
    #[error("op `{op}`: tensor `{name}`: {why}")]
    Tensor { op: String, name: String, why: String },
    /// A params key is missing, mistyped or unknown (dotted path, e.g. `cache.dims.latent`).
    #[error("op `{op}`: params key `{key}`: {why}")]
    Param { op: String, key: String, why: String },
    /// The op rejected the request (plan or argument check) or failed to run.
    #[error("op `{op}`: {source}")]
    Kernel {
        op: String,
        #[source]
        source: kernel_api::Error,
    },
}

impl OpError {
    pub(crate) fn file(path: &Path, why: impl Into<String>) -> Self {
        OpError::File { path: path.to_path_buf(), why: why.into() }
    }
    pub(crate) fn tensor(op: &str, name: &str, why: impl Into<String>) -> Self {
        OpError::Tensor { op: op.to_string(), name: name.to_string(), why: why.into() }
    }
    pub(crate) fn param(op: &str, key: impl Into<String>, why: impl Into<String>) -> Self {
        OpError::Param { op: op.to_string(), key: key.into(), why: why.into() }
    }

    /// What the error is about: the op, backend, tensor, params key or kernel field name.
    pub fn subject(&self) -> Option<&str> {
        match self {
            OpError::UnknownOp { op } => Some(op),
            OpError::File { .. } => None,
            OpError::Tensor { name, .. } => Some(name),
            OpError::Param { key, .. } => Some(key),
            OpError::Kernel { source: kernel_api::Error::InvalidInput { field, .. }, .. } => Some(field),
            OpError::Kernel { source: kernel_api::Error::Unsupported { reasons }, .. } => reasons.first().map(|r| r.subject.as_str()),
            OpError::Kernel { .. } => None,
        }
    }
}

/// The registry spelling of `op`, or [`OpError::UnknownOp`].
pub fn op_name(op: &str) -> Result<&'static str, OpError> {
    op_names().into_iter().find(|n| *n == op).ok_or_else(|| OpError::UnknownOp { op: op.to_string() })
}

/// Runs `op` on `backend` with host `inputs` and a parsed params JSON; returns the outputs
/// (pure ones, then in-place ones) by name.
pub fn run_op<B: AllOps>(backend: &B, op: &str, inputs: &BTreeMap<String, HostTensor>, params: &serde_json::Value) -> Result<Outputs, OpError> {
    let op = op_name(op)?;
    let c = call::Call::new(op, backend, inputs, json::Params::root(op, params)?)?;
    match op {
        "gemm" => dense::gemm(&c),
        "rms_norm" => dense::rms_norm(&c),
        "gated_rms_norm" => dense::gated_rms_norm(&c),
        "l2_norm" => dense::l2_norm(&c),
        "attn_res_mix" => dense::attn_res_mix(&c),
        "situ_glu" => dense::situ_glu(&c),
        "sigmoid_gate" => dense::sigmoid_gate(&c),
        "embedding_gather" => dense::embedding_gather(&c),
        "copy_cast" => dense::copy_cast(&c),
        "add_assign" => dense::add_assign(&c),
        "lse_merge" => dense::lse_merge(&c),
        "mla_prefill" => mla::mla_prefill(&c),
        "mla_cache_write" => mla::mla_cache_write(&c),
        "mla_decode" => mla::mla_decode(&c),
        "mla_prefill_absorbed" => mla::mla_prefill_absorbed(&c),
        "kda_gate" => kda::kda_gate(&c),
        "kda_prefill" => kda::kda_prefill(&c),
        "kda_decode" => kda::kda_decode(&c),
        "causal_conv1d" => kda::causal_conv1d(&c),
        "moe_router" => moe::moe_router(&c),
        "moe_align" => moe::moe_align(&c),
        "moe_grouped_gemm" => moe::moe_grouped_gemm(&c),
        "moe_combine" => moe::moe_combine(&c),
        _ => Err(OpError::UnknownOp { op: op.to_string() }),
    }
}

/// Reads a params file (`None`: no params, `{}`).
pub fn read_params(path: Option<&Path>) -> Result<serde_json::Value, OpError> {
    let Some(path) = path else { return Ok(serde_json::Value::Object(Default::default())) };
    let text = read_text_capped(path, PARAMS_FILE_MAX, "model_k3::limits::PARAMS_FILE_MAX").map_err(|e| OpError::file(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| OpError::file(path, format!("invalid JSON: {e}")))
}

/// `k3 op`: reads the inputs and params files, runs the op and writes the outputs file.
/// Returns the outputs written.
pub fn run_op_files<B: AllOps>(backend: &B, op: &str, inputs: &Path, params: Option<&Path>, outputs: &Path) -> Result<Outputs, OpError> {
    let op = op_name(op)?;
    check_replaceable(outputs).map_err(|e| OpError::file(outputs, e.to_string()))?;
    let params = read_params(params)?;
    let stored = read_safetensors(inputs)?;
    let host: BTreeMap<String, HostTensor> = stored.iter().map(|(k, v)| (k.clone(), v.tensor.clone())).collect();
    let outs = run_op(backend, op, &host, &params)?;
    // In-place tensors go back with the safetensors dtype they came with.
    let to_write: Vec<_> = outs.iter().map(|(name, t)| (name.clone(), t.clone(), stored.get(name).map(|s| s.stored_as))).collect();
    write_safetensors(outputs, op, &to_write)?;
    Ok(outs)
}
