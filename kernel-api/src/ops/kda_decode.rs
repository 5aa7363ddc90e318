//! Fused KDA decode: one token per sequence through short conv + SiLU, q/k L2 norm, decay gate,
//! write strength, delta rule and the gated per-head RMSNorm, with the conv state and the
//! recurrent state updated in place in slot pools (vLLM `fused_kda_decode`, FlashInfer
//! `fused_kda_decode`).
//!
//! Dimensions: B rows (one token each), H heads, K key dims, V value dims per head, conv width W
//! (K3: H = 96 / TP, K = V = 128, W = 4). Channels D = H·(2K + V), packed q | k | v, each head-major
//! (q channel h·K + i, k channel H·K + h·K + i, v channel 2·H·K + h·V + j).
//!
//! Semantics, per row b with slot s = state_indices[b]:
//! - **Null slot.** s = 0 is the null slot (padded CUDA-graph rows): out[b] = 0 exactly and
//!   neither pool is read or written. Slot 0 of both pools is never touched.
//! - **Conv** (every channel c): window = [conv_state[s, c, 0..W-1], x_qkv[b, c]];
//!   u_c = SiLU(Σ_j conv_weight[c, j] · window_j) (tap W-1 multiplies the current token);
//!   conv_state[s, c, :] = window[1..W] (shift left, append the current input, rounded to the pool
//!   dtype).
//! - **Heads** (h = 0..H): q, k ∈ ℝ^K and v ∈ ℝ^V are the head's slices of u. With `qk_l2norm`,
//!   q ← q/√(Σq² + 1e-6) and k ← k/√(Σk² + 1e-6); then q ← scale·q (scale defaults to K^-1/2).
//! - **Gate**: g_i = [`kda_gate_value`](super::kda_gate::kda_gate_value)(gate, g_raw[b,h,i],
//!   A_log[h], dt_bias[h·K+i]) (dt_bias absent = 0), α_i = exp(g_i).
//!   β = σ(beta[b,h]) with `beta_sigmoid`, else beta[b,h] as given.
//! - **Delta rule** on S = recurrent_state[s, h] viewed as K×V (stored `[K, V]` for `KMajor`,
//!   `[V, K]` for `VMajor`): S ← Diag(α)·S; r = v − Sᵀk; S ← S + β·k·rᵀ; o = Sᵀq. The state is
//!   computed in f32 and rounded once to the pool dtype on write-back.
//! - **Output**: with [`KdaOutputNorm::GatedRmsNorm`], out[b,h,j] = norm_weight[j] · o_j /
//!   √(mean(o²) + eps) · σ(output_gate[b,h,j]); with `None`, out[b,h] = o.
//!
//! Indices: state_indices is given to `plan` on the host (each in `[0, slots)`; non-null slots
//! pairwise distinct) and to `run` as the device tensor the kernel reads, with the same values.

use super::conv1d::{check_not_aliased, validate_slot_indices};
use super::kda_gate::{KdaGateMode, KdaStateLayout};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Epsilon inside the root of the q/k L2 norm (FLA, vLLM, FlashKDA).
pub const KDA_L2NORM_EPS: f32 = 1e-6;

/// Post-recurrence output transform.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaOutputNorm {
    /// out = o.
    None,
    /// out = norm_weight · o / √(mean(o²) + eps) · σ(output_gate) per head (K3: eps = 1e-5).
    GatedRmsNorm { eps: f32 },
}

/// Shape and mode of a fused KDA decode.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaDecodeParams {
    /// Rows B (one token each; null-slot rows included).
    pub batch: usize,
    /// Heads H (K3: 12, 24, 48 or 96).
    pub heads: usize,
    /// Key dims K per head.
    pub head_k: usize,
    /// Value dims V per head.
    pub head_v: usize,
    /// Conv width W (K3: 4).
    pub conv_width: usize,
    /// Slots of both pools, null slot 0 included.
    pub state_slots: usize,
    pub state_layout: KdaStateLayout,
    pub gate: KdaGateMode,
    /// β = σ(beta) when true; beta already is the write strength when false.
    pub beta_sigmoid: bool,
    /// L2-normalise q and k per head before scaling.
    pub qk_l2norm: bool,
    /// Factor applied to q; `None` = K^-1/2.
    pub scale: Option<f32>,
    pub output_norm: KdaOutputNorm,
}

