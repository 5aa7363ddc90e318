//! Grouped expert GEMMs over block-aligned routing (vLLM fused_moe kernel 1 and 2, triton
//! `matmul_ogs`) and the fp32 combine of the routed outputs (k3-architecture.md 2.5, 3.4).
//!
//! Both stages walk the output of [`crate::ops::MoeAlign`]: for block b < num_tokens_post_padded
//! / block_m with e = expert_ids[b] ≠ -1, every entry p = sorted_token_ids[i] of the block that is
//! not the sentinel (P = tokens·top_k) is a routing pair p = t·top_k + slot served by expert e.
//! In every other block (at or past num_tokens_post_padded, or with e = -1) the entries before
//! the block's first sentinel are pairs served by no expert (dropped by an expert map), and their
//! rows of `out` are written as zeros, so a rank's partial combine stays correct.
//!
//! **What is written**: exactly the rows of the pairs listed in `sorted_token_ids`, each once:
//! served rows with the values below, unserved rows with zeros; nothing else in `out` is touched
//! and nothing is cleared first. The align op lists every pair exactly once (served or after the
//! runs), so with its output every row of `out` is written, whatever `out` held before (NaN
//! included). A pair listed twice is invalid (the CPU reference rejects it); a pair listed
//! nowhere (hand-built routing only) keeps its row's previous contents.
//!
//! **Stage [`MoeGemmStage::GateUp`]** (`k` = model width, `n` = expert intermediate width N):
//! with a = x[t] and W = w13[e] (`[2N, k]`: gate rows 0..N, then up rows N..2N),
//! g_j = dot(a, W[j]), u_j = dot(a, W[N + j]), out[p, j] = SiTU(g_j, u_j) =
//! β·tanh(g/β)·σ(g) · β_l·tanh(u/β_l) in f32 (β_l = `linear_beta`, `None` = u uncapped), rounded
//! once to the dtype of `out`.
//!
//! **Stage [`MoeGemmStage::Down`]** (`k` = N, `n` = output width): with a = input[p] (the
//! gate/up output of pair p) and W = w2[e] (`[n, k]`), out[p, j] = dot(a, W[j]) · w_p in f32,
//! w_p = topk_weights[t, slot] the router weight.
//!
//! **dot**: the products a_i·W_i of f32-decoded operands, summed sequentially over i = 0..k in
//! ascending order and rounded to f32. The CPU reference forms products exactly and sums in f64
//! (bf16/MXFP4/MXFP8 products are exact in f64). The reduction order is the same for every
//! weight format, so MXFP4 weights give **bit-identical** results to their dequantised bf16 twin.
//!
//! **Weights** ([`MoeWeightFormat`]): `Dense` = bf16 or f32 `[E, rows, k]`; `Mxfp4` =
//! `weight` `[E, rows, k/2]` (U8 or F4E2M1x2: low nibble = even column) plus `weight_scale`
//! `[E, rows, k/32]` (E8M0 or U8), value = e2m1(code) · 2^(S-127), never re-quantised; k must be a
//! multiple of 32. `rows` = 2N for GateUp, n for Down.
//!
//! **Activations** (`activation_quant`): `None` reads the input as stored (W4A16 / W16A16
//! baseline); `Some(Mxfp8)` quantises each input row per 32 consecutive k-elements to MXFP8
//! (E4M3 elements, E8M0 shared exponent floor(log2 amax) - 8, round half to even, saturating;
//! [`crate::formats::Mxfp8Block`]) and uses the dequantised values in the dot (k % 32 == 0).
//!
//! **Combine** ([`MoeCombine`]): out[t, j] = Σ_slot y[t·top_k + slot, j] accumulated in (at
//! least) f32 and rounded once to the dtype of `out`.
//!
//! The down stage's `out` (y) is f32 on purpose: k3-architecture.md 2.5 sums the weighted expert
//! outputs in fp32 and rounds once, so each term w_p·dot must reach the combine unrounded (a bf16
//! y would round all top_k terms before the sum). The combine is a separate op because a
//! token's pairs are served by different experts' blocks: summing them in the GEMM's epilogue
//! would need float atomics, whose order of arrival (and so the result) varies from run to run.

use super::moe_align::MoeRouting;
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::formats::MX_BLOCK;
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Which GEMM of the expert MLP.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MoeGemmStage {
    /// x · w13ᵀ with the SiTU-GLU epilogue. `beta` > 0 (K3: 4); `linear_beta` > 0 caps the up
    /// branch (K3: 25), `None` leaves it uncapped.
    GateUp { beta: f32, linear_beta: Option<f32> },
    /// act · w2ᵀ times the router weight of the pair.
    Down,
}

