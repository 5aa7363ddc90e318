//! KDA chunked prefill (FlashKDA / FLA `chunk_kda` semantics): the delta-rule recurrence of
//! k3-architecture.md §2.3 over a varlen batch, with an indexed state pool updated in place and
//! optional state checkpoints at chosen token offsets (prefix caching).
//!
//! # Batch
//! Sequence n owns tokens `cu_seqlens[n] .. cu_seqlens[n+1]` of the packed `[T, ..]` inputs.
//! `cu_seqlens` (N+1 entries) starts at 0, is non-decreasing and ends at T; empty sequences are
//! allowed. Sequence n uses state pool slot `state_indices[n]` (slot n when no indices are given);
//! slots must be in range and distinct.
//!
//! # Per token t of sequence n, per head h (all in f32 or wider)
//! - `q_t = q[t,h,:]`, `k_t = k[t,h,:]`; with `use_qk_l2norm`: x ← x / √(Σx² + 1e-6)
//!   ([`KDA_L2_EPS`]); then q_t ← q_scale · q_t (K3: q_scale = K^-1/2, applied after the norm).
//!   `v_t = v[t,h,:]`.
//! - `g_t[i] = gate(g_raw[t,h,i], A_log[h], dt_bias[h·K+i])` per [`KdaGateMode`]; α_t = exp(g_t).
//! - β_t = `σ(beta[t,h])` with `beta_sigmoid`, else `beta[t,h]` as given.
//! - Recurrence on the K×V state S (row i = key channel i), starting from the pool slot when
//!   `read_initial_state`, else from zero:
//!   S ← Diag(α_t) S;  r = v_t − Sᵀ k_t;  S ← S + β_t k_t rᵀ;  `o[t,h,:]` = Sᵀ q_t.
//! - With `write_final_state` the state after the last token is written back to the slot.
//!   An empty sequence's final state is its initial state (the slot keeps its value when
//!   `read_initial_state`, and is zeroed when not).
//!
//! # Chunks
//! Backends evaluate the recurrence chunkwise (the WY form of §2.3, exp only of differences
//! G_i − G_j with i ≥ j). The chunk schedule is part of the contract because it fixes rounding:
//! the chunks of a sequence are `chunk_size` tokens long counted from token 0, **restarting at
//! every checkpoint offset** ([`KdaPrefillPlan::chunks`]). A checkpoint therefore behaves exactly
//! like splitting the prefill into two calls at that offset: the checkpoint state is bit-equal to
//! the final state of a prefix-only run (with the same earlier checkpoints, which are moot when
//! they fall on multiples of `chunk_size`), and the rest of the sequence equals a second call
//! resumed from that state.
//!
//! # Checkpoints
//! `checkpoint_offsets` `[N, C]`: entry (n, c) is −1 (unused) or an offset in `1..=len_n`; the
//! used entries of a sequence are strictly increasing. For each used entry the state after the
//! first `offset` tokens of sequence n is written to `checkpoint_state[n, c]` (f32, same layout
//! convention as the pool); unused entries are left untouched.
//!
//! # Precision
//! The state is carried in f32 between chunks; a bf16 pool is decoded to f32 on read and rounded
//! to bf16 once, on write-back. Gate, β and the L2 norm are f32. Output o is rounded once to its
//! dtype.
//!
//! # Workspace
//! GPU backends run the prefill as a token-parallel "prepare" pass per (chunk, head) and a
//! recurrence pass per (sequence, head) (the FlashKDA K1/K2 split); the prepare results live in
//! the caller's workspace, laid out as [`KdaPrefillWorkspace`] says. Every backend reports
//! [`KdaPrefillPlan::workspace_bytes`] (the CPU reference checks the size and does not use it).

use super::kda_gate::{check_gate_tensors, KdaGateMode, KdaStateLayout};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};
use std::ops::Range;

/// ε inside the square root of the q/k L2 norm.
pub const KDA_L2_EPS: f32 = 1e-6;

