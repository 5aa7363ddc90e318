//! Norms: weighted RMSNorm, gated per-head RMSNorm and L2 normalisation (k3-architecture §2.1,
//! kinds 1, 2 and 4; kind 3, the weightless norm inside AttnRes scoring, is part of
//! [`crate::ops::AttnResMix`]).
//!
//! All statistics are taken in fp32 or wider from inputs decoded exactly to f32; results are
//! rounded once to the output dtype (round-to-nearest-even), except where [`RmsWeightOrder`]
//! asks for the HF intermediate rounding. ε is a per-call-site parameter (1e-5 for the
//! model-width norms, KDA `o_norm` and the latent norm; 1e-6 for MLA `q_a_layernorm` /
//! `kv_a_layernorm` and for the KDA q/k L2 norm) and must be finite and > 0.
//!
//! ## Weighted RMSNorm ([`RmsNorm`])
//!
//! Rows `x` `[M, D]`, weight `w` `[D]`, per row: `r = 1 / √(mean_i x_i² + ε)` and
//!
//! - [`RmsWeightOrder::F32`]: `out_i = round_out(w_i · (x_i · r))`, one rounding;
//! - [`RmsWeightOrder::CastBeforeWeight`] (the HF `KimiRMSNorm` order): the normalised value is
//!   first rounded to the dtype of `x` (the activation dtype), then multiplied by `w`:
//!   `out_i = round_out(w_i · round_x(x_i · r))`. With f32 `x` the two orders agree up to one
//!   f32 rounding; with bf16 `x` they differ by about one bf16 rounding, which bit-matching a
//!   bf16 reference needs.
//!
//! ## Gated per-head RMSNorm ([`GatedRmsNorm`], KDA `o_norm`, FLA `FusedRMSNormGated`)
//!
//! `o`, `gate` `[M, H, Dh]`, weight `w` `[Dh]` shared by every head; per (m, h):
//! `out[m,h,i] = round_out(w_i · o[m,h,i] / √(mean_i o[m,h,i]² + ε) · σ(gate[m,h,i]))`, the mean
//! over the Dh dims of one head.
//!
//! ## L2 norm ([`L2Norm`], FLA `l2norm`)
//!
//! Rows `x` `[M, D]`: `out_i = round_out(x_i / √(Σ_i x_i² + ε))`: a *sum*, not a mean, and ε
//! *inside* the root (not `max(‖x‖, ε)` as llama.cpp has it).
//!
//! Layouts: inputs need unit stride along the last dim and may have any outer strides; outputs
//! are contiguous. `M = 0` is an empty batch.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Activation dtypes accepted by every norm (inputs and outputs).
pub const NORM_DTYPES: &[DType] = &[DType::F32, DType::BF16];

/// ε must be a finite positive number.
pub(crate) fn check_eps(field: &str, eps: f32) -> Result<()> {
    ensure(eps.is_finite() && eps > 0.0, field, || format!("must be finite and > 0, got {eps}"))
}

/// `a × b × c` must fit in memory sizes.
pub(crate) fn check_product(field: &str, dims: &[usize]) -> Result<()> {
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(4));
    ensure(n.is_some_and(|n| n <= isize::MAX as usize), field, || format!("{dims:?} overflows"))
}

/// Where the weight multiply happens relative to the rounding of the normalised value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RmsWeightOrder {
    /// `w · (x · r)` in f32, rounded once.
    #[default]
    F32,
    /// HF order: `w · round_x(x · r)`, the normalised value rounded to `x`'s dtype first.
    CastBeforeWeight,
}

/// Shape and mode of a weighted RMSNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormParams {
    /// Rows (tokens).
    pub m: usize,
    /// Normalised width.
    pub d: usize,
    pub eps: f32,
    pub weight_order: RmsWeightOrder,
}

/// Tensor arguments of a weighted RMSNorm.
#[derive(Debug)]
pub struct RmsNormArgs<'a, B: Backend + ?Sized> {
    /// `[M, D]`, f32 or bf16, unit inner stride.
    pub x: TensorRef<'a, B>,
    /// `[D]`, f32 or bf16.
    pub w: TensorRef<'a, B>,
    /// `[M, D]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated weighted RMSNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormPlan {
    pub params: RmsNormParams,
}

impl RmsNormPlan {
    pub fn new(p: &RmsNormParams) -> Result<Self> {
        ensure(p.d >= 1, "params.d", || "must be at least 1".into())?;
        check_eps("params.eps", p.eps)?;
        check_product("params.m", &[p.m, p.d])?;
        Ok(RmsNormPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &RmsNormArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.x.check(b, "x")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.unit_inner_stride()?;
        a.w.check(b, "w")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.d)])?.unit_inner_stride()?;
        a.out.check(b, "out")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.contiguous()?;
        Ok(())
    }
}

/// Weighted RMSNorm over rows.
pub trait RmsNorm: Backend {
    fn supports(&self, params: &RmsNormParams) -> Result<()>;
    fn plan(&self, params: &RmsNormParams) -> Result<RmsNormPlan> {
        let plan = RmsNormPlan::new(params)?;
        RmsNorm::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &RmsNormPlan) -> usize {
        0
    }
    fn run(&self, plan: &RmsNormPlan, args: RmsNormArgs<'_, Self>, workspace: Option<&mut Self::Buffer>, stream: &Self::Stream) -> Result<()>;
}

/// Shape of a gated per-head RMSNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedRmsNormParams {
    /// Rows (tokens).
    pub m: usize,
    pub heads: usize,
    /// Normalised width (one head).
    pub head_dim: usize,
    pub eps: f32,
}

