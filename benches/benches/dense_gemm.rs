//! CPU benches of the dense ops: GEMM at the tiny-model and hidden-1024 shapes (bf16 weights),
//! RMSNorm and the AttnRes mix. Criterion's "elem/s" for the GEMM groups counts floating-point
//! operations (2·M·N·K per run), so Gelem/s reads as GFLOP/s.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use k3_benches::random_tensor;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::{
    AttnResMix, AttnResMixArgs, AttnResMixParams, Gemm, GemmArgs, GemmParams, RmsNorm, RmsNormArgs, RmsNormParams, RmsWeightOrder,
};
use kernel_api::{Backend, BackendExt, DType};
use std::hint::black_box;
use std::time::Duration;

/// (label, M, K, N, weight dtype)
const GEMM_SHAPES: &[(&str, usize, usize, usize, DType)] = &[
    ("tiny_m64_k128_n160_bf16w", 64, 128, 160, DType::BF16),
    ("mid_m64_k1024_n1024_bf16w", 64, 1024, 1024, DType::BF16),
    ("mid_m1_k1024_n1024_bf16w", 1, 1024, 1024, DType::BF16),
    // The same decode shape with weights pre-converted to f32 (no per-call conversion).
    ("mid_m1_k1024_n1024_f32w", 1, 1024, 1024, DType::F32),
];

fn gemm_cpu(c: &mut Criterion) {
    let b = CpuBackend::new();
    let mut group = c.benchmark_group("gemm_cpu");
    for &(label, m, k, n, w_dt) in GEMM_SHAPES {
        let params = GemmParams::new(m, n, k, DType::BF16, w_dt, DType::BF16);
        let plan = Gemm::plan(&b, &params).expect("plan");
        let x = random_tensor(&b, DType::BF16, &[m, k], 1.0, 1).expect("x");
        let w = random_tensor(&b, w_dt, &[n, k], 0.03, 2).expect("w");
        let mut out = b.zeros(DType::BF16, &[m, n]).expect("out");
        group.throughput(Throughput::Elements(plan.flops()));
        group.bench_function(BenchmarkId::from_parameter(label), |bench| {
            bench.iter(|| {
                let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() };
                Gemm::run(&b, &plan, args, None, b.default_stream()).expect("run");
                black_box(&out);
            })
        });
    }
    group.finish();
}

fn norm_and_mix_cpu(c: &mut Criterion) {
    let b = CpuBackend::new();
    let (m, d) = (64, 1024);
    let mut group = c.benchmark_group("dense_small_ops_cpu");
    group.throughput(Throughput::Elements((m * d) as u64));

    let params = RmsNormParams { m, d, eps: 1e-5, weight_order: RmsWeightOrder::CastBeforeWeight };
    let plan = RmsNorm::plan(&b, &params).expect("plan");
    let x = random_tensor(&b, DType::BF16, &[m, d], 1.0, 3).expect("x");
    let w = random_tensor(&b, DType::BF16, &[d], 0.05, 4).expect("w");
    let mut out = b.zeros(DType::BF16, &[m, d]).expect("out");
    group.bench_function("rms_norm_m64_d1024_bf16", |bench| {
        bench.iter(|| {
            let args = RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() };
            RmsNorm::run(&b, &plan, args, None, b.default_stream()).expect("run");
            black_box(&out);
        })
    });

    let sources = 9; // the output mix of the real model: 8 snapshots + the final partial sum
    let params = AttnResMixParams { sources, m, d, eps: 1e-5 };
    let plan = AttnResMix::plan(&b, &params).expect("plan");
    let v = random_tensor(&b, DType::BF16, &[sources, m, d], 1.0, 5).expect("sources");
    let score = random_tensor(&b, DType::F32, &[d], 1.0 / (d as f32).sqrt(), 6).expect("score");
    group.bench_function("attn_res_mix_s9_m64_d1024_bf16", |bench| {
        bench.iter(|| {
            let args = AttnResMixArgs { sources: v.as_ref(), score_vector: score.as_ref(), out: out.as_mut() };
            AttnResMix::run(&b, &plan, args, None, b.default_stream()).expect("run");
            black_box(&out);
        })
    });
    group.finish();
}

fn config() -> Criterion {
    // Small samples so `cargo bench -p k3-benches` stays under a minute on 2 cores.
    Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1))
}

criterion_group! { name = dense; config = config(); targets = gemm_cpu, norm_and_mix_cpu }
criterion_main!(dense);
