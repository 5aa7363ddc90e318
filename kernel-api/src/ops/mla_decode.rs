//! MLA decode over the paged latent cache: the absorbed (MQA) form of K3's gated NoPE MLA
//! (k3-architecture.md 2.4), plus its ragged-prefill sibling [`MlaPrefillAbsorbed`].
//!
//! # What is computed
//!
//! The caller absorbs W_UK into the query: for head h, `q̂_h = (W_UK^h)ᵀ q_nope_h` (`latent`
//! values) followed by `q_pe_h` (`rope` values), one `latent + rope` row per (token, head). Every
//! head attends to the same cached keys (MQA): token s of a sequence holds `c_s` (`latent`) and
//! `k_pe_s` (`rope`), stored in one of the [`KvCacheFormat`]s and decoded with
//! [`kv_cache::decode_token`](super::kv_cache::decode_token). For query row i of sequence b:
//!
//! - `score(s) = (q̂ · c_s + q_pe · k_pe_s) · softmax_scale` for keys `s < limit(i)`;
//! - `p = softmax(score)` over those keys (computed in f32/f64);
//! - `out = Σ_s p_s c_s` (the latent context ĉ, `latent` values; the caller applies W_UV, which
//!   cannot be folded into W_o because K3's sigmoid gate sits between them);
//! - `lse = ln Σ_s exp(score(s))` (natural log, scale included). A row that sees no key has
//!   `out = 0`, `lse = -inf`.
//!
//! `softmax_scale` is that of the naive form, `1/sqrt(qk_nope + rope)`: for K3 `1/sqrt(192)`
//! ([`K3_SOFTMAX_SCALE`]), **not** `1/sqrt(576)` although the absorbed dot product runs over 576
//! values.
//!
//! # Masks and positions
//!
//! Decode: sequence b has `seq_lens[b]` tokens in the cache, the last `q_len` of which are the
//! new queries. Query i (0-based) sits at position `seq_lens[b] - q_len + i` and sees keys
//! `0..=that position` (causal tail mask, `limit(i) = seq_lens[b] - q_len + i + 1`). A sequence
//! with `seq_lens[b] < q_len` is invalid. Prefill (ragged, `cu_seqlens_q`): the same with the
//! sequence's own `q_len_b` when `causal`; without `causal` every query sees all `seq_lens[b]`
//! keys (the cache holds only prior context).
//!
//! # Paged cache addressing
//!
//! Token s of sequence b lives in page `block_table[b][s / page_size]`, row `s % page_size`.
//! Only the `ceil(seq_lens[b] / page_size)` leading entries of a block-table row are read; later
//! entries may hold anything (padding such as -1). Every entry read must be in `[0, num_pages)`.
//! The cache tensor is `[num_pages, page_size, bytes_per_token]` `u8` for every format (one row
//! of bytes per token in the layout of [`super::kv_cache`]), or `[num_pages, page_size,
//! latent + rope]` `bf16` for the `Bf16` format. Page and row strides are free (a layer slice of
//! a bigger pool works); the innermost stride must be 1.
//!
//! Page sizes are 1, 64 or 128 ([`MLA_PAGE_SIZES`]). The GPU kernels stream the cache in tiles
//! of 64 tokens (FlashMLA's 64 x 576 block, AITER Gluon's 64/128-token KV blocks): with pages of
//! 64 or 128 a tile never straddles a page, so one block-table read feeds one contiguous tile
//! load (TMA / async copy). Page size 1 is the token-granular gather mode of AITER's asm and
//! Gluon kernels (one index per token). Other sizes would need a third, per-token-gather-within-
//! a-tile addressing mode that no K3 stack uses, so the contract does not offer them.
//!
//! # Variants
//!
//! Both variants compute the same function; they differ in the plan (what a GPU launches):
//! - [`MlaDecodeVariant::AsmStyle`] (AITER asm / FlashMLA pattern): fixed-shape kernels for
//!   `q_len` in {1, 2, 4} ([`ASM_Q_LENS`]); heads in groups of [`HEAD_GROUP`] = 16 with the
//!   real head count masked (12 heads: one group, no padding copy); persistent: the plan cuts the
//!   work into items (batch, head group, kv range) balanced over the compute units and a reduce
//!   map that merges the partials of a split (batch, head group) by LSE.
//! - [`MlaDecodeVariant::GluonStyle`] (AITER Gluon pattern): one generic tiled kernel, heads in
//!   16-blocks with masking, `q_len` up to 16, a uniform grid (batch, head group, split) with
//!   `num_splits` kv splits per sequence and a stage-2 reduce.
//! - [`MlaDecodeVariant::Auto`] takes AsmStyle when it can serve the request, else GluonStyle.
//!
//! The schedule ([`MlaSchedule`]) is exposed: GPU backends launch from it, and the CPU reference
//! executes it (each item's partial (out, lse) goes through the workspace, then the reduce map
//! merges partials), so split and unsplit plans exercise different code.
//!
//! # Workspace
//!
//! Partial results of split (batch, head group) pairs live in the caller's workspace: for partial
//! slot p, `out` f32 `[q_len, HEAD_GROUP, latent]` at byte [`MlaDecodePlan::partial_out_offset`]
//! (rows [`MlaDecodePlan::partial_row_pitch`] floats apart: latent rounded up to 4) and `lse`
//! f32 `[q_len, HEAD_GROUP]` at [`MlaDecodePlan::partial_lse_offset`] (all outs first, then all
//! LSEs; masked head rows are unused). Items that cover a whole (batch, head group)
//! write `out`/`lse` directly and need no slot. An unsplit Gluon plan needs no workspace.
//!
//! AsmStyle plans also reserve room, after the LSEs at byte [`MlaDecodePlan::schedule_offset`],
//! for the schedule as a GPU keeps it (i32): `items` `[n_items, 4]` = (batch x head groups + head
//! group, kv_start, kv_end, slot or -1), `cu_indptr` `[compute_units + 1]`, then, from the next
//! 16-byte boundary, `reduce` `[n_reduce, 4]` = (batch, head group, first slot, count). The
//! schedule offset is a multiple of 64 bytes (each slot's LSE block is 64 x q_len bytes), so an
//! item and a reduce entry are one 16-byte load each. [`MlaDecodePlan::schedule_arrays`] gives
//! the three offsets. GPU backends rebuild it there with a device kernel from `seq_lens`
//! (AITER's `get_mla_metadata_v1`: `run` never uploads); the CPU reference executes the host copy
//! and leaves those bytes alone.
//! [`MlaDecode::prepare_schedule`] builds it once per decode step and [`MlaDecode::run_prepared`]
//! reuses it in every MLA layer with the same plan and workspace (`run` builds it on every call).
//! The kernels that read it check every entry against the plan's bounds (batch, head groups,
//! the block table's keys, the partial slots), so bytes overwritten between the two calls give a
//! typed error naming `workspace`, never an access outside the tensors.
//!
//! # Dtypes
//!
//! `q`: f32 or bf16. `kv_cache`: u8 (any format) or bf16 (`Bf16` format). `block_table`,
//! `seq_lens` (and prefill `cu_seqlens_q`): i32. `out`: f32 or bf16 (rounded once). `lse`: f32.

