//! KDA decay-gate modes and recurrent-state layouts shared by the KDA op families.

use crate::cpu::math;

/// How the decay gate g (natural-log decay per key channel) is formed from its raw input f.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGateMode {
    /// K3: g = lower_bound · σ(exp(A_log[h]) · (f + dt_bias)), in (lower_bound, 0).
    LowerBound { lower_bound: f32 },
    /// Kimi-Linear: g = −exp(A_log[h]) · softplus(f + dt_bias).
    Softplus,
    /// f already is g.
    Precomputed,
}

/// Memory order of one head's recurrent state S (K key rows × V value columns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaStateLayout {
    /// `[.., K, V]`: S as written in the math.
    KMajor,
    /// `[.., V, K]`: Sᵀ, FLA's `state_v_first` and the vLLM/FlashInfer decode pools.
    VMajor,
}

/// The decay gate g for one channel with raw input `f`, head parameter `a_log` and channel bias
/// `dt_bias` (ignored by `Precomputed`).
pub fn kda_gate_value(mode: KdaGateMode, f: f32, a_log: f32, dt_bias: f32) -> f32 {
    match mode {
        KdaGateMode::LowerBound { lower_bound } => math::kda_gate_lower_bound(f, a_log, dt_bias, lower_bound),
        KdaGateMode::Softplus => math::kda_gate_softplus(f, a_log, dt_bias),
        KdaGateMode::Precomputed => f,
    }
}
