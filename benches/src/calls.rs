//! The hot ops as calls on named device tensors, shared by `k3-device-bench` (inputs generated
//! on the device) and `k3-peer` (inputs read from a peer's files): each struct holds one call's
//! tensors and workspace, and `run` hands them to the op's `run` with its plan.

use kernel_api::cost::Cost;
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, Error, HostTensor, Result};

type Dev<B> = DeviceTensor<B>;

/// One KDA chunked prefill; `state` is the pool, read and written in place.
pub struct KdaPrefillCall<B: Backend> {
    pub q: Dev<B>,
    pub k: Dev<B>,
    pub v: Dev<B>,
    pub g_raw: Dev<B>,
    pub beta: Dev<B>,
    pub a_log: Dev<B>,
    pub dt_bias: Dev<B>,
    pub cu_seqlens: Dev<B>,
    pub state: Dev<B>,
    pub out: Dev<B>,
    pub ws: Option<B::Buffer>,
}

impl<B: KdaPrefill> KdaPrefillCall<B> {
    pub fn run(&mut self, b: &B, plan: &KdaPrefillPlan) -> Result<()> {
        let args = KdaPrefillArgs {
            q: self.q.as_ref(),
            k: self.k.as_ref(),
            v: self.v.as_ref(),
            g_raw: self.g_raw.as_ref(),
            beta: self.beta.as_ref(),
            a_log: Some(self.a_log.as_ref()),
            dt_bias: Some(self.dt_bias.as_ref()),
            cu_seqlens: self.cu_seqlens.as_ref(),
            state_indices: None,
            state: Some(self.state.as_mut()),
            checkpoint_offsets: None,
            checkpoint_state: None,
            out: self.out.as_mut(),
        };
        KdaPrefill::run(b, plan, args, self.ws.as_mut(), b.default_stream())
    }
}

/// One fused KDA decode step; both pools are updated in place. `norm` = (output_gate,
/// norm_weight) of the gated RMSNorm, when the plan has one.
pub struct KdaDecodeCall<B: Backend> {
    pub x_qkv: Dev<B>,
    pub conv_weight: Dev<B>,
    pub conv_state: Dev<B>,
    pub g_raw: Dev<B>,
    pub beta: Dev<B>,
    pub a_log: Dev<B>,
    pub dt_bias: Dev<B>,
    pub state_indices: Dev<B>,
    pub state: Dev<B>,
    pub norm: Option<(Dev<B>, Dev<B>)>,
    pub out: Dev<B>,
    pub ws: Option<B::Buffer>,
}

impl<B: KdaDecode> KdaDecodeCall<B> {
    pub fn run(&mut self, b: &B, plan: &KdaDecodePlan) -> Result<()> {
        let args = KdaDecodeArgs {
            x_qkv: self.x_qkv.as_ref(),
            conv_weight: self.conv_weight.as_ref(),
            conv_state: self.conv_state.as_mut(),
            g_raw: self.g_raw.as_ref(),
            beta: self.beta.as_ref(),
            a_log: Some(self.a_log.as_ref()),
            dt_bias: Some(self.dt_bias.as_ref()),
            state_indices: self.state_indices.as_ref(),
            recurrent_state: self.state.as_mut(),
            output_gate: self.norm.as_ref().map(|(g, _)| g.as_ref()),
            norm_weight: self.norm.as_ref().map(|(_, w)| w.as_ref()),
            out: self.out.as_mut(),
        };
        KdaDecode::run(b, plan, args, self.ws.as_mut(), b.default_stream())
    }
}

/// One absorbed MLA decode over the paged latent cache.
pub struct MlaDecodeCall<B: Backend> {
    pub q: Dev<B>,
    pub kv_cache: Dev<B>,
    pub block_table: Dev<B>,
    pub seq_lens: Dev<B>,
    pub out: Dev<B>,
    pub lse: Dev<B>,
    pub ws: Option<B::Buffer>,
}

impl<B: MlaDecode> MlaDecodeCall<B> {
    pub fn run(&mut self, b: &B, plan: &MlaDecodePlan) -> Result<()> {
        let args = MlaDecodeArgs {
            q: self.q.as_ref(),
            kv_cache: self.kv_cache.as_ref(),
            block_table: self.block_table.as_ref(),
            seq_lens: self.seq_lens.as_ref(),
            out: self.out.as_mut(),
            lse: Some(self.lse.as_mut()),
        };
        MlaDecode::run(b, plan, args, self.ws.as_mut(), b.default_stream())
    }
}

