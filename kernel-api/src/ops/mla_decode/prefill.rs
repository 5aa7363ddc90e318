//! Absorbed MLA over ragged query blocks (chunked prefill over the cached context): the decode
//! math of the parent module for `q_len_b` queries per sequence given by `cu_seqlens_q`.
//! Sequence b's queries are rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `q`; with `causal`
//! query i of the block sits at `seq_lens[b] - q_len_b + i` (so `seq_lens[b] >= q_len_b`),
//! without it every query sees all `seq_lens[b]` keys. Empty blocks (`q_len_b = 0`) are
//! allowed; a query that sees no key gets `out = 0`, `lse = -inf`.

use super::{check_heads, check_softmax_scale, MlaPagedCache, HEAD_GROUP, MLA_MAX_WORK_ITEMS};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Query rows one prefill work item covers.
pub const PREFILL_Q_TILE: usize = 64;

/// Shape and mode of an absorbed ragged prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaPrefillAbsorbedParams {
    pub cache: MlaPagedCache,
    pub heads: usize,
    pub softmax_scale: f32,
    /// Causal tail mask (the new tokens are in the cache) or full visibility (cache = prior
    /// context only).
    pub causal: bool,
}

/// Host copy of the batch metadata; the device copies passed to `run` must hold the same values.
#[derive(Clone, Copy, Debug)]
pub struct MlaPrefillAbsorbedBatch<'a> {
    /// `[batch + 1]`, starting at 0, non-decreasing; the last entry is `total_q`.
    pub cu_seqlens_q: &'a [i32],
    /// `[batch]`: cached tokens per sequence (keys).
    pub seq_lens: &'a [i32],
    /// `[batch, max_pages_per_seq]` row-major page ids.
    pub block_table: &'a [i32],
    pub max_pages_per_seq: usize,
}

/// Tensor arguments of [`MlaPrefillAbsorbed::run`].
#[derive(Debug)]
pub struct MlaPrefillAbsorbedArgs<'a, B: Backend + ?Sized> {
    /// `[total_q, heads, latent + rope]` f32 or bf16.
    pub q: TensorRef<'a, B>,
    /// As in decode.
    pub kv_cache: TensorRef<'a, B>,
    /// `[batch + 1]` i32.
    pub cu_seqlens_q: TensorRef<'a, B>,
    /// `[batch]` i32.
    pub seq_lens: TensorRef<'a, B>,
    /// `[batch, max_pages_per_seq]` i32.
    pub block_table: TensorRef<'a, B>,
    /// `[total_q, heads, latent]` f32 or bf16.
    pub out: TensorMut<'a, B>,
    /// `[total_q, heads]` f32; optional.
    pub lse: Option<TensorMut<'a, B>>,
}

/// Up to [`PREFILL_Q_TILE`] query rows (`q_start..q_end`, rows of `q`) of one sequence and one
/// head group, over all of the sequence's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaPrefillAbsorbedWorkItem {
    pub batch: u32,
    pub head_group: u32,
    pub q_start: u32,
    pub q_end: u32,
}

/// A validated prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaPrefillAbsorbedPlan {
    pub params: MlaPrefillAbsorbedParams,
    pub batch: usize,
    pub total_q: usize,
    pub max_pages_per_seq: usize,
    pub cu_seqlens_q: Vec<u32>,
    pub seq_lens: Vec<u32>,
    pub head_groups: usize,
    pub items: Vec<MlaPrefillAbsorbedWorkItem>,
}