mod partition;
mod prefill;
mod prepared;

pub use prepared::MlaPreparedSchedule;
pub use partition::{MlaReduceEntry, MlaSchedule, MlaWorkItem, ASM_MIN_CHUNK_TOKENS, GLUON_MIN_SPLIT_TOKENS};
pub use prefill::{
    MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaPrefillAbsorbedPlan, MlaPrefillAbsorbedWorkItem, PREFILL_Q_TILE,
};

use super::kv_cache::{KvCacheFormat, KvDims};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Reasons, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Page sizes the contract accepts (see the module docs for why only these).
pub const MLA_PAGE_SIZES: [usize; 3] = [1, 64, 128];
/// Largest decode `q_len` (MTP / speculative verify with up to 15 drafts).
pub const MLA_MAX_Q_LEN: usize = 16;
/// Query lengths the asm-style fixed-shape kernels exist for.
pub const ASM_Q_LENS: [usize; 3] = [1, 2, 4];
/// Heads one kernel tile processes; the last group of a head count that is not a multiple is
/// masked, never padded by a copy.
pub const HEAD_GROUP: usize = 16;
/// Largest head count (K3: 96 total, 12 per rank at TP8). Bounds the plan's metadata size.
pub const MLA_MAX_HEADS: usize = 1024;
/// Largest `latent` or `rope` width. Bounds byte-size arithmetic (K3: 512 and 64).
pub const MLA_MAX_DIM: usize = 1 << 16;
/// Largest explicit split count and compute-unit count a plan accepts.
pub const MLA_MAX_SPLITS: usize = 256;
pub const MLA_MAX_COMPUTE_UNITS: u32 = 1 << 16;
/// Largest `batch x head_groups x splits` of one plan (keeps the schedule's u32 indices and
/// its host memory bounded).
pub const MLA_MAX_WORK_ITEMS: usize = 1 << 24;
/// K3's query/key head dim in the naive form: 128 nope + 64 pe.
pub const K3_QK_HEAD_DIM: usize = 192;
/// K3's softmax scale, 1/sqrt(192) (not 1/sqrt(576)).
pub const K3_SOFTMAX_SCALE: f32 = 0.072168784;

