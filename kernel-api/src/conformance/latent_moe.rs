//! Conformance tests of the latent MoE block composition ([`crate::compose::latent_moe`]).

use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::compose::{latent_moe_forward, ExpertWeights, LatentMoeBackend, LatentMoeConfig, LatentMoeWeights, SharedMlp};
use crate::dtype::DType;
use crate::formats::{F4E2M1, E8M0};
use crate::tolerance::{assert_close, compare, Tolerance};

struct Block<B: Backend> {
    cfg: LatentMoeConfig,
    x: Vec<f32>,
    // Host copies (as stored) for the oracle.
    router: Vec<f32>,
    bias: Vec<f32>,
    down: Vec<f32>,
    norm: Vec<f32>,
    up: Vec<f32>,
    sg: Vec<f32>,
    su: Vec<f32>,
    sd: Vec<f32>,
    w13: Vec<f32>,
    w2: Vec<f32>,
    dev: Vec<DeviceTensor<B>>,
}

/// Random block with MXFP4 experts drawn on the grid (codes + power-of-two scales).
fn block<B: Backend>(b: &B, seed: u64, scaling: f32) -> Block<B> {
    let mut rng = TestRng::new(seed);
    let (t, d, l, n, e, k) = (6, 64, 32, 64, 8, 3);
    let cfg = LatentMoeConfig {
        hidden: d,
        latent: l,
        intermediate: n,
        experts: e,
        top_k: k,
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        routed_scaling_factor: scaling,
        situ_beta: 4.0,
        situ_linear_beta: Some(25.0),
        norm_eps: 1e-5,
        block_m: 4,
        activation_quant: None,
        act_dtype: DType::F32,
    };
    let bf = |v: Vec<f32>| round_through(DType::BF16, &v);
    let x = rng.normals(t * d, 1.0);
    let router = bf(rng.normals(e * d, 0.2));
    let bias = rng.normals(e, 0.05);
    let down = bf(rng.normals(l * d, 1.0 / (d as f32).sqrt()));
    let norm = bf((0..l).map(|_| 1.0 + 0.05 * rng.normal()).collect());
    let up = bf(rng.normals(d * l, 1.0 / (l as f32).sqrt()));
    let s = 16;
    let sg = bf(rng.normals(s * d, 1.0 / (d as f32).sqrt()));
    let su = bf(rng.normals(s * d, 1.0 / (d as f32).sqrt()));
    let sd = bf(rng.normals(d * s, 1.0 / (s as f32).sqrt()));
    // MXFP4 experts: codes uniform, scales 2^-4 or 2^-3.
    let mut draw = |rows: usize, cols: usize| -> (Vec<u8>, Vec<u8>, Vec<f32>) {
        let codes: Vec<u8> = (0..e * rows * cols).map(|_| rng.below(16) as u8).collect();
        let scales: Vec<u8> = (0..e * rows * cols / 32).map(|_| E8M0::from_exponent(-4 + rng.below(2) as i32).to_bits()).collect();
        let vals = (0..e * rows * cols).map(|i| F4E2M1::from_bits(codes[i]).to_f32() * E8M0::from_bits(scales[i / 32]).to_f32()).collect();
        (codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect(), scales, vals)
    };
    let (p13, s13, w13) = draw(2 * n, l);
    let (p2, s2, w2) = draw(l, n);
    let f32t = |v: &[f32], shape: &[usize], dt| upload_f32(b, dt, shape, v).unwrap();
    let u8t = |v: Vec<u8>, shape: &[usize]| b.upload_tensor(&crate::tensor::HostTensor::from_bytes(DType::U8, shape, v).unwrap()).unwrap();
    let dev = vec![
        f32t(&x, &[t, d], DType::F32),
        f32t(&router, &[e, d], DType::BF16),
        f32t(&bias, &[e], DType::F32),
        f32t(&down, &[l, d], DType::BF16),
        f32t(&norm, &[l], DType::BF16),
        f32t(&up, &[d, l], DType::BF16),
        f32t(&sg, &[s, d], DType::BF16),
        f32t(&su, &[s, d], DType::BF16),
        f32t(&sd, &[d, s], DType::BF16),
        u8t(p13, &[e, 2 * n, l / 2]),
        u8t(s13, &[e, 2 * n, l / 32]),
        u8t(p2, &[e, l, n / 2]),
        u8t(s2, &[e, l, n / 32]),
    ];
    Block { cfg, x, router, bias, down, norm, up, sg, su, sd, w13, w2, dev }
}