impl MlaPrefillAbsorbedPlan {
    pub fn new(p: &MlaPrefillAbsorbedParams, batch: &MlaPrefillAbsorbedBatch<'_>) -> Result<Self> {
        p.cache.validate()?;
        check_heads(p.heads)?;
        check_softmax_scale(p.softmax_scale)?;
        let cu = batch.cu_seqlens_q;
        ensure(cu.len() == batch.seq_lens.len() + 1, "batch.cu_seqlens_q", || {
            format!("{} entries for {} sequences (need batch + 1)", cu.len(), batch.seq_lens.len())
        })?;
        ensure(cu.first() == Some(&0), "batch.cu_seqlens_q", || format!("must start at 0, got {:?}", cu.first()))?;
        for (b, w) in cu.windows(2).enumerate() {
            ensure(w[1] >= w[0], "batch.cu_seqlens_q", || format!("decreases at {b}: {} -> {}", w[0], w[1]))?;
        }
        let seq_lens = p.cache.validate_batch(batch.seq_lens, batch.block_table, batch.max_pages_per_seq)?;
        let head_groups = p.heads.div_ceil(HEAD_GROUP);
        let mut items = Vec::new();
        for (b, &len) in seq_lens.iter().enumerate() {
            let (q0, q1) = (cu[b] as usize, cu[b + 1] as usize);
            ensure(!p.causal || q1 - q0 <= len as usize, "batch.seq_lens", || {
                format!("seq_lens[{b}] = {len} is shorter than its {} causal queries", q1 - q0)
            })?;
            let tiles = (q1 - q0).div_ceil(PREFILL_Q_TILE);
            ensure(items.len() + tiles * head_groups <= MLA_MAX_WORK_ITEMS, "batch.cu_seqlens_q", || {
                format!("more than {MLA_MAX_WORK_ITEMS} work items")
            })?;
            for t in 0..tiles {
                for g in 0..head_groups {
                    let start = q0 + t * PREFILL_Q_TILE;
                    let end = (start + PREFILL_Q_TILE).min(q1);
                    items.push(MlaPrefillAbsorbedWorkItem { batch: b as u32, head_group: g as u32, q_start: start as u32, q_end: end as u32 });
                }
            }
        }
        Ok(MlaPrefillAbsorbedPlan {
            params: p.clone(),
            batch: seq_lens.len(),
            total_q: cu.last().map_or(0, |&t| t as usize),
            max_pages_per_seq: batch.max_pages_per_seq,
            cu_seqlens_q: cu.iter().map(|&c| c as u32).collect(),
            seq_lens,
            head_groups,
            items,
        })
    }

    /// Checks every tensor argument against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MlaPrefillAbsorbedArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let (n, t, h) = (Dim::Is(self.batch), Dim::Is(self.total_q), Dim::Is(p.heads));
        a.q.check(b, "q")?.dtype(&[DType::F32, DType::BF16])?.shape(&[t, h, Dim::Is(p.cache.dims.width())])?.unit_inner_stride()?;
        p.cache.check_tensor(b, &a.kv_cache, "kv_cache")?;
        a.cu_seqlens_q.check(b, "cu_seqlens_q")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.batch + 1)])?;
        a.seq_lens.check(b, "seq_lens")?.dtype(&[DType::I32])?.shape(&[n])?;
        a.block_table.check(b, "block_table")?.dtype(&[DType::I32])?.shape(&[n, Dim::Is(self.max_pages_per_seq)])?;
        a.out.check(b, "out")?.dtype(&[DType::F32, DType::BF16])?.shape(&[t, h, Dim::Is(p.cache.dims.latent)])?.unit_inner_stride()?;
        if let Some(l) = &a.lse {
            l.check(b, "lse")?.dtype(&[DType::F32])?.shape(&[t, h])?;
        }
        Ok(())
    }
}

/// Absorbed MLA attention of ragged query blocks over the paged latent cache.
pub trait MlaPrefillAbsorbed: Backend {
    fn supports(&self, params: &MlaPrefillAbsorbedParams) -> Result<()>;
    fn plan(&self, params: &MlaPrefillAbsorbedParams, batch: &MlaPrefillAbsorbedBatch<'_>) -> Result<MlaPrefillAbsorbedPlan> {
        let plan = MlaPrefillAbsorbedPlan::new(params, batch)?;
        MlaPrefillAbsorbed::supports(self, params)?;
        Ok(plan)
    }
    /// No split-KV: the items write `out`/`lse` directly.
    fn workspace_size(&self, _plan: &MlaPrefillAbsorbedPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MlaPrefillAbsorbedPlan,
        args: MlaPrefillAbsorbedArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}
