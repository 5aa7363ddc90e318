//! Dense-family kernels on shapes the conformance suite does not reach, against the CPU
//! reference backend, and bit identity of every output across schedule seeds 0..3 (a difference
//! would mean a missing barrier): GEMMs with several M tiles, N = 1 and a decode GEMV (M = 1) on
//! both kernels (bf16 MMA and f32 FMA), an RMSNorm row wider than 1024 (the 256-thread block
//! path), an AttnRes mix with the most sources (64) and an L2 norm row longer than a warp.
use k3_backend_simt::{simt_backend_from, SimtRuntime};
use kernel_api::conformance::{download_f32, round_through, upload_f32, TestRng};
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::*;
use kernel_api::tolerance::{assert_close, Tolerance};
use kernel_api::{Backend, BackendExt, DType};

fn gemm<B: Backend + Gemm>(b: &B, m: usize, n: usize, k: usize, xd: DType, wd: DType, od: DType, bias: bool) -> Vec<f32> {
    let mut rng = TestRng::new(7);
    let x = round_through(xd, &rng.normals(m * k, 1.0));
    let w = round_through(wd, &rng.normals(n * k, 0.1));
    let bv = rng.normals(n, 0.5);
    let p = GemmParams {
        m,
        n,
        k,
        x_dtype: xd,
        w_dtype: wd,
        out_dtype: od,
        bias_dtype: bias.then_some(DType::F32),
    };
    let plan = Gemm::plan(b, &p).unwrap();
    let xt = upload_f32(b, xd, &[m, k], &x).unwrap();
    let wt = upload_f32(b, wd, &[n, k], &w).unwrap();
    let bt = upload_f32(b, DType::F32, &[n], &bv).unwrap();
    let mut out = b.zeros(od, &[m, n]).unwrap();
    Gemm::run(
        b,
        &plan,
        GemmArgs {
            x: xt.as_ref(),
            w: wt.as_ref(),
            bias: bias.then(|| bt.as_ref()),
            out: out.as_mut(),
        },
        None,
        b.default_stream(),
    )
    .unwrap();
    download_f32(b, &out).unwrap()
}

fn rms<B: Backend + RmsNorm>(b: &B, m: usize, d: usize) -> Vec<f32> {
    let mut rng = TestRng::new(8);
    let x = rng.normals(m * d, 2.0);
    let w = rng.normals(d, 1.0);
    let p = RmsNormParams {
        m,
        d,
        eps: 1e-5,
        weight_order: RmsWeightOrder::F32,
    };
    let plan = RmsNorm::plan(b, &p).unwrap();
    let xt = upload_f32(b, DType::F32, &[m, d], &x).unwrap();
    let wt = upload_f32(b, DType::F32, &[d], &w).unwrap();
    let mut out = b.zeros(DType::F32, &[m, d]).unwrap();
    RmsNorm::run(
        b,
        &plan,
        RmsNormArgs {
            x: xt.as_ref(),
            w: wt.as_ref(),
            out: out.as_mut(),
        },
        None,
        b.default_stream(),
    )
    .unwrap();
    download_f32(b, &out).unwrap()
}

fn mix<B: Backend + AttnResMix>(b: &B, s: usize, m: usize, d: usize) -> Vec<f32> {
    let mut rng = TestRng::new(9);
    let v = rng.normals(s * m * d, 3.0);
    let w = rng.normals(d, 0.05);
    let p = AttnResMixParams {
        sources: s,
        m,
        d,
        eps: 1e-5,
    };
    let plan = AttnResMix::plan(b, &p).unwrap();
    let vt = upload_f32(b, DType::F32, &[s, m, d], &v).unwrap();
    let wt = upload_f32(b, DType::F32, &[d], &w).unwrap();
    let mut out = b.zeros(DType::F32, &[m, d]).unwrap();
    AttnResMix::run(
        b,
        &plan,
        AttnResMixArgs {
            sources: vt.as_ref(),
            score_vector: wt.as_ref(),
            out: out.as_mut(),
        },
        None,
        b.default_stream(),
    )
    .unwrap();
    download_f32(b, &out).unwrap()
}

fn l2<B: Backend + L2Norm>(b: &B, m: usize, d: usize) -> Vec<f32> {
    let mut rng = TestRng::new(10);
    let x = rng.normals(m * d, 2.0);
    let plan = L2Norm::plan(b, &L2NormParams { m, d, eps: 1e-6 }).unwrap();
    let xt = upload_f32(b, DType::F32, &[m, d], &x).unwrap();
    let mut out = b.zeros(DType::F32, &[m, d]).unwrap();
    L2Norm::run(
        b,
        &plan,
        L2NormArgs {
            x: xt.as_ref(),
            out: out.as_mut(),
        },
        None,
        b.default_stream(),
    )
    .unwrap();
    download_f32(b, &out).unwrap()
}

#[test]
fn dense_kernels_match_cpu_and_are_seed_independent() {
    let cpu = CpuBackend::new();
    // (m, n, k, x, w, out, bias); f32 out, so the comparison is at the f32 threshold.
    let cases = [
        (130, 75, 70, DType::BF16, DType::BF16, DType::F32, true),
        (130, 75, 70, DType::F32, DType::BF16, DType::F32, true),
        (1, 200, 300, DType::BF16, DType::BF16, DType::F32, false),
        (1, 200, 300, DType::F32, DType::F32, DType::F32, false),
        (200, 1, 17, DType::F32, DType::F32, DType::F32, true),
        (70, 1, 40, DType::BF16, DType::BF16, DType::F32, true),
    ];
    for warp in [32, 64] {
        let mut first: Option<Vec<Vec<f32>>> = None;
        for seed in 0..4 {
            let b = simt_backend_from(SimtRuntime::new(warp).unwrap().with_seed(seed)).unwrap();
            let mut outs = Vec::new();
            for &(m, n, k, xd, wd, od, bias) in &cases {
                let got = gemm(&b, m, n, k, xd, wd, od, bias);
                assert_close(
                    &format!("gemm {m} {n} {k} w{warp}"),
                    &got,
                    &gemm(&cpu, m, n, k, xd, wd, od, bias),
                    Tolerance::F32,
                );
                outs.push(got);
            }
            let got = rms(&b, 5, 1500);
            assert_close("rms", &got, &rms(&cpu, 5, 1500), Tolerance::F32);
            outs.push(got);
            let got = mix(&b, 64, 3, 200);
            assert_close("mix", &got, &mix(&cpu, 64, 3, 200), Tolerance::F32);
            outs.push(got);
            let got = l2(&b, 9, 300);
            assert_close("l2", &got, &l2(&cpu, 9, 300), Tolerance::F32);
            outs.push(got);
            let bits: Vec<Vec<u32>> = outs.iter().map(|o| o.iter().map(|v| v.to_bits()).collect()).collect();
            match &first {
                None => first = Some(outs),
                Some(f) => {
                    for (i, (a, c)) in f.iter().zip(&bits).enumerate() {
                        assert!(
                            a.iter().map(|v| v.to_bits()).eq(c.iter().copied()),
                            "case {i} differs at seed {seed} warp {warp}"
                        );
                    }
                }
            }
        }
    }
}
