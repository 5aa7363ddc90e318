//! Conformance tests of [`crate::ops::RmsNorm`], [`crate::ops::GatedRmsNorm`] and
//! [`crate::ops::L2Norm`].

use super::gemm::upload_padded;
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::ops::{
    GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, L2Norm, L2NormArgs, L2NormParams, RmsNorm, RmsNormArgs, RmsNormParams,
    RmsWeightOrder,
};
use crate::tolerance::{assert_close, compare, Tolerance};


/// 1/√(mean x² + eps) in f64.
fn rms_inv64(x: &[f32], eps: f32) -> f64 {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    1.0 / (ms + eps as f64).sqrt()
}

/// Weighted RMSNorm in f64; `cast` rounds the normalised value through that dtype first (HF).
fn rms_oracle(x: &[f32], w: &[f32], d: usize, eps: f32, cast: Option<DType>) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let r = rms_inv64(row, eps);
        for (&xi, &wi) in row.iter().zip(w) {
            let n = xi as f64 * r;
            let n = match cast {
                Some(dt) => round_through(dt, &[n as f32])[0] as f64,
                None => n,
            };
            out.push((wi as f64 * n) as f32);
        }
    }
    out
}

/// Rows of N(0, 1) values scaled per row by one of `scales`, so some rows sit near √ε where
/// the ε placement matters.
fn scaled_rows(rng: &mut TestRng, rows: usize, d: usize, scales: &[f32]) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * d);
    for r in 0..rows {
        v.extend(rng.normals(d, scales[r % scales.len()]));
    }
    v
}

/// Near-1 jittered weights (a missing weight multiply cannot cancel out; k3-architecture §5.3).
fn near_one(rng: &mut TestRng, n: usize, dt: DType) -> Vec<f32> {
    round_through(dt, &rng.normals(n, 0.05).iter().map(|v| 1.0 + v).collect::<Vec<_>>())
}

fn run_rms<B: Backend + RmsNorm>(b: &B, p: &RmsNormParams, x: &DeviceTensor<B>, w: &DeviceTensor<B>, out_dt: DType) -> Vec<f32> {
    let plan = RmsNorm::plan(b, p).expect("plan");
    let mut out = b.zeros(out_dt, &[p.m, p.d]).unwrap();
    let args = RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() };
    RmsNorm::run(b, &plan, args, None, b.default_stream()).expect("run");
    download_f32(b, &out).unwrap()
}

/// Weighted RMSNorm, both weight orders, against f64, with tiny rows where ε dominates,
/// row-strided x and ε 1e-5 / 1e-6.
pub fn rms_norm_matches_f64_oracle<B: Backend + RmsNorm>(b: &B) {
    let mut rng = TestRng::new(31);
    let cases = [
        (1, 128, 1e-5, DType::F32, DType::F32, DType::F32),
        (7, 96, 1e-6, DType::BF16, DType::BF16, DType::BF16),
        (16, 160, 1e-5, DType::BF16, DType::F32, DType::F32),
        (5, 48, 1e-6, DType::F32, DType::BF16, DType::BF16),
    ];
    for &(m, d, eps, x_dt, w_dt, out_dt) in &cases {
        for order in [RmsWeightOrder::F32, RmsWeightOrder::CastBeforeWeight] {
            for pad in [0, 5] {
                let x = round_through(x_dt, &scaled_rows(&mut rng, m, d, &[1.0, 1e-3, 30.0, 3e-4]));
                let w = near_one(&mut rng, d, w_dt);
                let cast = (order == RmsWeightOrder::CastBeforeWeight).then_some(x_dt);
                let want = rms_oracle(&x, &w, d, eps, cast);
                let xt = upload_padded(b, x_dt, &[m, d], &x, pad, pad);
                let wt = upload_f32(b, w_dt, &[d], &w).unwrap();
                let got = run_rms(b, &RmsNormParams { m, d, eps, weight_order: order }, &xt, &wt, out_dt);
                // f32 out: a mean of ≤ 160 squares and two products, well inside 1e-5.
                // bf16 out: one bf16 rounding (plus the HF intermediate one).
                let what = format!("rms_norm m{m} d{d} eps {eps} x {x_dt} w {w_dt} out {out_dt} {order:?} pad {pad}");
                assert_close(&what, &got, &want, Tolerance::for_dtype(out_dt));
            }
        }
    }
}

