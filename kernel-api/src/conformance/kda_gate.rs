//! Conformance tests of [`crate::ops::KdaGate`].

use super::{download_f32, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt};
use crate::dtype::DType;
use crate::ops::{KdaGate, KdaGateArgs, KdaGateMode, KdaGateParams};
use crate::tolerance::{assert_close, Tolerance};


/// Runs the gate on host values: g_raw `[T, H, K]` in `in_dt`, A_log `[A]`, dt_bias `[H·K]`.
fn run_gate<B: Backend + KdaGate>(
    b: &B,
    p: &KdaGateParams,
    in_dt: DType,
    g_raw: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
) -> Vec<f32> {
    let plan = KdaGate::plan(b, p).expect("plan");
    let shape = [p.tokens, p.heads, p.head_dim];
    let g = upload_f32(b, in_dt, &shape, g_raw).unwrap();
    let a = upload_f32(b, DType::F32, &[a_log.len()], a_log).unwrap();
    let d = upload_f32(b, DType::F32, &[dt_bias.len()], dt_bias).unwrap();
    let mut out = b.zeros(DType::F32, &shape).unwrap();
    let args = KdaGateArgs { g_raw: g.as_ref(), a_log: Some(a.as_ref()), dt_bias: Some(d.as_ref()), g_out: out.as_mut() };
    KdaGate::run(b, &plan, args, None, b.default_stream()).expect("run");
    download_f32(b, &out).unwrap()
}

/// The decay-gate table of k3-architecture.md 5.4 (A_log = 0, lower bound −5), reached through
/// f̃ + dt_bias = z and, for head 1, through A_log = ln 2 with f̃ = z/2 − dt_bias. A_log is
/// padded past H with NaN, which must not be read.
pub fn kda_gate_worked_values<B: Backend + KdaGate>(b: &B) {
    // (z, g, α) from the table.
    let table = [(0.0f32, -2.5f64, 0.0820849986f64), (1.0, -3.6552929, 0.0258539239), (-3.0, -0.2371294, 0.7888892261)];
    let (heads, k) = (2, 3);
    let dt_bias = [0.0, 0.25, -0.5, 0.5, -1.0, 0.125];
    let a_log = [0.0, std::f32::consts::LN_2, f32::NAN, f32::NAN];
    let mut g_raw = Vec::new();
    for h in 0..heads {
        for (i, &(z, _, _)) in table.iter().enumerate() {
            let f = if h == 0 { z - dt_bias[i] } else { z / 2.0 - dt_bias[k + i] };
            g_raw.push(f);
        }
    }
    let p = KdaGateParams { tokens: 1, heads, head_dim: k, a_log_len: 4, mode: KdaGateMode::LowerBound { lower_bound: -5.0 } };
    let g = run_gate(b, &p, DType::F32, &g_raw, &a_log, &dt_bias);
    for h in 0..heads {
        for (i, &(z, g_want, a_want)) in table.iter().enumerate() {
            let got = g[h * k + i] as f64;
            // f32 gate: the sigmoid's rounding and exp(ln 2) ≠ 2 exactly stay below 1e-6.
            assert!((got - g_want).abs() < 1e-6, "head {h}: g(z = {z}) = {got}, want {g_want}");
            assert!((got.exp() - a_want).abs() < 1e-7, "head {h}: alpha(z = {z}) = {}, want {a_want}", got.exp());
        }
    }
}

