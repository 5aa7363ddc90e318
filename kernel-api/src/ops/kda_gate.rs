//! KDA decay gate: turns the pre-activation gate input f̃ (the low-rank projection output) into
//! the per-channel natural-log decay g, so that α = exp(g) scales key row i of the state.
//!
//! Per token t, head h, key channel i (channels are head-major: c = h·K + i):
//!
//! - `LowerBound { lower_bound: lb }` (K3, FLA `safe_gate`, FlashKDA):
//!   `g = lb · σ(exp(A_log[h]) · (f̃[t,h,i] + dt_bias[h·K+i]))`, in (lb, 0);
//! - `Softplus` (Kimi-Linear, FLA default): `g = −exp(A_log[h]) · softplus(f̃[t,h,i] + dt_bias[h·K+i])`;
//! - `Precomputed`: f̃ already is the log-decay, g = f̃ (A_log and dt_bias are not read).
//!
//! The gate is computed in f32 (fp32 in every reference); the output is f32 `[T, H, K]`.
//!
//! **A_log padding.** K3 stores `A_log` as `[128]` f32 whose first H = 96 entries are the
//! per-head values and whose tail is exactly zero. The ops take `A_log` of any length A ≥ H and
//! read only the first H entries; [`check_a_log_padding`] is the host-side check a weight loader
//! runs to reject a non-zero tail (a sign of a mis-sliced checkpoint or a TP shard taken from
//! the wrong place).
//!
//! This module also holds the enums shared by every KDA op (prefill, decode):
//! [`KdaGateMode`] and the recurrent-state layout [`KdaStateLayout`].

use crate::backend::Backend;
use crate::cpu::math;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// How the decay gate g is obtained from the gate input f̃ (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGateMode {
    /// g = lower_bound · σ(exp(A_log)·(f̃ + dt_bias)); K3 uses lower_bound = −5.
    LowerBound { lower_bound: f32 },
    /// g = −exp(A_log)·softplus(f̃ + dt_bias).
    Softplus,
    /// f̃ is already the natural-log decay g.
    Precomputed,
}

impl KdaGateMode {
    /// Whether this mode reads `A_log` and `dt_bias`.
    pub fn uses_gate_params(self) -> bool {
        !matches!(self, KdaGateMode::Precomputed)
    }

    /// Validates the mode's own parameters; `field` names the mode in errors.
    /// A lower bound must be finite and ≤ 0 (a positive bound would make the "decay" a growth).
    pub fn validate(self, field: &str) -> Result<()> {
        if let KdaGateMode::LowerBound { lower_bound } = self {
            ensure(lower_bound.is_finite() && lower_bound <= 0.0, field, || {
                format!("lower_bound must be finite and <= 0, got {lower_bound}")
            })?;
        }
        Ok(())
    }
}

/// Layout of one head's K×V recurrent state inside a state tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaStateLayout {
    /// `[.., K, V]`: row i is key channel i (the math of k3-architecture.md §2.3).
    KMajor,
    /// `[.., V, K]`: transposed; FLA `state_v_first`, FlashKDA, vLLM, FlashInfer.
    VMajor,
}

impl KdaStateLayout {
    /// The two trailing dims of a state tensor for key width `k_dim` and value width `v_dim`.
    pub fn trailing_dims(self, k_dim: usize, v_dim: usize) -> [usize; 2] {
        match self {
            KdaStateLayout::KMajor => [k_dim, v_dim],
            KdaStateLayout::VMajor => [v_dim, k_dim],
        }
    }

    /// Row-major position of state element (key i, value j) inside one contiguous head state.
    pub fn index(self, i: usize, j: usize, k_dim: usize, v_dim: usize) -> usize {
        match self {
            KdaStateLayout::KMajor => i * v_dim + j,
            KdaStateLayout::VMajor => j * k_dim + i,
        }
    }
}

/// The gate of one channel: `f` = f̃, `a_log` = `A_log[h]`, `dt_bias` = `dt_bias[h·K+i]`.
pub fn kda_gate_value(mode: KdaGateMode, f: f32, a_log: f32, dt_bias: f32) -> f32 {
    match mode {
        KdaGateMode::LowerBound { lower_bound } => math::kda_gate_lower_bound(f, a_log, dt_bias, lower_bound),
        KdaGateMode::Softplus => math::kda_gate_softplus(f, a_log, dt_bias),
        KdaGateMode::Precomputed => f,
    }
}

/// Host-side check of a loaded `A_log`: at least `heads` entries and every entry past the
/// first `heads` exactly zero (K3 pads 96 heads to 128 with zeros).
pub fn check_a_log_padding(a_log: &[f32], heads: usize) -> Result<()> {
    ensure(a_log.len() >= heads, "a_log", || format!("{} entries for {heads} heads", a_log.len()))?;
    if let Some((i, v)) = a_log.iter().enumerate().skip(heads).find(|(_, v)| **v != 0.0) {
        return Err(Error::invalid("a_log", format!("padding entry {i} (past the first {heads} heads) is {v}, not 0")));
    }
    Ok(())
}

/// Shape and mode of a standalone gate activation.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaGateParams {
    /// Tokens T (0 is a no-op).
    pub tokens: usize,
    /// Heads H.
    pub heads: usize,
    /// Key width K (gate channels per head).
    pub head_dim: usize,
    /// Length A ≥ H of the `a_log` tensor (only the first H entries are read).
    pub a_log_len: usize,
    pub mode: KdaGateMode,
}