impl KdaDecodeParams {
    /// K3's fused decode of `batch` rows over `heads` heads (96 / TP): K = V = 128, conv width 4,
    /// pools of `batch + 1` slots (null slot 0), V-major state (the vLLM / FlashInfer pool
    /// layout), lower-bound gate −5, β logits, q/k L2 norm, scale K^-1/2, gated RMSNorm ε 1e-5.
    pub fn k3(batch: usize, heads: usize) -> Self {
        KdaDecodeParams {
            batch,
            heads,
            head_k: 128,
            head_v: 128,
            conv_width: 4,
            state_slots: batch.saturating_add(1),
            state_layout: KdaStateLayout::VMajor,
            gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
            beta_sigmoid: true,
            qk_l2norm: true,
            scale: None,
            output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
        }
    }

    /// Packed channels D = H·(2K + V).
    pub fn channels(&self) -> usize {
        self.heads * (2 * self.head_k + self.head_v)
    }
    /// The q scale in effect.
    pub fn effective_scale(&self) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (self.head_k as f32).sqrt())
    }
}

/// Host copy of the batch metadata.
#[derive(Clone, Copy, Debug)]
pub struct KdaDecodeBatch<'a> {
    /// `[B]` pool slot per row; 0 = null slot.
    pub state_indices: &'a [i32],
}

/// Tensor arguments.
#[derive(Debug)]
pub struct KdaDecodeArgs<'a, B: Backend + ?Sized> {
    /// `[B, D]` pre-conv q|k|v projections, f32 or bf16; rows may be strided, channels unit-stride.
    pub x_qkv: TensorRef<'a, B>,
    /// `[D, W]` f32 depthwise conv weights (q, k, v stacked), any strides.
    pub conv_weight: TensorRef<'a, B>,
    /// `[slots, D, W-1]` f32 or bf16 conv state pool (last W-1 inputs, oldest first), any
    /// strides, updated in place.
    pub conv_state: TensorMut<'a, B>,
    /// `[B, H, K]` decay-gate input, f32 or bf16, unit inner stride.
    pub g_raw: TensorRef<'a, B>,
    /// `[B, H]` write-strength logits (or probabilities), f32 or bf16, any strides.
    pub beta: TensorRef<'a, B>,
    /// `[A]` with A >= H, f32 (K3 stores 128 entries, the first H used); required by the
    /// `LowerBound` and `Softplus` gates.
    pub a_log: Option<TensorRef<'a, B>>,
    /// `[H·K]` f32 gate bias; absent = 0. Unused by `Precomputed`.
    pub dt_bias: Option<TensorRef<'a, B>>,
    /// `[B]` i32 device copy of the host state indices.
    pub state_indices: TensorRef<'a, B>,
    /// `[slots, H, K, V]` (`KMajor`) or `[slots, H, V, K]` (`VMajor`), f32 or bf16, any strides,
    /// updated in place.
    pub recurrent_state: TensorMut<'a, B>,
    /// `[B, H, V]` pre-sigmoid output gate ĝ, f32 or bf16, unit inner stride; required by
    /// `GatedRmsNorm`, absent otherwise.
    pub output_gate: Option<TensorRef<'a, B>>,
    /// `[V]` f32 norm weight shared by all heads; required by `GatedRmsNorm`, absent otherwise.
    pub norm_weight: Option<TensorRef<'a, B>>,
    /// `[B, H, V]`, f32 or bf16, unit inner stride.
    pub out: TensorMut<'a, B>,
}

/// A validated fused decode.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaDecodePlan {
    pub params: KdaDecodeParams,
    /// Rows whose slot is not the null slot.
    pub active_rows: usize,
}

/// Checks decode state indices: each in `[0, slots)`, non-null slots pairwise distinct. Returns
/// the number of non-null rows.
pub fn validate_decode_indices(idx: &[i64], slots: usize, field: &str) -> Result<usize> {
    for (b, &s) in idx.iter().enumerate() {
        ensure(s >= 0 && (s as u64) < slots as u64, field, || {
            format!("entry {b} = {s} is outside the pool [0, {slots})")
        })?;
    }
    let live: Vec<i64> = idx.iter().copied().filter(|&s| s != 0).collect();
    validate_slot_indices(&live, slots, field)?;
    Ok(live.len())
}

