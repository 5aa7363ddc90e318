//! Causal depthwise conv1d over variable-length sequences (the KDA short convolution, prefill).
//!
//! Shapes: x `[T, D]` holds the tokens of N sequences back to back; sequence n owns rows
//! `cu_seqlens[n] .. cu_seqlens[n+1]`. The weight is `[D, W]` (K3: W = 4, stored in the checkpoint
//! as `[D, 1, W]`, the same bytes). The conv state pool is `[slots, D, W-1]` and holds, per
//! channel, the last W-1 *pre-conv* inputs of a sequence, oldest first.
//!
//! Semantics, per sequence n with L = len(n) tokens x_0..x_{L-1}, slot s = state_indices[n]
//! (or n when no indices are given), and per channel c:
//! - history h_0..h_{W-2} = conv_state[s, c, :] when `read_initial_state`, else zeros;
//! - extended row e = [h_0, .., h_{W-2}, x_0, .., x_{L-1}];
//! - out_t = act(Σ_{j=0..W-1} weight[c, j] · e_{t+j}) for t = 0..L, so tap W-1 multiplies the
//!   current token and tap 0 the token W-1 positions earlier; act is identity or SiLU;
//! - when `write_final_state` and L > 0: conv_state[s, c, :] = the last W-1 entries of e (a
//!   sequence shorter than W-1 shifts the old history left and appends its tokens; with
//!   `read_initial_state` false the shifted-in history is zeros). The state is stored rounded to
//!   its dtype; the conv itself uses the inputs as given;
//! - an empty sequence (L = 0) writes no output rows and leaves its state unchanged.
//!
//! There is no bias (K3 has none) and no null slot: every state index names a real pool slot.
//! Dot products accumulate in at least f32; the output is rounded once to its dtype.
//!
//! Indices: `cu_seqlens` is passed twice, once on the host to `plan` (validated here: starts at
//! 0, non-decreasing, ends at T) and once as a device tensor that the kernel reads; the two must
//! hold the same values (the CPU reference re-validates the device copy). `state_indices`
//! likewise; they must lie in `[0, slots)` and be distinct (two sequences writing one slot race).

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, Layout, TensorMut, TensorRef};

/// Activation applied to the conv output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvActivation {
    Identity,
    /// SiLU(x) = x·σ(x) (K3).
    Silu,
}

/// Shape and mode of a causal conv1d.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalConv1dParams {
    /// Channels D.
    pub dim: usize,
    /// Kernel width W (K3: 4); the state keeps W-1 inputs.
    pub width: usize,
    pub activation: ConvActivation,
    /// Read each sequence's history from the pool (else the history is zeros).
    pub read_initial_state: bool,
    /// Write each non-empty sequence's last W-1 inputs back to the pool.
    pub write_final_state: bool,
    /// Slots of the conv state pool (its leading dimension); unused when no state is read or
    /// written.
    pub state_slots: usize,
}

impl CausalConv1dParams {
    /// Whether the op reads or writes the state pool.
    pub fn uses_state(&self) -> bool {
        self.read_initial_state || self.write_final_state
    }
}

/// A host index array of either index dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostIndices<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl HostIndices<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            HostIndices::I32(_) => DType::I32,
            HostIndices::I64(_) => DType::I64,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            HostIndices::I32(v) => v.len(),
            HostIndices::I64(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn to_i64(&self) -> Vec<i64> {
        match self {
            HostIndices::I32(v) => v.iter().map(|&x| x as i64).collect(),
            HostIndices::I64(v) => v.to_vec(),
        }
    }
}

/// Host copies of the batch metadata (the same values the device tensors hold).
#[derive(Clone, Copy, Debug)]
pub struct CausalConv1dBatch<'a> {
    /// `[N+1]` token offsets of the sequences.
    pub cu_seqlens: HostIndices<'a>,
    /// `[N]` pool slot per sequence; `None` means sequence n uses slot n.
    pub state_indices: Option<&'a [i32]>,
}

/// Tensor arguments.
#[derive(Debug)]
pub struct CausalConv1dArgs<'a, B: Backend + ?Sized> {
    /// `[T, D]`, f32 or bf16; rows may be strided, channels unit-stride.
    pub x: TensorRef<'a, B>,
    /// `[D, W]`, f32, any strides (a `[W, D]` buffer passes as its transposed view).
    pub weight: TensorRef<'a, B>,
    /// `[N+1]`, i32 or i64 (the dtype given to `plan`): device copy of the host offsets.
    pub cu_seqlens: TensorRef<'a, B>,
    /// `[N]`, i32: device copy of the host state indices; present iff given to `plan`.
    pub state_indices: Option<TensorRef<'a, B>>,
    /// `[slots, D, W-1]`, f32 or bf16, any strides, updated in place; required when the op
    /// reads or writes state.
    pub conv_state: Option<TensorMut<'a, B>>,
    /// `[T, D]`, f32 or bf16; rows may be strided, channels unit-stride.
    pub out: TensorMut<'a, B>,
}

