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

pub mod kv_cache;
pub mod lse_merge;
pub mod moe_align;
pub mod moe_gemm;
pub mod moe_router;

pub use kv_cache::{KvCacheFormat, KvDims, Fp8Flavor};
pub use lse_merge::{LseMerge, LseMergeArgs, LseMergeParams, LseMergePlan};
pub use moe_align::{MoeAlign, MoeAlignArgs, MoeAlignParams, MoeAlignPlan, MoeRouting};
pub use moe_gemm::{
    MoeActivationQuant, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeCombinePlan, MoeGemmArgs, MoeGemmParams, MoeGemmPlan,
    MoeGemmStage, MoeGroupedGemm, MoeWeightFormat,
};
pub use moe_router::{MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};

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