/// The chunk sizes the contract accepts.
pub const KDA_CHUNK_SIZES: [usize; 3] = [16, 32, 64];

/// Shape and mode of a prefill (independent of the batch).
#[derive(Clone, Debug, PartialEq)]
pub struct KdaPrefillParams {
    /// Heads H.
    pub heads: usize,
    /// Key width K (q, k, gate channels per head).
    pub k_dim: usize,
    /// Value width V.
    pub v_dim: usize,
    /// Length A ≥ H of `a_log` (K3 stores 128, zero-padded; only the first H are read).
    pub a_log_len: usize,
    pub gate: KdaGateMode,
    /// `beta` holds logits (σ applied in-kernel) rather than probabilities.
    pub beta_sigmoid: bool,
    /// L2-normalise q and k per head before use.
    pub use_qk_l2norm: bool,
    /// Multiplies q after the optional L2 norm (K3: K^-1/2).
    pub q_scale: f32,
    /// Tokens per chunk: one of [`KDA_CHUNK_SIZES`].
    pub chunk_size: usize,
    pub state_layout: KdaStateLayout,
    /// Slots in the state pool (ignored when the pool is neither read nor written).
    pub state_slots: usize,
    /// Start each sequence from its pool slot (else from zero).
    pub read_initial_state: bool,
    /// Write each sequence's final state to its pool slot.
    pub write_final_state: bool,
}

impl KdaPrefillParams {
    /// K3's settings for the given dims: lower-bound gate −5, β logits, q/k L2 norm, q scale
    /// K^-1/2, chunk 64, K-major state, no pool access (set the pool fields as needed).
    pub fn k3_defaults(heads: usize, k_dim: usize, v_dim: usize) -> Self {
        KdaPrefillParams {
            heads,
            k_dim,
            v_dim,
            a_log_len: heads,
            gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
            beta_sigmoid: true,
            use_qk_l2norm: true,
            q_scale: 1.0 / (k_dim.max(1) as f32).sqrt(),
            chunk_size: 64,
            state_layout: KdaStateLayout::KMajor,
            state_slots: 0,
            read_initial_state: false,
            write_final_state: false,
        }
    }

    /// Whether the state pool is read or written.
    pub fn uses_state_pool(&self) -> bool {
        self.read_initial_state || self.write_final_state
    }
}

/// Checkpoint offsets of a batch (host copy of the `checkpoint_offsets` tensor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaCheckpointOffsets<'a> {
    /// Entries per sequence, C ≥ 1.
    pub per_seq: usize,
    /// `[N, C]` row-major; −1 marks an unused entry.
    pub offsets: &'a [i64],
}

/// Host copies of the batch metadata whose contents the plan validates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaPrefillBatch<'a> {
    /// `[N+1]`: 0, non-decreasing, ends at T.
    pub cu_seqlens: &'a [i64],
    /// `[N]`: the pool slot of each sequence; `None` means slot n for sequence n.
    pub state_indices: Option<&'a [i64]>,
    pub checkpoints: Option<KdaCheckpointOffsets<'a>>,
}