/// The paged latent cache one MLA layer reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaPagedCache {
    pub dims: KvDims,
    pub format: KvCacheFormat,
    /// Tokens per page: 1, 64 or 128.
    pub page_size: usize,
    /// Pages in the cache tensor.
    pub num_pages: usize,
    /// Flat-fp8 per-tensor dequantisation scale (`value = fp8 · kv_scale`); must be finite and
    /// positive for `Fp8Flat`, ignored by the other formats.
    pub kv_scale: f32,
}

impl MlaPagedCache {
    /// Backend-independent validation; errors name `params.cache.*`.
    pub fn validate(&self) -> Result<()> {
        let d = self.dims;
        ensure(d.latent >= 1 && d.latent <= MLA_MAX_DIM, "params.cache.dims.latent", || {
            format!("must be in 1..={MLA_MAX_DIM}, got {}", d.latent)
        })?;
        ensure(d.rope <= MLA_MAX_DIM, "params.cache.dims.rope", || format!("must be at most {MLA_MAX_DIM}, got {}", d.rope))?;
        ensure(MLA_PAGE_SIZES.contains(&self.page_size), "params.cache.page_size", || {
            format!("{} is not one of {:?} (kernels tile the cache by 64 tokens or gather per token)", self.page_size, MLA_PAGE_SIZES)
        })?;
        ensure(!self.format.uses_tensor_scale() || (self.kv_scale.is_finite() && self.kv_scale > 0.0), "params.cache.kv_scale", || {
            format!("must be finite and positive for {}, got {}", self.format.name(), self.kv_scale)
        })?;
        // Bytes of the whole cache must be addressable.
        let bytes = self.num_pages.checked_mul(self.page_size).and_then(|t| t.checked_mul(self.bytes_per_token()));
        ensure(bytes.is_some(), "params.cache.num_pages", || "num_pages x page_size x bytes_per_token overflows".into())
    }

    /// Bytes per cached token (valid dims only: checked by [`Self::validate`]).
    pub fn bytes_per_token(&self) -> usize {
        self.format.bytes_per_token(self.dims)
    }

