//! Elementwise ops: SiTU-GLU, sigmoid gate and embedding gather. Each computes in f32 or wider
//! from inputs decoded exactly to f32 and rounds once to the output dtype.
//!
//! ## SiTU-GLU ([`SituGlu`], k3-architecture §2.5)
//!
//! `out[m, n] = round_out(SiTU(gate[m, n], up[m, n]))` with
//!
//! ```text
//! SiTU(g, u) = β·tanh(g/β)·σ(g) · β_l·tanh(u/β_l)        (β_l = linear_beta)
//! SiTU(g, u) = β·tanh(g/β)·σ(g) · u                      (linear_beta = None: up uncapped)
//! ```
//!
//! K3 uses β = 4, β_l = 25 (a null `activation_situ_beta` means 1.0; the loader maps that).
//! Both betas must be finite and > 0. The input is either two tensors `gate`, `up` `[M, N]` or
//! one fused `[M, 2N]` tensor whose columns `0..N` are the gate and `N..2N` the up branch
//! (the output of a fused gate|up projection).
//!
//! ## Sigmoid gate ([`SigmoidGate`])
//!
//! `out[m, n] = round_out(x[m, n] · σ(g[m, n]))`, the MLA output gate.
//!
//! ## Embedding gather ([`EmbeddingGather`])
//!
//! `out[m, :] = table[ids[m], :]`, ids i32 or i64 in `0..V`. With the output dtype equal to the
//! table's (or f32 out of a bf16 table) the copy is exact. The plan takes the host copy of the
//! ids and rejects any outside `0..V`; the CPU run re-checks the ids it reads, a GPU kernel checks
//! each id it reads (an out-of-range row is written as NaN and reported; see
//! [device metadata](crate::ops#device-metadata)).
//!
//! Accepted dtypes: activations and tables f32 or bf16; ids i32 or i64.
//! Layouts: inputs need unit stride along the last dim, any row stride (so `gate`/`g` may be a
//! column slice of a wider projection output); outputs are contiguous. `M = 0` is an empty batch.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::ops::norm::check_product;
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Activation dtypes accepted by the elementwise ops.
pub const ELEMENTWISE_DTYPES: &[DType] = &[DType::F32, DType::BF16];

fn check_beta(field: &str, beta: f32) -> Result<()> {
    ensure(beta.is_finite() && beta > 0.0, field, || format!("must be finite and > 0, got {beta}"))
}

/// Shape and constants of a SiTU-GLU.
#[derive(Clone, Debug, PartialEq)]
pub struct SituGluParams {
    /// Rows (tokens).
    pub m: usize,
    /// Output width N (the FFN intermediate size).
    pub n: usize,
    /// β of the gate soft cap (`activation_situ_beta`).
    pub beta: f32,
    /// β_l of the up-branch cap (`activation_situ_linear_beta`); `None` = no cap.
    pub linear_beta: Option<f32>,
}

/// Where the gate and up branches come from.
#[derive(Debug)]
pub enum SituGluInput<'a, B: Backend + ?Sized> {
    /// `gate`, `up` `[M, N]` each, f32 or bf16, unit inner stride.
    Separate { gate: TensorRef<'a, B>, up: TensorRef<'a, B> },
    /// `[M, 2N]`, f32 or bf16, unit inner stride: gate in columns `0..N`, up in `N..2N`.
    Fused(TensorRef<'a, B>),
}

/// Tensor arguments of a SiTU-GLU.
#[derive(Debug)]
pub struct SituGluArgs<'a, B: Backend + ?Sized> {
    pub input: SituGluInput<'a, B>,
    /// `[M, N]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated SiTU-GLU.
#[derive(Clone, Debug, PartialEq)]
pub struct SituGluPlan {
    pub params: SituGluParams,
}