/// The plans of the routed MoE path.
pub struct MoePlans {
    pub router: MoeRouterPlan,
    pub align: MoeAlignPlan,
    pub gate_up: MoeGemmPlan,
    pub down: MoeGemmPlan,
    pub combine: MoeCombinePlan,
}

/// The input tensors of a [`MoeCall`]: router input `x`, expert input `z` (`x` when `None`),
/// the router weight and f32 bias, MXFP4 codes and E8M0 scales of gate/up and down.
pub struct MoeInputs<B: Backend> {
    pub x: Dev<B>,
    pub z: Option<Dev<B>>,
    pub router_weight: Dev<B>,
    pub bias: Dev<B>,
    pub w13: Dev<B>,
    pub s13: Dev<B>,
    pub w2: Dev<B>,
    pub s2: Dev<B>,
}

/// The routed MoE path: router, align, MXFP4 gate/up + SiTU, down with the router weights,
/// combine; its intermediate buffers and workspaces.
pub struct MoeCall<B: Backend> {
    pub inputs: MoeInputs<B>,
    pub topk_ids: Dev<B>,
    pub topk_weights: Dev<B>,
    pub sorted: Dev<B>,
    pub expert_ids: Dev<B>,
    pub padded: Dev<B>,
    pub act: Dev<B>,
    pub y: Dev<B>,
    pub out: Dev<B>,
    pub router_ws: Option<B::Buffer>,
    pub align_ws: Option<B::Buffer>,
    pub gate_up_ws: Option<B::Buffer>,
    pub down_ws: Option<B::Buffer>,
}

impl<B: MoeRouter + MoeAlign + MoeGroupedGemm + MoeCombine> MoeCall<B> {
    pub fn router(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        let args = MoeRouterArgs {
            x: self.inputs.x.as_ref(),
            weight: self.inputs.router_weight.as_ref(),
            bias: Some(self.inputs.bias.as_ref()),
            topk_ids: self.topk_ids.as_mut(),
            topk_weights: self.topk_weights.as_mut(),
        };
        MoeRouter::run(b, &p.router, args, self.router_ws.as_mut(), b.default_stream())
    }

    pub fn align(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        let args = MoeAlignArgs {
            topk_ids: self.topk_ids.as_ref(),
            expert_map: None,
            sorted_token_ids: self.sorted.as_mut(),
            expert_ids: self.expert_ids.as_mut(),
            num_tokens_post_padded: self.padded.as_mut(),
        };
        MoeAlign::run(b, &p.align, args, self.align_ws.as_mut(), b.default_stream())
    }

    pub fn gate_up(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        let args = MoeGemmArgs {
            input: self.inputs.z.as_ref().unwrap_or(&self.inputs.x).as_ref(),
            weight: self.inputs.w13.as_ref(),
            weight_scale: Some(self.inputs.s13.as_ref()),
            sorted_token_ids: self.sorted.as_ref(),
            expert_ids: self.expert_ids.as_ref(),
            num_tokens_post_padded: self.padded.as_ref(),
            topk_weights: None,
            out: self.act.as_mut(),
        };
        MoeGroupedGemm::run(b, &p.gate_up, args, self.gate_up_ws.as_mut(), b.default_stream())
    }

    pub fn down(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        let args = MoeGemmArgs {
            input: self.act.as_ref(),
            weight: self.inputs.w2.as_ref(),
            weight_scale: Some(self.inputs.s2.as_ref()),
            sorted_token_ids: self.sorted.as_ref(),
            expert_ids: self.expert_ids.as_ref(),
            num_tokens_post_padded: self.padded.as_ref(),
            topk_weights: Some(self.topk_weights.as_ref()),
            out: self.y.as_mut(),
        };
        MoeGroupedGemm::run(b, &p.down, args, self.down_ws.as_mut(), b.default_stream())
    }

    pub fn combine(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        MoeCombine::run(b, &p.combine, MoeCombineArgs { y: self.y.as_ref(), out: self.out.as_mut() }, None, b.default_stream())
    }