/// A validated causal conv1d.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CausalConv1dPlan {
    pub params: CausalConv1dParams,
    /// Sequences N.
    pub num_seqs: usize,
    /// Tokens T (the last offset).
    pub total_tokens: usize,
    /// Longest sequence (launch sizing).
    pub max_seqlen: usize,
    /// Dtype of the `cu_seqlens` device tensor.
    pub cu_seqlens_dtype: DType,
    pub has_state_indices: bool,
}

/// Checks varlen offsets: N+1 >= 1 entries, starting at 0, non-decreasing. Returns
/// (N, T, longest length). When `total` is given the last offset must equal it.
pub fn validate_cu_seqlens(cu: &[i64], total: Option<usize>, field: &str) -> Result<(usize, usize, usize)> {
    let (&first, &last) = match (cu.first(), cu.last()) {
        (Some(f), Some(l)) => (f, l),
        _ => return Err(Error::invalid(field, "needs at least one entry (N+1 offsets)")),
    };
    ensure(first == 0, field, || format!("must start at 0, got {first}"))?;
    let mut longest = 0usize;
    for (n, w) in cu.windows(2).enumerate() {
        ensure(w[1] >= w[0], field, || format!("decreases at sequence {n}: {} -> {}", w[0], w[1]))?;
        longest = longest.max((w[1] - w[0]) as usize);
    }
    let t =
        usize::try_from(last).map_err(|_| Error::invalid(field, format!("last offset {last} does not fit usize")))?;
    if let Some(want) = total {
        ensure(t == want, field, || format!("ends at {t} but the tokens tensor has {want} rows"))?;
    }
    Ok((cu.len() - 1, t, longest))
}

/// Checks pool slot indices: each in `[0, slots)`, pairwise distinct.
pub fn validate_slot_indices(idx: &[i64], slots: usize, field: &str) -> Result<()> {
    for (n, &s) in idx.iter().enumerate() {
        ensure(s >= 0 && (s as u64) < slots as u64, field, || {
            format!("entry {n} = {s} is outside the pool [0, {slots})")
        })?;
    }
    // Sorting (not a slot-sized table) keeps this O(N log N) for any pool size.
    let mut sorted = idx.to_vec();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::invalid(field, format!("slot {} is used by two entries", w[0]))),
        None => Ok(()),
    }
}

/// A written tensor must not alias its own elements (a zero or too small stride): the writes
/// would race on a GPU, and a broadcast layout could declare far more elements than its buffer
/// holds. Checked as `numel · size <= span`, which every non-overlapping layout satisfies.
pub fn check_not_aliased(layout: &Layout, field: &str) -> Result<()> {
    let need = layout.numel().and_then(|n| n.checked_mul(layout.dtype.size_bytes()));
    let span = layout.span_bytes().map(|s| s.saturating_sub(layout.offset.saturating_mul(layout.dtype.size_bytes())));
    match (need, span) {
        (Some(n), Some(s)) if n <= s => Ok(()),
        _ => Err(Error::invalid(field, format!("written tensor overlaps itself (strides {:?})", layout.strides))),
    }
}

/// Checks the params alone. Plans call it, and so does `check_args`, because plan fields are
/// public and a hand-built plan must not make a check panic.
pub fn validate_params(p: &CausalConv1dParams) -> Result<()> {
    ensure(p.dim >= 1, "params.dim", || "must be at least 1".into())?;
    ensure(p.width >= 1, "params.width", || "must be at least 1".into())?;
    ensure(p.dim.checked_mul(p.width).is_some(), "params.width", || "dim x width overflows".into())?;
    if p.uses_state() {
        let pool = p.state_slots.checked_mul(p.dim).and_then(|x| x.checked_mul(p.width - 1));
        ensure(pool.is_some(), "params.state_slots", || "slots x dim x (width-1) overflows".into())?;
    }
    Ok(())
}