/// Tensor arguments of [`KdaGate`].
#[derive(Debug)]
pub struct KdaGateArgs<'a, B: Backend + ?Sized> {
    /// `[T, H, K]`, f32 or bf16: the gate input f̃. Inner stride 1; rows may be strided.
    pub g_raw: TensorRef<'a, B>,
    /// `[A]` f32 with A = `params.a_log_len` ≥ H. Required unless the mode is `Precomputed`.
    pub a_log: Option<TensorRef<'a, B>>,
    /// `[H·K]` f32. Required unless the mode is `Precomputed`.
    pub dt_bias: Option<TensorRef<'a, B>>,
    /// `[T, H, K]` f32: the log-decay g.
    pub g_out: TensorMut<'a, B>,
}

/// A validated gate activation.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaGatePlan {
    pub params: KdaGateParams,
}

/// Validates `A_log` `[A]` and `dt_bias` `[H·K]` (both f32) for a gate mode that reads them.
pub(crate) fn check_gate_tensors<B: Backend + ?Sized>(
    b: &B,
    mode: KdaGateMode,
    a_log_len: usize,
    bias_len: usize,
    a_log: Option<&TensorRef<'_, B>>,
    dt_bias: Option<&TensorRef<'_, B>>,
) -> Result<()> {
    match a_log {
        Some(t) => {
            t.check(b, "a_log")?.dtype(&[DType::F32])?.shape(&[Dim::Is(a_log_len)])?;
        }
        None if mode.uses_gate_params() => return Err(Error::invalid("a_log", "required by this gate mode")),
        None => {}
    }
    match dt_bias {
        Some(t) => {
            t.check(b, "dt_bias")?.dtype(&[DType::F32])?.shape(&[Dim::Is(bias_len)])?;
        }
        None if mode.uses_gate_params() => return Err(Error::invalid("dt_bias", "required by this gate mode")),
        None => {}
    }
    Ok(())
}

impl KdaGatePlan {
    /// Backend-independent validation.
    pub fn new(p: &KdaGateParams) -> Result<Self> {
        ensure(p.heads >= 1, "params.heads", || "must be at least 1".into())?;
        ensure(p.head_dim >= 1, "params.head_dim", || "must be at least 1".into())?;
        p.mode.validate("params.mode")?;
        if p.mode.uses_gate_params() {
            ensure(p.a_log_len >= p.heads, "params.a_log_len", || {
                format!("A_log has {} entries but there are {} heads", p.a_log_len, p.heads)
            })?;
        }
        let n = p.tokens.checked_mul(p.heads).and_then(|x| x.checked_mul(p.head_dim));
        ensure(n.is_some(), "params.tokens", || "tokens x heads x head_dim overflows".into())?;
        Ok(KdaGatePlan { params: p.clone() })
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &KdaGateArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let thk = [Dim::Is(p.tokens), Dim::Is(p.heads), Dim::Is(p.head_dim)];
        a.g_raw.check(b, "g_raw")?.dtype(&[DType::F32, DType::BF16])?.shape(&thk)?.unit_inner_stride()?;
        a.g_out.check(b, "g_out")?.dtype(&[DType::F32])?.shape(&thk)?.unit_inner_stride()?;
        check_gate_tensors(b, p.mode, p.a_log_len, p.heads * p.head_dim, a.a_log.as_ref(), a.dt_bias.as_ref())
    }
}

/// Standalone KDA gate activation (FLA `fused_kda_gate`).
pub trait KdaGate: Backend {
    /// Whether this backend can run the gate (reasons if not).
    fn supports(&self, params: &KdaGateParams) -> Result<()>;
    fn plan(&self, params: &KdaGateParams) -> Result<KdaGatePlan> {
        let plan = KdaGatePlan::new(params)?;
        KdaGate::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &KdaGatePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &KdaGatePlan,
        args: KdaGateArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_padding_must_be_zero() {
        let mut a = vec![0.5f32, -0.25, 0.0, 0.0, -0.0];
        assert!(check_a_log_padding(&a, 2).is_ok());
        assert!(check_a_log_padding(&a, 5).is_ok());
        assert_eq!(check_a_log_padding(&a, 6).unwrap_err().field(), Some("a_log"));
        a[4] = 1e-30;
        assert_eq!(check_a_log_padding(&a, 2).unwrap_err().field(), Some("a_log"));
        a[4] = f32::NAN;
        assert_eq!(check_a_log_padding(&a, 2).unwrap_err().field(), Some("a_log"));
    }

    #[test]
    fn state_layout_indexing_transposes() {
        let (k, v) = (3, 5);
        assert_eq!(KdaStateLayout::KMajor.trailing_dims(k, v), [3, 5]);
        assert_eq!(KdaStateLayout::VMajor.trailing_dims(k, v), [5, 3]);
        assert_eq!(KdaStateLayout::KMajor.index(2, 4, k, v), 14);
        assert_eq!(KdaStateLayout::VMajor.index(2, 4, k, v), 14);
        assert_eq!(KdaStateLayout::VMajor.index(1, 0, k, v), 1);
        assert_eq!(KdaStateLayout::KMajor.index(1, 0, k, v), 5);
    }
}
