//! CPU bench of the latent MoE block (router, align, grouped MXFP4 expert GEMMs with SiTU-GLU,
//! combine, latent RMSNorm, up-projection, shared experts) at the tiny-model shape and a mid shape
//! (hidden 1024). Criterion's "elem/s" counts tokens.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use k3_benches::random_tensor;
use kernel_api::compose::{latent_moe_forward, ExpertWeights, LatentMoeConfig, LatentMoeWeights, SharedMlp};
use kernel_api::cpu::CpuBackend;
use kernel_api::{BackendExt, DType, HostTensor};
use std::hint::black_box;
use std::time::Duration;

/// (label, tokens, hidden, latent, intermediate, experts, top_k, shared width)
const SHAPES: &[(&str, usize, usize, usize, usize, usize, usize, usize)] = &[
    ("tiny_t64_d128_l64_n96_e16_k4", 64, 128, 64, 96, 16, 4, 192),
    ("mid_t64_d1024_l512_n384_e64_k8", 64, 1024, 512, 384, 64, 8, 768),
    ("mid_t1_d1024_l512_n384_e64_k8", 1, 1024, 512, 384, 64, 8, 768),
];

/// Random MXFP4 codes and scales around 2^-5 for a stacked `[e, rows, cols]` matrix.
fn mxfp4(b: &CpuBackend, e: usize, rows: usize, cols: usize, seed: u64) -> (kernel_api::DeviceTensor<CpuBackend>, kernel_api::DeviceTensor<CpuBackend>) {
    let mut rng = kernel_api::conformance::TestRng::new(seed);
    let packed: Vec<u8> = (0..e * rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<u8> = (0..e * rows * cols / 32).map(|_| 121 + rng.below(2) as u8).collect();
    let p = b.upload_tensor(&HostTensor::from_bytes(DType::U8, &[e, rows, cols / 2], packed).expect("packed")).expect("upload");
    let s = b.upload_tensor(&HostTensor::from_bytes(DType::U8, &[e, rows, cols / 32], scales).expect("scales")).expect("upload");
    (p, s)
}

fn moe_block_cpu(c: &mut Criterion) {
    let b = CpuBackend::new();
    let mut group = c.benchmark_group("latent_moe_block_cpu");
    for &(label, t, d, l, n, e, k, s) in SHAPES {
        let cfg = LatentMoeConfig {
            hidden: d,
            latent: l,
            intermediate: n,
            experts: e,
            top_k: k,
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            routed_scaling_factor: 1.0,
            situ_beta: 4.0,
            situ_linear_beta: Some(25.0),
            norm_eps: 1e-5,
            block_m: 16,
            activation_quant: None,
            act_dtype: DType::F32,
        };
        let rt = |dt, shape: &[usize], std, seed| random_tensor(&b, dt, shape, std, seed).expect("tensor");
        let x = rt(DType::F32, &[t, d], 1.0, 1);
        let router = rt(DType::BF16, &[e, d], 0.03, 2);
        let bias = rt(DType::F32, &[e], 0.05, 3);
        let down = rt(DType::BF16, &[l, d], 0.03, 4);
        let norm = rt(DType::BF16, &[l], 1.0, 5);
        let up = rt(DType::BF16, &[d, l], 0.04, 6);
        let (sg, su, sd) = (rt(DType::BF16, &[s, d], 0.03, 7), rt(DType::BF16, &[s, d], 0.03, 8), rt(DType::BF16, &[d, s], 0.03, 9));
        let (p13, s13) = mxfp4(&b, e, 2 * n, l, 10);
        let (p2, s2) = mxfp4(&b, e, l, n, 11);
        let w = LatentMoeWeights {
            router: router.as_ref(),
            bias: bias.as_ref(),
            latent_down: down.as_ref(),
            latent_norm: Some(norm.as_ref()),
            latent_up: up.as_ref(),
            shared: Some(SharedMlp { gate: sg.as_ref(), up: su.as_ref(), down: sd.as_ref() }),
            w13: ExpertWeights { weight: p13.as_ref(), scale: Some(s13.as_ref()) },
            w2: ExpertWeights { weight: p2.as_ref(), scale: Some(s2.as_ref()) },
        };
        group.throughput(Throughput::Elements(t as u64));
        group.bench_function(BenchmarkId::from_parameter(label), |bench| {
            bench.iter(|| black_box(latent_moe_forward(&b, &cfg, &w, x.as_ref()).expect("forward")))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    targets = moe_block_cpu
}
criterion_main!(benches);