/// Tensor arguments of [`KdaPrefill`]. Inputs accept f32 or bf16 unless noted; every tensor
/// has unit innermost stride (outer strides are free: slices of a fused projection are fine).
#[derive(Debug)]
pub struct KdaPrefillArgs<'a, B: Backend + ?Sized> {
    /// `[T, H, K]` (post conv + SiLU).
    pub q: TensorRef<'a, B>,
    /// `[T, H, K]`.
    pub k: TensorRef<'a, B>,
    /// `[T, H, V]`.
    pub v: TensorRef<'a, B>,
    /// `[T, H, K]`: gate input f̃ (or g itself with `KdaGateMode::Precomputed`).
    pub g_raw: TensorRef<'a, B>,
    /// `[T, H]` with row stride ≥ H (FlashKDA reads β as a strided row slice).
    pub beta: TensorRef<'a, B>,
    /// `[A]` f32; required unless the gate is `Precomputed`.
    pub a_log: Option<TensorRef<'a, B>>,
    /// `[H·K]` f32; required unless the gate is `Precomputed`.
    pub dt_bias: Option<TensorRef<'a, B>>,
    /// `[N+1]` i32 or i64, same contents as the host copy given to `plan`.
    pub cu_seqlens: TensorRef<'a, B>,
    /// `[N]` i32 or i64; present exactly when the batch has state indices.
    pub state_indices: Option<TensorRef<'a, B>>,
    /// Pool `[slots, H, K, V]` (K-major) or `[slots, H, V, K]` (V-major), f32 or bf16, in place.
    /// Required when the pool is read or written.
    pub state: Option<TensorMut<'a, B>>,
    /// `[N, C]` i32 or i64; present exactly when the batch has checkpoints.
    pub checkpoint_offsets: Option<TensorRef<'a, B>>,
    /// `[N, C, H, K, V]` or `[N, C, H, V, K]` (pool layout), f32; present with the offsets.
    pub checkpoint_state: Option<TensorMut<'a, B>>,
    /// `[T, H, V]`, f32 or bf16.
    pub out: TensorMut<'a, B>,
}

/// Layout of the prefill workspace (all offsets in bytes, each section 256-byte aligned):
/// - chunk descriptors `[chunks, 4]` i32: (first token of the chunk in the packed batch, its
///   length, the flat checkpoint entry `n·C + c` written at its end or −1, sequence n), in
///   sequence order, each sequence's chunks as [`KdaPrefillPlan::chunks`] lists them;
/// - sequence chunk starts `[N+1]` i32: the first descriptor of each sequence (and the total);
/// - per (token, head) f32 rows of `floats_per_token` = 4K + V + chunk_size values:
///   `[q̂ K | k̂ K | G K | w K | u V | A_qk chunk_size]` (see the GPU kernels for their meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaPrefillWorkspace {
    /// Chunks of the whole batch.
    pub chunks: usize,
    pub chunk_desc_offset: usize,
    pub seq_chunk_offset: usize,
    pub token_rows_offset: usize,
    pub floats_per_token: usize,
    /// Total bytes.
    pub bytes: usize,
}

impl KdaPrefillWorkspace {
    fn new(p: &KdaPrefillParams, tokens: usize, num_seqs: usize, chunks: usize) -> Option<Self> {
        let align = |x: usize| x.checked_add(255).map(|v| v / 256 * 256);
        let floats_per_token = p.k_dim.checked_mul(4)?.checked_add(p.v_dim)?.checked_add(p.chunk_size)?;
        let chunk_desc_offset = 0;
        let seq_chunk_offset = align(chunks.checked_mul(16)?)?;
        let token_rows_offset = align(seq_chunk_offset.checked_add(num_seqs.checked_add(1)?.checked_mul(4)?)?)?;
        let rows = tokens.checked_mul(p.heads)?.checked_mul(floats_per_token)?.checked_mul(4)?;
        let bytes = token_rows_offset.checked_add(rows)?;
        Some(KdaPrefillWorkspace { chunks, chunk_desc_offset, seq_chunk_offset, token_rows_offset, floats_per_token, bytes })
    }
}

/// A validated prefill: params plus the checked batch metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaPrefillPlan {
    pub params: KdaPrefillParams,
    /// Total tokens T.
    pub tokens: usize,
    /// Sequences N.
    pub num_seqs: usize,
    /// The host `cu_seqlens` (validated).
    pub cu_seqlens: Vec<i64>,
    /// The host state indices, if given (validated).
    pub state_indices: Option<Vec<i64>>,
    /// Checkpoint entries per sequence (0 when the batch has none).
    pub checkpoints_per_seq: usize,
    /// The host checkpoint offsets `[N, C]` (validated; empty when none).
    pub checkpoint_offsets: Vec<i64>,
    /// Where the GPU passes keep their intermediate results.
    pub workspace: KdaPrefillWorkspace,
}

fn to_usize(v: i64, field: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(field, format!("value {v} is negative")))
}