/// Checks the params alone (dims, overflow, modes). Plans call it, and so does `check_args`,
/// because plan fields are public and a hand-built plan must not make a check panic.
pub fn validate_params(p: &KdaDecodeParams) -> Result<()> {
    ensure(p.heads >= 1, "params.heads", || "must be at least 1".into())?;
    ensure(p.head_k >= 1, "params.head_k", || "must be at least 1".into())?;
    ensure(p.head_v >= 1, "params.head_v", || "must be at least 1".into())?;
    ensure(p.conv_width >= 1, "params.conv_width", || "must be at least 1".into())?;
    ensure(p.state_slots >= 1, "params.state_slots", || "the pool needs at least the null slot 0".into())?;
    let d = p.head_k.checked_mul(2).and_then(|x| x.checked_add(p.head_v)).and_then(|x| x.checked_mul(p.heads));
    let d = d.ok_or_else(|| Error::invalid("params.heads", "heads x (2K + V) overflows"))?;
    let sizes = [
        d.checked_mul(p.conv_width),
        p.batch.checked_mul(d),
        p.state_slots.checked_mul(d).and_then(|x| x.checked_mul(p.conv_width)),
        p.heads.checked_mul(p.head_k).and_then(|x| x.checked_mul(p.head_v)).and_then(|x| x.checked_mul(p.state_slots)),
    ];
    ensure(sizes.iter().all(Option::is_some), "params.state_slots", || "a tensor size overflows usize".into())?;
    match p.gate {
        KdaGateMode::LowerBound { lower_bound } => {
            ensure(lower_bound.is_finite() && lower_bound < 0.0, "params.gate", || {
                format!("lower_bound must be finite and negative, got {lower_bound}")
            })?
        }
        KdaGateMode::Softplus | KdaGateMode::Precomputed => {}
    }
    if let Some(s) = p.scale {
        ensure(s.is_finite(), "params.scale", || format!("must be finite, got {s}"))?;
    }
    if let KdaOutputNorm::GatedRmsNorm { eps } = p.output_norm {
        ensure(eps.is_finite() && eps >= 0.0, "params.output_norm", || {
            format!("eps must be finite and >= 0, got {eps}")
        })?;
    }
    Ok(())
}

impl KdaDecodePlan {
    /// Backend-independent validation of the params and host batch metadata.
    pub fn new(p: &KdaDecodeParams, batch: &KdaDecodeBatch<'_>) -> Result<Self> {
        validate_params(p)?;
        ensure(batch.state_indices.len() == p.batch, "state_indices", || {
            format!("{} entries for batch {}", batch.state_indices.len(), p.batch)
        })?;
        let wide: Vec<i64> = batch.state_indices.iter().map(|&s| s as i64).collect();
        let active_rows = validate_decode_indices(&wide, p.state_slots, "state_indices")?;
        Ok(KdaDecodePlan { params: p.clone(), active_rows })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &KdaDecodeArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        validate_params(p)?;
        let (bt, h, k, v, d, w) = (p.batch, p.heads, p.head_k, p.head_v, p.channels(), p.conv_width);
        let act = [DType::F32, DType::BF16];
        a.x_qkv.check(b, "x_qkv")?.dtype(&act)?.shape(&[Dim::Is(bt), Dim::Is(d)])?.unit_inner_stride()?;
        a.conv_weight.check(b, "conv_weight")?.dtype(&[DType::F32])?.shape(&[Dim::Is(d), Dim::Is(w)])?;
        a.conv_state.check(b, "conv_state")?.dtype(&act)?.shape(&[
            Dim::Is(p.state_slots),
            Dim::Is(d),
            Dim::Is(w - 1),
        ])?;
        check_not_aliased(&a.conv_state.layout, "conv_state")?;
        a.g_raw.check(b, "g_raw")?.dtype(&act)?.shape(&[Dim::Is(bt), Dim::Is(h), Dim::Is(k)])?.unit_inner_stride()?;
        a.beta.check(b, "beta")?.dtype(&act)?.shape(&[Dim::Is(bt), Dim::Is(h)])?;
        match (&a.a_log, p.gate) {
            (Some(t), _) => {
                let c = t.check(b, "a_log")?.dtype(&[DType::F32])?.shape(&[Dim::Any])?;
                ensure(c.size(0) >= h, "a_log", || format!("{} entries for {h} heads", c.size(0)))?;
            }
            (None, KdaGateMode::Precomputed) => {}
            (None, mode) => return Err(Error::invalid("a_log", format!("required by gate mode {mode:?}"))),
        }
        if let Some(t) = &a.dt_bias {
            t.check(b, "dt_bias")?.dtype(&[DType::F32])?.shape(&[Dim::Is(h * k)])?;
        }
        a.state_indices.check(b, "state_indices")?.dtype(&[DType::I32])?.shape(&[Dim::Is(bt)])?;
        let (d2, d3) = match p.state_layout {
            KdaStateLayout::KMajor => (k, v),
            KdaStateLayout::VMajor => (v, k),
        };
        a.recurrent_state.check(b, "recurrent_state")?.dtype(&act)?.shape(&[
            Dim::Is(p.state_slots),
            Dim::Is(h),
            Dim::Is(d2),
            Dim::Is(d3),
        ])?;
        check_not_aliased(&a.recurrent_state.layout, "recurrent_state")?;
        match p.output_norm {
            KdaOutputNorm::GatedRmsNorm { .. } => {
                let g =
                    a.output_gate.as_ref().ok_or_else(|| Error::invalid("output_gate", "required by GatedRmsNorm"))?;
                g.check(b, "output_gate")?
                    .dtype(&act)?
                    .shape(&[Dim::Is(bt), Dim::Is(h), Dim::Is(v)])?
                    .unit_inner_stride()?;
                let nw =
                    a.norm_weight.as_ref().ok_or_else(|| Error::invalid("norm_weight", "required by GatedRmsNorm"))?;
                nw.check(b, "norm_weight")?.dtype(&[DType::F32])?.shape(&[Dim::Is(v)])?;
            }
            KdaOutputNorm::None => {
                ensure(a.output_gate.is_none(), "output_gate", || "given but output_norm is None".into())?;
                ensure(a.norm_weight.is_none(), "norm_weight", || "given but output_norm is None".into())?;
            }
        }
        a.out.check(b, "out")?.dtype(&act)?.shape(&[Dim::Is(bt), Dim::Is(h), Dim::Is(v)])?.unit_inner_stride()?;
        check_not_aliased(&a.out.layout, "out")
    }
}

