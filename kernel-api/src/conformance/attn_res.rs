//! Conformance tests of [`crate::ops::AttnResMix`] and [`crate::ops::attn_res_score_vector`].

use super::gemm::upload_padded;
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::ops::{attn_res_score_vector, AttnResMix, AttnResMixArgs, AttnResMixParams};
use crate::tensor::HostTensor;
use crate::tolerance::{assert_close, compare, Tolerance};


/// Mix in f64: scores on RMS-normalised sources, softmax over sources, sum of raw sources.
/// `v` is `[S, M, D]` in logical order.
fn oracle(v: &[f32], w: &[f64], s_n: usize, m_n: usize, d: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; m_n * d];
    for m in 0..m_n {
        let src = |i: usize| &v[(i * m_n + m) * d..(i * m_n + m + 1) * d];
        let scores: Vec<f64> = (0..s_n)
            .map(|i| {
                let vi = src(i);
                let ms = vi.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / d as f64;
                let r = 1.0 / (ms + eps as f64).sqrt();
                vi.iter().zip(w).map(|(&x, &wj)| wj * x as f64 * r).sum::<f64>()
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let z: f64 = e.iter().sum();
        for j in 0..d {
            out[m * d + j] = (0..s_n).map(|i| e[i] / z * src(i)[j] as f64).sum::<f64>() as f32;
        }
    }
    out
}

fn run_mix<B: Backend + AttnResMix>(b: &B, p: &AttnResMixParams, v: &DeviceTensor<B>, w: &[f32], out_dt: DType) -> Vec<f32> {
    let plan = AttnResMix::plan(b, p).expect("plan");
    let wt = upload_f32(b, DType::F32, &[p.d], w).unwrap();
    let mut out = b.zeros(out_dt, &[p.m, p.d]).unwrap();
    let args = AttnResMixArgs { sources: v.as_ref(), score_vector: wt.as_ref(), out: out.as_mut() };
    AttnResMix::run(b, &plan, args, None, b.default_stream()).expect("run");
    download_f32(b, &out).unwrap()
}

/// Sources of different magnitudes (as bank entries are: the embedding, then block sums).
fn sources(rng: &mut TestRng, s_n: usize, m_n: usize, d: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(s_n * m_n * d);
    for _ in 0..s_n {
        let scale = rng.range(0.1, 10.0);
        v.extend(rng.normals(m_n * d, scale));
    }
    v
}

/// S from 1 to 10 against f64, with the score vector built from bf16 norm and projection
/// weights by `attn_res_score_vector` (and checked against the f64 product here).
pub fn attn_res_matches_f64_oracle<B: Backend + AttnResMix>(b: &B) {
    let mut rng = TestRng::new(41);
    let cases = [
        (1, 2, 64, DType::F32, DType::F32, 0),
        (2, 3, 128, DType::BF16, DType::BF16, 0),
        (4, 1, 96, DType::BF16, DType::F32, 5),
        (9, 4, 128, DType::BF16, DType::BF16, 3),
        (10, 2, 64, DType::F32, DType::F32, 1),
    ];
    for &(s_n, m_n, d, in_dt, out_dt, pad) in &cases {
        let nw = round_through(DType::BF16, &rng.normals(d, 0.05).iter().map(|x| 1.0 + x).collect::<Vec<_>>());
        // Projection ~ N(0, 1/D): scores then spread ~ N(0, 1), a meaningful softmax.
        let pw = round_through(DType::BF16, &rng.normals(d, 1.0 / (d as f32).sqrt()));
        let score = attn_res_score_vector(
            &HostTensor::from_f32(DType::BF16, &[d], &nw).unwrap(),
            &HostTensor::from_f32(DType::BF16, &[1, d], &pw).unwrap(),
        )
        .expect("score vector");
        let w64: Vec<f64> = nw.iter().zip(&pw).map(|(&a, &c)| a as f64 * c as f64).collect();
        let w = score.to_f32();
        // The product of two bf16 values is exact in f32.
        assert!(w.iter().zip(&w64).all(|(&a, &c)| a as f64 == c), "score vector must be the exact product");
        let v = round_through(in_dt, &sources(&mut rng, s_n, m_n, d));
        let want = oracle(&v, &w64, s_n, m_n, d, 1e-5);
        let vt = upload_padded(b, in_dt, &[s_n, m_n, d], &v, pad, pad);
        let got = run_mix(b, &AttnResMixParams { sources: s_n, m: m_n, d, eps: 1e-5 }, &vt, &w, out_dt);
        // f32: scores are sums of ≤ 128 products and the softmax is exp-normalised; the mix of
        // ≤ 10 sources adds a few roundings. bf16: one rounding of the result.
        let what = format!("attn_res S{s_n} M{m_n} D{d} {in_dt}->{out_dt} pad {pad}");
        assert_close(&what, &got, &want, Tolerance::for_dtype(out_dt));
    }
}

/// A zero score vector gives the plain average of the sources (k3-architecture §5.4 item 3).
pub fn attn_res_zero_scores_average<B: Backend + AttnResMix>(b: &B) {
    let mut rng = TestRng::new(42);
    for s_n in 1..=10 {
        let (m_n, d) = (2, 32);
        let v = sources(&mut rng, s_n, m_n, d);
        let mut want = vec![0f32; m_n * d];
        for (k, o) in want.iter_mut().enumerate() {
            *o = ((0..s_n).map(|i| v[i * m_n * d + k] as f64).sum::<f64>() / s_n as f64) as f32;
        }
        let vt = upload_f32(b, DType::F32, &[s_n, m_n, d], &v).unwrap();
        let got = run_mix(b, &AttnResMixParams { sources: s_n, m: m_n, d, eps: 1e-5 }, &vt, &vec![0.0; d], DType::F32);
        assert_close(&format!("attn_res zero scores S{s_n}"), &got, &want, Tolerance::F32);
    }
}

/// Scores use RMS-normalised sources but the sum uses raw ones: with v₂ = 8·v₁ both scores
/// are equal, so the mix is (v₁ + 8v₁)/2 = 4.5·v₁, while raw-value scores would pick v₂
/// almost surely and a sum of normalised values would return v₁/rms(v₁).
pub fn attn_res_scores_normalised_sum_raw<B: Backend + AttnResMix>(b: &B) {
    let mut rng = TestRng::new(43);
    let d = 64;
    for in_dt in [DType::F32, DType::BF16] {
        let v1 = round_through(in_dt, &rng.normals(d, 2.0));
        let v2: Vec<f32> = v1.iter().map(|x| 8.0 * x).collect(); // exact in bf16 too
        // A score vector along v₁, so the (equal) scores are large: raw scores would differ by 8×.
        let norm: f32 = v1.iter().map(|x| x * x).sum::<f32>().sqrt();
        let w: Vec<f32> = v1.iter().map(|x| 0.5 * x / norm).collect();
        let v: Vec<f32> = v1.iter().chain(&v2).copied().collect();
        let vt = upload_f32(b, in_dt, &[2, 1, d], &v).unwrap();
        let got = run_mix(b, &AttnResMixParams { sources: 2, m: 1, d, eps: 1e-5 }, &vt, &w, DType::F32);
        let want: Vec<f32> = v1.iter().map(|x| 4.5 * x).collect();
        // Equal scores → π = (½, ½) up to rounding of the two scores (relative 1e-7).
        assert_close(&format!("attn_res equal normalised scores ({in_dt})"), &got, &want, Tolerance::F32);
        let w64: Vec<f64> = w.iter().map(|&x| x as f64).collect();
        assert_close("attn_res oracle agrees", &want, &oracle(&v, &w64, 2, 1, d, 1e-5), Tolerance::F32);
        // The wrong readings are far away on this input (so the check above can fail).
        let rms1 = (v1.iter().map(|x| (x * x) as f64).sum::<f64>() / d as f64 + 1e-5).sqrt();
        let normalised_sum: Vec<f32> = v1.iter().map(|&x| (x as f64 / rms1) as f32).collect();
        assert!(compare(&normalised_sum, &want).rel_rmse > 0.5);
        assert!(compare(&v2, &want).rel_rmse > 0.5);
    }
}

/// One source: softmax weight exactly 1, the output is the source, bit for bit.
pub fn attn_res_single_source_identity<B: Backend + AttnResMix>(b: &B) {
    let mut rng = TestRng::new(44);
    let (m_n, d) = (3, 96);
    for dt in [DType::F32, DType::BF16] {
        let v = round_through(dt, &rng.normals(m_n * d, 3.0));
        let w = rng.normals(d, 1.0);
        let vt = upload_f32(b, dt, &[1, m_n, d], &v).unwrap();
        let got = run_mix(b, &AttnResMixParams { sources: 1, m: m_n, d, eps: 1e-5 }, &vt, &w, dt);
        assert!(got.iter().zip(&v).all(|(a, c)| a.to_bits() == c.to_bits()), "S = 1 must return the source ({dt})");
    }
}

/// Bad params, shapes and dtypes are typed errors naming the field.
pub fn attn_res_rejects_bad_args<B: Backend + AttnResMix>(b: &B) {
    let p = AttnResMixParams { sources: 3, m: 2, d: 8, eps: 1e-5 };
    let plan_field = |p: AttnResMixParams| AttnResMix::plan(b, &p).unwrap_err().field().map(str::to_string);
    assert_eq!(plan_field(AttnResMixParams { sources: 0, ..p.clone() }).as_deref(), Some("params.sources"));
    let too_many = crate::ops::attn_res::MAX_SOURCES + 1;
    assert_eq!(plan_field(AttnResMixParams { sources: too_many, ..p.clone() }).as_deref(), Some("params.sources"));
    assert_eq!(plan_field(AttnResMixParams { d: 0, ..p.clone() }).as_deref(), Some("params.d"));
    assert_eq!(plan_field(AttnResMixParams { eps: f32::NAN, ..p.clone() }).as_deref(), Some("params.eps"));
    assert_eq!(plan_field(AttnResMixParams { eps: -1.0, ..p.clone() }).as_deref(), Some("params.eps"));

    let plan = AttnResMix::plan(b, &p).unwrap();
    let z = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let err = |v: &DeviceTensor<B>, w: &DeviceTensor<B>, out: &mut DeviceTensor<B>| {
        let args = AttnResMixArgs { sources: v.as_ref(), score_vector: w.as_ref(), out: out.as_mut() };
        AttnResMix::run(b, &plan, args, None, b.default_stream()).unwrap_err().field().map(str::to_string)
    };
    let (v, w) = (z(DType::BF16, &[3, 2, 8]), z(DType::F32, &[8]));
    assert_eq!(err(&v, &z(DType::BF16, &[8]), &mut z(DType::F32, &[2, 8])).as_deref(), Some("score_vector"), "bf16 w");
    assert_eq!(err(&v, &z(DType::F32, &[1, 8]), &mut z(DType::F32, &[2, 8])).as_deref(), Some("score_vector"), "[1, D] w");
    assert_eq!(err(&z(DType::BF16, &[4, 2, 8]), &w, &mut z(DType::F32, &[2, 8])).as_deref(), Some("sources"), "S");
    assert_eq!(err(&z(DType::I32, &[3, 2, 8]), &w, &mut z(DType::F32, &[2, 8])).as_deref(), Some("sources"), "dtype");
    assert_eq!(err(&v, &w, &mut z(DType::F32, &[2, 9])).as_deref(), Some("out"), "out D");

    let nw = HostTensor::from_f32(DType::BF16, &[8], &[1.0; 8]).unwrap();
    let pw = HostTensor::from_f32(DType::BF16, &[2, 8], &[1.0; 16]).unwrap();
    assert_eq!(attn_res_score_vector(&nw, &pw).unwrap_err().field(), Some("proj_weight"));
    let pw = HostTensor::from_f32(DType::BF16, &[1, 8], &[1.0; 8]).unwrap();
    let nw_i32 = HostTensor::from_i32(&[8], &[1; 8]).unwrap();
    assert_eq!(attn_res_score_vector(&nw_i32, &pw).unwrap_err().field(), Some("norm_weight"));
}