/// Tensor arguments of a gated per-head RMSNorm.
#[derive(Debug)]
pub struct GatedRmsNormArgs<'a, B: Backend + ?Sized> {
    /// `[M, H, Dh]`, f32 or bf16, unit inner stride.
    pub o: TensorRef<'a, B>,
    /// `[M, H, Dh]`, f32 or bf16, unit inner stride (pre-sigmoid gate logits).
    pub gate: TensorRef<'a, B>,
    /// `[Dh]`, f32 (the checkpoint dtype of `o_norm`) or bf16.
    pub w: TensorRef<'a, B>,
    /// `[M, H, Dh]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated gated per-head RMSNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedRmsNormPlan {
    pub params: GatedRmsNormParams,
}

impl GatedRmsNormPlan {
    pub fn new(p: &GatedRmsNormParams) -> Result<Self> {
        ensure(p.heads >= 1, "params.heads", || "must be at least 1".into())?;
        ensure(p.head_dim >= 1, "params.head_dim", || "must be at least 1".into())?;
        check_eps("params.eps", p.eps)?;
        check_product("params.m", &[p.m, p.heads, p.head_dim])?;
        Ok(GatedRmsNormPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &GatedRmsNormArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let dims = [Dim::Is(p.m), Dim::Is(p.heads), Dim::Is(p.head_dim)];
        a.o.check(b, "o")?.dtype(NORM_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
        a.gate.check(b, "gate")?.dtype(NORM_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
        a.w.check(b, "w")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.head_dim)])?.unit_inner_stride()?;
        a.out.check(b, "out")?.dtype(NORM_DTYPES)?.shape(&dims)?.contiguous()?;
        Ok(())
    }
}

/// Gated per-head RMSNorm `w · o / rms(o) · σ(gate)`.
pub trait GatedRmsNorm: Backend {
    fn supports(&self, params: &GatedRmsNormParams) -> Result<()>;
    fn plan(&self, params: &GatedRmsNormParams) -> Result<GatedRmsNormPlan> {
        let plan = GatedRmsNormPlan::new(params)?;
        GatedRmsNorm::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &GatedRmsNormPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &GatedRmsNormPlan,
        args: GatedRmsNormArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

/// Shape of an L2 normalisation.
#[derive(Clone, Debug, PartialEq)]
pub struct L2NormParams {
    /// Rows (tokens × heads, say).
    pub m: usize,
    /// Normalised width.
    pub d: usize,
    pub eps: f32,
}

/// Tensor arguments of an L2 normalisation.
#[derive(Debug)]
pub struct L2NormArgs<'a, B: Backend + ?Sized> {
    /// `[M, D]`, f32 or bf16, unit inner stride.
    pub x: TensorRef<'a, B>,
    /// `[M, D]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated L2 normalisation.
#[derive(Clone, Debug, PartialEq)]
pub struct L2NormPlan {
    pub params: L2NormParams,
}

impl L2NormPlan {
    pub fn new(p: &L2NormParams) -> Result<Self> {
        ensure(p.d >= 1, "params.d", || "must be at least 1".into())?;
        check_eps("params.eps", p.eps)?;
        check_product("params.m", &[p.m, p.d])?;
        Ok(L2NormPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &L2NormArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.x.check(b, "x")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.unit_inner_stride()?;
        a.out.check(b, "out")?.dtype(NORM_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.contiguous()?;
        Ok(())
    }
}

/// L2 normalisation `x / √(Σx² + ε)` over rows.
pub trait L2Norm: Backend {
    fn supports(&self, params: &L2NormParams) -> Result<()>;
    fn plan(&self, params: &L2NormParams) -> Result<L2NormPlan> {
        let plan = L2NormPlan::new(params)?;
        L2Norm::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &L2NormPlan) -> usize {
        0
    }
    fn run(&self, plan: &L2NormPlan, args: L2NormArgs<'_, Self>, workspace: Option<&mut Self::Buffer>, stream: &Self::Stream) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl RmsNormParams {
    /// x read, out written, the weight once; 4 FLOPs per value (square-add, scale, weight).
    pub fn cost(&self, x: DType, w: DType, out: DType) -> Result<Cost> {
        let (m, d) = (dim(self.m), dim(self.d));
        CostBuilder::new("params")
            .bytes(&[m, d, elem_bytes(x)])
            .bytes(&[m, d, elem_bytes(out)])
            .bytes(&[d, elem_bytes(w)])
            .flops(MathClass::Vector, &[m, d, 4])
            .build()
    }
}

impl GatedRmsNormParams {
    /// o and the gate read, out written, the f32 weight once; 8 FLOPs per value (the norm, the
    /// weight, the sigmoid gate).
    pub fn cost(&self, o: DType, gate: DType, out: DType) -> Result<Cost> {
        let (m, h, d) = (dim(self.m), dim(self.heads), dim(self.head_dim));
        CostBuilder::new("params")
            .bytes(&[m, h, d, elem_bytes(o)])
            .bytes(&[m, h, d, elem_bytes(gate)])
            .bytes(&[m, h, d, elem_bytes(out)])
            .bytes(&[d, 4])
            .flops(MathClass::Vector, &[m, h, d, 8])
            .build()
    }
}
