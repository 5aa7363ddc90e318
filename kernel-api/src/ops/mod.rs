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
//!
//! # Device metadata
//!
//! Index tensors given to `run` (block tables, slot mappings, sequence lengths, cu_seqlens,
//! state indices, checkpoint offsets, top-k ids, expert maps, the align outputs, embedding ids)
//! must hold the values the plan validated on the host. `run` never reads device memory on a
//! GPU, so a difference is found where the data is used:
//! - the CPU reference reads every such tensor in `run` and returns
//!   [`Error::InvalidInput`] naming it for any value it cannot accept (for most: any value that
//!   differs from the plan's);
//! - GPU kernels check every index they read against the bounds the plan fixed, skip the work a
//!   bad one would address (never touching memory outside the op's tensors), and the backend
//!   returns [`Error::InvalidInput`] naming the same tensor (the op, the entry, the value and the
//!   bound in the reason) at the next synchronising call (`Backend::synchronize`, `download`).
//!   Values out of bounds, repeated state slots and counts that do not fit the plan's schedule
//!   are reported; an in-bounds value that differs from the plan's is used as given (the result
//!   is that of the batch the device data describes), or reported where the plan's schedule
//!   cannot hold it. After a reported error the op's outputs and states are unspecified.
//!   Engines that validate upstream may switch the kernel checks off (`k3_kernels::DeviceChecks`,
//!   `K3_DEVICE_CHECKS=off`); out-of-range data is then undefined behaviour.
//! - not looked for on GPUs (a caller contract; the CPU reference rejects both): two tokens with
//!   one device slot in `mla_cache_write`, and a pair listed twice in `sorted_token_ids`.
//!
//! The bad-input suite (`conformance::bad_input`, [`crate::bad_input_suite!`]) holds every
//! backend to this.

pub mod attn_res;
pub mod conv1d;
pub mod elementwise;
pub mod gemm;
pub mod kda_decode;
pub mod kda_gate;
pub mod kda_prefill;
pub mod kv_cache;
pub mod lse_merge;
pub mod mla_cache_write;
pub mod mla_decode;
pub mod mla_prefill;
pub mod moe_align;
pub mod moe_gemm;
pub mod moe_router;
pub mod norm;
pub mod tensor_ops;

pub use kv_cache::{Fp8Flavor, KvCacheFormat, KvDims};
pub use kda_gate::{
    check_a_log_padding, kda_gate_value, KdaGate, KdaGateArgs, KdaGateMode, KdaGateParams, KdaGatePlan, KdaStateLayout,
};
pub use kda_prefill::{
    KdaCheckpointOffsets, KdaPrefill, KdaPrefillArgs, KdaPrefillBatch, KdaPrefillParams, KdaPrefillPlan, KdaPrefillWorkspace,
    KDA_CHUNK_SIZES,
    KDA_L2_EPS,
};
pub use conv1d::{CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, CausalConv1dPlan, ConvActivation, HostIndices};
pub use kda_decode::{KdaDecode, KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaDecodePlan, KdaOutputNorm};
pub use lse_merge::{LseMerge, LseMergeArgs, LseMergeParams, LseMergePlan};
pub use mla_cache_write::{MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams, MlaCacheWritePlan};
pub use mla_prefill::{MlaPrefill, MlaPrefillArgs, MlaPrefillBatch, MlaPrefillKv, MlaPrefillParams, MlaPrefillPlan};
pub use tensor_ops::{AddAssign, AddAssignArgs, CopyCast, CopyCastArgs, ElementwiseParams, ElementwisePlan};
pub use mla_decode::{
    MlaPreparedSchedule, MlaDecode, MlaDecodeArgs, MlaDecodeBatch, MlaDecodeParams, MlaDecodePlan, MlaDecodeVariant, MlaKernel, MlaPagedCache,
    MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaPrefillAbsorbedPlan, MlaSchedule, MlaSplitPolicy,
};
pub use moe_align::{MoeAlign, MoeAlignArgs, MoeAlignParams, MoeAlignPlan, MoeRouting};
pub use moe_gemm::{
    MoeActivationQuant, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeCombinePlan, MoeGemmArgs, MoeGemmParams, MoeGemmPlan,
    MoeGemmStage, MoeGroupedGemm, MoeWeightFormat,
};
pub use moe_router::{MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};
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