    /// Checks the cache tensor: `[num_pages, page_size, bytes_per_token]` u8, or `[num_pages,
    /// page_size, latent + rope]` bf16 for the `Bf16` format; innermost stride 1.
    pub fn check_tensor<B: Backend + ?Sized>(&self, b: &B, t: &TensorRef<'_, B>, field: &str) -> Result<()> {
        let (np, ps) = (Dim::Is(self.num_pages), Dim::Is(self.page_size));
        let c = t.check(b, field)?;
        match (t.layout.dtype, self.format) {
            (DType::U8, _) => c.shape(&[np, ps, Dim::Is(self.bytes_per_token())])?,
            (DType::BF16, KvCacheFormat::Bf16) => c.shape(&[np, ps, Dim::Is(self.dims.width())])?,
            (dt, f) => {
                return Err(Error::invalid(
                    field,
                    format!("dtype {dt} not accepted for the {} cache (u8 for every format, bf16 for bf16)", f.name()),
                ))
            }
        }
        .unit_inner_stride()?;
        Ok(())
    }

    /// Validates the host page table of a batch and returns the sequence lengths.
    /// `block_table` is row-major `[seq_lens.len(), max_pages_per_seq]`.
    pub(crate) fn validate_batch(&self, seq_lens: &[i32], block_table: &[i32], max_pages_per_seq: usize) -> Result<Vec<u32>> {
        let rows = seq_lens.len();
        let want = rows.checked_mul(max_pages_per_seq);
        ensure(want == Some(block_table.len()), "batch.block_table", || {
            format!("{} entries for {rows} sequences x {max_pages_per_seq} pages", block_table.len())
        })?;
        let capacity = max_pages_per_seq.checked_mul(self.page_size);
        let mut lens = Vec::with_capacity(rows);
        for (b, &len) in seq_lens.iter().enumerate() {
            ensure(len >= 0, "batch.seq_lens", || format!("seq_lens[{b}] = {len} is negative"))?;
            let len = len as usize;
            ensure(capacity.is_none_or(|c| len <= c), "batch.seq_lens", || {
                format!("seq_lens[{b}] = {len} exceeds the page table's capacity {max_pages_per_seq} x {}", self.page_size)
            })?;
            let row = &block_table[b * max_pages_per_seq..(b + 1) * max_pages_per_seq];
            for (j, &page) in row.iter().take(len.div_ceil(self.page_size)).enumerate() {
                ensure(page >= 0 && (page as usize) < self.num_pages, "batch.block_table", || {
                    format!("block_table[{b}][{j}] = {page} is outside [0, {})", self.num_pages)
                })?;
            }
            lens.push(len as u32);
        }
        Ok(lens)
    }
}

fn check_heads(heads: usize) -> Result<()> {
    ensure((1..=MLA_MAX_HEADS).contains(&heads), "params.heads", || format!("must be in 1..={MLA_MAX_HEADS}, got {heads}"))
}

fn check_softmax_scale(s: f32) -> Result<()> {
    ensure(s.is_finite() && s > 0.0, "params.softmax_scale", || format!("must be finite and positive, got {s}"))
}

/// Which decode plan to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlaDecodeVariant {
    /// AsmStyle when it can take the request, else GluonStyle.
    Auto,
    /// Fixed-shape persistent kernels with a work partition and a reduce step.
    AsmStyle,
    /// One generic tiled kernel with split-KV and a stage-2 reduce.
    GluonStyle,
}

/// The variant a plan resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlaKernel {
    Asm,
    Gluon,
}

/// How the kv dimension is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlaSplitPolicy {
    /// Balance over the blocks the device runs at once: `device_info().compute_units` in the
    /// trait's default `plan`, times the attention kernels' resident blocks per unit where the
    /// backend knows them (the GPU backends: 2 per CU on gfx942 / gfx950). The asm partition
    /// fills those slots; Gluon picks the most splits that still run in one wave (see
    /// [`MlaSchedule`]).
    Auto,
    /// As `Auto`, for a device with this many block slots (tuning, tests).
    ComputeUnits(u32),
    /// Exactly this many kv splits per sequence (GluonStyle only; AsmStyle partitions by
    /// compute units and reports it as unsupported).
    NumSplits(usize),
}