impl KdaPrefillPlan {
    /// Backend-independent validation of params and batch metadata.
    pub fn new(p: &KdaPrefillParams, batch: &KdaPrefillBatch<'_>) -> Result<Self> {
        ensure(p.heads >= 1, "params.heads", || "must be at least 1".into())?;
        ensure(p.k_dim >= 1, "params.k_dim", || "must be at least 1".into())?;
        ensure(p.v_dim >= 1, "params.v_dim", || "must be at least 1".into())?;
        ensure(KDA_CHUNK_SIZES.contains(&p.chunk_size), "params.chunk_size", || {
            format!("{} is not one of {KDA_CHUNK_SIZES:?}", p.chunk_size)
        })?;
        ensure(p.q_scale.is_finite(), "params.q_scale", || format!("must be finite, got {}", p.q_scale))?;
        p.gate.validate("params.gate")?;
        if p.gate.uses_gate_params() {
            ensure(p.a_log_len >= p.heads, "params.a_log_len", || {
                format!("A_log has {} entries but there are {} heads", p.a_log_len, p.heads)
            })?;
        }

        // cu_seqlens.
        let cu = batch.cu_seqlens;
        ensure(!cu.is_empty(), "cu_seqlens", || "needs at least one entry (N+1 with N >= 0)".into())?;
        ensure(cu[0] == 0, "cu_seqlens", || format!("must start at 0, starts at {}", cu[0]))?;
        if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid("cu_seqlens", format!("decreases at entry {}: {} -> {}", w + 1, cu[w], cu[w + 1])));
        }
        let num_seqs = cu.len() - 1;
        let tokens = to_usize(cu[num_seqs], "cu_seqlens")?;
        let hd = p.heads.checked_mul(p.k_dim.max(p.v_dim));
        ensure(hd.and_then(|x| x.checked_mul(tokens)).is_some(), "cu_seqlens", || {
            format!("{tokens} tokens x heads x head dim overflows")
        })?;

        // State pool and indices.
        let head_state = p.heads.checked_mul(p.k_dim).and_then(|x| x.checked_mul(p.v_dim));
        ensure(head_state.is_some(), "params.heads", || "heads x k_dim x v_dim overflows".into())?;
        let head_state = head_state.unwrap_or(0);
        if p.uses_state_pool() {
            ensure(p.state_slots.checked_mul(head_state).is_some(), "params.state_slots", || "pool size overflows".into())?;
        }
        if let Some(idx) = batch.state_indices {
            ensure(idx.len() == num_seqs, "state_indices", || format!("{} entries for {num_seqs} sequences", idx.len()))?;
            let limit = if p.uses_state_pool() { p.state_slots } else { usize::MAX };
            let mut sorted = Vec::with_capacity(idx.len());
            for (n, &s) in idx.iter().enumerate() {
                let slot = usize::try_from(s).ok().filter(|&s| s < limit).ok_or_else(|| {
                    Error::invalid("state_indices", format!("entry {n} = {s} is outside the pool's {} slots", p.state_slots))
                })?;
                sorted.push((slot, n));
            }
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::invalid("state_indices", format!("slot {} is used by entries {} and {}", w[0].0, w[0].1, w[1].1)));
            }
        } else if p.uses_state_pool() {
            ensure(p.state_slots >= num_seqs, "params.state_slots", || {
                format!("{} slots for {num_seqs} sequences (no state_indices: sequence n uses slot n)", p.state_slots)
            })?;
        }

        // Checkpoints.
        let (per_seq, offsets) = match batch.checkpoints {
            None => (0, Vec::new()),
            Some(c) => {
                ensure(c.per_seq >= 1, "checkpoint_offsets", || "at least one entry per sequence is needed".into())?;
                let n = num_seqs.checked_mul(c.per_seq);
                ensure(n == Some(c.offsets.len()), "checkpoint_offsets", || {
                    format!("{} entries for {num_seqs} sequences x {} per sequence", c.offsets.len(), c.per_seq)
                })?;
                ensure(n.and_then(|x| x.checked_mul(head_state)).is_some(), "checkpoint_offsets", || {
                    "checkpoint state size overflows".into()
                })?;
                for s in 0..num_seqs {
                    let len = cu[s + 1] - cu[s];
                    let mut last = 0i64;
                    for (c_i, &off) in c.offsets[s * c.per_seq..(s + 1) * c.per_seq].iter().enumerate() {
                        if off == -1 {
                            continue;
                        }
                        ensure((1..=len).contains(&off), "checkpoint_offsets", || {
                            format!("entry ({s}, {c_i}) = {off} is outside 1..={len} (sequence length), and not -1")
                        })?;
                        ensure(off > last, "checkpoint_offsets", || {
                            format!("entry ({s}, {c_i}) = {off} does not increase (previous used entry {last})")
                        })?;
                        last = off;
                    }
                }
                (c.per_seq, c.offsets.to_vec())
            }
        };

        let mut plan = KdaPrefillPlan {
            params: p.clone(),
            tokens,
            num_seqs,
            cu_seqlens: cu.to_vec(),
            state_indices: batch.state_indices.map(|s| s.to_vec()),
            checkpoints_per_seq: per_seq,
            checkpoint_offsets: offsets,
            workspace: KdaPrefillWorkspace {
                chunks: 0,
                chunk_desc_offset: 0,
                seq_chunk_offset: 0,
                token_rows_offset: 0,
                floats_per_token: 0,
                bytes: 0,
            },
        };
        let chunks: usize = (0..num_seqs).map(|n| plan.chunks(n).len()).sum();
        plan.workspace = KdaPrefillWorkspace::new(p, tokens, num_seqs, chunks)
            .ok_or_else(|| Error::invalid("cu_seqlens", format!("the workspace for {tokens} tokens overflows usize")))?;
        Ok(plan)
    }

    /// Bytes of workspace the GPU passes need ([`KdaPrefillWorkspace`]).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.bytes
    }

    /// Token range of sequence n in the packed inputs.
    pub fn seq_range(&self, n: usize) -> Range<usize> {
        // Validated: non-negative and non-decreasing.
        self.cu_seqlens[n] as usize..self.cu_seqlens[n + 1] as usize
    }

    /// The pool slot of sequence n.
    pub fn slot(&self, n: usize) -> usize {
        match &self.state_indices {
            Some(idx) => idx[n] as usize,
            None => n,
        }
    }

    /// The used checkpoints of sequence n: (entry c, offset in tokens), increasing.
    pub fn checkpoints(&self, n: usize) -> Vec<(usize, usize)> {
        let c = self.checkpoints_per_seq;
        if c == 0 {
            return Vec::new();
        }
        self.checkpoint_offsets[n * c..(n + 1) * c]
            .iter()
            .enumerate()
            .filter(|(_, &o)| o >= 1)
            .map(|(i, &o)| (i, o as usize))
            .collect()
    }

    /// The chunk schedule of sequence n, as token ranges relative to the sequence start:
    /// `chunk_size`-token chunks from 0, restarting at every checkpoint offset.
    pub fn chunks(&self, n: usize) -> Vec<Range<usize>> {
        let len = self.seq_range(n).len();
        let mut cuts: Vec<usize> = self.checkpoints(n).into_iter().map(|(_, o)| o).filter(|&o| o < len).collect();
        cuts.push(len);
        let mut out = Vec::new();
        let mut start = 0;
        for end in cuts {
            let mut a = start;
            while a < end {
                let b = (a + self.params.chunk_size).min(end);
                out.push(a..b);
                a = b;
            }
            start = end;
        }
        out
    }

    /// The two trailing dims of a state (pool slot or checkpoint) in this plan's layout.
    pub fn state_dims(&self) -> [usize; 2] {
        self.params.state_layout.trailing_dims(self.params.k_dim, self.params.v_dim)
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &KdaPrefillArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let (t, h) = (self.tokens, p.heads);
        let io = [DType::F32, DType::BF16];
        let idx = [DType::I32, DType::I64];
        let [d1, d2] = self.state_dims();
        for (field, tensor, width) in [("q", &a.q, p.k_dim), ("k", &a.k, p.k_dim), ("v", &a.v, p.v_dim), ("g_raw", &a.g_raw, p.k_dim)] {
            tensor.check(b, field)?.dtype(&io)?.shape(&[Dim::Is(t), Dim::Is(h), Dim::Is(width)])?.unit_inner_stride()?;
        }
        a.beta.check(b, "beta")?.dtype(&io)?.shape(&[Dim::Is(t), Dim::Is(h)])?.unit_inner_stride()?;
        let row_stride = a.beta.layout.strides[0];
        ensure(t <= 1 || row_stride >= h, "beta", || format!("row stride {row_stride} is smaller than the {h} heads of a row"))?;
        check_gate_tensors(b, p.gate, p.a_log_len, p.heads * p.k_dim, a.a_log.as_ref(), a.dt_bias.as_ref())?;

        a.cu_seqlens.check(b, "cu_seqlens")?.dtype(&idx)?.shape(&[Dim::Is(self.num_seqs + 1)])?.contiguous()?;
        ensure(a.cu_seqlens.layout.dtype != DType::I32 || i32::try_from(t).is_ok(), "cu_seqlens", || {
            format!("i32 cannot hold {t} tokens")
        })?;
        match (&a.state_indices, &self.state_indices) {
            (Some(s), Some(_)) => {
                s.check(b, "state_indices")?.dtype(&idx)?.shape(&[Dim::Is(self.num_seqs)])?.contiguous()?;
            }
            (None, None) => {}
            (Some(_), None) => return Err(Error::invalid("state_indices", "given, but the plan's batch has none")),
            (None, Some(_)) => return Err(Error::invalid("state_indices", "missing, but the plan's batch has them")),
        }
        match &a.state {
            Some(s) => {
                s.check(b, "state")?
                    .dtype(&io)?
                    .shape(&[Dim::Is(p.state_slots), Dim::Is(h), Dim::Is(d1), Dim::Is(d2)])?
                    .unit_inner_stride()?;
            }
            None if p.uses_state_pool() => {
                return Err(Error::invalid("state", "required when read_initial_state or write_final_state is set"))
            }
            None => {}
        }
        let c = self.checkpoints_per_seq;
        match (&a.checkpoint_offsets, &a.checkpoint_state, c) {
            (None, None, 0) => {}
            (Some(o), Some(s), c) if c > 0 => {
                o.check(b, "checkpoint_offsets")?.dtype(&idx)?.shape(&[Dim::Is(self.num_seqs), Dim::Is(c)])?.contiguous()?;
                s.check(b, "checkpoint_state")?
                    .dtype(&[DType::F32])?
                    .shape(&[Dim::Is(self.num_seqs), Dim::Is(c), Dim::Is(h), Dim::Is(d1), Dim::Is(d2)])?
                    .unit_inner_stride()?;
            }
            (o, _, 0) => {
                let field = if o.is_some() { "checkpoint_offsets" } else { "checkpoint_state" };
                return Err(Error::invalid(field, "given, but the plan's batch has no checkpoints"));
            }
            (o, _, _) => {
                let field = if o.is_none() { "checkpoint_offsets" } else { "checkpoint_state" };
                return Err(Error::invalid(field, "missing, but the plan's batch has checkpoints"));
            }
        }
        a.out.check(b, "out")?.dtype(&io)?.shape(&[Dim::Is(t), Dim::Is(h), Dim::Is(p.v_dim)])?.unit_inner_stride()?;
        Ok(())
    }
}

