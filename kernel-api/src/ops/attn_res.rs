//! AttnRes Mix (Block Attention Residuals, k3-architecture §2.2): the softmax-weighted mix over
//! depth that replaces the residual stream at every sublayer input and at the output head.
//!
//! Inputs: `sources` `[S, M, D]`, the bank entries in append order followed by the current
//! partial sum (S = 1..=9 in K3; the contract accepts 1..=[`MAX_SOURCES`]), and the score
//! vector `w` `[D]` (f32).
//! Per row m, all in f32 or wider:
//!
//! ```text
//! s_i   = Σ_j w_j · v[i,m,j] / √(mean_j v[i,m,j]² + ε)      (scores on RMS-normalised values)
//! π     = softmax_i(s)                                       (over the S sources)
//! out[m,j] = round_out( Σ_i π_i · v[i,m,j] )                 (sum over the RAW values)
//! ```
//!
//! - The weightless RMS normalisation is norm kind 3 of §2.1; its weight is folded into `w`.
//! - `w = res_norm.weight ⊙ res_proj.weight[0, :]`, computed once at load by
//!   [`attn_res_score_vector`]. The product of two bf16 values is exact in f32.
//! - Consequences a test can see: `w = 0` gives the plain average of the sources; `S = 1`
//!   returns the source (π = 1); sources that are positive multiples of each other get equal
//!   scores.
//! - ε = `rms_norm_eps` (1e-5 in K3), finite and > 0.
//!
//! Accepted dtypes: `sources` f32 or bf16; `w` f32; `out` f32 or bf16.
//! Layouts: `sources` needs unit stride along D (any stride over S and M, so the bank can be a
//! slice of a larger buffer); `w` unit stride; `out` `[M, D]` contiguous. `M = 0` is an empty
//! batch.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::ops::norm::{check_eps, check_product};
use crate::tensor::{Dim, HostTensor, TensorMut, TensorRef};

/// The most sources one mix takes. K3 needs at most 9 (8 block snapshots + the partial sum); a
/// GPU kernel keeps one score per source on chip, and the bound also keeps a zero-stride
/// `sources` view from standing for an unbounded number of sources.
pub const MAX_SOURCES: usize = 64;

/// Shape of one mix.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnResMixParams {
    /// Number of sources S (bank length + 1).
    pub sources: usize,
    /// Rows (tokens).
    pub m: usize,
    /// Hidden width D.
    pub d: usize,
    pub eps: f32,
}

/// Tensor arguments of one mix.
#[derive(Debug)]
pub struct AttnResMixArgs<'a, B: Backend + ?Sized> {
    /// `[S, M, D]`, f32 or bf16, unit inner stride: bank entries in append order, then p.
    pub sources: TensorRef<'a, B>,
    /// `[D]`, f32: the score vector from [`attn_res_score_vector`].
    pub score_vector: TensorRef<'a, B>,
    /// `[M, D]`, f32 or bf16, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated mix.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnResMixPlan {
    pub params: AttnResMixParams,
}

impl AttnResMixPlan {
    pub fn new(p: &AttnResMixParams) -> Result<Self> {
        ensure((1..=MAX_SOURCES).contains(&p.sources), "params.sources", || {
            format!("{} sources; a mix takes 1..={MAX_SOURCES}", p.sources)
        })?;
        ensure(p.d >= 1, "params.d", || "must be at least 1".into())?;
        check_eps("params.eps", p.eps)?;
        check_product("params.m", &[p.sources, p.m, p.d])?;
        Ok(AttnResMixPlan { params: p.clone() })
    }

    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &AttnResMixArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.sources
            .check(b, "sources")?
            .dtype(&[DType::F32, DType::BF16])?
            .shape(&[Dim::Is(p.sources), Dim::Is(p.m), Dim::Is(p.d)])?
            .unit_inner_stride()?;
        a.score_vector.check(b, "score_vector")?.dtype(&[DType::F32])?.shape(&[Dim::Is(p.d)])?.unit_inner_stride()?;
        a.out.check(b, "out")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(p.m), Dim::Is(p.d)])?.contiguous()?;
        Ok(())
    }
}

/// The AttnRes depth mix.
pub trait AttnResMix: Backend {
    fn supports(&self, params: &AttnResMixParams) -> Result<()>;
    fn plan(&self, params: &AttnResMixParams) -> Result<AttnResMixPlan> {
        let plan = AttnResMixPlan::new(params)?;
        AttnResMix::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &AttnResMixPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &AttnResMixPlan,
        args: AttnResMixArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

/// The score vector `w_j = norm_weight_j · proj_weight[0, j]` in f32, computed once at load.
///
/// `norm_weight` is `[D]` and `proj_weight` `[1, D]` (the checkpoint shape) or `[D]`; each f32
/// or bf16. The result is an f32 `[D]` host tensor (exact when both inputs are bf16).
pub fn attn_res_score_vector(norm_weight: &HostTensor, proj_weight: &HostTensor) -> Result<HostTensor> {
    let float = [DType::F32, DType::BF16];
    ensure(float.contains(&norm_weight.dtype), "norm_weight", || format!("dtype {} not accepted (f32 or bf16)", norm_weight.dtype))?;
    ensure(float.contains(&proj_weight.dtype), "proj_weight", || format!("dtype {} not accepted (f32 or bf16)", proj_weight.dtype))?;
    let [d] = norm_weight.shape[..] else {
        return Err(Error::invalid("norm_weight", format!("shape {:?} is not [D]", norm_weight.shape)));
    };
    ensure(d >= 1, "norm_weight", || "D must be at least 1".into())?;
    ensure(proj_weight.shape == [1, d] || proj_weight.shape == [d], "proj_weight", || {
        format!("shape {:?} is not [1, {d}] or [{d}]", proj_weight.shape)
    })?;
    let (nw, pw) = (norm_weight.to_f32(), proj_weight.to_f32());
    ensure(nw.len() == d && pw.len() == d, "norm_weight", || "byte length does not match the shape".into())?;
    let w: Vec<f32> = nw.iter().zip(&pw).map(|(a, b)| a * b).collect();
    HostTensor::from_f32(DType::F32, &[d], &w)
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl AttnResMixParams {
    /// The S sources read once, out written, the f32 score vector; 7 FLOPs per source value
    /// (the RMS statistics, the score dot product, the weighted sum) on the vector units.
    pub fn cost(&self, sources: DType, out: DType) -> Result<Cost> {
        let (s, m, d) = (dim(self.sources), dim(self.m), dim(self.d));
        CostBuilder::new("params")
            .bytes(&[s, m, d, elem_bytes(sources)])
            .bytes(&[m, d, elem_bytes(out)])
            .bytes(&[d, 4])
            .flops(MathClass::Vector, &[s, m, d, 7])
            .build()
    }
}
