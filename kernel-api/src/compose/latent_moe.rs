//! The K3 Stable LatentMoE block (k3-architecture.md 2.5):
//!
//! 1. route: fp32 sigmoid router on the full-width x, bias selects, unbiased weights renormalised
//!    and scaled ([`MoeRouter`]);
//! 2. z = W_down x (to the latent width L);
//! 3. align pairs by expert ([`MoeAlign`]), y_i = W2_i SiTU(W1_i z, W3_i z) times the router
//!    weight ([`MoeGroupedGemm`] GateUp and Down), r = Σ_i y_i in f32 ([`MoeCombine`]);
//! 4. r' = RMSNorm(r) ⊙ w_norm (when the latent norm is on);
//! 5. routed = W_up r';
//! 6. shared = W_sd SiTU(W_sg x, W_su x) at full width (the fused shared experts);
//! 7. out = routed + shared.

use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::elementwise::{SituGlu, SituGluArgs, SituGluInput, SituGluParams};
use crate::ops::gemm::{Gemm, GemmArgs, GemmParams};
use crate::ops::norm::{RmsNorm, RmsNormArgs, RmsNormParams, RmsWeightOrder};
use crate::ops::{
    AddAssign, AddAssignArgs, ElementwiseParams, MoeActivationQuant, MoeAlign, MoeAlignArgs, MoeAlignParams, MoeCombine,
    MoeCombineArgs, MoeCombineParams, MoeGemmArgs, MoeGemmParams, MoeGemmStage, MoeGroupedGemm, MoeRouter, MoeRouterArgs,
    MoeRouterParams, MoeRouting, MoeWeightFormat, RouterScore,
};
use crate::tensor::TensorRef;

/// Every op the block uses.
pub trait LatentMoeBackend:
    Backend + Gemm + RmsNorm + SituGlu + MoeRouter + MoeAlign + MoeGroupedGemm + MoeCombine + AddAssign
{
}
impl<T> LatentMoeBackend for T where
    T: Backend + Gemm + RmsNorm + SituGlu + MoeRouter + MoeAlign + MoeGroupedGemm + MoeCombine + AddAssign
{
}

/// Shapes and switches of the block.
#[derive(Clone, Debug, PartialEq)]
pub struct LatentMoeConfig {
    pub hidden: usize,
    pub latent: usize,
    /// Routed expert FFN width N.
    pub intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub routed_scaling_factor: f32,
    pub situ_beta: f32,
    pub situ_linear_beta: Option<f32>,
    /// Epsilon of the latent RMSNorm (K3: 1e-5).
    pub norm_eps: f32,
    pub block_m: usize,
    pub activation_quant: Option<MoeActivationQuant>,
    /// Dtype of the block output and intermediates.
    pub act_dtype: DType,
}

/// One stacked expert matrix: bf16/f32 values, or MXFP4 codes plus E8M0 scales.
#[derive(Debug)]
pub struct ExpertWeights<'a, B: Backend + ?Sized> {
    pub weight: TensorRef<'a, B>,
    pub scale: Option<TensorRef<'a, B>>,
}

/// The fused shared experts (gate/up `[S, d]`, down `[d, S]`).
#[derive(Debug)]
pub struct SharedMlp<'a, B: Backend + ?Sized> {
    pub gate: TensorRef<'a, B>,
    pub up: TensorRef<'a, B>,
    pub down: TensorRef<'a, B>,
}

/// The block's weights (checkpoint layouts; experts stacked as `[E, 2N, L]` and `[E, L, N]`).
#[derive(Debug)]
pub struct LatentMoeWeights<'a, B: Backend + ?Sized> {
    pub router: TensorRef<'a, B>,
    /// f32 `[E]` (a bf16 bias is rejected by the router).
    pub bias: TensorRef<'a, B>,
    pub latent_down: TensorRef<'a, B>,
    pub latent_norm: Option<TensorRef<'a, B>>,
    pub latent_up: TensorRef<'a, B>,
    pub shared: Option<SharedMlp<'a, B>>,
    pub w13: ExpertWeights<'a, B>,
    pub w2: ExpertWeights<'a, B>,
}