/// The HF order (normalised value cast to bf16 before the weight multiply) is what
/// `CastBeforeWeight` computes, and it differs measurably from the f32 order.
pub fn rms_norm_hf_cast_order<B: Backend + RmsNorm>(b: &B) {
    let mut rng = TestRng::new(32);
    let (m, d, eps) = (32, 128, 1e-5);
    let x = round_through(DType::BF16, &scaled_rows(&mut rng, m, d, &[1.0, 4.0]));
    let w = near_one(&mut rng, d, DType::BF16);
    let xt = upload_f32(b, DType::BF16, &[m, d], &x).unwrap();
    let wt = upload_f32(b, DType::BF16, &[d], &w).unwrap();
    let hf = rms_oracle(&x, &w, d, eps, Some(DType::BF16));
    let fused = rms_oracle(&x, &w, d, eps, None);
    // The two orders are about one bf16 rounding apart (≈ 1e-3 relative RMS): the test below
    // can tell them apart only if that gap is far above its 1e-4 threshold.
    let gap = compare(&hf, &fused).rel_rmse;
    assert!(gap > 5e-4, "the two orders should differ on these inputs (gap {gap:.2e})");
    // f32 output keeps the difference visible. Threshold 1e-4 (F32_ALGO): the x·r product may be
    // one f32 ulp apart between backends and flip one bf16 rounding in ~1e4 elements, which
    // costs 2⁻⁸/√4096 ≈ 6e-5 relative RMSE; the wrong order costs ≈ 1e-3.
    let got = run_rms(b, &RmsNormParams { m, d, eps, weight_order: RmsWeightOrder::CastBeforeWeight }, &xt, &wt, DType::F32);
    assert_close("rms_norm CastBeforeWeight vs HF order", &got, &hf, Tolerance::F32_ALGO);
    let got = run_rms(b, &RmsNormParams { m, d, eps, weight_order: RmsWeightOrder::F32 }, &xt, &wt, DType::F32);
    assert_close("rms_norm F32 order vs f64", &got, &fused, Tolerance::F32);
}

/// Gated per-head RMSNorm in f64: the mean runs over one head.
fn gated_oracle(o: &[f32], gate: &[f32], w: &[f32], dh: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(o.len());
    for (oh, gh) in o.chunks_exact(dh).zip(gate.chunks_exact(dh)) {
        let r = rms_inv64(oh, eps);
        for ((&oi, &gi), &wi) in oh.iter().zip(gh).zip(w) {
            let sig = 1.0 / (1.0 + (-(gi as f64)).exp());
            out.push((wi as f64 * oi as f64 * r * sig) as f32);
        }
    }
    out
}

/// Gated per-head RMSNorm against f64: heads of very different scale (so a per-row mean would
/// fail), heads near √ε, strided gate, f32 and bf16.
pub fn gated_rms_norm_matches_f64_oracle<B: Backend + GatedRmsNorm>(b: &B) {
    let mut rng = TestRng::new(33);
    let cases = [
        (3, 4, 32, DType::F32, DType::F32, DType::F32),
        (5, 2, 64, DType::BF16, DType::BF16, DType::BF16),
        (2, 6, 16, DType::BF16, DType::F32, DType::F32),
        (1, 1, 128, DType::F32, DType::BF16, DType::BF16),
    ];
    for &(m, h, dh, o_dt, g_dt, out_dt) in &cases {
        for w_dt in [DType::F32, DType::BF16] {
            let o = round_through(o_dt, &scaled_rows(&mut rng, m * h, dh, &[1.0, 2e-3, 50.0]));
            let gate = round_through(g_dt, &rng.normals(m * h * dh, 2.0));
            let w = near_one(&mut rng, dh, w_dt);
            let eps = 1e-5;
            let want = gated_oracle(&o, &gate, &w, dh, eps);
            let p = GatedRmsNormParams { m, heads: h, head_dim: dh, eps };
            let plan = GatedRmsNorm::plan(b, &p).expect("plan");
            let ot = upload_f32(b, o_dt, &[m, h, dh], &o).unwrap();
            let gt = upload_padded(b, g_dt, &[m, h, dh], &gate, 3, 2);
            let wt = upload_f32(b, w_dt, &[dh], &w).unwrap();
            let mut out = b.zeros(out_dt, &[m, h, dh]).unwrap();
            let args = GatedRmsNormArgs { o: ot.as_ref(), gate: gt.as_ref(), w: wt.as_ref(), out: out.as_mut() };
            GatedRmsNorm::run(b, &plan, args, None, b.default_stream()).expect("run");
            let got = download_f32(b, &out).unwrap();
            // f32: mean of ≤ 128 squares, a sigmoid and three products; bf16: one rounding.
            let what = format!("gated_rms_norm m{m} h{h} dh{dh} o {o_dt} gate {g_dt} w {w_dt} out {out_dt}");
            assert_close(&what, &got, &want, Tolerance::for_dtype(out_dt));
        }
    }
}