impl SituGluPlan {
    pub fn new(p: &SituGluParams) -> Result<Self> {
        ensure(p.n >= 1, "params.n", || "must be at least 1".into())?;
        check_beta("params.beta", p.beta)?;
        if let Some(bl) = p.linear_beta {
            check_beta("params.linear_beta", bl)?;
        }
        check_product("params.n", &[p.n, 2])?;
        check_product("params.m", &[p.m, p.n, 2])?;
        Ok(SituGluPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &SituGluArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let dims = [Dim::Is(p.m), Dim::Is(p.n)];
        match &a.input {
            SituGluInput::Separate { gate, up } => {
                gate.check(b, "gate")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
                up.check(b, "up")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
            }
            SituGluInput::Fused(gu) => {
                gu.check(b, "gate_up")?.dtype(ELEMENTWISE_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(2 * p.n)])?.unit_inner_stride()?;
            }
        }
        a.out.check(b, "out")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.contiguous()?;
        Ok(())
    }
}

/// SiTU-GLU activation of the dense MLP, shared and routed experts.
pub trait SituGlu: Backend {
    fn supports(&self, params: &SituGluParams) -> Result<()>;
    fn plan(&self, params: &SituGluParams) -> Result<SituGluPlan> {
        let plan = SituGluPlan::new(params)?;
        SituGlu::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &SituGluPlan) -> usize {
        0
    }
    fn run(&self, plan: &SituGluPlan, args: SituGluArgs<'_, Self>, workspace: Option<&mut Self::Buffer>, stream: &Self::Stream) -> Result<()>;
}

/// Shape of a sigmoid gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigmoidGateParams {
    pub m: usize,
    pub n: usize,
}

/// Tensor arguments of a sigmoid gate.
#[derive(Debug)]
pub struct SigmoidGateArgs<'a, B: Backend + ?Sized> {
    /// `[M, N]`, f32 or bf16, unit inner stride.
    pub x: TensorRef<'a, B>,
    /// `[M, N]` gate logits, f32 or bf16, unit inner stride, any row stride.
    pub g: TensorRef<'a, B>,
    /// `[M, N]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated sigmoid gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigmoidGatePlan {
    pub params: SigmoidGateParams,
}