fn run<B: LatentMoeBackend>(b: &B, blk: &Block<B>) -> Vec<f32> {
    let d = &blk.dev;
    let w = LatentMoeWeights {
        router: d[1].as_ref(),
        bias: d[2].as_ref(),
        latent_down: d[3].as_ref(),
        latent_norm: Some(d[4].as_ref()),
        latent_up: d[5].as_ref(),
        shared: Some(SharedMlp { gate: d[6].as_ref(), up: d[7].as_ref(), down: d[8].as_ref() }),
        w13: ExpertWeights { weight: d[9].as_ref(), scale: Some(d[10].as_ref()) },
        w2: ExpertWeights { weight: d[11].as_ref(), scale: Some(d[12].as_ref()) },
    };
    let out = latent_moe_forward(b, &blk.cfg, &w, d[0].as_ref()).expect("latent_moe_forward");
    download_f32(b, &out).unwrap()
}

fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] as f64 * x[c]).sum()).collect()
}

fn situ(g: f64, u: f64) -> f64 {
    4.0 * (g / 4.0).tanh() / (1.0 + (-g).exp()) * 25.0 * (u / 25.0).tanh()
}

/// The block in f64 from its definition; `None` when a routing margin is too thin to trust.
fn oracle(blk: &Block<impl Backend>) -> Option<Vec<f32>> {
    let c = &blk.cfg;
    let (d, l, n, e, k) = (c.hidden, c.latent, c.intermediate, c.experts, c.top_k);
    let t = blk.x.len() / d;
    let mut out = Vec::with_capacity(t * d);
    for ti in 0..t {
        let x: Vec<f64> = blk.x[ti * d..(ti + 1) * d].iter().map(|&v| v as f64).collect();
        let s: Vec<f64> = matvec(&blk.router, e, d, &x).iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
        let mut order: Vec<usize> = (0..e).collect();
        let sel = |i: usize| s[i] + blk.bias[i] as f64;
        order.sort_by(|&a, &b| sel(b).partial_cmp(&sel(a)).unwrap().then(a.cmp(&b)));
        if sel(order[k - 1]) - sel(order[k]) < 1e-4 {
            return None;
        }
        let chosen = &order[..k];
        let z_sum: f64 = chosen.iter().map(|&i| s[i]).sum();
        let z = matvec(&blk.down, l, d, &x);
        let mut r = vec![0f64; l];
        for &ex in chosen {
            let w = s[ex] / (z_sum + 1e-20) * c.routed_scaling_factor as f64;
            let w13 = &blk.w13[ex * 2 * n * l..(ex + 1) * 2 * n * l];
            let gu = matvec(w13, 2 * n, l, &z);
            let a: Vec<f64> = (0..n).map(|j| situ(gu[j], gu[n + j])).collect();
            let y = matvec(&blk.w2[ex * l * n..(ex + 1) * l * n], l, n, &a);
            for (ri, yi) in r.iter_mut().zip(y) {
                *ri += w * yi;
            }
        }
        let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / l as f64 + c.norm_eps as f64).sqrt();
        let rn: Vec<f64> = r.iter().zip(&blk.norm).map(|(v, w)| v * inv * *w as f64).collect();
        let routed = matvec(&blk.up, d, l, &rn);
        let sw = blk.sg.len() / d;
        let g = matvec(&blk.sg, sw, d, &x);
        let u = matvec(&blk.su, sw, d, &x);
        let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| situ(*g, *u)).collect();
        let shared = matvec(&blk.sd, d, sw, &a);
        out.extend(routed.iter().zip(&shared).map(|(a, b)| (a + b) as f32));
    }
    Some(out)
}

/// The composed block equals its f64 definition (MXFP4 experts, latent norm, shared experts).
/// F32_ALGO: f32 GEMMs and SiTU against f64, inputs exactly representable.
pub fn latent_moe_matches_definition<B: Backend + LatentMoeBackend>(b: &B) {
    let mut checked = 0;
    for seed in 0..6 {
        let blk = block(b, 40 + seed, 1.0);
        let Some(want) = oracle(&blk) else { continue };
        assert_close("latent MoE block", &run(b, &blk), &want, Tolerance::F32_ALGO);
        checked += 1;
    }
    assert!(checked >= 3, "too few seeds with clear routing margins");
}

/// routed_scaling_factor multiplies every routed weight, and the latent RMSNorm divides it back
/// out: 1.0 vs 2.5 moves the output only through the norm epsilon (k3-architecture.md 5.4 #4).
pub fn latent_moe_scaling_factor_cancels<B: Backend + LatentMoeBackend>(b: &B) {
    let one = run(b, &block(b, 50, 1.0));
    let more = run(b, &block(b, 50, 2.5));
    let c = compare(&more, &one);
    assert!(c.rel_rmse < 1e-4, "scaling factor moved the output by {:.3e}", c.rel_rmse);
}

