//! Op families whose GPU kernels are not written yet: every backend must implement every trait
//! (the conformance suite and the model runner are generic over all of them), so these answer
//! `supports` with `Unsupported` and the reason, and `run` refuses the same way. A family moves
//! out of this file when its kernels and launcher land.

use crate::gpu_backend::GpuBackend;
use crate::runtime::Runtime;
use kernel_api::ops::attn_res::{AttnResMix, AttnResMixArgs, AttnResMixParams, AttnResMixPlan};
use kernel_api::ops::elementwise::{
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, EmbeddingGatherPlan, SigmoidGate, SigmoidGateArgs,
    SigmoidGateParams, SigmoidGatePlan, SituGlu, SituGluArgs, SituGluParams, SituGluPlan,
};
use kernel_api::ops::gemm::{Gemm, GemmArgs, GemmParams, GemmPlan};
use kernel_api::ops::kda_gate::{KdaGate, KdaGateArgs, KdaGateParams, KdaGatePlan};
use kernel_api::ops::norm::{
    GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, GatedRmsNormPlan, L2Norm, L2NormArgs, L2NormParams, L2NormPlan,
    RmsNorm, RmsNormArgs, RmsNormParams, RmsNormPlan,
};
use kernel_api::ops::*;
use kernel_api::{Error, Result};

fn no_kernel(op: &str) -> Error {
    Error::unsupported(op, "no GPU kernel for this op yet (it runs on the CPU reference backend)")
}

macro_rules! pending {
    ($($tr:ident, $params:ty, $plan:ty, $args:ident, $op:literal;)*) => {$(
        impl<R: Runtime> $tr for GpuBackend<R> {
            fn supports(&self, _p: &$params) -> Result<()> {
                Err(no_kernel($op))
            }
            fn run(&self, _plan: &$plan, _args: $args<'_, Self>, _ws: Option<&mut R::Buffer>, _s: &R::Stream) -> Result<()> {
                Err(no_kernel($op))
            }
        }
    )*};
}

pending! {
    Gemm, GemmParams, GemmPlan, GemmArgs, "gemm";
    RmsNorm, RmsNormParams, RmsNormPlan, RmsNormArgs, "rms_norm";
    GatedRmsNorm, GatedRmsNormParams, GatedRmsNormPlan, GatedRmsNormArgs, "gated_rms_norm";
    L2Norm, L2NormParams, L2NormPlan, L2NormArgs, "l2_norm";
    AttnResMix, AttnResMixParams, AttnResMixPlan, AttnResMixArgs, "attn_res_mix";
    SituGlu, SituGluParams, SituGluPlan, SituGluArgs, "situ_glu";
    SigmoidGate, SigmoidGateParams, SigmoidGatePlan, SigmoidGateArgs, "sigmoid_gate";
    EmbeddingGather, EmbeddingGatherParams, EmbeddingGatherPlan, EmbeddingGatherArgs, "embedding_gather";
    KdaGate, KdaGateParams, KdaGatePlan, KdaGateArgs, "kda_gate";
    KdaPrefill, KdaPrefillParams, KdaPrefillPlan, KdaPrefillArgs, "kda_prefill";
    KdaDecode, KdaDecodeParams, KdaDecodePlan, KdaDecodeArgs, "kda_decode";
    CausalConv1d, CausalConv1dParams, CausalConv1dPlan, CausalConv1dArgs, "causal_conv1d";
    MoeRouter, MoeRouterParams, MoeRouterPlan, MoeRouterArgs, "moe_router";
    MoeAlign, MoeAlignParams, MoeAlignPlan, MoeAlignArgs, "moe_align";
    MoeGroupedGemm, MoeGemmParams, MoeGemmPlan, MoeGemmArgs, "moe_grouped_gemm";
    MoeCombine, MoeCombineParams, MoeCombinePlan, MoeCombineArgs, "moe_combine";
}