/// FLA L2 norm in f64: x / √(Σx² + eps).
fn l2_oracle(x: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        out.extend(row.iter().map(|&v| (v as f64 / (ss + eps as f64).sqrt()) as f32));
    }
    out
}

fn run_l2<B: Backend + L2Norm>(b: &B, x: &DeviceTensor<B>, m: usize, d: usize, eps: f32, out_dt: DType) -> Vec<f32> {
    let plan = L2Norm::plan(b, &L2NormParams { m, d, eps }).expect("plan");
    let mut out = b.zeros(out_dt, &[m, d]).unwrap();
    let args = L2NormArgs { x: x.as_ref(), out: out.as_mut() };
    L2Norm::run(b, &plan, args, None, b.default_stream()).expect("run");
    download_f32(b, &out).unwrap()
}

/// L2 norm against f64 on random rows (f32 and bf16, strided x).
pub fn l2_norm_matches_f64_oracle<B: Backend + L2Norm>(b: &B) {
    let mut rng = TestRng::new(34);
    for &(m, d, x_dt, out_dt, pad) in
        &[(4, 128, DType::F32, DType::F32, 0), (9, 32, DType::BF16, DType::BF16, 7), (3, 96, DType::BF16, DType::F32, 1)]
    {
        let x = round_through(x_dt, &scaled_rows(&mut rng, m, d, &[1.0, 1e-3, 20.0]));
        let xt = upload_padded(b, x_dt, &[m, d], &x, pad, pad);
        let got = run_l2(b, &xt, m, d, 1e-6, out_dt);
        // f32: one sum of ≤ 128 squares, a root and a division; bf16: one rounding.
        assert_close(&format!("l2_norm m{m} d{d} {x_dt}->{out_dt}"), &got, &l2_oracle(&x, d, 1e-6), Tolerance::for_dtype(out_dt));
    }
}

/// Pins the ε form: rows with Σx² comparable to ε, where ε outside the root (‖x‖ + ε,
/// max(‖x‖, ε)) or a mean instead of a sum give outputs 20-60% off.
pub fn l2_norm_eps_inside_root_and_sum<B: Backend + L2Norm>(b: &B) {
    let mut rng = TestRng::new(35);
    let (m, d, eps) = (3, 16, 1e-6f32);
    let mut x = Vec::new();
    for target_ss in [2e-6f64, 5e-7, 1.0] {
        // Scale a random row to Σx² = target_ss (the last row is a large-norm control).
        let row = rng.normals(d, 1.0);
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        x.extend(row.iter().map(|&v| (v as f64 * (target_ss / ss).sqrt()) as f32));
    }
    let want = l2_oracle(&x, d, eps);
    let alt = |f: &dyn Fn(f64) -> f64| -> Vec<f32> {
        x.chunks_exact(d)
            .flat_map(|row| {
                let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
                let denom = f(ss);
                row.iter().map(move |&v| (v as f64 / denom) as f32)
            })
            .collect()
    };
    let e = eps as f64;
    let wrong_forms = [
        ("eps outside the root", alt(&|ss: f64| ss.sqrt() + e)),
        ("max(norm, eps)", alt(&|ss: f64| ss.sqrt().max(e))),
        ("mean instead of sum", alt(&|ss: f64| (ss / d as f64 + e).sqrt())),
    ];
    for (name, v) in &wrong_forms {
        let gap = compare(&v[..2 * d], &want[..2 * d]).rel_rmse;
        assert!(gap > 0.1, "{name} must be distinguishable on these rows (gap {gap:.2e})");
    }
    let xt = upload_f32(b, DType::F32, &[m, d], &x).unwrap();
    let got = run_l2(b, &xt, m, d, eps, DType::F32);
    assert_close("l2_norm eps inside the root, sum of squares", &got, &want, Tolerance::F32);
}