    /// The whole routed path.
    pub fn run(&mut self, b: &B, p: &MoePlans) -> Result<()> {
        self.router(b, p)?;
        self.align(b, p)?;
        self.gate_up(b, p)?;
        self.down(b, p)?;
        self.combine(b, p)
    }
}

impl MoePlans {
    /// Plans the routed path for `tokens` tokens: router over `hidden`, MXFP4 experts of width
    /// `n` on a `latent`-wide input, SiTU(`beta`, `linear_beta`).
    pub fn new<B: MoeRouter + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B, tokens: usize, hidden: usize, latent: usize, n: usize, experts: usize, top_k: usize, beta: f32, linear_beta: Option<f32>) -> Result<Self> {
        let routing = MoeRouting { tokens, top_k, experts, block_m: 16 };
        let stage = |stage, k, nn| MoeGemmParams { routing: routing.clone(), k, n: nn, stage, weights: MoeWeightFormat::Mxfp4, activation_quant: None };
        Ok(MoePlans {
            router: MoeRouter::plan(b, &MoeRouterParams::sigmoid(tokens, hidden, experts, top_k))?,
            align: MoeAlign::plan(b, &MoeAlignParams { routing: routing.clone(), global_experts: None })?,
            gate_up: MoeGroupedGemm::plan(b, &stage(MoeGemmStage::GateUp { beta, linear_beta }, latent, n))?,
            down: MoeGroupedGemm::plan(b, &stage(MoeGemmStage::Down, n, latent))?,
            combine: MoeCombine::plan(b, &MoeCombineParams { tokens, top_k, hidden: latent })?,
        })
    }

    /// Costs of router, align, gate/up, down and combine when `touched` experts serve a pair;
    /// activations of dtype `io`, router weight `router_w`.
    pub fn costs(&self, touched: usize, io: DType, router_w: DType) -> Result<[Cost; 5]> {
        Ok([
            self.router.params.cost(io, router_w)?,
            self.align.params.cost()?,
            self.gate_up.params.cost(touched, io, io, io)?,
            self.down.params.cost(touched, io, io, DType::F32)?,
            self.combine.params.cost(DType::F32, io)?,
        ])
    }
}

/// The sum of costs.
pub fn total(costs: &[Cost]) -> Result<Cost> {
    costs.iter().try_fold(Cost::default(), |a, c| a.checked_add(c)).ok_or_else(|| Error::invalid("params", "cost overflows u64"))
}

/// Distinct experts in a `topk_ids` download (ids outside `0..experts` ignored).
pub fn experts_touched(topk_ids: &HostTensor, experts: usize) -> usize {
    let mut used = vec![false; experts];
    for i in topk_ids.to_i64() {
        if let Some(u) = usize::try_from(i).ok().and_then(|i| used.get_mut(i)) {
            *u = true;
        }
    }
    used.iter().filter(|&&u| u).count()
}

/// A [`MoeCall`] on `inputs` with zeroed buffers and workspaces sized for `p`; activations of
/// dtype `io`.
pub fn moe_call<B: MoeRouter + MoeAlign + MoeGroupedGemm>(b: &B, p: &MoePlans, inputs: MoeInputs<B>, io: DType) -> Result<MoeCall<B>> {
    let (t, k) = (p.router.params.tokens, p.router.params.top_k);
    let (n, l) = (p.gate_up.params.n, p.down.params.n);
    Ok(MoeCall {
        inputs,
        topk_ids: b.zeros(DType::I32, &[t, k])?,
        topk_weights: b.zeros(DType::F32, &[t, k])?,
        sorted: b.zeros(DType::I32, &[p.align.max_padded])?,
        expert_ids: b.zeros(DType::I32, &[p.align.num_blocks])?,
        padded: b.zeros(DType::I32, &[1])?,
        act: b.zeros(io, &[t * k, n])?,
        y: b.zeros(DType::F32, &[t * k, l])?,
        out: b.zeros(io, &[t, l])?,
        router_ws: b.workspace(MoeRouter::workspace_size(b, &p.router))?,
        align_ws: b.workspace(MoeAlign::workspace_size(b, &p.align))?,
        gate_up_ws: b.workspace(MoeGroupedGemm::workspace_size(b, &p.gate_up))?,
        down_ws: b.workspace(MoeGroupedGemm::workspace_size(b, &p.down))?,
    })
}