/// Storage of expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeWeightFormat {
    /// bf16 or f32 values `[E, rows, k]`.
    Dense,
    /// MXFP4 codes `[E, rows, k/2]` + E8M0 scales `[E, rows, k/32]` (checkpoint layout).
    Mxfp4,
}

/// Optional quantisation of the activations entering a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeActivationQuant {
    /// OCP MXFP8: E4M3 elements with one E8M0 exponent per 32 along k.
    Mxfp8,
}

/// Shape and mode of one grouped GEMM stage.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeGemmParams {
    /// The routing the align op produced (same `tokens`, `top_k`, `experts`, `block_m`).
    pub routing: MoeRouting,
    /// Reduction width (GateUp: model width; Down: intermediate N).
    pub k: usize,
    /// Output width (GateUp: N, the act width; Down: model width).
    pub n: usize,
    pub stage: MoeGemmStage,
    pub weights: MoeWeightFormat,
    /// `None` = activations as stored; `Some(Mxfp8)` = quantised per 32 along k first.
    pub activation_quant: Option<MoeActivationQuant>,
}

impl MoeGemmParams {
    /// Rows of one expert's weight: 2n (gate then up) for GateUp, n for Down.
    pub fn weight_rows(&self) -> Option<usize> {
        match self.stage {
            MoeGemmStage::GateUp { .. } => self.n.checked_mul(2),
            MoeGemmStage::Down => Some(self.n),
        }
    }
}

/// Tensor arguments of a grouped GEMM stage.
#[derive(Debug)]
pub struct MoeGemmArgs<'a, B: Backend + ?Sized> {
    /// GateUp: `x` `[tokens, k]`; Down: gate/up output `[tokens·top_k, k]`. bf16 or f32.
    pub input: TensorRef<'a, B>,
    /// Dense: `[E, rows, k]` bf16/f32; Mxfp4: packed codes `[E, rows, k/2]` U8/F4E2M1x2.
    pub weight: TensorRef<'a, B>,
    /// Mxfp4 only: `[E, rows, k/32]` E8M0/U8 (must be `None` for dense weights).
    pub weight_scale: Option<TensorRef<'a, B>>,
    /// `[max_padded]` i32, from the align op.
    pub sorted_token_ids: TensorRef<'a, B>,
    /// `[max_padded / block_m]` i32, from the align op.
    pub expert_ids: TensorRef<'a, B>,
    /// `[1]` i32, from the align op.
    pub num_tokens_post_padded: TensorRef<'a, B>,
    /// Down only (required there, `None` for GateUp): router weights `[tokens, top_k]` f32.
    pub topk_weights: Option<TensorRef<'a, B>>,
    /// GateUp: `[tokens·top_k, n]` bf16/f32; Down: `[tokens·top_k, n]` f32.
    pub out: TensorMut<'a, B>,
}

/// A validated grouped GEMM stage.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeGemmPlan {
    pub params: MoeGemmParams,
    pub pairs: usize,
    pub max_padded: usize,
    pub num_blocks: usize,
    /// Rows of one expert's weight.
    pub weight_rows: usize,
}

fn check_beta(v: f32, field: &str) -> Result<()> {
    ensure(v.is_finite() && v > 0.0, field, || format!("{v} must be finite and > 0"))
}

