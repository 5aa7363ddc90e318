//! Op families of the contract. Each family has: a params struct (shape and mode, host-side),
//! an args struct (tensor arguments), a plan (validated params plus derived launch metadata),
//! and a trait with `supports`, `plan`, `workspace_size` and `run`.
//!
//! Rules every family follows:
//! - `plan` does all validation and returns `InvalidInput{field, why}` or `Unsupported{reasons}`;
//! - `run` re-checks that its arguments match the plan (cheap, no data reads on GPUs), never
//!   allocates, never synchronises and never copies metadata host -> device, so a sequence of
//!   `run` calls can be captured into a CUDA/HIP graph;
//! - workspaces are caller-owned buffers of at least `workspace_size(&plan)` bytes.

pub mod attn_res;
pub mod elementwise;
pub mod gemm;
pub mod kv_cache;
pub mod lse_merge;
pub mod norm;

pub use kv_cache::{KvCacheFormat, KvDims, Fp8Flavor};
pub use lse_merge::{LseMerge, LseMergeArgs, LseMergeParams, LseMergePlan};
pub use attn_res::{attn_res_score_vector, AttnResMix, AttnResMixArgs, AttnResMixParams, AttnResMixPlan};
pub use elementwise::{
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, EmbeddingGatherPlan, SigmoidGate, SigmoidGateArgs,
    SigmoidGateParams, SigmoidGatePlan, SituGlu, SituGluArgs, SituGluInput, SituGluParams, SituGluPlan,
};
pub use gemm::{Gemm, GemmArgs, GemmParams, GemmPlan};
pub use norm::{
    GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, GatedRmsNormPlan, L2Norm, L2NormArgs, L2NormParams, L2NormPlan,
    RmsNorm, RmsNormArgs, RmsNormParams, RmsNormPlan, RmsWeightOrder,
};

use crate::backend::Backend;
use crate::error::{Error, Result};

/// Checks a caller-provided workspace against the plan's requirement.
pub fn check_workspace<B: Backend + ?Sized>(backend: &B, ws: Option<&B::Buffer>, need: usize) -> Result<()> {
    let have = ws.map(|b| backend.buffer_len(b)).unwrap_or(0);
    if have < need {
        return Err(Error::invalid("workspace", format!("{have} bytes given, plan needs {need}")));
    }
    Ok(())
}
