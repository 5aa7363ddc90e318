//! MoE align/sort by expert (vLLM `moe_align_block_size` semantics, kernel-anchors.md 5.1).
//!
//! Input: `topk_ids[t, slot]` (i32), the expert of routing pair p = t·top_k + slot. Optionally an
//! `expert_map[E_global]` (i32) maps a global expert id to this rank's local id, -1 = not on this
//! rank (expert parallelism); the pairs of such experts are dropped. Without a map, ids are local.
//!
//! Output, with P = tokens·top_k, sentinel = P and M = `block_m`:
//! - `sorted_token_ids[max_padded]`: the pair indices grouped by local expert in ascending
//!   expert order, stable within an expert (ascending p); each expert's run is padded with the
//!   sentinel up to a multiple of M (an expert with no pairs has an empty run). Right after the
//!   last run (from index `num_tokens_post_padded` on) come the pairs no local expert serves
//!   (dropped by the expert map; on the GPU also pairs with an invalid id, which are reported),
//!   in ascending order and not padded; every later entry is the sentinel. So every pair is
//!   listed exactly once, and the grouped GEMMs write every row of their output (the unserved
//!   rows as zeros) without clearing it first. They fit: the runs take at most
//!   P_served + E_local·(M - 1) entries, so runs plus unserved pairs take at most
//!   P + E_local·(M - 1) <= max_padded.
//! - `expert_ids[max_padded / M]`: the local expert of each M-block of `sorted_token_ids`; -1 for
//!   the tail blocks (blocks at or past `num_tokens_post_padded`, which hold the unserved pairs
//!   and then sentinels).
//! - `num_tokens_post_padded[1]`: Σ_e roundup(count_e, M), a device scalar (never read back by
//!   the host: buffers are sized for the worst case).
//!
//! max_padded = roundup(P + E_local·(M - 1), M), fixed at plan time, so no host sync is needed.
//! Each GEMM tile then serves one expert: it reads M entries of `sorted_token_ids` and skips the
//! sentinels. Ids outside [0, E) (or outside the map) are invalid input; the CPU reference reports
//! them as an error naming `topk_ids` (or `expert_map`).

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// The shape of a block-aligned routing: what the align op produces and the grouped GEMMs read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeRouting {
    pub tokens: usize,
    pub top_k: usize,
    /// Experts on this rank (rows of the expert weight tensors); local ids are 0..experts.
    pub experts: usize,
    /// Rows per GEMM tile; every expert's run is padded to a multiple of it.
    pub block_m: usize,
}

impl MoeRouting {
    /// Routing pairs P = tokens·top_k (`None` on overflow).
    pub fn pairs(&self) -> Option<usize> {
        self.tokens.checked_mul(self.top_k)
    }
    /// The padding value of `sorted_token_ids`: P.
    pub fn sentinel(&self) -> Option<usize> {
        self.pairs()
    }
    /// Worst-case padded length roundup(P + E·(M-1), M) (`None` on overflow or M = 0).
    pub fn max_padded(&self) -> Option<usize> {
        if self.block_m == 0 {
            return None;
        }
        let raw = self.pairs()?.checked_add(self.experts.checked_mul(self.block_m - 1)?)?;
        raw.div_ceil(self.block_m).checked_mul(self.block_m)
    }
    /// Number of M-blocks (length of `expert_ids`).
    pub fn num_blocks(&self) -> Option<usize> {
        Some(self.max_padded()? / self.block_m)
    }

    /// Validates the routing shape; `prefix` names the params field (`params.routing`).
    pub fn validate(&self, prefix: &str) -> Result<()> {
        let f = |name: &str| format!("{prefix}.{name}");
        ensure(self.block_m >= 1, &f("block_m"), || "must be at least 1".into())?;
        ensure(self.top_k >= 1, &f("top_k"), || "must be at least 1".into())?;
        ensure(self.experts >= 1, &f("experts"), || "at least one local expert is needed".into())?;
        ensure(i32::try_from(self.experts).is_ok(), &f("experts"), || format!("{} does not fit an i32 id", self.experts))?;
        let fits = self.max_padded().is_some_and(|m| i32::try_from(m).is_ok());
        ensure(fits, &f("tokens"), || {
            format!(
                "tokens·top_k + experts·(block_m-1) = {}·{} + {}·{} does not fit an i32 index",
                self.tokens,
                self.top_k,
                self.experts,
                self.block_m.saturating_sub(1)
            )
        })
    }
}

/// Shape of an align call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeAlignParams {
    pub routing: MoeRouting,
    /// `Some(E_global)`: `topk_ids` hold global ids in 0..E_global and `expert_map[E_global]`
    /// is given; `None`: ids are local (0..routing.experts) and there is no map.
    pub global_experts: Option<usize>,
}

