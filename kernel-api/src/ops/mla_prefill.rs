//! MLA prefill: ragged multi-head attention in the naive (non-absorbed) MLA form, with a query/key
//! head dim different from the value head dim (K3: qk 192 = 128 nope + 64 pe, v 128; the tiny
//! config: 48 / 16). Every head has its own keys and values (the runner has expanded the latent
//! with `kv_b_proj` and appended the shared k_pe to each head's k_nope).
//!
//! # Semantics
//!
//! The batch holds `B` sequences. Sequence `b` owns query rows `cu_seqlens[b] .. cu_seqlens[b+1]`
//! (`Lq_b` rows) and key/value rows `cu_seqlens_k[b] .. cu_seqlens_k[b+1]` (`Lk_b` rows). Without
//! a separate key side ([`MlaPrefillBatch::kv`] = `None`, self-attention, the K3 prefill) the key
//! rows are the query rows. For query row `i` (0-based inside its sequence) and head `h`:
//!
//! - visible keys: `j` in `0..Lk_b` with `j <= i + (Lk_b - Lq_b)` when `causal` (bottom-right
//!   aligned: in self-attention token t sees tokens s <= t of its own sequence), all `j` otherwise;
//! - `s_j = softmax_scale · Σ_d q[i, h, d] · k[j, h, d]` over `qk_dim` (K3: `1/sqrt(192)`);
//! - `lse[i, h] = ln Σ_j exp(s_j)` (natural log, f32);
//! - `out[i, h, :] = Σ_j exp(s_j - lse) · v[j, h, :]` over `v_dim`, rounded once to `out`'s dtype;
//! - a query with no visible key (only possible without `causal`, when `Lk_b = 0`) gets
//!   `out = 0` and `lse = -inf`, the convention [`crate::ops::LseMerge`] skips.
//!
//! Sequences never see each other. Empty sequences (`Lq_b = 0`) are allowed anywhere.
//!
//! # Chunked prefill
//!
//! A chunk of new tokens over a cached context is two calls merged by LSE: a non-causal call of
//! the chunk's queries over the context keys (`kv = Some(..)`) and a causal self-attention call
//! over the chunk. The conformance suite checks that this equals one causal pass.
//!
//! # Validation
//!
//! The plan takes the host copy of the offsets ([`MlaPrefillBatch`]) and checks: `cu_seqlens`
//! starts at 0, never decreases and ends at `total_tokens` (same for the key side); with `causal`
//! and a key side, `Lk_b >= Lq_b` for every sequence (so every query sees at least one key). The
//! device tensors `cu_seqlens` / `cu_seqlens_k` must hold the same values; the CPU reference
//! checks that, GPU kernels check the bounds ([device metadata](crate::ops#device-metadata)).

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Model-side shape and mode of a prefill call.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaPrefillParams {
    /// Attention heads (any count >= 1; K3: 96 / TP).
    pub heads: usize,
    /// Query/key head dim (K3: 192 = 128 nope + 64 pe; tiny: 48).
    pub qk_dim: usize,
    /// Value/output head dim (K3: 128; tiny: 16).
    pub v_dim: usize,
    /// Multiplies q·k before the softmax (K3: `1/sqrt(192)`); finite and > 0.
    pub softmax_scale: f32,
    /// Causal (bottom-right aligned) mask; true for K3 self-attention.
    pub causal: bool,
}

impl MlaPrefillParams {
    /// K3 per-rank shape: `heads` local heads, qk 192, v 128, scale 1/sqrt(192), causal.
    pub fn k3(heads: usize) -> Self {
        MlaPrefillParams { heads, qk_dim: 192, v_dim: 128, softmax_scale: 1.0 / 192f32.sqrt(), causal: true }
    }
}

/// Key-side offsets when the keys are not the query tokens themselves (a context pass).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaPrefillKv {
    /// Rows of `k` and `v`.
    pub total_kv_tokens: usize,
    /// `[batch + 1]` key offsets, host copy of the `cu_seqlens_k` argument.
    pub cu_seqlens_k: Vec<i64>,
}

/// Host-side batch metadata of one call (what the plan range-checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaPrefillBatch {
    /// Rows of `q`, `out` and `lse`.
    pub total_tokens: usize,
    /// `[batch + 1]` query offsets, host copy of the `cu_seqlens` argument.
    pub cu_seqlens: Vec<i64>,
    /// `None`: self-attention, keys/values are the query tokens (`k`, `v` have `total_tokens` rows).
    pub kv: Option<MlaPrefillKv>,
}

