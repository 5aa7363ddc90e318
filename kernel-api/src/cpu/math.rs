//! Scalar math shared by the CPU reference ops (one definition of each formula in the spec).
//! Computed in f64 and returned as f32 unless noted, so the reference carries less rounding
//! error than any kernel it judges.

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// SiLU(x) = x·σ(x).
pub fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// softplus(x) = ln(1 + e^x), computed without overflow.
pub fn softplus(x: f32) -> f32 {
    let x = x as f64;
    (if x > 20.0 { x } else { x.exp().ln_1p() }) as f32
}

/// SiTU(g, u) = β·tanh(g/β)·σ(g) · β_l·tanh(u/β_l); a `None` linear beta leaves u uncapped.
pub fn situ(g: f32, u: f32, beta: f32, linear_beta: Option<f32>) -> f32 {
    let (g, u, b) = (g as f64, u as f64, beta as f64);
    let gate = b * (g / b).tanh() / (1.0 + (-g).exp());
    let up = match linear_beta {
        Some(bl) => bl as f64 * (u / bl as f64).tanh(),
        None => u,
    };
    (gate * up) as f32
}

/// KDA lower-bound decay gate: g = lb·σ(exp(A_log)·(f + dt_bias)), natural-log decay in (lb, 0).
pub fn kda_gate_lower_bound(f: f32, a_log: f32, dt_bias: f32, lower_bound: f32) -> f32 {
    let z = (a_log as f64).exp() * (f as f64 + dt_bias as f64);
    (lower_bound as f64 / (1.0 + (-z).exp())) as f32
}

/// Kimi-Linear softplus decay gate: g = -exp(A_log)·softplus(f + dt_bias).
pub fn kda_gate_softplus(f: f32, a_log: f32, dt_bias: f32) -> f32 {
    -((a_log as f64).exp() * softplus(f + dt_bias) as f64) as f32
}

/// FLA L2 normalisation in place: x / sqrt(Σx² + eps) (eps inside the root; 1e-6 in KDA).
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / (ss + eps as f64).sqrt();
    for v in x.iter_mut() {
        *v = (*v as f64 * inv) as f32;
    }
}

/// 1/sqrt(mean(x²) + eps), the RMSNorm factor (f64 statistics).
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len().max(1) as f64;
    (1.0 / (ms + eps as f64).sqrt()) as f32
}

/// LSE merge of partial attention results: the weights `exp(lse_p - lse)` of the parts and the
/// merged `lse = ln Σ_p exp(lse_p)`; `None` when every part is empty (all lse_p = -inf), whose
/// merged result is out = 0, lse = -inf.
pub fn lse_merge_weights(lses: &[f32]) -> Option<(Vec<f64>, f32)> {
    let m = lses.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
    if m == f64::NEG_INFINITY {
        return None;
    }
    let e: Vec<f64> = lses.iter().map(|&l| (l as f64 - m).exp()).collect();
    let total: f64 = e.iter().sum();
    Some((e.iter().map(|x| x / total).collect(), (m + total.ln()) as f32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked SiTU values from k3-architecture.md 5.4 (f64 reference, checked to f32 precision).
    #[test]
    fn situ_table() {
        for &(g, u, want) in &[
            (1.0, 1.0, 0.7158178280748404),
            (-2.0, 3.0, -0.6578738185454248),
            (10.0, 50.0, 95.1080215340149),
            (0.5, -100.0, -7.735277097238144),
        ] {
            let got = situ(g, u, 4.0, Some(25.0)) as f64;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "SiTU({g},{u}) = {got}, want {want}");
        }
    }

    /// Decay-gate table from k3-architecture.md 5.4 (A_log = 0, lower bound -5).
    #[test]
    fn lower_bound_gate_table() {
        for &(z, g_want, a_want) in &[(0.0f32, -2.5f64, 0.0820849986f64), (1.0, -3.6552929, 0.0258539239), (-3.0, -0.2371294, 0.7888892261)] {
            let g = kda_gate_lower_bound(z, 0.0, 0.0, -5.0) as f64;
            assert!((g - g_want).abs() < 1e-6, "g({z}) = {g}");
            assert!((g.exp() - a_want).abs() < 1e-7, "alpha({z}) = {}", g.exp());
        }
    }
}
