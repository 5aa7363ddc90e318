//! Conformance tests of [`crate::ops::SituGlu`], [`crate::ops::SigmoidGate`] and
//! [`crate::ops::EmbeddingGather`].

use super::gemm::upload_padded;
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::ops::{
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, SigmoidGate, SigmoidGateArgs, SigmoidGateParams, SituGlu,
    SituGluArgs, SituGluInput, SituGluParams,
};
use crate::tensor::HostTensor;
use crate::tolerance::{assert_close, Tolerance};


fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// SiTU(g, u) in f64, written out from k3-architecture §2.5.
fn situ64(g: f64, u: f64, beta: f64, linear_beta: Option<f64>) -> f64 {
    let gate = beta * (g / beta).tanh() * sigmoid64(g);
    let up = linear_beta.map_or(u, |bl| bl * (u / bl).tanh());
    gate * up
}

/// Runs SiTU-GLU with separate inputs, or fused `[M, 2N]` when `fused`, and returns the output.
fn run_situ<B: Backend + SituGlu>(b: &B, p: &SituGluParams, g: &[f32], u: &[f32], in_dt: DType, out_dt: DType, fused: bool) -> Vec<f32> {
    let (m, n) = (p.m, p.n);
    let plan = SituGlu::plan(b, p).expect("plan");
    let mut out = b.zeros(out_dt, &[m, n]).unwrap();
    if fused {
        let gu: Vec<f32> = (0..m).flat_map(|r| g[r * n..(r + 1) * n].iter().chain(&u[r * n..(r + 1) * n]).copied()).collect();
        let t = upload_f32(b, in_dt, &[m, 2 * n], &gu).unwrap();
        let args = SituGluArgs { input: SituGluInput::Fused(t.as_ref()), out: out.as_mut() };
        SituGlu::run(b, &plan, args, None, b.default_stream()).expect("run");
    } else {
        // Strided views, as column slices of a wider projection output would be.
        let gt = upload_padded(b, in_dt, &[m, n], g, 3, 1);
        let ut = upload_padded(b, in_dt, &[m, n], u, 1, 4);
        let args = SituGluArgs { input: SituGluInput::Separate { gate: gt.as_ref(), up: ut.as_ref() }, out: out.as_mut() };
        SituGlu::run(b, &plan, args, None, b.default_stream()).expect("run");
    }
    download_f32(b, &out).unwrap()
}

/// The four worked values of k3-architecture §5.4 (β = 4, β_l = 25), and the same inputs with
/// the up cap off (linear_beta = None), fused and separate.
pub fn situ_glu_worked_values<B: Backend + SituGlu>(b: &B) {
    let g = [1.0f32, -2.0, 10.0, 0.5];
    let u = [1.0f32, 3.0, 50.0, -100.0];
    let table = [0.7158178280748404f64, -0.6578738185454248, 95.1080215340149, -7.735277097238144];
    let p = SituGluParams { m: 1, n: 4, beta: 4.0, linear_beta: Some(25.0) };
    for fused in [false, true] {
        let got = run_situ(b, &p, &g, &u, DType::F32, DType::F32, fused);
        for (i, (&o, &want)) in got.iter().zip(&table).enumerate() {
            // f32 output of an f64-exact value: within a few f32 ulps.
            assert!((o as f64 - want).abs() <= 1e-6 * want.abs(), "SiTU({}, {}) = {o}, table {want} (fused {fused})", g[i], u[i]);
        }
        let p_uncapped = SituGluParams { linear_beta: None, ..p.clone() };
        let got = run_situ(b, &p_uncapped, &g, &u, DType::F32, DType::F32, fused);
        let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| situ64(g as f64, u as f64, 4.0, None) as f32).collect();
        assert_close("SiTU with linear_beta None", &got, &want, Tolerance::F32);
        // Without the cap, u = 50 and u = -100 pass through: the last two values change a lot.
        assert!((got[2] as f64 - table[2]).abs() > 1.0 && (got[3] as f64 - table[3]).abs() > 1.0, "None must not cap u");
    }
}

/// Random SiTU-GLU against f64 with values large enough to hit both caps, bf16 and f32.
pub fn situ_glu_matches_f64_oracle<B: Backend + SituGlu>(b: &B) {
    let mut rng = TestRng::new(51);
    for &(m, n, beta, lb, in_dt, out_dt, fused) in &[
        (3, 40, 4.0, Some(25.0), DType::F32, DType::F32, false),
        (5, 64, 4.0, Some(25.0), DType::BF16, DType::BF16, true),
        (2, 33, 1.0, None, DType::BF16, DType::F32, false),
        (7, 16, 4.0, None, DType::F32, DType::BF16, true),
    ] {
        let g = round_through(in_dt, &rng.normals(m * n, 6.0));
        let u = round_through(in_dt, &rng.normals(m * n, 30.0));
        let want: Vec<f32> =
            g.iter().zip(&u).map(|(&g, &u)| situ64(g as f64, u as f64, beta as f64, lb.map(|x: f32| x as f64)) as f32).collect();
        let p = SituGluParams { m, n, beta, linear_beta: lb };
        let got = run_situ(b, &p, &g, &u, in_dt, out_dt, fused);
        // f32: tanh, exp and three products in f32 stay within 1e-5; bf16: one rounding.
        let what = format!("situ_glu m{m} n{n} beta {beta} lb {lb:?} {in_dt}->{out_dt} fused {fused}");
        assert_close(&what, &got, &want, Tolerance::for_dtype(out_dt));
    }
}