fn gemm<B: LatentMoeBackend>(b: &B, x: TensorRef<'_, B>, w: TensorRef<'_, B>, out: DType) -> Result<DeviceTensor<B>> {
    let (m, k) = (x.layout.shape[0], x.layout.shape[1]);
    let n = w.layout.shape[0];
    let p = GemmParams { m, n, k, x_dtype: x.layout.dtype, w_dtype: w.layout.dtype, out_dtype: out, bias_dtype: None };
    let plan = Gemm::plan(b, &p)?;
    let mut y = b.zeros(out, &[m, n])?;
    let mut ws = b.workspace(Gemm::workspace_size(b, &plan))?;
    Gemm::run(b, &plan, GemmArgs { x, w, bias: None, out: y.as_mut() }, ws.as_mut(), b.default_stream())?;
    Ok(y)
}

/// The full-width SiTU MLP: W_down SiTU(W_gate x, W_up x).
pub fn situ_mlp<B: LatentMoeBackend>(b: &B, x: TensorRef<'_, B>, w: &SharedMlp<'_, B>, beta: f32, linear_beta: Option<f32>, out: DType) -> Result<DeviceTensor<B>> {
    let g = gemm(b, x.clone(), w.gate.clone(), out)?;
    let u = gemm(b, x, w.up.clone(), out)?;
    let (m, n) = (g.layout.shape[0], g.layout.shape[1]);
    let plan = SituGlu::plan(b, &SituGluParams { m, n, beta, linear_beta })?;
    let mut a = b.zeros(out, &[m, n])?;
    let args = SituGluArgs { input: SituGluInput::Separate { gate: g.as_ref(), up: u.as_ref() }, out: a.as_mut() };
    SituGlu::run(b, &plan, args, None, b.default_stream())?;
    gemm(b, a.as_ref(), w.down.clone(), out)
}

