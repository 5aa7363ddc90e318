//! MoE router: sigmoid scores, bias-corrected selection, optional group masking, top-k, and the
//! routing weights (k3-architecture.md 2.5; DeepSeek-V3 style `noaux_tc` routing).
//!
//! Per token t (x_t = row t of `x`, W_r = `weight`, b = `bias` or 0):
//! 1. logits ℓ = W_r x_t: both operands upcast to f32, products and sum accumulated in at
//!    least f32 (the CPU reference sums in f64 and rounds once), ℓ stored as f32.
//! 2. s = σ(ℓ) (f32). Only the sigmoid score function exists ([`RouterScore::Sigmoid`]).
//! 3. selection score s' = s + b, an f32 add. `b` is `[E]` **f32 only**: a bf16 bias is rejected
//!    (the correction bias is a trained f32 tensor and must never be truncated).
//! 4. group masking when `n_group > 1`: experts split into `n_group` contiguous groups of
//!    E / n_group; a group's score is the sum of its top-2 selection scores (its single score if
//!    the group has one expert); the `topk_group` best groups are kept (ties: lowest group index),
//!    experts of the other groups are never selected. K3 uses n_group = topk_group = 1 (no mask).
//! 5. I = the `top_k` experts with the largest s' among the unmasked ones, ordered by descending
//!    s', ties broken by the lowest expert index (a NaN s' ranks like -inf).
//! 6. weights, from the **unbiased** s: w_i = s_i / (Σ_{j∈I} s_j + 1e-20) when `renormalize`,
//!    else w_i = s_i; then w_i · `routed_scaling_factor` (the reference evaluates this in f64 and
//!    rounds once to f32).
//!
//! Outputs: `topk_ids[t, j]` (i32) is the j-th expert of I in the order of step 5 and
//! `topk_weights[t, j]` (f32) its weight. Selection is compared bit for bit across backends on
//! inputs without near-ties.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// The score function turning logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RouterScore {
    /// s = σ(ℓ) (K3, DeepSeek-V3).
    Sigmoid,
}

/// Shape and mode of a routing call.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeRouterParams {
    pub tokens: usize,
    /// Width of `x` and of each router weight row.
    pub hidden: usize,
    /// Number of routed experts E (global).
    pub experts: usize,
    /// Experts chosen per token, 1..=E.
    pub top_k: usize,
    /// Expert groups (1 = no group masking); must divide E.
    pub n_group: usize,
    /// Groups kept per token, 1..=n_group.
    pub topk_group: usize,
    /// Divide the chosen scores by their sum (+1e-20).
    pub renormalize: bool,
    /// Multiplies every weight (K3: 1.0); must be finite.
    pub routed_scaling_factor: f32,
    pub score: RouterScore,
}

impl MoeRouterParams {
    /// A sigmoid router picking `top_k` of `experts` without groups, renormalised, scaling 1.0
    /// (change fields with struct update syntax for the other variants).
    pub fn sigmoid(tokens: usize, hidden: usize, experts: usize, top_k: usize) -> Self {
        MoeRouterParams {
            tokens,
            hidden,
            experts,
            top_k,
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            routed_scaling_factor: 1.0,
            score: RouterScore::Sigmoid,
        }
    }

    /// The K3 router (E = 896, top-16, no groups, renormalised, scaling 1.0) for `tokens` tokens
    /// of width `hidden` (7168).
    pub fn k3(tokens: usize, hidden: usize) -> Self {
        Self::sigmoid(tokens, hidden, 896, 16)
    }
}

/// Tensor arguments.
#[derive(Debug)]
pub struct MoeRouterArgs<'a, B: Backend + ?Sized> {
    /// `[tokens, hidden]`, bf16 or f32.
    pub x: TensorRef<'a, B>,
    /// Router weight `[experts, hidden]`, bf16 or f32.
    pub weight: TensorRef<'a, B>,
    /// Score-correction bias `[experts]`, f32 only; `None` = zero bias.
    pub bias: Option<TensorRef<'a, B>>,
    /// `[tokens, top_k]`, i32.
    pub topk_ids: TensorMut<'a, B>,
    /// `[tokens, top_k]`, f32.
    pub topk_weights: TensorMut<'a, B>,
}

/// A validated routing call.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeRouterPlan {
    pub params: MoeRouterParams,
}