/// x·σ(g) against f64 with a row-strided g.
pub fn sigmoid_gate_matches_f64_oracle<B: Backend + SigmoidGate>(b: &B) {
    let mut rng = TestRng::new(52);
    for &(m, n, x_dt, g_dt, out_dt) in
        &[(4, 64, DType::F32, DType::F32, DType::F32), (9, 24, DType::BF16, DType::BF16, DType::BF16), (1, 7, DType::BF16, DType::F32, DType::F32)]
    {
        let x = round_through(x_dt, &rng.normals(m * n, 2.0));
        let g = round_through(g_dt, &rng.normals(m * n, 4.0));
        let want: Vec<f32> = x.iter().zip(&g).map(|(&x, &g)| (x as f64 * sigmoid64(g as f64)) as f32).collect();
        let plan = SigmoidGate::plan(b, &SigmoidGateParams { m, n }).expect("plan");
        let xt = upload_f32(b, x_dt, &[m, n], &x).unwrap();
        let gt = upload_padded(b, g_dt, &[m, n], &g, n, 2); // g as the second half of [M, 2N] rows
        let mut out = b.zeros(out_dt, &[m, n]).unwrap();
        let args = SigmoidGateArgs { x: xt.as_ref(), g: gt.as_ref(), out: out.as_mut() };
        SigmoidGate::run(b, &plan, args, None, b.default_stream()).expect("run");
        let got = download_f32(b, &out).unwrap();
        // f32: one exp and two divisions/products; bf16: one rounding.
        assert_close(&format!("sigmoid_gate m{m} n{n} {x_dt}/{g_dt}->{out_dt}"), &got, &want, Tolerance::for_dtype(out_dt));
    }
}

fn upload_ids<B: Backend>(b: &B, dt: DType, ids: &[i64]) -> DeviceTensor<B> {
    let host = match dt {
        DType::I32 => HostTensor::from_i32(&[ids.len()], &ids.iter().map(|&i| i as i32).collect::<Vec<_>>()),
        _ => HostTensor::from_i64(&[ids.len()], ids),
    };
    b.upload_tensor(&host.unwrap()).unwrap()
}

/// Gathered rows equal the table rows bit for bit (or rounded once when the output dtype is
/// narrower), for i32 and i64 ids, repeated ids and both ends of the table.
pub fn embedding_gather_copies_rows<B: Backend + EmbeddingGather>(b: &B) {
    let mut rng = TestRng::new(53);
    let (vocab, d) = (50, 24);
    let ids: Vec<i64> = vec![0, 49, 7, 7, 23, 1, 48, 0, 31];
    for &(t_dt, o_dt, id_dt) in &[
        (DType::BF16, DType::BF16, DType::I32),
        (DType::F32, DType::F32, DType::I64),
        (DType::BF16, DType::F32, DType::I64),
        (DType::F32, DType::BF16, DType::I32),
    ] {
        let table = round_through(t_dt, &rng.normals(vocab * d, 1.0));
        let p = EmbeddingGatherParams { vocab, d, m: ids.len() };
        let plan = EmbeddingGather::plan(b, &p, &ids).expect("plan");
        let tt = upload_padded(b, t_dt, &[vocab, d], &table, 2, 3);
        let it = upload_ids(b, id_dt, &ids);
        let mut out = b.zeros(o_dt, &[ids.len(), d]).unwrap();
        let args = EmbeddingGatherArgs { table: tt.as_ref(), ids: it.as_ref(), out: out.as_mut() };
        EmbeddingGather::run(b, &plan, args, None, b.default_stream()).expect("run");
        let got = download_f32(b, &out).unwrap();
        let want: Vec<f32> = round_through(o_dt, &ids.iter().flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec()).collect::<Vec<_>>());
        assert!(got.iter().zip(&want).all(|(a, c)| a.to_bits() == c.to_bits()), "gather {t_dt}->{o_dt} ids {id_dt} must be exact");
    }
}

/// Ids outside `0..V` (and a host id list of the wrong length) are rejected by the plan.
pub fn embedding_gather_rejects_out_of_range<B: Backend + EmbeddingGather>(b: &B) {
    let p = EmbeddingGatherParams { vocab: 10, d: 4, m: 3 };
    for bad in [vec![0, 10, 1], vec![-1, 2, 3], vec![i64::MIN, 0, 0], vec![0, 0, i64::MAX]] {
        let e = EmbeddingGather::plan(b, &p, &bad).unwrap_err();
        assert_eq!(e.field(), Some("ids"), "{bad:?}: {e}");
    }
    assert_eq!(EmbeddingGather::plan(b, &p, &[0, 1]).unwrap_err().field(), Some("ids"), "2 ids for m = 3");
    assert!(EmbeddingGather::plan(b, &p, &[0, 9, 5]).is_ok());
}