/// Shape and mode of an absorbed MLA decode.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaDecodeParams {
    pub cache: MlaPagedCache,
    /// Query heads (any count in 1..=1024; 12, 24, 48, 96 natively, no padding copies).
    pub heads: usize,
    /// New tokens per sequence, 1..=16 (the same for every sequence of the batch).
    pub q_len: usize,
    /// Scale of the naive form (K3: [`K3_SOFTMAX_SCALE`]).
    pub softmax_scale: f32,
    pub variant: MlaDecodeVariant,
    pub splits: MlaSplitPolicy,
}

/// Host copy of the batch metadata (FlashInfer-style plan input). The device copies passed to
/// `run` must hold the same values.
#[derive(Clone, Copy, Debug)]
pub struct MlaDecodeBatch<'a> {
    /// `[batch]`: tokens in the cache per sequence, including the `q_len` new ones.
    pub seq_lens: &'a [i32],
    /// `[batch, max_pages_per_seq]` row-major page ids.
    pub block_table: &'a [i32],
    pub max_pages_per_seq: usize,
}

/// Tensor arguments of [`MlaDecode::run`].
#[derive(Debug)]
pub struct MlaDecodeArgs<'a, B: Backend + ?Sized> {
    /// `[batch, q_len, heads, latent + rope]` f32 or bf16: `[q̂ | q_pe]` per head.
    pub q: TensorRef<'a, B>,
    /// `[num_pages, page_size, bytes_per_token]` u8, or `[num_pages, page_size, latent + rope]` bf16.
    pub kv_cache: TensorRef<'a, B>,
    /// `[batch, max_pages_per_seq]` i32.
    pub block_table: TensorRef<'a, B>,
    /// `[batch]` i32.
    pub seq_lens: TensorRef<'a, B>,
    /// `[batch, q_len, heads, latent]` f32 or bf16: the latent context ĉ.
    pub out: TensorMut<'a, B>,
    /// `[batch, q_len, heads]` f32 natural-log LSE; optional.
    pub lse: Option<TensorMut<'a, B>>,
}

/// A validated decode with its launch schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaDecodePlan {
    pub params: MlaDecodeParams,
    pub kernel: MlaKernel,
    pub batch: usize,
    pub max_pages_per_seq: usize,
    /// Host copy of `seq_lens`.
    pub seq_lens: Vec<u32>,
    /// `ceil(heads / HEAD_GROUP)`.
    pub head_groups: usize,
    pub schedule: MlaSchedule,
}