impl SigmoidGatePlan {
    pub fn new(p: &SigmoidGateParams) -> Result<Self> {
        ensure(p.n >= 1, "params.n", || "must be at least 1".into())?;
        check_product("params.m", &[p.m, p.n])?;
        Ok(SigmoidGatePlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &SigmoidGateArgs<'_, B>) -> Result<()> {
        let dims = [Dim::Is(self.params.m), Dim::Is(self.params.n)];
        a.x.check(b, "x")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
        a.g.check(b, "g")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.unit_inner_stride()?;
        a.out.check(b, "out")?.dtype(ELEMENTWISE_DTYPES)?.shape(&dims)?.contiguous()?;
        Ok(())
    }
}

/// `out = x · σ(g)`.
pub trait SigmoidGate: Backend {
    fn supports(&self, params: &SigmoidGateParams) -> Result<()>;
    fn plan(&self, params: &SigmoidGateParams) -> Result<SigmoidGatePlan> {
        let plan = SigmoidGatePlan::new(params)?;
        SigmoidGate::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &SigmoidGatePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &SigmoidGatePlan,
        args: SigmoidGateArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

/// Shape of an embedding gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingGatherParams {
    /// Table rows V (vocabulary size).
    pub vocab: usize,
    /// Embedding width D.
    pub d: usize,
    /// Number of ids M (tokens).
    pub m: usize,
}

/// Tensor arguments of an embedding gather.
#[derive(Debug)]
pub struct EmbeddingGatherArgs<'a, B: Backend + ?Sized> {
    /// `[V, D]`, f32 or bf16, unit inner stride.
    pub table: TensorRef<'a, B>,
    /// `[M]`, i32 or i64, the same values the plan was given.
    pub ids: TensorRef<'a, B>,
    /// `[M, D]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated gather; the ids it was planned with were all in `0..V`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingGatherPlan {
    pub params: EmbeddingGatherParams,
}

impl EmbeddingGatherPlan {
    /// Validates the params and the host copy of the ids.
    pub fn new(p: &EmbeddingGatherParams, host_ids: &[i64]) -> Result<Self> {
        ensure(p.vocab >= 1, "params.vocab", || "must be at least 1".into())?;
        ensure(p.d >= 1, "params.d", || "must be at least 1".into())?;
        check_product("params.vocab", &[p.vocab, p.d])?;
        check_product("params.m", &[p.m, p.d])?;
        ensure(host_ids.len() == p.m, "ids", || format!("{} host ids for params.m = {}", host_ids.len(), p.m))?;
        check_ids(host_ids, p.vocab)?;
        Ok(EmbeddingGatherPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &EmbeddingGatherArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.table.check(b, "table")?.dtype(ELEMENTWISE_DTYPES)?.shape(&[Dim::Is(p.vocab), Dim::Is(p.d)])?.unit_inner_stride()?;
        a.ids.check(b, "ids")?.dtype(&[DType::I32, DType::I64])?.shape(&[Dim::Is(p.m)])?;
        a.out.check(b, "out")?.dtype(ELEMENTWISE_DTYPES)?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.contiguous()?;
        Ok(())
    }
}

/// Every id must index a table row.
pub(crate) fn check_ids(ids: &[i64], vocab: usize) -> Result<()> {
    match ids.iter().position(|&t| t < 0 || t as u64 >= vocab as u64) {
        Some(i) => Err(Error::invalid("ids", format!("ids[{i}] = {} is outside 0..{vocab}", ids[i]))),
        None => Ok(()),
    }
}

/// Embedding lookup `out[m] = table[ids[m]]`.
pub trait EmbeddingGather: Backend {
    fn supports(&self, params: &EmbeddingGatherParams) -> Result<()>;
    /// Plans a gather of these host ids (the same values the `ids` tensor will hold).
    fn plan(&self, params: &EmbeddingGatherParams, host_ids: &[i64]) -> Result<EmbeddingGatherPlan> {
        let plan = EmbeddingGatherPlan::new(params, host_ids)?;
        EmbeddingGather::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &EmbeddingGatherPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &EmbeddingGatherPlan,
        args: EmbeddingGatherArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl SituGluParams {
    /// The gate and up halves read, out written; 14 FLOPs per output (two tanh soft caps, a
    /// sigmoid, the products).
    pub fn cost(&self, input: DType, out: DType) -> Result<Cost> {
        let (m, n) = (dim(self.m), dim(self.n));
        CostBuilder::new("params")
            .bytes(&[m, n, 2, elem_bytes(input)])
            .bytes(&[m, n, elem_bytes(out)])
            .flops(MathClass::Vector, &[m, n, 14])
            .build()
    }
}

impl SigmoidGateParams {
    /// x and g read, out written; 4 FLOPs per value.
    pub fn cost(&self, x: DType, g: DType, out: DType) -> Result<Cost> {
        let (m, n) = (dim(self.m), dim(self.n));
        CostBuilder::new("params")
            .bytes(&[m, n, elem_bytes(x)])
            .bytes(&[m, n, elem_bytes(g)])
            .bytes(&[m, n, elem_bytes(out)])
            .flops(MathClass::Vector, &[m, n, 4])
            .build()
    }
}

impl EmbeddingGatherParams {
    /// The ids and the M gathered rows read, out written. No FLOPs.
    pub fn cost(&self, table: DType, ids: DType, out: DType) -> Result<Cost> {
        let (m, d) = (dim(self.m), dim(self.d));
        CostBuilder::new("params")
            .bytes(&[m, elem_bytes(ids)])
            .bytes(&[m, d, elem_bytes(table)])
            .bytes(&[m, d, elem_bytes(out)])
            .build()
    }
}