impl MoeGemmPlan {
    /// Backend-independent validation.
    pub fn new(p: &MoeGemmParams) -> Result<Self> {
        let r = &p.routing;
        r.validate("params.routing")?;
        ensure(p.k >= 1, "params.k", || "must be at least 1".into())?;
        ensure(p.n >= 1, "params.n", || "must be at least 1".into())?;
        if p.weights == MoeWeightFormat::Mxfp4 {
            ensure(p.k.is_multiple_of(MX_BLOCK), "params.k", || {
                format!("{} is not a multiple of {MX_BLOCK}, required by MXFP4 weights", p.k)
            })?;
        }
        if p.activation_quant == Some(MoeActivationQuant::Mxfp8) {
            ensure(p.k.is_multiple_of(MX_BLOCK), "params.k", || {
                format!("{} is not a multiple of {MX_BLOCK}, required by MXFP8 activations", p.k)
            })?;
        }
        if let MoeGemmStage::GateUp { beta, linear_beta } = p.stage {
            check_beta(beta, "params.stage.beta")?;
            if let Some(lb) = linear_beta {
                check_beta(lb, "params.stage.linear_beta")?;
            }
        }
        let overflow = || Error::invalid("params.n", "tensor sizes overflow usize");
        let weight_rows = p.weight_rows().ok_or_else(overflow)?;
        let pairs = r.pairs().ok_or_else(overflow)?;
        let sizes =
            [r.experts.checked_mul(weight_rows).and_then(|x| x.checked_mul(p.k)), pairs.checked_mul(p.n), pairs.checked_mul(p.k)];
        if sizes.iter().any(Option::is_none) {
            return Err(overflow());
        }
        let max_padded = r.max_padded().ok_or_else(overflow)?;
        Ok(MoeGemmPlan { params: p.clone(), pairs, max_padded, num_blocks: max_padded / r.block_m, weight_rows })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MoeGemmArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let r = &p.routing;
        let (e, rows, k) = (r.experts, self.weight_rows, p.k);
        let is_down = p.stage == MoeGemmStage::Down;
        let in_rows = if is_down { self.pairs } else { r.tokens };
        a.input.check(b, "input")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(in_rows), Dim::Is(k)])?;
        match p.weights {
            MoeWeightFormat::Dense => {
                a.weight.check(b, "weight")?.dtype(&[DType::BF16, DType::F32])?.shape(&[
                    Dim::Is(e),
                    Dim::Is(rows),
                    Dim::Is(k),
                ])?;
                if a.weight_scale.is_some() {
                    return Err(Error::invalid("weight_scale", "given for dense weights (only MXFP4 weights have scales)"));
                }
            }
            MoeWeightFormat::Mxfp4 => {
                a.weight.check(b, "weight")?.dtype(&[DType::U8, DType::F4E2M1x2])?.shape(&[
                    Dim::Is(e),
                    Dim::Is(rows),
                    Dim::Is(k / 2),
                ])?;
                let s = a.weight_scale.as_ref().ok_or_else(|| Error::invalid("weight_scale", "required for MXFP4 weights"))?;
                s.check(b, "weight_scale")?.dtype(&[DType::E8M0, DType::U8])?.shape(&[
                    Dim::Is(e),
                    Dim::Is(rows),
                    Dim::Is(k / MX_BLOCK),
                ])?;
            }
        }
        a.sorted_token_ids.check(b, "sorted_token_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.max_padded)])?;
        a.expert_ids.check(b, "expert_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.num_blocks)])?;
        a.num_tokens_post_padded.check(b, "num_tokens_post_padded")?.dtype(&[DType::I32])?.shape(&[Dim::Is(1)])?;
        match (is_down, &a.topk_weights) {
            (true, Some(w)) => {
                w.check(b, "topk_weights")?.dtype(&[DType::F32])?.shape(&[Dim::Is(r.tokens), Dim::Is(r.top_k)])?;
            }
            (true, None) => return Err(Error::invalid("topk_weights", "required by the down stage")),
            (false, Some(_)) => return Err(Error::invalid("topk_weights", "not used by the gate/up stage")),
            (false, None) => {}
        }
        let out_dtypes: &[DType] = if is_down { &[DType::F32] } else { &[DType::F32, DType::BF16] };
        a.out.check(b, "out")?.dtype(out_dtypes)?.shape(&[Dim::Is(self.pairs), Dim::Is(p.n)])?;
        Ok(())
    }
}

/// Grouped expert GEMM (both stages of the expert MLP).
pub trait MoeGroupedGemm: Backend {
    fn supports(&self, params: &MoeGemmParams) -> Result<()>;
    fn plan(&self, params: &MoeGemmParams) -> Result<MoeGemmPlan> {
        let plan = MoeGemmPlan::new(params)?;
        MoeGroupedGemm::supports(self, params)?;
        Ok(plan)
    }
    /// Bytes of scratch `run` needs. Default (tiles write disjoint output rows directly): none.
    /// The GPU backends ask for f32 partial sums when they split k at decode sizes (their
    /// `workspace_size` depends on the device's compute units); callers size it with this call.
    fn workspace_size(&self, _plan: &MoeGemmPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MoeGemmPlan,
        args: MoeGemmArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

/// Shape of a combine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeCombineParams {
    pub tokens: usize,
    pub top_k: usize,
    pub hidden: usize,
}

/// Tensor arguments of a combine.
#[derive(Debug)]
pub struct MoeCombineArgs<'a, B: Backend + ?Sized> {
    /// Weighted expert outputs `[tokens·top_k, hidden]` f32 (the down stage's `out`).
    pub y: TensorRef<'a, B>,
    /// `[tokens, hidden]`, bf16 or f32.
    pub out: TensorMut<'a, B>,
}

/// A validated combine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeCombinePlan {
    pub params: MoeCombineParams,
}

impl MoeCombinePlan {
    pub fn new(p: &MoeCombineParams) -> Result<Self> {
        ensure(p.top_k >= 1, "params.top_k", || "must be at least 1".into())?;
        ensure(p.hidden >= 1, "params.hidden", || "must be at least 1".into())?;
        let n = p.tokens.checked_mul(p.top_k).and_then(|x| x.checked_mul(p.hidden));
        ensure(n.is_some(), "params.tokens", || "tokens x top_k x hidden overflows".into())?;
        Ok(MoeCombinePlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MoeCombineArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.y.check(b, "y")?.dtype(&[DType::F32])?.shape(&[Dim::Is(p.tokens * p.top_k), Dim::Is(p.hidden)])?;
        a.out.check(b, "out")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(p.tokens), Dim::Is(p.hidden)])?;
        Ok(())
    }
}