impl MlaPrefillBatch {
    /// Self-attention batch from per-sequence lengths.
    pub fn from_seq_lens(lens: &[usize]) -> Self {
        let cu = offsets(lens);
        MlaPrefillBatch { total_tokens: lens.iter().sum(), cu_seqlens: cu, kv: None }
    }

    /// Batch whose queries (`q_lens`) attend to separate keys (`kv_lens`), e.g. cached context.
    pub fn with_kv_lens(q_lens: &[usize], kv_lens: &[usize]) -> Self {
        MlaPrefillBatch {
            total_tokens: q_lens.iter().sum(),
            cu_seqlens: offsets(q_lens),
            kv: Some(MlaPrefillKv { total_kv_tokens: kv_lens.iter().sum(), cu_seqlens_k: offsets(kv_lens) }),
        }
    }
}

fn offsets(lens: &[usize]) -> Vec<i64> {
    let mut v = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0i64;
    v.push(0);
    for &l in lens {
        acc = acc.saturating_add(i64::try_from(l).unwrap_or(i64::MAX));
        v.push(acc);
    }
    v
}

/// Tensor arguments. `q`, `k`, `v` share one dtype; their rows and heads may be strided (slices
/// of a fused projection) but the innermost dim must be unit-stride.
#[derive(Debug)]
pub struct MlaPrefillArgs<'a, B: Backend + ?Sized> {
    /// `[total_tokens, heads, qk_dim]`, bf16 or f32.
    pub q: TensorRef<'a, B>,
    /// `[total_kv_tokens, heads, qk_dim]` (`total_tokens` rows in self-attention), q's dtype.
    pub k: TensorRef<'a, B>,
    /// `[total_kv_tokens, heads, v_dim]`, q's dtype.
    pub v: TensorRef<'a, B>,
    /// `[batch + 1]` i32 or i64, contiguous; same values as the plan's `cu_seqlens`.
    pub cu_seqlens: TensorRef<'a, B>,
    /// `[batch + 1]` i32 or i64, contiguous; present exactly when the plan has a key side.
    pub cu_seqlens_k: Option<TensorRef<'a, B>>,
    /// `[total_tokens, heads, v_dim]`, bf16 or f32, unit inner stride.
    pub out: TensorMut<'a, B>,
    /// `[total_tokens, heads]` f32 natural-log LSE; optional.
    pub lse: Option<TensorMut<'a, B>>,
}

/// A validated prefill call.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaPrefillPlan {
    pub params: MlaPrefillParams,
    pub batch: MlaPrefillBatch,
    /// Number of sequences.
    pub batch_size: usize,
    /// Longest query sequence (grid size of a GPU launch).
    pub max_seqlen_q: usize,
    /// Longest key sequence.
    pub max_seqlen_k: usize,
}

/// Checks one offsets array; returns per-sequence lengths.
fn check_offsets(cu: &[i64], total: usize, field: &str) -> Result<Vec<usize>> {
    ensure(!cu.is_empty(), field, || "needs at least one entry (batch + 1)".into())?;
    ensure(cu[0] == 0, field, || format!("must start at 0, starts at {}", cu[0]))?;
    let mut lens = Vec::with_capacity(cu.len() - 1);
    for (i, w) in cu.windows(2).enumerate() {
        ensure(w[1] >= w[0], field, || format!("decreases at entry {}: {} -> {}", i + 1, w[0], w[1]))?;
        let len = usize::try_from(w[1] - w[0]).map_err(|_| Error::invalid(field, "sequence length does not fit usize"))?;
        lens.push(len);
    }
    let last = cu[cu.len() - 1];
    ensure(i64::try_from(total).is_ok_and(|t| t == last), field, || {
        format!("ends at {last} but the batch has {total} tokens")
    })?;
    Ok(lens)
}

/// The dtypes `q`, `k`, `v` and `out` may have.
const FLOAT_IO: &[DType] = &[DType::F32, DType::BF16];