impl MoeRouterPlan {
    /// Backend-independent validation.
    pub fn new(p: &MoeRouterParams) -> Result<Self> {
        ensure(p.experts >= 1, "params.experts", || "at least one expert is needed".into())?;
        ensure(i32::try_from(p.experts).is_ok(), "params.experts", || format!("{} does not fit an i32 expert id", p.experts))?;
        ensure(p.hidden >= 1, "params.hidden", || "must be at least 1".into())?;
        ensure(p.top_k >= 1 && p.top_k <= p.experts, "params.top_k", || {
            format!("{} is outside 1..={} (the number of experts)", p.top_k, p.experts)
        })?;
        ensure(p.n_group >= 1 && p.experts.is_multiple_of(p.n_group), "params.n_group", || {
            format!("{} groups do not split {} experts evenly", p.n_group, p.experts)
        })?;
        ensure(p.topk_group >= 1 && p.topk_group <= p.n_group, "params.topk_group", || {
            format!("{} is outside 1..={} (n_group)", p.topk_group, p.n_group)
        })?;
        let selectable = p.topk_group * (p.experts / p.n_group);
        ensure(p.top_k <= selectable, "params.top_k", || {
            format!("{} exceeds the {selectable} experts left after keeping {} of {} groups", p.top_k, p.topk_group, p.n_group)
        })?;
        ensure(p.routed_scaling_factor.is_finite(), "params.routed_scaling_factor", || {
            format!("{} is not finite", p.routed_scaling_factor)
        })?;
        let sizes = [p.tokens.checked_mul(p.hidden), p.experts.checked_mul(p.hidden), p.tokens.checked_mul(p.experts)];
        ensure(sizes.iter().all(Option::is_some), "params.tokens", || "tensor sizes overflow usize".into())?;
        Ok(MoeRouterPlan { params: p.clone() })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MoeRouterArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.x.check(b, "x")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(p.tokens), Dim::Is(p.hidden)])?;
        a.weight.check(b, "weight")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(p.experts), Dim::Is(p.hidden)])?;
        if let Some(bias) = &a.bias {
            if bias.layout.dtype != DType::F32 {
                return Err(Error::invalid(
                    "bias",
                    format!(
                        "dtype {} not accepted: the router correction bias must stay f32 (never truncated)",
                        bias.layout.dtype
                    ),
                ));
            }
            bias.check(b, "bias")?.shape(&[Dim::Is(p.experts)])?;
        }
        a.topk_ids.check(b, "topk_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(p.tokens), Dim::Is(p.top_k)])?;
        a.topk_weights.check(b, "topk_weights")?.dtype(&[DType::F32])?.shape(&[Dim::Is(p.tokens), Dim::Is(p.top_k)])?;
        Ok(())
    }
}

/// The MoE router.
pub trait MoeRouter: Backend {
    /// Whether this backend can route with these params (reasons if not).
    fn supports(&self, params: &MoeRouterParams) -> Result<()>;
    fn plan(&self, params: &MoeRouterParams) -> Result<MoeRouterPlan> {
        let plan = MoeRouterPlan::new(params)?;
        MoeRouter::supports(self, params)?;
        Ok(plan)
    }
    /// Bytes of workspace `run` needs. Routing has no state across calls; the default (the CPU
    /// reference) needs none. The GPU backends stage the f32 logits of every (token, expert) in
    /// it (tokens x E rounded up to 4 floats, 16-byte aligned; past 8 tokens one such plane per
    /// split of the hidden size, which the selection adds in order), so the logits GEMV / GEMM can
    /// spread the router weight over the whole card before the per-token selection.
    fn workspace_size(&self, _plan: &MoeRouterPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MoeRouterPlan,
        args: MoeRouterArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder, MathClass};

impl MoeRouterParams {
    /// x (dtype `x`), the router weight (dtype `w`) and the f32 bias read, ids and weights
    /// written; 2·T·hidden·E FLOPs for the logits in the class of x and W (bf16 products are
    /// exact in the f32 accumulator the contract asks for), 6 vector FLOPs per (token, expert)
    /// for the sigmoid, bias and top-k selection.
    pub fn cost(&self, x: DType, w: DType) -> Result<Cost> {
        let (t, hid, e, k) = (dim(self.tokens), dim(self.hidden), dim(self.experts), dim(self.top_k));
        CostBuilder::new("params")
            .bytes(&[t, hid, elem_bytes(x)])
            .bytes(&[e, hid, elem_bytes(w)])
            .bytes(&[e, 4])
            .bytes(&[t, k, 8])
            .flops(matrix_class(x, w), &[2, t, hid, e])
            .flops(MathClass::Vector, &[t, e, 6])
            .build()
    }
}