impl MlaDecodePlan {
    /// All backend-independent validation, variant resolution and the schedule. `compute_units`:
    /// the blocks the device runs at once (see [`MlaSplitPolicy::Auto`]), used unless the split
    /// policy names its own.
    pub fn new(p: &MlaDecodeParams, batch: &MlaDecodeBatch<'_>, compute_units: u32) -> Result<Self> {
        p.cache.validate()?;
        check_heads(p.heads)?;
        ensure((1..=MLA_MAX_Q_LEN).contains(&p.q_len), "params.q_len", || format!("must be in 1..={MLA_MAX_Q_LEN}, got {}", p.q_len))?;
        check_softmax_scale(p.softmax_scale)?;
        let cus = match p.splits {
            MlaSplitPolicy::Auto => compute_units.clamp(1, MLA_MAX_COMPUTE_UNITS),
            MlaSplitPolicy::ComputeUnits(n) => {
                ensure((1..=MLA_MAX_COMPUTE_UNITS).contains(&n), "params.splits", || {
                    format!("compute units must be in 1..={MLA_MAX_COMPUTE_UNITS}, got {n}")
                })?;
                n
            }
            MlaSplitPolicy::NumSplits(n) => {
                ensure((1..=MLA_MAX_SPLITS).contains(&n), "params.splits", || {
                    format!("num_splits must be in 1..={MLA_MAX_SPLITS}, got {n}")
                })?;
                1
            }
        };
        let seq_lens = p.cache.validate_batch(batch.seq_lens, batch.block_table, batch.max_pages_per_seq)?;
        for (b, &len) in seq_lens.iter().enumerate() {
            ensure(len as usize >= p.q_len, "batch.seq_lens", || {
                format!("seq_lens[{b}] = {len} is shorter than q_len {} (the new tokens must be in the cache)", p.q_len)
            })?;
        }
        let kernel = match p.variant {
            MlaDecodeVariant::AsmStyle => {
                asm_support(p).into_result()?;
                MlaKernel::Asm
            }
            MlaDecodeVariant::GluonStyle => MlaKernel::Gluon,
            MlaDecodeVariant::Auto if asm_support(p).into_result().is_ok() => MlaKernel::Asm,
            MlaDecodeVariant::Auto => MlaKernel::Gluon,
        };
        let head_groups = p.heads.div_ceil(HEAD_GROUP);
        let splits = match p.splits {
            MlaSplitPolicy::NumSplits(n) => n,
            _ => 1,
        };
        let tiles = seq_lens.len().checked_mul(head_groups * splits);
        ensure(tiles.is_some_and(|t| t <= MLA_MAX_WORK_ITEMS), "batch.seq_lens", || {
            format!("{} sequences x {head_groups} head groups x {splits} splits exceed {MLA_MAX_WORK_ITEMS} work items", seq_lens.len())
        })?;
        let schedule = match (kernel, p.splits) {
            (MlaKernel::Asm, _) => MlaSchedule::asm(&seq_lens, head_groups, cus),
            (MlaKernel::Gluon, MlaSplitPolicy::NumSplits(n)) => MlaSchedule::gluon(&seq_lens, head_groups, n),
            (MlaKernel::Gluon, _) => {
                MlaSchedule::gluon(&seq_lens, head_groups, MlaSchedule::gluon_auto_splits(&seq_lens, head_groups, cus))
            }
        };
        let plan = MlaDecodePlan {
            params: p.clone(),
            kernel,
            batch: seq_lens.len(),
            max_pages_per_seq: batch.max_pages_per_seq,
            seq_lens,
            head_groups,
            schedule,
        };
        ensure(plan.workspace_bytes_checked().is_some(), "params.splits", || "workspace size overflows usize".into())?;
        Ok(plan)
    }

    fn slot_floats(&self) -> (usize, usize) {
        let rows = self.params.q_len * HEAD_GROUP;
        (rows * self.partial_row_pitch(), rows)
    }

    /// Floats from one row of a partial slot's `out` to the next: `latent` rounded up to a
    /// multiple of 4, so that the reduce reads every row in 16-byte loads (the pad floats are
    /// never written and never reach the output).
    pub fn partial_row_pitch(&self) -> usize {
        self.params.cache.dims.latent.next_multiple_of(4)
    }

    fn partial_bytes_checked(&self) -> Option<usize> {
        let (o, l) = self.slot_floats();
        self.schedule.num_partials.checked_mul(o + l)?.checked_mul(4)
    }

    /// Byte offsets of the device schedule's `items`, `cu_indptr` and `reduce` arrays and its end
    /// (asm plans; see the module docs). `reduce` starts on a 16-byte boundary.
    fn schedule_layout_checked(&self) -> Option<[usize; 4]> {
        let s = &self.schedule;
        let items = self.partial_bytes_checked()?;
        if self.kernel == MlaKernel::Gluon {
            return Some([items; 4]);
        }
        let cu_indptr = items.checked_add(s.items.len().checked_mul(16)?)?;
        let reduce = cu_indptr.checked_add(s.cu_indptr.len().checked_mul(4)?)?.checked_next_multiple_of(16)?;
        Some([items, cu_indptr, reduce, reduce.checked_add(s.reduce.len().checked_mul(16)?)?])
    }