impl MlaPrefillPlan {
    /// Backend-independent validation of params and host offsets.
    pub fn new(p: &MlaPrefillParams, batch: &MlaPrefillBatch) -> Result<Self> {
        ensure(p.heads >= 1, "params.heads", || "must be at least 1".into())?;
        ensure(p.qk_dim >= 1, "params.qk_dim", || "must be at least 1".into())?;
        ensure(p.v_dim >= 1, "params.v_dim", || "must be at least 1".into())?;
        ensure(p.softmax_scale.is_finite() && p.softmax_scale > 0.0, "params.softmax_scale", || {
            format!("must be finite and positive, got {}", p.softmax_scale)
        })?;
        let q_lens = check_offsets(&batch.cu_seqlens, batch.total_tokens, "cu_seqlens")?;
        let k_lens = match &batch.kv {
            None => q_lens.clone(),
            Some(kv) => {
                let k_lens = check_offsets(&kv.cu_seqlens_k, kv.total_kv_tokens, "cu_seqlens_k")?;
                ensure(k_lens.len() == q_lens.len(), "cu_seqlens_k", || {
                    format!("{} sequences but cu_seqlens has {}", k_lens.len(), q_lens.len())
                })?;
                if p.causal {
                    if let Some(b) = (0..q_lens.len()).find(|&b| k_lens[b] < q_lens[b]) {
                        return Err(Error::invalid(
                            "cu_seqlens_k",
                            format!(
                                "causal sequence {b} has {} queries but only {} keys (needs keys >= queries)",
                                q_lens[b], k_lens[b]
                            ),
                        ));
                    }
                }
                k_lens
            }
        };
        let total_kv = batch.kv.as_ref().map_or(batch.total_tokens, |kv| kv.total_kv_tokens);
        for (rows, field) in [(batch.total_tokens, "total_tokens"), (total_kv, "total_kv_tokens")] {
            let n = rows.checked_mul(p.heads).and_then(|x| x.checked_mul(p.qk_dim.max(p.v_dim)));
            ensure(n.is_some(), field, || "tokens x heads x head dim overflows".into())?;
        }
        Ok(MlaPrefillPlan {
            params: p.clone(),
            batch: batch.clone(),
            batch_size: q_lens.len(),
            max_seqlen_q: q_lens.iter().copied().max().unwrap_or(0),
            max_seqlen_k: k_lens.iter().copied().max().unwrap_or(0),
        })
    }

    /// Rows of `k` and `v`.
    pub fn total_kv_tokens(&self) -> usize {
        self.batch.kv.as_ref().map_or(self.batch.total_tokens, |kv| kv.total_kv_tokens)
    }

    /// Key offsets (the query offsets in self-attention).
    pub fn cu_seqlens_k(&self) -> &[i64] {
        self.batch.kv.as_ref().map_or(&self.batch.cu_seqlens, |kv| &kv.cu_seqlens_k)
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MlaPrefillArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let (t, tk, h) = (self.batch.total_tokens, self.total_kv_tokens(), p.heads);
        let q = a.q.check(b, "q")?.dtype(FLOAT_IO)?.shape(&[Dim::Is(t), Dim::Is(h), Dim::Is(p.qk_dim)])?;
        q.unit_inner_stride()?;
        let in_dt = a.q.layout.dtype;
        for (tensor, field, d) in [(&a.k, "k", p.qk_dim), (&a.v, "v", p.v_dim)] {
            ensure(tensor.layout.dtype == in_dt, field, || {
                format!("dtype {} differs from q's {in_dt} (q, k, v share one dtype)", tensor.layout.dtype)
            })?;
            tensor.check(b, field)?.shape(&[Dim::Is(tk), Dim::Is(h), Dim::Is(d)])?.unit_inner_stride()?;
        }
        check_offsets_arg(b, &a.cu_seqlens, "cu_seqlens", self.batch.cu_seqlens.len(), t)?;
        match (&self.batch.kv, &a.cu_seqlens_k) {
            (Some(kv), Some(ck)) => check_offsets_arg(b, ck, "cu_seqlens_k", kv.cu_seqlens_k.len(), tk)?,
            (None, None) => {}
            (Some(_), None) => return Err(Error::invalid("cu_seqlens_k", "the plan has a key side; pass its offsets")),
            (None, Some(_)) => {
                return Err(Error::invalid("cu_seqlens_k", "the plan is self-attention; pass no key offsets"))
            }
        }
        a.out.check(b, "out")?.dtype(FLOAT_IO)?.shape(&[Dim::Is(t), Dim::Is(h), Dim::Is(p.v_dim)])?.unit_inner_stride()?;
        if let Some(l) = &a.lse {
            l.check(b, "lse")?.dtype(&[DType::F32])?.shape(&[Dim::Is(t), Dim::Is(h)])?;
        }
        Ok(())
    }
}