/// Bad constants, shapes and dtypes are typed errors naming the field.
pub fn elementwise_rejects_bad_args<B: Backend + SituGlu + SigmoidGate + EmbeddingGather>(b: &B) {
    let field = |e: crate::Error| e.field().map(str::to_string);
    let p = SituGluParams { m: 2, n: 4, beta: 4.0, linear_beta: Some(25.0) };
    for beta in [0.0, -4.0, f32::NAN, f32::INFINITY] {
        assert_eq!(field(SituGlu::plan(b, &SituGluParams { beta, ..p.clone() }).unwrap_err()).as_deref(), Some("params.beta"));
        let q = SituGluParams { linear_beta: Some(beta), ..p.clone() };
        assert_eq!(field(SituGlu::plan(b, &q).unwrap_err()).as_deref(), Some("params.linear_beta"));
    }
    assert_eq!(field(SituGlu::plan(b, &SituGluParams { n: 0, ..p.clone() }).unwrap_err()).as_deref(), Some("params.n"));

    let z = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let plan = SituGlu::plan(b, &p).unwrap();
    let situ_err = |input: SituGluInput<'_, B>, out: &mut DeviceTensor<B>| {
        field(SituGlu::run(b, &plan, SituGluArgs { input, out: out.as_mut() }, None, b.default_stream()).unwrap_err())
    };
    let (g, u) = (z(DType::BF16, &[2, 4]), z(DType::BF16, &[2, 4]));
    let fused_narrow = z(DType::BF16, &[2, 4]);
    assert_eq!(situ_err(SituGluInput::Fused(fused_narrow.as_ref()), &mut z(DType::F32, &[2, 4])).as_deref(), Some("gate_up"));
    let u_bad = z(DType::BF16, &[2, 5]);
    let sep = SituGluInput::Separate { gate: g.as_ref(), up: u_bad.as_ref() };
    assert_eq!(situ_err(sep, &mut z(DType::F32, &[2, 4])).as_deref(), Some("up"));
    let g_bad = z(DType::I32, &[2, 4]);
    let sep = SituGluInput::Separate { gate: g_bad.as_ref(), up: u.as_ref() };
    assert_eq!(situ_err(sep, &mut z(DType::F32, &[2, 4])).as_deref(), Some("gate"));
    let sep = SituGluInput::Separate { gate: g.as_ref(), up: u.as_ref() };
    assert_eq!(situ_err(sep, &mut z(DType::F16, &[2, 4])).as_deref(), Some("out"));

    let sg = SigmoidGate::plan(b, &SigmoidGateParams { m: 2, n: 4 }).unwrap();
    let mut out = z(DType::F32, &[2, 4]);
    let g_i32 = z(DType::I32, &[2, 4]);
    let args = SigmoidGateArgs { x: g.as_ref(), g: g_i32.as_ref(), out: out.as_mut() };
    assert_eq!(field(SigmoidGate::run(b, &sg, args, None, b.default_stream()).unwrap_err()).as_deref(), Some("g"));
    let x_t = z(DType::F32, &[4, 2]);
    let args = SigmoidGateArgs { x: x_t.as_ref(), g: u.as_ref(), out: out.as_mut() };
    assert_eq!(field(SigmoidGate::run(b, &sg, args, None, b.default_stream()).unwrap_err()).as_deref(), Some("x"));

    let ep = EmbeddingGatherParams { vocab: 10, d: 4, m: 2 };
    assert_eq!(field(EmbeddingGather::plan(b, &EmbeddingGatherParams { vocab: 0, ..ep.clone() }, &[0, 0]).unwrap_err()).as_deref(), Some("params.vocab"));
    let plan = EmbeddingGather::plan(b, &ep, &[3, 4]).unwrap();
    let gather_err = |table: &DeviceTensor<B>, ids: &DeviceTensor<B>| {
        let mut out = z(DType::F32, &[2, 4]);
        let args = EmbeddingGatherArgs { table: table.as_ref(), ids: ids.as_ref(), out: out.as_mut() };
        field(EmbeddingGather::run(b, &plan, args, None, b.default_stream()).unwrap_err())
    };
    let (table, ids) = (z(DType::F32, &[10, 4]), upload_ids(b, DType::I64, &[3, 4]));
    assert_eq!(gather_err(&z(DType::F32, &[9, 4]), &ids).as_deref(), Some("table"));
    assert_eq!(gather_err(&table, &z(DType::F32, &[2])).as_deref(), Some("ids"), "float ids");
    assert_eq!(gather_err(&table, &upload_ids(b, DType::I32, &[3, 4, 5])).as_deref(), Some("ids"), "3 ids for m = 2");
}