    fn workspace_bytes_checked(&self) -> Option<usize> {
        self.schedule_layout_checked().map(|l| l[3])
    }

    /// Byte offsets in the workspace of the device schedule's `items`, `cu_indptr` and `reduce`
    /// arrays (asm plans; the module docs, "Workspace").
    pub fn schedule_arrays(&self) -> (usize, usize, usize) {
        let [items, cu_indptr, reduce, _] = self.schedule_layout_checked().unwrap_or([usize::MAX; 4]);
        (items, cu_indptr, reduce)
    }

    /// Bytes of workspace the plan needs: the partials, plus the device schedule of asm plans
    /// (0 for an unsplit Gluon plan).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes_checked().unwrap_or(usize::MAX)
    }

    /// Byte offset of the device schedule (asm plans): right after the partial LSEs.
    pub fn schedule_offset(&self) -> usize {
        self.partial_bytes_checked().unwrap_or(usize::MAX)
    }

    /// Byte offset of partial slot `p`'s `out` block (f32 `[q_len, HEAD_GROUP, latent]`, rows
    /// [`partial_row_pitch`](Self::partial_row_pitch) floats apart).
    pub fn partial_out_offset(&self, p: usize) -> usize {
        p * self.slot_floats().0 * 4
    }

    /// Byte offset of partial slot `p`'s `lse` block (f32 `[q_len, HEAD_GROUP]`).
    pub fn partial_lse_offset(&self, p: usize) -> usize {
        let (o, l) = self.slot_floats();
        (self.schedule.num_partials * o + p * l) * 4
    }

    /// Checks every tensor argument against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MlaDecodeArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let (n, t, h) = (Dim::Is(self.batch), Dim::Is(p.q_len), Dim::Is(p.heads));
        a.q.check(b, "q")?.dtype(&[DType::F32, DType::BF16])?.shape(&[n, t, h, Dim::Is(p.cache.dims.width())])?.unit_inner_stride()?;
        p.cache.check_tensor(b, &a.kv_cache, "kv_cache")?;
        a.block_table.check(b, "block_table")?.dtype(&[DType::I32])?.shape(&[n, Dim::Is(self.max_pages_per_seq)])?;
        a.seq_lens.check(b, "seq_lens")?.dtype(&[DType::I32])?.shape(&[n])?;
        a.out.check(b, "out")?.dtype(&[DType::F32, DType::BF16])?.shape(&[n, t, h, Dim::Is(p.cache.dims.latent)])?.unit_inner_stride()?;
        if let Some(l) = &a.lse {
            l.check(b, "lse")?.dtype(&[DType::F32])?.shape(&[n, t, h])?;
        }
        Ok(())
    }
}

/// Why the asm-style kernels cannot take a request (empty when they can).
fn asm_support(p: &MlaDecodeParams) -> Reasons {
    let mut r = Reasons::new();
    r.require(ASM_Q_LENS.contains(&p.q_len), "params.q_len", format!("asm-style kernels exist for q_len {ASM_Q_LENS:?}, not {}", p.q_len));
    r.require(
        !matches!(p.splits, MlaSplitPolicy::NumSplits(_)),
        "params.splits",
        "the asm-style plan partitions work over compute units; a fixed num_splits is GluonStyle only",
    );
    r
}