/// Runs the block on `x` `[T, hidden]` and returns `[T, hidden]` in `cfg.act_dtype`.
pub fn latent_moe_forward<B: LatentMoeBackend>(b: &B, cfg: &LatentMoeConfig, w: &LatentMoeWeights<'_, B>, x: TensorRef<'_, B>) -> Result<DeviceTensor<B>> {
    let t = x.layout.shape.first().copied().unwrap_or(0);
    let act = cfg.act_dtype;
    let stream = b.default_stream();
    let rparams = MoeRouterParams {
        tokens: t,
        hidden: cfg.hidden,
        experts: cfg.experts,
        top_k: cfg.top_k,
        n_group: cfg.n_group,
        topk_group: cfg.topk_group,
        renormalize: cfg.renormalize,
        routed_scaling_factor: cfg.routed_scaling_factor,
        score: RouterScore::Sigmoid,
    };
    let rplan = MoeRouter::plan(b, &rparams)?;
    let mut ids = b.zeros(DType::I32, &[t, cfg.top_k])?;
    let mut weights = b.zeros(DType::F32, &[t, cfg.top_k])?;
    let rargs = MoeRouterArgs {
        x: x.clone(),
        weight: w.router.clone(),
        bias: Some(w.bias.clone()),
        topk_ids: ids.as_mut(),
        topk_weights: weights.as_mut(),
    };
    let mut rws = b.workspace(MoeRouter::workspace_size(b, &rplan))?;
    MoeRouter::run(b, &rplan, rargs, rws.as_mut(), stream)?;
    let z = gemm(b, x.clone(), w.latent_down.clone(), act)?;

    let routing = MoeRouting { tokens: t, top_k: cfg.top_k, experts: cfg.experts, block_m: cfg.block_m };
    let aplan = MoeAlign::plan(b, &MoeAlignParams { routing: routing.clone(), global_experts: None })?;
    let mut sorted = b.zeros(DType::I32, &[aplan.max_padded])?;
    let mut expert_ids = b.zeros(DType::I32, &[aplan.num_blocks])?;
    let mut ntp = b.zeros(DType::I32, &[1])?;
    let mut aws = b.alloc_zeroed(MoeAlign::workspace_size(b, &aplan))?;
    let aargs = MoeAlignArgs {
        topk_ids: ids.as_ref(),
        expert_map: None,
        sorted_token_ids: sorted.as_mut(),
        expert_ids: expert_ids.as_mut(),
        num_tokens_post_padded: ntp.as_mut(),
    };
    MoeAlign::run(b, &aplan, aargs, Some(&mut aws), stream)?;

    let format = if w.w13.scale.is_some() { MoeWeightFormat::Mxfp4 } else { MoeWeightFormat::Dense };
    let stage = |stage, k, n| MoeGemmParams { routing: routing.clone(), k, n, stage, weights: format, activation_quant: cfg.activation_quant };
    let gate_up = stage(MoeGemmStage::GateUp { beta: cfg.situ_beta, linear_beta: cfg.situ_linear_beta }, cfg.latent, cfg.intermediate);
    let gplan = MoeGroupedGemm::plan(b, &gate_up)?;
    let mut a = b.zeros(act, &[t * cfg.top_k, cfg.intermediate])?;
    let gargs = MoeGemmArgs {
        input: z.as_ref(),
        weight: w.w13.weight.clone(),
        weight_scale: w.w13.scale.clone(),
        sorted_token_ids: sorted.as_ref(),
        expert_ids: expert_ids.as_ref(),
        num_tokens_post_padded: ntp.as_ref(),
        topk_weights: None,
        out: a.as_mut(),
    };
    let mut gws = b.alloc_zeroed(MoeGroupedGemm::workspace_size(b, &gplan))?;
    MoeGroupedGemm::run(b, &gplan, gargs, Some(&mut gws), stream)?;
    let dplan = MoeGroupedGemm::plan(b, &stage(MoeGemmStage::Down, cfg.intermediate, cfg.latent))?;
    let mut y = b.zeros(DType::F32, &[t * cfg.top_k, cfg.latent])?;
    let dargs = MoeGemmArgs {
        input: a.as_ref(),
        weight: w.w2.weight.clone(),
        weight_scale: w.w2.scale.clone(),
        sorted_token_ids: sorted.as_ref(),
        expert_ids: expert_ids.as_ref(),
        num_tokens_post_padded: ntp.as_ref(),
        topk_weights: Some(weights.as_ref()),
        out: y.as_mut(),
    };
    let mut dws = b.alloc_zeroed(MoeGroupedGemm::workspace_size(b, &dplan))?;
    MoeGroupedGemm::run(b, &dplan, dargs, Some(&mut dws), stream)?;
    let cplan = MoeCombine::plan(b, &MoeCombineParams { tokens: t, top_k: cfg.top_k, hidden: cfg.latent })?;
    let mut r = b.zeros(act, &[t, cfg.latent])?;
    MoeCombine::run(b, &cplan, MoeCombineArgs { y: y.as_ref(), out: r.as_mut() }, None, stream)?;

    let r = match &w.latent_norm {
        Some(nw) => {
            let plan = RmsNorm::plan(b, &RmsNormParams { m: t, d: cfg.latent, eps: cfg.norm_eps, weight_order: RmsWeightOrder::F32 })?;
            let mut n = b.zeros(act, &[t, cfg.latent])?;
            RmsNorm::run(b, &plan, RmsNormArgs { x: r.as_ref(), w: nw.clone(), out: n.as_mut() }, None, stream)?;
            n
        }
        None => r,
    };
    let mut out = gemm(b, r.as_ref(), w.latent_up.clone(), act)?;
    if let Some(sh) = &w.shared {
        let s = situ_mlp(b, x, sh, cfg.situ_beta, cfg.situ_linear_beta, act)?;
        let plan = AddAssign::plan(b, &ElementwiseParams { shape: vec![t, cfg.hidden] })?;
        AddAssign::run(b, &plan, AddAssignArgs { acc: out.as_mut(), x: s.as_ref() }, stream)?;
    }
    Ok(out)
}