/// Fused single-token KDA decode over slot pools.
pub trait KdaDecode: Backend {
    /// Whether this backend can run the decode (reasons if not).
    fn supports(&self, params: &KdaDecodeParams) -> Result<()>;
    fn plan(&self, params: &KdaDecodeParams, batch: &KdaDecodeBatch<'_>) -> Result<KdaDecodePlan> {
        let plan = KdaDecodePlan::new(params, batch)?;
        KdaDecode::supports(self, params)?;
        Ok(plan)
    }
    /// Bytes of workspace `run` needs for this plan (0: none; `run` then takes `None`). The GPU
    /// backends need one for the V-split decode (per (row, head): the prepared q̂, k̂, α, v, β and
    /// the norm's partial sums); a missing or smaller workspace is an invalid-input error naming
    /// `workspace`. Query it per plan: the size follows the batch and the shapes.
    fn workspace_size(&self, _plan: &KdaDecodePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &KdaDecodePlan,
        args: KdaDecodeArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl KdaDecodeParams {
    /// One decode step of all `batch` rows (null-slot rows counted like the others). `io` is the
    /// dtype of x_qkv, g_raw, beta, output_gate and out; `conv_state` and `state` those of the
    /// two pools.
    ///
    /// Bytes: per row its inputs and output, its conv-state slot and recurrent-state slot each
    /// read and written once, its state index; once: conv weights, A_log, dt_bias, norm weight.
    /// FLOPs (all vector: one token per state is a matrix-vector product): conv 2·W + SiLU 4 per
    /// channel; per head 7·K·V for the recurrence (decay, Sᵀk, rank-1 update, Sᵀq), 13·K for
    /// the L2 norms, q scale and gate, 2·V for the residual and β, 8·V for the gated RMSNorm.
    pub fn cost(&self, io: DType, conv_state: DType, state: DType) -> Result<Cost> {
        let (b, h, k, v, w) = (dim(self.batch), dim(self.heads), dim(self.head_k), dim(self.head_v), dim(self.conv_width));
        let gated = matches!(self.output_norm, KdaOutputNorm::GatedRmsNorm { .. }) as u64;
        let gate_params = self.gate.uses_gate_params() as u64;
        let (s, cs) = (elem_bytes(io), elem_bytes(conv_state));
        let hist = w.saturating_sub(1);
        let mut c = CostBuilder::new("params");
        // The packed q|k|v channels: 2K + V per head.
        for per_head in [k, k, v] {
            c = c
                .bytes(&[b, h, per_head, s])
                .bytes(&[2, b, h, per_head, hist, cs])
                .bytes(&[h, per_head, w, 4])
                .flops(MathClass::Vector, &[b, h, per_head, w.saturating_mul(2).saturating_add(4)]);
        }
        c.bytes(&[b, h, k, s])
            .bytes(&[b, h, s])
            .bytes(&[b, h, v, s])
            .bytes(&[gated, b, h, v, s])
            .bytes(&[2, b, h, k, v, elem_bytes(state)])
            .bytes(&[b, 4])
            .bytes(&[gate_params, h, 4])
            .bytes(&[gate_params, h, k, 4])
            .bytes(&[gated, v, 4])
            .flops(MathClass::Vector, &[b, h, 7, k, v])
            .flops(MathClass::Vector, &[b, h, 13, k])
            .flops(MathClass::Vector, &[b, h, 2, v])
            .flops(MathClass::Vector, &[gated, b, h, 8, v])
            .build()
    }
}