/// Sum of the top-k weighted expert outputs per token (vLLM `moe_sum`).
pub trait MoeCombine: Backend {
    fn supports(&self, params: &MoeCombineParams) -> Result<()>;
    fn plan(&self, params: &MoeCombineParams) -> Result<MoeCombinePlan> {
        let plan = MoeCombinePlan::new(params)?;
        MoeCombine::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &MoeCombinePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MoeCombinePlan,
        args: MoeCombineArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder, MathClass};

impl MoeGemmParams {
    /// One stage over the routing, `experts_touched` experts serving at least one pair (see
    /// [`MoeRouting::expected_experts_touched`]). `input`/`out` are the activation dtypes,
    /// `dense_weight` the weight dtype of [`MoeWeightFormat::Dense`] (ignored for MXFP4).
    ///
    /// Bytes: the weights (MXFP4: k/2 code bytes + k/32 scale bytes per row) of the touched
    /// experts once; the input rows once (GateUp: one per token, Down: one per pair); out; the
    /// align metadata of the blocks walked (and the router weights for Down). FLOPs: 2·pairs·k·rows in the class of
    /// the activations against the weights (MXFP4 x bf16 dequantises to bf16, x MXFP8 runs at
    /// the fp8 rate); the MXFP8 quantisation (3 per input value), the SiTU epilogue (12 per
    /// output) or the router-weight multiply (1 per output) on the vector units.
    pub fn cost(&self, experts_touched: usize, input: DType, dense_weight: DType, out: DType) -> Result<Cost> {
        let r = &self.routing;
        if experts_touched > r.experts {
            return Err(Error::invalid("experts_touched", format!("{experts_touched} exceeds routing.experts = {}", r.experts)));
        }
        let (Some(pairs), Some(padded), Some(rows)) = (r.pairs(), r.max_padded(), self.weight_rows()) else {
            return Err(Error::invalid("params.routing", "tokens·top_k + experts·(block_m-1) or the weight rows overflow"));
        };
        let (pairs, rows, k, n, e) = (dim(pairs), dim(rows), dim(self.k), dim(self.n), dim(experts_touched));
        let rows_in = match self.stage {
            MoeGemmStage::GateUp { .. } => dim(r.tokens),
            MoeGemmStage::Down => pairs,
        };
        let act = match self.activation_quant {
            Some(MoeActivationQuant::Mxfp8) => DType::F8E4M3Fn,
            None => input,
        };
        let c = CostBuilder::new("params");
        let (c, weight) = match self.weights {
            MoeWeightFormat::Mxfp4 => (c.bytes(&[e, rows, k / 2]).bytes(&[e, rows, k / MX_BLOCK as u64]), DType::F4E2M1x2),
            MoeWeightFormat::Dense => (c.bytes(&[e, rows, k, elem_bytes(dense_weight)]), dense_weight),
        };
        let (epilogue, router_weights) = match self.stage {
            MoeGemmStage::GateUp { .. } => (12, 0),
            MoeGemmStage::Down => (1, 1),
        };
        // The blocks actually walked: each touched expert's run padded to block_m.
        let m = dim(r.block_m);
        let used = dim(padded).min(pairs.saturating_add(e.saturating_mul(m.saturating_sub(1))));
        c.bytes(&[rows_in, k, elem_bytes(input)])
            .bytes(&[pairs, n, elem_bytes(out)])
            .bytes(&[used.saturating_add(used.div_ceil(m.max(1))).saturating_add(1), 4])
            .bytes(&[router_weights, pairs, 4])
            .flops(matrix_class(act, weight), &[2, pairs, k, rows])
            .flops(MathClass::Vector, &[self.activation_quant.is_some() as u64, rows_in, k, 3])
            .flops(MathClass::Vector, &[pairs, n, epilogue])
            .build()
    }
}

impl MoeCombineParams {
    /// The routed rows (dtype `input`, f32 in K3) read once, out written; one add per value.
    pub fn cost(&self, input: DType, out: DType) -> Result<Cost> {
        let (t, k, h) = (dim(self.tokens), dim(self.top_k), dim(self.hidden));
        CostBuilder::new("params")
            .bytes(&[t, k, h, elem_bytes(input)])
            .bytes(&[t, h, elem_bytes(out)])
            .flops(MathClass::Vector, &[t, k, h])
            .build()
    }
}