/// Bad ε, shapes and dtypes are typed errors naming the field.
pub fn norm_rejects_bad_args<B: Backend + RmsNorm + GatedRmsNorm + L2Norm>(b: &B) {
    let field = |e: crate::Error| e.field().map(str::to_string);
    for eps in [0.0, -1e-5, f32::NAN, f32::INFINITY] {
        let p = RmsNormParams { m: 2, d: 8, eps, weight_order: RmsWeightOrder::F32 };
        assert_eq!(field(RmsNorm::plan(b, &p).unwrap_err()).as_deref(), Some("params.eps"), "rms eps {eps}");
        let p = GatedRmsNormParams { m: 2, heads: 2, head_dim: 8, eps };
        assert_eq!(field(GatedRmsNorm::plan(b, &p).unwrap_err()).as_deref(), Some("params.eps"), "gated eps {eps}");
        let p = L2NormParams { m: 2, d: 8, eps };
        assert_eq!(field(L2Norm::plan(b, &p).unwrap_err()).as_deref(), Some("params.eps"), "l2 eps {eps}");
    }
    let p = RmsNormParams { m: 2, d: 0, eps: 1e-5, weight_order: RmsWeightOrder::F32 };
    assert_eq!(field(RmsNorm::plan(b, &p).unwrap_err()).as_deref(), Some("params.d"));
    let p = GatedRmsNormParams { m: 2, heads: 0, head_dim: 8, eps: 1e-5 };
    assert_eq!(field(GatedRmsNorm::plan(b, &p).unwrap_err()).as_deref(), Some("params.heads"));

    let z = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let rms = RmsNorm::plan(b, &RmsNormParams { m: 2, d: 8, eps: 1e-5, weight_order: RmsWeightOrder::F32 }).unwrap();
    let rms_err = |x: &DeviceTensor<B>, w: &DeviceTensor<B>, out: &mut DeviceTensor<B>| {
        let args = RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() };
        field(RmsNorm::run(b, &rms, args, None, b.default_stream()).unwrap_err())
    };
    let (x, w) = (z(DType::BF16, &[2, 8]), z(DType::F32, &[8]));
    assert_eq!(rms_err(&z(DType::F16, &[2, 8]), &w, &mut z(DType::BF16, &[2, 8])).as_deref(), Some("x"));
    assert_eq!(rms_err(&x, &z(DType::F32, &[9]), &mut z(DType::BF16, &[2, 8])).as_deref(), Some("w"));
    assert_eq!(rms_err(&x, &w, &mut z(DType::I32, &[2, 8])).as_deref(), Some("out"));
    assert_eq!(rms_err(&x, &w, &mut z(DType::BF16, &[3, 8])).as_deref(), Some("out"));

    let gp = GatedRmsNormParams { m: 2, heads: 3, head_dim: 4, eps: 1e-5 };
    let gated = GatedRmsNorm::plan(b, &gp).unwrap();
    let gated_err = |o: &DeviceTensor<B>, g: &DeviceTensor<B>, w: &DeviceTensor<B>| {
        let mut out = z(DType::F32, &[2, 3, 4]);
        let args = GatedRmsNormArgs { o: o.as_ref(), gate: g.as_ref(), w: w.as_ref(), out: out.as_mut() };
        field(GatedRmsNorm::run(b, &gated, args, None, b.default_stream()).unwrap_err())
    };
    let (o, g, gw) = (z(DType::F32, &[2, 3, 4]), z(DType::F32, &[2, 3, 4]), z(DType::F32, &[4]));
    assert_eq!(gated_err(&o, &z(DType::F32, &[2, 4, 3]), &gw).as_deref(), Some("gate"));
    assert_eq!(gated_err(&o, &g, &z(DType::F32, &[12])).as_deref(), Some("w"), "w per head dim, not per channel");
    assert_eq!(gated_err(&z(DType::F32, &[2, 12]), &g, &gw).as_deref(), Some("o"));

    let l2 = L2Norm::plan(b, &L2NormParams { m: 2, d: 8, eps: 1e-6 }).unwrap();
    let mut out = z(DType::F32, &[2, 8]);
    let x7 = z(DType::F32, &[2, 7]);
    let args = L2NormArgs { x: x7.as_ref(), out: out.as_mut() };
    assert_eq!(field(L2Norm::run(b, &l2, args, None, b.default_stream()).unwrap_err()).as_deref(), Some("x"));
}

