//! LSE merge: combines partial attention outputs computed over disjoint key sets (split-KV,
//! decode context parallelism, chunked-context prefill) into the result over their union.
//!
//! Semantics, per (token t, head h), over parts p = 0..P:
//! - lse = log Σ_p exp(lse_p)            (natural log; parts with lse_p = -inf contribute nothing)
//! - out = Σ_p exp(lse_p - lse) · out_p
//! - when every part is empty (all lse_p = -inf): out = 0, lse = -inf.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Shape of a merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LseMergeParams {
    pub parts: usize,
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// Tensor arguments.
#[derive(Debug)]
pub struct LseMergeArgs<'a, B: Backend + ?Sized> {
    /// `[parts, tokens, heads, head_dim]`, f32 or bf16.
    pub partial_out: TensorRef<'a, B>,
    /// `[parts, tokens, heads]`, f32 natural-log LSE.
    pub partial_lse: TensorRef<'a, B>,
    /// `[tokens, heads, head_dim]`, f32 or bf16.
    pub out: TensorMut<'a, B>,
    /// `[tokens, heads]`, f32; optional.
    pub lse: Option<TensorMut<'a, B>>,
}

/// A validated merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LseMergePlan {
    pub params: LseMergeParams,
}

impl LseMergePlan {
    /// Backend-independent validation.
    pub fn new(p: &LseMergeParams) -> Result<Self> {
        ensure(p.parts >= 1, "parts", || "at least one part is needed".into())?;
        ensure(p.heads >= 1, "heads", || "must be at least 1".into())?;
        ensure(p.head_dim >= 1, "head_dim", || "must be at least 1".into())?;
        let n = p.parts.checked_mul(p.tokens).and_then(|x| x.checked_mul(p.heads)).and_then(|x| x.checked_mul(p.head_dim));
        ensure(n.is_some(), "tokens", || "parts x tokens x heads x head_dim overflows".into())?;
        Ok(LseMergePlan { params: p.clone() })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &LseMergeArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.partial_out
            .check(b, "partial_out")?
            .dtype(&[DType::F32, DType::BF16])?
            .shape(&[Dim::Is(p.parts), Dim::Is(p.tokens), Dim::Is(p.heads), Dim::Is(p.head_dim)])?;
        a.partial_lse.check(b, "partial_lse")?.dtype(&[DType::F32])?.shape(&[
            Dim::Is(p.parts),
            Dim::Is(p.tokens),
            Dim::Is(p.heads),
        ])?;
        a.out.check(b, "out")?.dtype(&[DType::F32, DType::BF16])?.shape(&[
            Dim::Is(p.tokens),
            Dim::Is(p.heads),
            Dim::Is(p.head_dim),
        ])?;
        if let Some(l) = &a.lse {
            l.check(b, "lse")?.dtype(&[DType::F32])?.shape(&[Dim::Is(p.tokens), Dim::Is(p.heads)])?;
        }
        Ok(())
    }
}

/// LSE merge of partial attention outputs.
pub trait LseMerge: Backend {
    /// Whether this backend can run the merge (reasons if not).
    fn supports(&self, params: &LseMergeParams) -> Result<()>;
    fn plan(&self, params: &LseMergeParams) -> Result<LseMergePlan> {
        let plan = LseMergePlan::new(params)?;
        LseMerge::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &LseMergePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &LseMergePlan,
        args: LseMergeArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}