/// An offsets tensor: i32/i64, contiguous, `[len]`, and its largest value fits its dtype.
fn check_offsets_arg<B: Backend + ?Sized>(b: &B, t: &TensorRef<'_, B>, field: &str, len: usize, total: usize) -> Result<()> {
    t.check(b, field)?.dtype(&[DType::I32, DType::I64])?.shape(&[Dim::Is(len)])?.contiguous()?;
    if t.layout.dtype == DType::I32 {
        ensure(i32::try_from(total).is_ok(), field, || format!("i32 offsets cannot hold {total} tokens; use i64"))?;
    }
    Ok(())
}

/// Ragged MLA prefill attention.
pub trait MlaPrefill: Backend {
    /// Whether this backend can run these params (reasons if not).
    fn supports(&self, params: &MlaPrefillParams) -> Result<()>;
    fn plan(&self, params: &MlaPrefillParams, batch: &MlaPrefillBatch) -> Result<MlaPrefillPlan> {
        let plan = MlaPrefillPlan::new(params, batch)?;
        MlaPrefill::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &MlaPrefillPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MlaPrefillPlan,
        args: MlaPrefillArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder, MathClass};

impl MlaPrefillParams {
    /// `seqs` sequences of `q_per_seq` queries attending to `kv_per_seq` keys each (equal for
    /// self-attention; causal masks are bottom-right aligned), q/k/v/out of dtype `io`.
    ///
    /// Bytes: q, k, v, out and lse once, cu_seqlens. FLOPs: per (query, key it sees, head)
    /// 2·qk_dim + 2·v_dim in the matrix class of `io`, 5 vector FLOPs for the online softmax.
    pub fn cost(&self, seqs: usize, q_per_seq: usize, kv_per_seq: usize, io: DType) -> Result<Cost> {
        let (n, q, kv, h) = (dim(seqs), dim(q_per_seq) as u128, dim(kv_per_seq) as u128, dim(self.heads));
        let pairs = if self.causal {
            // Query i (0-based) sees kv - q + i + 1 keys (none when that is <= 0).
            sum_clamped(kv as i128 - q as i128 + 1, q)
        } else {
            q.checked_mul(kv)
        };
        let pairs = pairs.and_then(|p| u64::try_from(p).ok()).ok_or_else(|| Error::invalid("params", "query-key pairs overflow u64"))?;
        let s = elem_bytes(io);
        let (qk, v) = (dim(self.qk_dim), dim(self.v_dim));
        CostBuilder::new("params")
            .bytes(&[n, dim(q_per_seq), h, qk.saturating_add(v), s])
            .bytes(&[n, dim(kv_per_seq), h, qk.saturating_add(v), s])
            .bytes(&[n, dim(q_per_seq), h, 4])
            .bytes(&[n.saturating_add(1), 8])
            .flops(matrix_class(io, io), &[n, pairs, h, 2, qk.saturating_add(v)])
            .flops(MathClass::Vector, &[n, pairs, h, 5])
            .build()
    }
}

/// Σ_{i=0}^{q-1} max(0, first + i), `None` when it does not fit.
fn sum_clamped(first: i128, q: u128) -> Option<u128> {
    let q = i128::try_from(q).ok()?;
    // Terms are positive from i0 = max(0, 1 - first) on.
    let i0 = (1 - first).clamp(0, q);
    let (lo, hi) = (first + i0, first + q - 1);
    if hi < lo {
        return Some(0);
    }
    let n = u128::try_from(hi - lo + 1).ok()?;
    let (lo, hi) = (u128::try_from(lo).ok()?, u128::try_from(hi).ok()?);
    // (lo + hi)·n is even: halve the even factor first so the product cannot overflow early.
    let sum = lo.checked_add(hi)?;
    if sum % 2 == 0 { (sum / 2).checked_mul(n) } else { sum.checked_mul(n / 2) }
}