/// Softplus and lower-bound modes match their f64 formulas on random inputs (f32 and bf16
/// g_raw); `Precomputed` passes g through unchanged.
pub fn kda_gate_formulas<B: Backend + KdaGate>(b: &B) {
    let mut rng = TestRng::new(21);
    for &(tokens, heads, k) in &[(5, 1, 16), (3, 4, 8), (0, 2, 4)] {
        let n = tokens * heads * k;
        let g_raw = rng.normals(n, 3.0);
        let a_log: Vec<f32> = (0..heads + 3).map(|h| if h < heads { rng.range(-2.0, 1.0) } else { 0.0 }).collect();
        let dt_bias = rng.uniforms(heads * k, -4.0, 2.0);
        for in_dt in [DType::F32, DType::BF16] {
            let seen = super::round_through(in_dt, &g_raw);
            for mode in [KdaGateMode::Softplus, KdaGateMode::LowerBound { lower_bound: -3.5 }, KdaGateMode::Precomputed] {
                let p = KdaGateParams { tokens, heads, head_dim: k, a_log_len: a_log.len(), mode };
                let got = run_gate(b, &p, in_dt, &g_raw, &a_log, &dt_bias);
                let want: Vec<f32> = (0..n)
                    .map(|e| {
                        let (h, i) = ((e / k) % heads, e % k);
                        let f = seen[e] as f64;
                        let x = f + dt_bias[h * k + i] as f64;
                        let a = (a_log[h] as f64).exp();
                        (match mode {
                            KdaGateMode::Softplus => -a * (1.0 + x.exp()).ln(),
                            KdaGateMode::LowerBound { lower_bound } => lower_bound as f64 / (1.0 + (-a * x).exp()),
                            KdaGateMode::Precomputed => f,
                        }) as f32
                    })
                    .collect();
                if mode == KdaGateMode::Precomputed {
                    assert_eq!(got, want, "precomputed gate must pass g through ({in_dt})");
                } else {
                    // Same formula evaluated in f32 with an f32 output: the f32 same-algorithm policy.
                    assert_close(&format!("kda_gate {mode:?} ({in_dt})"), &got, &want, Tolerance::F32);
                }
            }
        }
    }
}

/// Malformed params and arguments are typed errors naming the field.
pub fn kda_gate_rejects_bad_input<B: Backend + KdaGate>(b: &B) {
    let p = KdaGateParams { tokens: 2, heads: 3, head_dim: 4, a_log_len: 3, mode: KdaGateMode::LowerBound { lower_bound: -5.0 } };
    let field = |p: &KdaGateParams| KdaGate::plan(b, p).unwrap_err().field().map(str::to_string);
    assert_eq!(field(&KdaGateParams { a_log_len: 2, ..p.clone() }).as_deref(), Some("params.a_log_len"));
    assert_eq!(field(&KdaGateParams { heads: 0, ..p.clone() }).as_deref(), Some("params.heads"));
    for lb in [1.0, f32::NAN, f32::NEG_INFINITY] {
        let bad = KdaGateParams { mode: KdaGateMode::LowerBound { lower_bound: lb }, ..p.clone() };
        assert_eq!(field(&bad).as_deref(), Some("params.mode"), "lower bound {lb}");
    }
    // A short A_log is fine when the gate is precomputed (it is not read).
    assert!(KdaGate::plan(b, &KdaGateParams { a_log_len: 0, mode: KdaGateMode::Precomputed, ..p.clone() }).is_ok());

    let plan = KdaGate::plan(b, &p).unwrap();
    let g = b.zeros(DType::F32, &[2, 3, 4]).unwrap();
    let g16 = b.zeros(DType::F16, &[2, 3, 4]).unwrap();
    let a = b.zeros(DType::F32, &[3]).unwrap();
    let a_bf16 = b.zeros(DType::BF16, &[3]).unwrap();
    let d = b.zeros(DType::F32, &[12]).unwrap();
    let d_short = b.zeros(DType::F32, &[11]).unwrap();
    let mut out = b.zeros(DType::F32, &[2, 3, 4]).unwrap();
    let mut out_bf16 = b.zeros(DType::BF16, &[2, 3, 4]).unwrap();
    let run = |g_raw: &crate::DeviceTensor<B>, a_log: Option<&crate::DeviceTensor<B>>, dt: Option<&crate::DeviceTensor<B>>, o: &mut crate::DeviceTensor<B>| {
        let args = KdaGateArgs { g_raw: g_raw.as_ref(), a_log: a_log.map(|t| t.as_ref()), dt_bias: dt.map(|t| t.as_ref()), g_out: o.as_mut() };
        KdaGate::run(b, &plan, args, None, b.default_stream()).err().and_then(|e| e.field().map(str::to_string))
    };
    assert_eq!(run(&g, Some(&a), Some(&d), &mut out), None);
    assert_eq!(run(&g16, Some(&a), Some(&d), &mut out).as_deref(), Some("g_raw"));
    assert_eq!(run(&g, Some(&a_bf16), Some(&d), &mut out).as_deref(), Some("a_log"));
    assert_eq!(run(&g, None, Some(&d), &mut out).as_deref(), Some("a_log"));
    assert_eq!(run(&g, Some(&a), Some(&d_short), &mut out).as_deref(), Some("dt_bias"));
    assert_eq!(run(&g, Some(&a), None, &mut out).as_deref(), Some("dt_bias"));
    assert_eq!(run(&g, Some(&a), Some(&d), &mut out_bf16).as_deref(), Some("g_out"));
}