/// KDA chunked prefill.
pub trait KdaPrefill: Backend {
    /// Whether this backend can run the prefill (reasons if not).
    fn supports(&self, params: &KdaPrefillParams) -> Result<()>;
    fn plan(&self, params: &KdaPrefillParams, batch: &KdaPrefillBatch<'_>) -> Result<KdaPrefillPlan> {
        let plan = KdaPrefillPlan::new(params, batch)?;
        KdaPrefill::supports(self, params)?;
        Ok(plan)
    }
    /// [`KdaPrefillPlan::workspace_bytes`] for every backend (the CPU reference checks it too).
    fn workspace_size(&self, plan: &KdaPrefillPlan) -> usize {
        plan.workspace_bytes()
    }
    fn run(
        &self,
        plan: &KdaPrefillPlan,
        args: KdaPrefillArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_counts_chunks_and_token_rows() {
        let p = KdaPrefillParams { chunk_size: 16, ..KdaPrefillParams::k3_defaults(3, 8, 4) };
        let cu = [0i64, 37, 37, 50];
        let ck = [7i64, -1, -1, -1, 13, -1];
        let batch = KdaPrefillBatch { cu_seqlens: &cu, state_indices: None, checkpoints: Some(KdaCheckpointOffsets { per_seq: 2, offsets: &ck }) };
        let plan = KdaPrefillPlan::new(&p, &batch).unwrap();
        // Sequence 0: 7 | 16 16 (restart at 7), then 14 tokens: 0..7, 7..23, 23..37; sequence 2: 13.
        assert_eq!(plan.chunks(0), vec![0..7, 7..23, 23..37]);
        let w = plan.workspace;
        assert_eq!(w.chunks, 4);
        assert_eq!(w.floats_per_token, 4 * 8 + 4 + 16);
        assert_eq!((w.seq_chunk_offset, w.token_rows_offset), (256, 512));
        assert_eq!(plan.workspace_bytes(), 512 + 50 * 3 * w.floats_per_token * 4);
    }
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder, MathClass};

impl KdaPrefillParams {
    /// A prefill of `tokens` tokens in `seqs` sequences; `io` is the dtype of q, k, v, g_raw,
    /// beta and out, `state` that of the pool.
    ///
    /// Bytes: q, k, g_raw (K each), v and out (V each) and beta per (token, head); A_log and
    /// dt_bias; cu_seqlens; the pool slot of each sequence read and/or written once.
    /// FLOPs, per (token, head), of the chunked (WY) form with chunk C = min(chunk_size, mean
    /// sequence length), in the matrix class of `io`: 6·K·V (v' = u − wS, (q⊙e^G)S, the state
    /// update) + 3·C·K (the strictly lower K·Kᵀ, A_qk, w) + 2·C·V (u, A_qk v') + C²/3 (the
    /// triangular solve); plus 13·K vector FLOPs (q/k L2 norms, q scale, gate, decays) and β.
    pub fn cost(&self, tokens: usize, seqs: usize, io: DType, state: DType) -> Result<Cost> {
        let (t, n, h, k, v) = (dim(tokens), dim(seqs), dim(self.heads), dim(self.k_dim), dim(self.v_dim));
        let c = dim(self.chunk_size).min(t.div_ceil(n.max(1))).max(1);
        let pool = self.read_initial_state as u64 + self.write_final_state as u64;
        let gate_params = self.gate.uses_gate_params() as u64;
        let (s, class) = (elem_bytes(io), matrix_class(io, io));
        CostBuilder::new("params")
            .bytes(&[t, h, k, 3, s])
            .bytes(&[t, h, v, 2, s])
            .bytes(&[t, h, s])
            .bytes(&[gate_params, dim(self.a_log_len), 4])
            .bytes(&[gate_params, h, k, 4])
            .bytes(&[n.saturating_add(1), 8])
            .bytes(&[pool, n, h, k, v, elem_bytes(state)])
            .flops(class, &[t, h, 6, k, v])
            .flops(class, &[t, h, 3, c, k])
            .flops(class, &[t, h, 2, c, v])
            .flops(class, &[t, h, c.saturating_mul(c) / 3])
            .flops(MathClass::Vector, &[t, h, 13, k])
            .flops(MathClass::Vector, &[t, h, 2])
            .build()
    }
}