impl CausalConv1dPlan {
    /// Backend-independent validation of the params and host batch metadata.
    pub fn new(p: &CausalConv1dParams, batch: &CausalConv1dBatch<'_>) -> Result<Self> {
        validate_params(p)?;
        let cu = batch.cu_seqlens.to_i64();
        let (n, t, longest) = validate_cu_seqlens(&cu, None, "cu_seqlens")?;
        ensure(t.checked_mul(p.dim).is_some(), "cu_seqlens", || format!("{t} tokens x dim {} overflows", p.dim))?;
        if let Some(idx) = batch.state_indices {
            ensure(idx.len() == n, "state_indices", || format!("{} entries for {n} sequences", idx.len()))?;
            let wide: Vec<i64> = idx.iter().map(|&s| s as i64).collect();
            validate_slot_indices(&wide, p.state_slots, "state_indices")?;
        } else if p.uses_state() {
            ensure(n <= p.state_slots, "params.state_slots", || {
                format!("{n} sequences use slots 0..{n} but the pool has {} slots", p.state_slots)
            })?;
        }
        Ok(CausalConv1dPlan {
            params: p.clone(),
            num_seqs: n,
            total_tokens: t,
            max_seqlen: longest,
            cu_seqlens_dtype: batch.cu_seqlens.dtype(),
            has_state_indices: batch.state_indices.is_some(),
        })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &CausalConv1dArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        validate_params(p)?;
        ensure(self.num_seqs.checked_add(1).is_some(), "cu_seqlens", || "sequence count overflows".into())?;
        let (t, d) = (self.total_tokens, p.dim);
        a.x.check(b, "x")?.dtype(&[DType::F32, DType::BF16])?.shape(&[Dim::Is(t), Dim::Is(d)])?.unit_inner_stride()?;
        a.weight.check(b, "weight")?.dtype(&[DType::F32])?.shape(&[Dim::Is(d), Dim::Is(p.width)])?;
        a.cu_seqlens.check(b, "cu_seqlens")?.dtype(&[self.cu_seqlens_dtype])?.shape(&[Dim::Is(self.num_seqs + 1)])?;
        match (&a.state_indices, self.has_state_indices) {
            (Some(s), true) => {
                s.check(b, "state_indices")?.dtype(&[DType::I32])?.shape(&[Dim::Is(self.num_seqs)])?;
            }
            (None, false) => {}
            (Some(_), false) => return Err(Error::invalid("state_indices", "given to run but not to plan")),
            (None, true) => return Err(Error::invalid("state_indices", "given to plan but missing in run")),
        }
        match &a.conv_state {
            Some(s) => {
                s.check(b, "conv_state")?.dtype(&[DType::F32, DType::BF16])?.shape(&[
                    Dim::Is(p.state_slots),
                    Dim::Is(d),
                    Dim::Is(p.width - 1),
                ])?;
                check_not_aliased(&s.layout, "conv_state")?;
            }
            None if p.uses_state() => {
                return Err(Error::invalid("conv_state", "required when reading or writing state"));
            }
            None => {}
        }
        a.out
            .check(b, "out")?
            .dtype(&[DType::F32, DType::BF16])?
            .shape(&[Dim::Is(t), Dim::Is(d)])?
            .unit_inner_stride()?;
        check_not_aliased(&a.out.layout, "out")
    }
}

/// Causal depthwise conv1d prefill with conv-state read/write.
pub trait CausalConv1d: Backend {
    /// Whether this backend can run the conv (reasons if not).
    fn supports(&self, params: &CausalConv1dParams) -> Result<()>;
    fn plan(&self, params: &CausalConv1dParams, batch: &CausalConv1dBatch<'_>) -> Result<CausalConv1dPlan> {
        let plan = CausalConv1dPlan::new(params, batch)?;
        CausalConv1d::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &CausalConv1dPlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &CausalConv1dPlan,
        args: CausalConv1dArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl CausalConv1dParams {
    /// `tokens` tokens in `seqs` sequences, x/out of dtype `io`, a state pool of dtype `state`:
    /// x and out once, f32 weights, each sequence's state slot read and/or written; 2·W FLOPs
    /// per value plus 4 for the SiLU.
    pub fn cost(&self, tokens: usize, seqs: usize, io: DType, state: DType) -> Result<Cost> {
        let (t, n, d, w) = (dim(tokens), dim(seqs), dim(self.dim), dim(self.width));
        let pool = self.read_initial_state as u64 + self.write_final_state as u64;
        let silu = matches!(self.activation, ConvActivation::Silu) as u64;
        CostBuilder::new("params")
            .bytes(&[t, d, 2, elem_bytes(io)])
            .bytes(&[d, w, 4])
            .bytes(&[pool, n, d, w.saturating_sub(1), elem_bytes(state)])
            .bytes(&[n.saturating_add(1), 8])
            .flops(MathClass::Vector, &[t, d, 2, w])
            .flops(MathClass::Vector, &[silu, t, d, 4])
            .build()
    }
}