/// Absorbed MLA decode over the paged latent cache.
pub trait MlaDecode: Backend {
    /// Whether this backend can run the request (reasons if not).
    fn supports(&self, params: &MlaDecodeParams) -> Result<()>;
    fn plan(&self, params: &MlaDecodeParams, batch: &MlaDecodeBatch<'_>) -> Result<MlaDecodePlan> {
        let plan = MlaDecodePlan::new(params, batch, self.device_info().compute_units)?;
        MlaDecode::supports(self, params)?;
        Ok(plan)
    }
    /// The partials and LSEs of the plan's splits (see the module docs for the layout).
    fn workspace_size(&self, plan: &MlaDecodePlan) -> usize {
        plan.workspace_bytes()
    }
    /// Builds the plan's schedule in `workspace` and runs the decode.
    fn run(
        &self,
        plan: &MlaDecodePlan,
        args: MlaDecodeArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
    /// Writes the plan's device schedule into `workspace` once (asm plans on GPU backends, from
    /// the device `seq_lens` `[batch]` i32; Gluon plans and the CPU reference have nothing to
    /// write) and returns the receipt [`Self::run_prepared`] takes: every MLA layer of a decode
    /// step with this plan then skips the schedule launch. See [`MlaPreparedSchedule`] for how a
    /// stale schedule is refused.
    fn prepare_schedule(
        &self,
        plan: &MlaDecodePlan,
        seq_lens: &TensorRef<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<MlaPreparedSchedule>;
    /// [`Self::run`] with the schedule [`Self::prepare_schedule`] wrote into this `workspace`
    /// for this plan (an `InvalidInput` naming `schedule` otherwise). The workspace's schedule
    /// bytes must not be written in between; its partials may be (each run rewrites them).
    fn run_prepared(
        &self,
        plan: &MlaDecodePlan,
        schedule: &MlaPreparedSchedule,
        args: MlaDecodeArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder, MathClass};

impl MlaDecodeParams {
    /// One decode call over `batch` sequences holding `kv_tokens` cached tokens in all (the sum
    /// of `seq_lens`, the new `q_len` tokens included); `q` and `out` are the query and output
    /// dtypes.
    ///
    /// Bytes: every cached token once (the heads of a sequence share it: MQA), q, out and lse,
    /// the block-table entries read and seq_lens. FLOPs: per (query row, head, key it sees)
    /// 2·(latent + rope) for the score and 2·latent for the context, in the class of q against
    /// a bf16 key (fp8 caches are dequantised to bf16 on chip; an f32 q runs on the vector
    /// units); 5 vector FLOPs per score for the online softmax, and for fp8 caches one dequant
    /// FLOP per cached value and head group of 16.
    pub fn cost(&self, batch: usize, kv_tokens: u64, q: DType, out: DType) -> Result<Cost> {
        let (b, h, ql) = (dim(batch), dim(self.heads), dim(self.q_len));
        let (lat, rope) = (dim(self.cache.dims.latent), dim(self.cache.dims.rope));
        let width = lat.saturating_add(rope);
        // Causal tail: query i of a sequence sees len - q_len + i + 1 keys.
        let tail = b.saturating_mul(ql.saturating_mul(ql.saturating_sub(1)) / 2);
        let seen = ql.checked_mul(kv_tokens).map(|x| x.saturating_sub(tail));
        let Some(seen) = seen else { return Err(Error::invalid("params", "q_len x kv_tokens overflows u64")) };
        let fp8 = !matches!(self.cache.format, KvCacheFormat::Bf16) as u64;
        let page = dim(self.cache.page_size).max(1);
        CostBuilder::new("params")
            .bytes(&[kv_tokens, dim(self.cache.bytes_per_token())])
            .bytes(&[b, ql, h, width, elem_bytes(q)])
            .bytes(&[b, ql, h, lat, elem_bytes(out)])
            .bytes(&[b, ql, h, 4])
            .bytes(&[(kv_tokens / page).saturating_add(b), 4])
            .bytes(&[b, 4])
            .flops(matrix_class(q, DType::BF16), &[seen, h, 2, width.saturating_add(lat)])
            .flops(MathClass::Vector, &[seen, h, 5])
            .flops(MathClass::Vector, &[fp8, kv_tokens, width, h.div_ceil(HEAD_GROUP as u64)])
            .build()
    }
}