/// Tensor arguments.
#[derive(Debug)]
pub struct MoeAlignArgs<'a, B: Backend + ?Sized> {
    /// `[tokens, top_k]`, i32.
    pub topk_ids: TensorRef<'a, B>,
    /// `[global_experts]`, i32 local id or -1; present iff `params.global_experts` is.
    pub expert_map: Option<TensorRef<'a, B>>,
    /// `[max_padded]`, i32.
    pub sorted_token_ids: TensorMut<'a, B>,
    /// `[max_padded / block_m]`, i32.
    pub expert_ids: TensorMut<'a, B>,
    /// `[1]`, i32.
    pub num_tokens_post_padded: TensorMut<'a, B>,
}

/// A validated align call with its worst-case sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeAlignPlan {
    pub params: MoeAlignParams,
    /// Length of `sorted_token_ids`.
    pub max_padded: usize,
    /// Length of `expert_ids`.
    pub num_blocks: usize,
}

impl MoeAlignPlan {
    /// Backend-independent validation.
    pub fn new(p: &MoeAlignParams) -> Result<Self> {
        p.routing.validate("params.routing")?;
        if let Some(g) = p.global_experts {
            ensure(g >= 1 && i32::try_from(g).is_ok(), "params.global_experts", || format!("{g} is outside 1..=i32::MAX"))?;
        }
        let max_padded = p.routing.max_padded().ok_or_else(|| Error::invalid("params.routing", "size overflows"))?;
        Ok(MoeAlignPlan { params: p.clone(), max_padded, num_blocks: max_padded / p.routing.block_m })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MoeAlignArgs<'_, B>) -> Result<()> {
        let r = &self.params.routing;
        a.topk_ids.check(b, "topk_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(r.tokens), Dim::Is(r.top_k)])?;
        match (self.params.global_experts, &a.expert_map) {
            (Some(g), Some(m)) => {
                m.check(b, "expert_map")?.dtype(&[DType::I32])?.shape(&[Dim::Is(g)])?;
            }
            (None, Some(_)) => return Err(Error::invalid("expert_map", "given but params.global_experts is None")),
            (Some(_), None) => return Err(Error::invalid("expert_map", "params.global_experts is set but no map is given")),
            (None, None) => {}
        }
        a.sorted_token_ids.check(b, "sorted_token_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.max_padded)])?;
        a.expert_ids.check(b, "expert_ids")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.num_blocks)])?;
        a.num_tokens_post_padded.check(b, "num_tokens_post_padded")?.dtype(&[DType::I32])?.shape(&[Dim::Is(1)])?;
        Ok(())
    }

    /// Workspace a GPU needs: per-expert counts and padded offsets, (E_local + 1) i32.
    pub fn workspace_bytes(&self) -> usize {
        (self.params.routing.experts + 1) * 4
    }
}

/// Sort routing pairs by expert into block-padded runs.
pub trait MoeAlign: Backend {
    fn supports(&self, params: &MoeAlignParams) -> Result<()>;
    fn plan(&self, params: &MoeAlignParams) -> Result<MoeAlignPlan> {
        let plan = MoeAlignPlan::new(params)?;
        MoeAlign::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, plan: &MoeAlignPlan) -> usize {
        plan.workspace_bytes()
    }
    fn run(
        &self,
        plan: &MoeAlignPlan,
        args: MoeAlignArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, Cost, CostBuilder};

impl MoeRouting {
    /// Experts expected to serve at least one pair when every token picks `top_k` distinct
    /// experts uniformly at random (how the published MoE kernel benchmarks route):
    /// E·(1 − (1 − k/E)^T), rounded down, at least `top_k` (capped at E) for T ≥ 1.
    pub fn expected_experts_touched(&self) -> usize {
        if self.tokens == 0 || self.experts == 0 {
            return 0;
        }
        let (e, k) = (self.experts as f64, self.top_k.min(self.experts) as f64);
        let miss = (1.0 - k / e).powf(self.tokens as f64);
        ((e * (1.0 - miss)).floor() as usize).clamp(self.top_k.min(self.experts), self.experts)
    }
}

impl MoeAlignParams {
    /// topk_ids read; sorted_token_ids, expert_ids and the padded count written; the expert
    /// map read. No FLOPs.
    pub fn cost(&self) -> Result<Cost> {
        let r = &self.routing;
        let (Some(pairs), Some(padded), Some(blocks)) = (r.pairs(), r.max_padded(), r.num_blocks()) else {
            return Err(Error::invalid("params.routing", "tokens·top_k + experts·(block_m-1) overflows"));
        };
        CostBuilder::new("params")
            .bytes(&[dim(pairs), 4])
            .bytes(&[dim(padded), 4])
            .bytes(&[dim(blocks), 4])
            .bytes(&[4])
            .bytes(&[dim(self.global_experts.unwrap_or(0)), 4])
            .build()
    }
}
