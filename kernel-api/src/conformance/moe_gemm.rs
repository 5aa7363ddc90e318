//! Conformance tests of [`crate::ops::MoeGroupedGemm`] and [`crate::ops::MoeCombine`]
//! (k3-architecture.md 2.5, 3.4 and 5.4 item 5).
//!
//! Each stage is compared with a per-token dense oracle written here (f64, MXFP4 dequantised
//! by this file's own decoder), fed with the op's actual input of that stage, so a rounding of
//! the previous stage's output cannot blur the comparison.

use super::moe_align::{align_on, upload_i32};
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::formats::{Mxfp8Block, MX_BLOCK};
use crate::ops::{
    MoeActivationQuant, MoeAlign, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeGemmArgs, MoeGemmParams, MoeGemmStage,
    MoeGroupedGemm, MoeRouting, MoeWeightFormat,
};
use crate::tensor::HostTensor;
use crate::tolerance::{assert_close, compare, Tolerance};


/// SiTU constants of K3 (activation_situ_beta, activation_situ_linear_beta).
const BETA: f32 = 4.0;

/// Shape and dtypes of one MoE problem.
#[derive(Clone, Debug)]
struct Cfg {
    tokens: usize,
    hidden: usize,
    inter: usize,
    /// Global experts (ids in `topk_ids`).
    experts: usize,
    /// Experts on this rank when an expert map is used.
    local: Option<usize>,
    top_k: usize,
    block_m: usize,
    x_dt: DType,
    act_dt: DType,
    out_dt: DType,
    linear_beta: Option<f32>,
}

/// Expert weights `[E, rows, cols]`: exact values, and the MXFP4 bytes when drawn as MXFP4.
#[derive(Clone)]
struct Weights {
    values: Vec<f32>,
    packed: Vec<u8>,
    scales: Vec<u8>,
}

/// Host inputs of a problem.
#[derive(Clone)]
struct Problem {
    cfg: Cfg,
    routing: MoeRouting,
    x: Vec<f32>,
    topk_ids: Vec<i32>,
    expert_map: Option<Vec<i32>>,
    router_w: Vec<f32>,
    w13: Weights,
    w2: Weights,
}

/// E2M1 value of a 4-bit code: bit 3 sign, bits 0-2 index the magnitude table.
fn e2m1(code: u8) -> f64 {
    let mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
    if code & 8 != 0 {
        -mag
    } else {
        mag
    }
}

/// This file's own MXFP4 decoder (checkpoint layout: low nibble = even column).
fn dequant_mxfp4(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            let s = scales[r * cols / 32 + c / 32];
            out.push((e2m1(code) * 2f64.powi(s as i32 - 127)) as f32);
        }
    }
    out
}

fn dense_weights(rng: &mut TestRng, rows: usize, cols: usize) -> Weights {
    let values = round_through(DType::BF16, &rng.normals(rows * cols, 1.0 / (cols as f32).sqrt()));
    Weights { values, packed: Vec::new(), scales: Vec::new() }
}

/// Random codes with power-of-two scales 2^-6..2^-3: every value is exact in bf16.
fn mxfp4_weights(rng: &mut TestRng, rows: usize, cols: usize) -> Weights {
    let packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.below(256) as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / 32).map(|_| 121 + rng.below(4) as u8).collect();
    Weights { values: dequant_mxfp4(&packed, &scales, rows, cols), packed, scales }
}

fn make_problem(rng: &mut TestRng, cfg: &Cfg, fmt: MoeWeightFormat) -> Problem {
    let local = cfg.local.unwrap_or(cfg.experts);
    let expert_map = cfg.local.map(|l| {
        let mut map = vec![-1i32; cfg.experts];
        for (id, &g) in rng.permutation(l).iter().zip(&rng.permutation(cfg.experts)) {
            map[g] = *id as i32;
        }
        map
    });
    let topk_ids: Vec<i32> = (0..cfg.tokens)
        .flat_map(|_| rng.permutation(cfg.experts).into_iter().take(cfg.top_k).map(|e| e as i32).collect::<Vec<_>>())
        .collect();
    let draw = |rng: &mut TestRng, rows, cols| match fmt {
        MoeWeightFormat::Dense => dense_weights(rng, rows, cols),
        MoeWeightFormat::Mxfp4 => mxfp4_weights(rng, rows, cols),
    };
    Problem {
        routing: MoeRouting { tokens: cfg.tokens, top_k: cfg.top_k, experts: local, block_m: cfg.block_m },
        x: round_through(cfg.x_dt, &rng.normals(cfg.tokens * cfg.hidden, 2.0)),
        router_w: rng.uniforms(cfg.tokens * cfg.top_k, 0.05, 1.0),
        w13: draw(rng, local * 2 * cfg.inter, cfg.hidden),
        w2: draw(rng, local * cfg.hidden, cfg.inter),
        topk_ids,
        expert_map,
        cfg: cfg.clone(),
    }
}

fn upload_weights<B: Backend>(
    b: &B,
    w: &Weights,
    fmt: MoeWeightFormat,
    e: usize,
    rows: usize,
    cols: usize,
) -> Result<(DeviceTensor<B>, Option<DeviceTensor<B>>)> {
    match fmt {
        MoeWeightFormat::Dense => Ok((upload_f32(b, DType::BF16, &[e, rows, cols], &w.values)?, None)),
        MoeWeightFormat::Mxfp4 => Ok((
            b.upload_tensor(&HostTensor::from_bytes(DType::U8, &[e, rows, cols / 2], w.packed.clone())?)?,
            Some(b.upload_tensor(&HostTensor::from_bytes(DType::E8M0, &[e, rows, cols / MX_BLOCK], w.scales.clone())?)?),
        )),
    }
}

/// Runs one grouped GEMM stage on the backend. `input` is x (GateUp) or act (Down).
fn run_stage<B: Backend + MoeAlign + MoeGroupedGemm>(
    b: &B,
    pr: &Problem,
    stage: MoeGemmStage,
    fmt: MoeWeightFormat,
    quant: Option<MoeActivationQuant>,
    input: &[f32],
) -> Result<Vec<f32>> {
    let c = &pr.cfg;
    let r = &pr.routing;
    let pairs = r.tokens * r.top_k;
    let aligned = align_on(b, r, &pr.topk_ids, pr.expert_map.as_deref())?;
    let (k, n, in_shape, in_dt, out_dt, w) = match stage {
        MoeGemmStage::GateUp { .. } => (c.hidden, c.inter, [r.tokens, c.hidden], c.x_dt, c.act_dt, &pr.w13),
        MoeGemmStage::Down => (c.inter, c.hidden, [pairs, c.inter], c.act_dt, DType::F32, &pr.w2),
    };
    let params = MoeGemmParams { routing: r.clone(), k, n, stage, weights: fmt, activation_quant: quant };
    let plan = MoeGroupedGemm::plan(b, &params)?;
    let input = upload_f32(b, in_dt, &in_shape, input)?;
    let (weight, scale) = upload_weights(b, w, fmt, r.experts, plan.weight_rows, k)?;
    let router_w = match stage {
        MoeGemmStage::Down => Some(upload_f32(b, DType::F32, &[r.tokens, r.top_k], &pr.router_w)?),
        MoeGemmStage::GateUp { .. } => None,
    };
    let mut out = b.zeros(out_dt, &[pairs, n])?;
    // NaN in the output proves every row is written (dropped pairs as zeros): nothing clears it.
    if pairs * n > 0 {
        out = upload_f32(b, out_dt, &[pairs, n], &vec![f32::NAN; pairs * n])?;
    }
    let args = MoeGemmArgs {
        input: input.as_ref(),
        weight: weight.as_ref(),
        weight_scale: scale.as_ref().map(DeviceTensor::as_ref),
        sorted_token_ids: aligned.sorted_token_ids.as_ref(),
        expert_ids: aligned.expert_ids.as_ref(),
        num_tokens_post_padded: aligned.num_tokens_post_padded.as_ref(),
        topk_weights: router_w.as_ref().map(DeviceTensor::as_ref),
        out: out.as_mut(),
    };
    let mut ws = b.alloc_zeroed(MoeGroupedGemm::workspace_size(b, &plan))?;
    MoeGroupedGemm::run(b, &plan, args, Some(&mut ws), b.default_stream())?;
    download_f32(b, &out)
}

fn gate_up_stage(linear_beta: Option<f32>) -> MoeGemmStage {
    MoeGemmStage::GateUp { beta: BETA, linear_beta }
}

fn run_combine<B: Backend + MoeCombine>(
    b: &B,
    tokens: usize,
    top_k: usize,
    hidden: usize,
    y: &[f32],
    out_dt: DType,
) -> Result<Vec<f32>> {
    let plan = MoeCombine::plan(b, &MoeCombineParams { tokens, top_k, hidden })?;
    let y = upload_f32(b, DType::F32, &[tokens * top_k, hidden], y)?;
    let mut out = b.zeros(out_dt, &[tokens, hidden])?;
    MoeCombine::run(b, &plan, MoeCombineArgs { y: y.as_ref(), out: out.as_mut() }, None, b.default_stream())?;
    download_f32(b, &out)
}

/// Local expert of pair p, `None` when the expert map drops it.
fn local_expert(pr: &Problem, p: usize) -> Option<usize> {
    let id = pr.topk_ids[p];
    let local = match &pr.expert_map {
        Some(m) => m[id as usize],
        None => id,
    };
    (local >= 0).then_some(local as usize)
}

/// MXFP8 round trip of every 32-wide group of each row (the activation quantiser).
fn mxfp8_rows(v: &[f32]) -> Vec<f32> {
    v.chunks(MX_BLOCK)
        .flat_map(|c| {
            let mut block = [0f32; MX_BLOCK];
            block.copy_from_slice(c);
            Mxfp8Block::quantize(&block).dequantize()
        })
        .collect()
}

fn dot64(a: &[f32], w: &[f32]) -> f64 {
    a.iter().zip(w).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn situ64(g: f64, u: f64, beta: f64, linear_beta: Option<f32>) -> f64 {
    let up = linear_beta.map_or(u, |lb| lb as f64 * (u / lb as f64).tanh());
    beta * (g / beta).tanh() / (1.0 + (-g).exp()) * up
}

/// Per-token dense gate/up + SiTU oracle: act[p, j] for every pair (zeros for dropped pairs).
fn gate_up_oracle(pr: &Problem, x: &[f32]) -> Vec<f32> {
    let (h, n) = (pr.cfg.hidden, pr.cfg.inter);
    let mut act = vec![0f32; pr.topk_ids.len() * n];
    for p in 0..pr.topk_ids.len() {
        let Some(e) = local_expert(pr, p) else { continue };
        let t = p / pr.cfg.top_k;
        let xt = &x[t * h..(t + 1) * h];
        for j in 0..n {
            let g = dot64(xt, &pr.w13.values[(e * 2 * n + j) * h..][..h]);
            let u = dot64(xt, &pr.w13.values[(e * 2 * n + n + j) * h..][..h]);
            act[p * n + j] = situ64(g, u, BETA as f64, pr.cfg.linear_beta) as f32;
        }
    }
    act
}

/// Per-pair dense down-projection oracle times the router weight.
fn down_oracle(pr: &Problem, act: &[f32]) -> Vec<f32> {
    let (h, n) = (pr.cfg.hidden, pr.cfg.inter);
    let mut y = vec![0f32; pr.topk_ids.len() * h];
    for p in 0..pr.topk_ids.len() {
        let Some(e) = local_expert(pr, p) else { continue };
        for j in 0..h {
            y[p * h + j] =
                (dot64(&act[p * n..(p + 1) * n], &pr.w2.values[(e * h + j) * n..][..n]) * pr.router_w[p] as f64) as f32;
        }
    }
    y
}

/// out[t] = Σ_slot y[t·k + slot] in f64.
fn combine_oracle(y: &[f32], tokens: usize, top_k: usize, hidden: usize) -> Vec<f32> {
    (0..tokens * hidden)
        .map(|i| {
            let (t, j) = (i / hidden, i % hidden);
            (0..top_k).map(|s| y[(t * top_k + s) * hidden + j] as f64).sum::<f64>() as f32
        })
        .collect()
}

/// Runs gate/up, down and combine, checking each stage against its oracle on the op's own
/// input. Returns (act, y, out).
fn check_pipeline<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(
    b: &B,
    pr: &Problem,
    fmt: MoeWeightFormat,
    what: &str,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let c = &pr.cfg;
    let act = run_stage(b, pr, gate_up_stage(c.linear_beta), fmt, None, &pr.x).unwrap_or_else(|e| panic!("{what}: gate/up: {e}"));
    // f32 act: an f32 dot over <= 128 exact products and one f32 SiTU evaluation, well inside
    // the same-algorithm f32 threshold; bf16 act: one bf16 rounding of the result.
    assert_close(&format!("{what}: act"), &act, &gate_up_oracle(pr, &pr.x), Tolerance::for_dtype(c.act_dt));
    let y = run_stage(b, pr, MoeGemmStage::Down, fmt, None, &act).unwrap_or_else(|e| panic!("{what}: down: {e}"));
    // y is f32 computed from the op's own act: f32 dot-product rounding only.
    assert_close(&format!("{what}: y"), &y, &down_oracle(pr, &act), Tolerance::F32);
    let out = run_combine(b, c.tokens, c.top_k, c.hidden, &y, c.out_dt).unwrap_or_else(|e| panic!("{what}: combine: {e}"));
    // f32 sum of top_k terms, rounded once to the output dtype.
    assert_close(&format!("{what}: out"), &out, &combine_oracle(&y, c.tokens, c.top_k, c.hidden), Tolerance::for_dtype(c.out_dt));
    // Dropped pairs (expert map) contribute exact zeros; a map case must drop some.
    let dropped: Vec<usize> = (0..pr.topk_ids.len()).filter(|&p| local_expert(pr, p).is_none()).collect();
    assert_eq!(c.local.is_some() && c.tokens > 0, !dropped.is_empty(), "{what}: the expert map drops pairs");
    for &p in &dropped {
        assert!(act[p * c.inter..(p + 1) * c.inter].iter().all(|&v| v == 0.0), "{what}: act row of dropped pair {p}");
        assert!(y[p * c.hidden..(p + 1) * c.hidden].iter().all(|&v| v == 0.0), "{what}: y row of dropped pair {p}");
    }
    (act, y, out)
}

fn cfg(tokens: usize, hidden: usize, inter: usize, experts: usize, top_k: usize, block_m: usize) -> Cfg {
    Cfg {
        tokens,
        hidden,
        inter,
        experts,
        local: None,
        top_k,
        block_m,
        x_dt: DType::BF16,
        act_dt: DType::F32,
        out_dt: DType::F32,
        linear_beta: Some(25.0),
    }
}

/// bf16 expert weights: gate/up + SiTU, down x router weight and the combine against dense
/// per-token oracles (bf16/f32 activations and outputs, uncapped up branch, expert map, T = 0).
pub fn moe_gemm_bf16_matches_dense_reference<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B) {
    let mut rng = TestRng::new(51);
    let cases = [
        cfg(5, 64, 32, 4, 2, 4),
        Cfg { act_dt: DType::BF16, out_dt: DType::BF16, ..cfg(9, 48, 24, 6, 3, 16) },
        Cfg { x_dt: DType::F32, linear_beta: None, ..cfg(7, 40, 8, 5, 1, 1) },
        Cfg { local: Some(3), ..cfg(7, 40, 16, 8, 2, 2) },
        cfg(0, 32, 16, 3, 2, 4),
        // Prefill-sized M-blocks: 72 pairs per expert in blocks of 128 (row chunks of a tiled
        // kernel: a full one and a partial one), bf16 act so both stages read bf16 inputs; k and
        // n not multiples of 32 / 64 (tails of the k steps and of the column tiles).
        Cfg { act_dt: DType::BF16, ..cfg(72, 80, 40, 2, 2, 128) },
        // Decode-sized: 1 pair, gate/up over k = 224 (3 steps of 64 and a 32-wide tail), which
        // the GPU backends split over k on any device with 2+ compute units.
        Cfg { act_dt: DType::BF16, ..cfg(1, 224, 64, 8, 1, 16) },
        // The same with 30 gate/up columns: n not a multiple of 4 (the partial rows' pad columns)
        // and a last group of 2 columns, stored one at a time.
        Cfg { act_dt: DType::BF16, ..cfg(1, 224, 30, 8, 1, 16) },
        // Gate/up over k = 320 (5 steps): an odd split count (5 splits on the stand-ins' cards
        // and 2 simt32 workers, 3 at simt64), bf16 act and outputs (the reduce's one 8-byte store
        // per 4 columns).
        Cfg { act_dt: DType::BF16, out_dt: DType::BF16, ..cfg(1, 320, 36, 8, 1, 16) },
        // More splits than the reduce loads at once (8): gate/up over k = 704 (11 steps), down
        // over k = 576 (9): 11 and 9 splits on the stand-ins' cards, a full group of 8 and a
        // partial one, whose past-the-end rows are loaded but must not be added.
        Cfg { act_dt: DType::BF16, ..cfg(1, 704, 576, 8, 1, 16) },
        // Several live rows per 16-row M-block (6 pairs per expert), split over k on 2+ units
        // (2 splits on simt32): the reduce takes each row's pair from its staged sorted id.
        Cfg { act_dt: DType::BF16, ..cfg(6, 256, 32, 2, 2, 16) },
        // Expert maps on every GPU kernel: the pairs of other ranks' experts are listed after the
        // runs and their rows zeroed by the 16-row MMA kernels (split over k or not, as the
        // device's units decide; the MXFP4 twin below splits on 2+ units), by the 64-row MMA
        // kernel (block_m 128), and one per tail block (block_m 1: 16-row MMA gate/up, f32 down).
        Cfg { local: Some(3), act_dt: DType::BF16, ..cfg(3, 224, 64, 8, 2, 16) },
        Cfg { local: Some(1), act_dt: DType::BF16, ..cfg(40, 80, 40, 4, 2, 128) },
        Cfg { local: Some(2), ..cfg(9, 32, 16, 8, 3, 1) },
        // f32 x and act at decode sizes, as model-k3 passes them: the 16-row kernels' f32-input
        // form on both stages, gate/up split over k on 2+ units (k = 256), several live rows.
        Cfg { x_dt: DType::F32, ..cfg(1, 256, 64, 8, 2, 16) },
        Cfg { x_dt: DType::F32, ..cfg(6, 256, 32, 2, 2, 16) },
    ];
    for c in &cases {
        let pr = make_problem(&mut rng, c, MoeWeightFormat::Dense);
        check_pipeline(b, &pr, MoeWeightFormat::Dense, &format!("bf16 {c:?}"));
    }
}

/// MXFP4 expert weights against the dense oracle on weights decoded by this file.
pub fn moe_gemm_mxfp4_matches_dense_reference<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B) {
    let mut rng = TestRng::new(52);
    let cases = [
        cfg(6, 64, 32, 4, 2, 4),
        Cfg { act_dt: DType::BF16, out_dt: DType::BF16, ..cfg(4, 32, 64, 3, 3, 8) },
        Cfg { local: Some(2), x_dt: DType::F32, ..cfg(5, 96, 32, 6, 2, 2) },
        // Several row chunks per M-block (70 pairs per expert, block_m 128), 1.5 column tiles of
        // down outputs.
        Cfg { act_dt: DType::BF16, ..cfg(70, 96, 32, 2, 2, 128) },
        // Decode-sized, split over k on the GPU backends (2 pairs, k = 256 for gate/up).
        Cfg { act_dt: DType::BF16, ..cfg(1, 256, 32, 6, 2, 16) },
        // With an expert map: 3 M-blocks, split on 2+ units (the split reduce zeroes the
        // dropped rows).
        Cfg { local: Some(2), act_dt: DType::BF16, ..cfg(3, 256, 32, 6, 2, 16) },
        // f32 x and act at decode sizes (model-k3's dtypes), with an expert map: gate/up split
        // over k on 2+ units, both stages on the f32-input form.
        Cfg { local: Some(4), x_dt: DType::F32, ..cfg(2, 256, 64, 6, 3, 16) },
    ];
    for c in &cases {
        let pr = make_problem(&mut rng, c, MoeWeightFormat::Mxfp4);
        check_pipeline(b, &pr, MoeWeightFormat::Mxfp4, &format!("mxfp4 {c:?}"));
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// MXFP4 weights give bit-identical results to their dequantised bf16 twin (same reduction
/// order), and bumping one scale byte changes the output.
pub fn moe_gemm_mxfp4_equals_bf16_twin<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B) {
    let mut rng = TestRng::new(53);
    // The last two run many k steps in one block (gate/up k = 512: 8 steps of 64, down k = 256),
    // so the GPU kernels' weight rings wrap around several times: 16-row and 64-row chunks.
    for c in [
        cfg(6, 64, 32, 4, 2, 4),
        Cfg { act_dt: DType::BF16, out_dt: DType::BF16, ..cfg(5, 32, 32, 3, 3, 2) },
        Cfg { act_dt: DType::BF16, ..cfg(8, 512, 256, 4, 2, 4) },
        Cfg { act_dt: DType::BF16, ..cfg(8, 512, 64, 2, 2, 32) },
    ] {
        let mut pr = make_problem(&mut rng, &c, MoeWeightFormat::Mxfp4);
        let (act4, y4, out4) = check_pipeline(b, &pr, MoeWeightFormat::Mxfp4, "mxfp4");
        let (act16, y16, out16) = check_pipeline(b, &pr, MoeWeightFormat::Dense, "bf16 twin");
        assert_eq!(bits(&act4), bits(&act16), "{c:?}: act of MXFP4 vs bf16 twin");
        assert_eq!(bits(&y4), bits(&y16), "{c:?}: y of MXFP4 vs bf16 twin");
        assert_eq!(bits(&out4), bits(&out16), "{c:?}: out of MXFP4 vs bf16 twin");

        // Expert of pair 0, gate row 0, first group: a non-zero code, then its scale doubled.
        let e = local_expert(&pr, 0).expect("no expert map here");
        let row = e * 2 * c.inter;
        pr.w13.packed[row * c.hidden / 2] = 0x22; // +1.0, +1.0
        let before = run_stage(b, &pr, gate_up_stage(c.linear_beta), MoeWeightFormat::Mxfp4, None, &pr.x).expect("gate/up");
        pr.w13.scales[row * c.hidden / MX_BLOCK] += 1;
        let after = run_stage(b, &pr, gate_up_stage(c.linear_beta), MoeWeightFormat::Mxfp4, None, &pr.x).expect("gate/up");
        assert_ne!(before[0], after[0], "{c:?}: a scale bump must change act[pair 0, 0]");
        // Only column 0 (gate row 0) of the pairs served by that expert may move.
        for (i, (x0, x1)) in before.iter().zip(&after).enumerate() {
            let (p, j) = (i / c.inter, i % c.inter);
            if j != 0 || local_expert(&pr, p) != Some(e) {
                assert_eq!(x0.to_bits(), x1.to_bits(), "{c:?}: act[{p}, {j}] does not read the bumped group");
            }
        }
        // Same for the down weights: a non-zero code in row 0 of that expert, then its scale.
        pr.w2.packed[e * c.hidden * c.inter / 2] = 0x22;
        let y_before = run_stage(b, &pr, MoeGemmStage::Down, MoeWeightFormat::Mxfp4, None, &act4).expect("down");
        pr.w2.scales[e * c.hidden * c.inter / MX_BLOCK] += 1;
        let y_after = run_stage(b, &pr, MoeGemmStage::Down, MoeWeightFormat::Mxfp4, None, &act4).expect("down");
        assert_ne!(y_before[0], y_after[0], "{c:?}: a scale bump must change y[pair 0, 0]");
    }
}

/// MXFP8 activations: equal to the oracle on MXFP8-rounded inputs, within fp8 tolerance of the
/// unquantised mode, and measurably different from it (it really quantises).
pub fn moe_gemm_mxfp8_activations<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B) {
    let mut rng = TestRng::new(54);
    // block_m 4 and 32: the 16-row and the 64-row chunkings of the MMA kernels.
    for (fmt, block_m) in [(MoeWeightFormat::Mxfp4, 4), (MoeWeightFormat::Dense, 4), (MoeWeightFormat::Mxfp4, 32)] {
        let c = cfg(8, 64, 32, 4, 2, block_m);
        let pr = make_problem(&mut rng, &c, fmt);
        let q = Some(MoeActivationQuant::Mxfp8);
        let stage = gate_up_stage(c.linear_beta);
        let act_q = run_stage(b, &pr, stage, fmt, q, &pr.x).expect("gate/up mxfp8");
        let act = run_stage(b, &pr, stage, fmt, None, &pr.x).expect("gate/up");
        // Same math on inputs rounded by the MXFP8 quantiser: the f32 threshold.
        assert_close(&format!("{fmt:?}: act (mxfp8)"), &act_q, &gate_up_oracle(&pr, &mxfp8_rows(&pr.x)), Tolerance::F32);
        // act = gate(g)·up(u) where g and u are both dots over e4m3-rounded inputs: two
        // independent fp8 errors multiply (√2·3.6e-2 ≈ 5e-2, measured 4.5e-2..6.0e-2 on the CPU),
        // so twice the single-rounding fp8 threshold.
        let two_fp8 = Tolerance { rel_rmse: 2.0 * Tolerance::FP8_E4M3.rel_rmse, ..Tolerance::FP8_E4M3 };
        let cmp = assert_close(&format!("{fmt:?}: act mxfp8 vs bf16 mode"), &act_q, &act, two_fp8);
        assert!(cmp.rel_rmse > 1e-3, "{fmt:?}: MXFP8 mode is indistinguishable from bf16 ({:.1e})", cmp.rel_rmse);
        let y_q = run_stage(b, &pr, MoeGemmStage::Down, fmt, q, &act).expect("down mxfp8");
        let y = run_stage(b, &pr, MoeGemmStage::Down, fmt, None, &act).expect("down");
        assert_close(&format!("{fmt:?}: y (mxfp8)"), &y_q, &down_oracle(&pr, &mxfp8_rows(&act)), Tolerance::F32);
        // One e4m3 rounding per input element of a single dot: the fp8 threshold (measured 3.2e-2).
        let cmp = assert_close(&format!("{fmt:?}: y mxfp8 vs bf16 mode"), &y_q, &y, Tolerance::FP8_E4M3);
        assert!(cmp.rel_rmse > 1e-3, "{fmt:?}: MXFP8 down is indistinguishable ({:.1e})", cmp.rel_rmse);
    }
}

/// f32 input is never rounded: with one-hot weights (1.0 at column j mod k of output row j, bf16
/// or MXFP4) each output of the down stage is one input value times the router weight, bit for
/// bit, for inputs that use every bit of f32's mantissa. A kernel that rounded the input to bf16
/// would miss by up to 2^-9 relative, one that kept 16 bits of it by up to 2^-17. Decode-sized
/// M-blocks (split over k on 2+ units at k = 256) and small ones.
pub fn moe_gemm_f32_input_is_exact<B: Backend + MoeAlign + MoeGroupedGemm>(b: &B) {
    let mut rng = TestRng::new(55);
    for fmt in [MoeWeightFormat::Dense, MoeWeightFormat::Mxfp4] {
        for c in [cfg(2, 96, 256, 4, 2, 16), cfg(3, 64, 64, 4, 2, 4)] {
            let mut pr = make_problem(&mut rng, &c, fmt);
            let (rows, cols) = (c.experts * c.hidden, c.inter);
            let hot = |r: usize| (r % c.hidden) % cols;
            pr.w2.values = (0..rows * cols).map(|i| if i % cols == hot(i / cols) { 1.0 } else { 0.0 }).collect();
            // E2M1 code 2 is 1.0; E8M0 127 is 2^0 (low nibble = even column).
            pr.w2.packed = (0..rows * cols / 2)
                .map(|i| {
                    let (r, col) = (2 * i / cols, 2 * i % cols);
                    u8::from(hot(r) == col) * 0x02 | u8::from(hot(r) == col + 1) * 0x20
                })
                .collect();
            pr.w2.scales = vec![127; rows * cols / MX_BLOCK];
            let pairs = c.tokens * c.top_k;
            // Normals whose low mantissa bits are all drawn (an f32 normal's are).
            let act = rng.normals(pairs * cols, 1.0);
            assert!(act.iter().any(|v| v.to_bits() & 0xff != 0), "inputs use the low mantissa bits");
            let y = run_stage(b, &pr, MoeGemmStage::Down, fmt, None, &act).unwrap_or_else(|e| panic!("{fmt:?} {c:?}: {e}"));
            for p in 0..pairs {
                for j in 0..c.hidden {
                    let want = act[p * cols + j % cols] * pr.router_w[p];
                    let got = y[p * c.hidden + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{fmt:?} {c:?}: y[{p}][{j}] = {got:e}, want {want:e}");
                }
            }
        }
    }
}

/// The combine sums the top-k rows in f32 and rounds once: against the f64 sum, and a case
/// where a bf16 accumulator would lose every small term.
pub fn moe_combine_matches_f64_sum<B: Backend + MoeCombine>(b: &B) {
    let mut rng = TestRng::new(55);
    for &(tokens, top_k, hidden, dt) in
        &[(7, 3, 20, DType::F32), (5, 16, 33, DType::BF16), (1, 1, 4, DType::F32), (0, 4, 8, DType::BF16),
          // Several column tiles of the GPU kernel (1024 columns each) with a tail: 16-byte rows
          // (hidden % 4 == 0) and rows read per column (hidden % 4 == 2).
          (3, 4, 2052, DType::F32), (2, 16, 1030, DType::BF16),
          // 16-byte rows with more slots than the kernel loads at once (8): a full group and a
          // partial one.
          (2, 11, 1028, DType::F32)]
    {
        let y = rng.normals(tokens * top_k * hidden, 1.0);
        let out = run_combine(b, tokens, top_k, hidden, &y, dt).expect("combine");
        // f32 sum of <= 16 terms vs f64, rounded once to the output dtype.
        assert_close(
            &format!("combine {tokens}x{top_k}x{hidden} {dt}"),
            &out,
            &combine_oracle(&y, tokens, top_k, hidden),
            Tolerance::for_dtype(dt),
        );
    }
    // 1 + 15·2^-9 = 1.029..., which rounds once to bf16 1.03125; a bf16 running sum stays at 1.
    let mut y = vec![2f32.powi(-9); 16];
    y[0] = 1.0;
    let out = run_combine(b, 1, 16, 1, &y, DType::BF16).expect("combine");
    assert_eq!(out, vec![1.03125], "rounded once, not accumulated in bf16");
    let cmp = compare(&out, &round_through(DType::BF16, &combine_oracle(&y, 1, 16, 1)));
    assert_eq!(cmp.max_abs, 0.0);
}

/// Malformed params and tensors are typed errors naming the field.
pub fn moe_gemm_rejects_bad_shapes<B: Backend + MoeAlign + MoeGroupedGemm + MoeCombine>(b: &B) {
    let r = MoeRouting { tokens: 3, top_k: 2, experts: 4, block_m: 4 };
    let base = MoeGemmParams {
        routing: r.clone(),
        k: 64,
        n: 16,
        stage: gate_up_stage(Some(25.0)),
        weights: MoeWeightFormat::Mxfp4,
        activation_quant: None,
    };
    let plan_err = |p: MoeGemmParams| MoeGroupedGemm::plan(b, &p).unwrap_err().field().map(str::to_string);
    assert_eq!(plan_err(MoeGemmParams { k: 48, ..base.clone() }).as_deref(), Some("params.k"), "MXFP4 needs k % 32 == 0");
    let dense_q = MoeGemmParams {
        k: 48,
        weights: MoeWeightFormat::Dense,
        activation_quant: Some(MoeActivationQuant::Mxfp8),
        ..base.clone()
    };
    assert_eq!(plan_err(dense_q).as_deref(), Some("params.k"), "MXFP8 activations need k % 32 == 0");
    assert_eq!(
        plan_err(MoeGemmParams { stage: MoeGemmStage::GateUp { beta: 0.0, linear_beta: None }, ..base.clone() }).as_deref(),
        Some("params.stage.beta")
    );
    assert_eq!(
        plan_err(MoeGemmParams { stage: gate_up_stage(Some(f32::NAN)), ..base.clone() }).as_deref(),
        Some("params.stage.linear_beta")
    );
    assert_eq!(
        plan_err(MoeGemmParams { routing: MoeRouting { block_m: 0, ..r.clone() }, ..base.clone() }).as_deref(),
        Some("params.routing.block_m")
    );
    assert_eq!(plan_err(MoeGemmParams { n: 0, ..base.clone() }).as_deref(), Some("params.n"));

    let plan = MoeGroupedGemm::plan(b, &base).expect("plan");
    let aligned = align_on(b, &r, &[0, 1, 2, 3, 1, 0], None).expect("align");
    let t = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let x = t(DType::BF16, &[3, 64]);
    let packed = t(DType::U8, &[4, 32, 32]);
    let scale = t(DType::E8M0, &[4, 32, 2]);
    let router_w = t(DType::F32, &[3, 2]);
    let run = |plan: &crate::ops::MoeGemmPlan,
               input: &DeviceTensor<B>,
               w: &DeviceTensor<B>,
               s: Option<&DeviceTensor<B>>,
               tw: Option<&DeviceTensor<B>>,
               out_dt: DType,
               out_n: usize| {
        let mut out = t(out_dt, &[6, out_n]);
        let args = MoeGemmArgs {
            input: input.as_ref(),
            weight: w.as_ref(),
            weight_scale: s.map(DeviceTensor::as_ref),
            sorted_token_ids: aligned.sorted_token_ids.as_ref(),
            expert_ids: aligned.expert_ids.as_ref(),
            num_tokens_post_padded: aligned.num_tokens_post_padded.as_ref(),
            topk_weights: tw.map(DeviceTensor::as_ref),
            out: out.as_mut(),
        };
        MoeGroupedGemm::run(b, plan, args, None, b.default_stream()).err().and_then(|e| e.field().map(str::to_string))
    };
    assert_eq!(run(&plan, &x, &packed, Some(&scale), None, DType::F32, 16), None, "well-formed call must succeed");
    assert_eq!(run(&plan, &t(DType::I32, &[3, 64]), &packed, Some(&scale), None, DType::F32, 16).as_deref(), Some("input"));
    assert_eq!(
        run(&plan, &x, &t(DType::U8, &[4, 32, 31]), Some(&scale), None, DType::F32, 16).as_deref(),
        Some("weight"),
        "packed width != k/2"
    );
    assert_eq!(
        run(&plan, &x, &t(DType::BF16, &[4, 32, 32]), Some(&scale), None, DType::F32, 16).as_deref(),
        Some("weight"),
        "packed dtype"
    );
    assert_eq!(
        run(&plan, &x, &packed, Some(&t(DType::E8M0, &[4, 32, 3])), None, DType::F32, 16).as_deref(),
        Some("weight_scale"),
        "scale width != k/32"
    );
    assert_eq!(run(&plan, &x, &packed, None, None, DType::F32, 16).as_deref(), Some("weight_scale"), "missing scales");
    assert_eq!(
        run(&plan, &x, &packed, Some(&scale), Some(&router_w), DType::F32, 16).as_deref(),
        Some("topk_weights"),
        "router weights in gate/up"
    );
    assert_eq!(run(&plan, &x, &packed, Some(&scale), None, DType::F16, 16).as_deref(), Some("out"));
    assert_eq!(run(&plan, &x, &packed, Some(&scale), None, DType::F32, 15).as_deref(), Some("out"));
    let dense = MoeGroupedGemm::plan(b, &MoeGemmParams { weights: MoeWeightFormat::Dense, ..base.clone() }).expect("plan");
    let w_dense = t(DType::BF16, &[4, 32, 64]);
    assert_eq!(
        run(&dense, &x, &w_dense, Some(&scale), None, DType::F32, 16).as_deref(),
        Some("weight_scale"),
        "scales with dense weights"
    );
    assert_eq!(run(&dense, &x, &w_dense, None, None, DType::F32, 16), None, "well-formed dense call must succeed");
    let down = MoeGroupedGemm::plan(
        b,
        &MoeGemmParams { stage: MoeGemmStage::Down, weights: MoeWeightFormat::Dense, k: 64, n: 16, ..base.clone() },
    )
    .expect("plan");
    let act = t(DType::BF16, &[6, 64]);
    let w2 = t(DType::BF16, &[4, 16, 64]);
    assert_eq!(run(&down, &act, &w2, None, None, DType::F32, 16).as_deref(), Some("topk_weights"), "down needs router weights");
    assert_eq!(run(&down, &act, &w2, None, Some(&t(DType::BF16, &[3, 2])), DType::F32, 16).as_deref(), Some("topk_weights"));
    assert_eq!(run(&down, &act, &w2, None, Some(&router_w), DType::BF16, 16).as_deref(), Some("out"), "down output is f32");
    assert_eq!(
        run(&down, &x, &w2, None, Some(&router_w), DType::F32, 16).as_deref(),
        Some("input"),
        "down input has one row per pair"
    );
    assert_eq!(run(&down, &act, &w2, None, Some(&router_w), DType::F32, 16), None, "well-formed down call must succeed");

    // Index tensors from a different routing (wrong lengths).
    let other = align_on(b, &MoeRouting { block_m: 2, ..r.clone() }, &[0, 1, 2, 3, 1, 0], None).expect("align");
    let mut out = t(DType::F32, &[6, 16]);
    let args = MoeGemmArgs {
        input: x.as_ref(),
        weight: packed.as_ref(),
        weight_scale: Some(scale.as_ref()),
        sorted_token_ids: other.sorted_token_ids.as_ref(),
        expert_ids: aligned.expert_ids.as_ref(),
        num_tokens_post_padded: aligned.num_tokens_post_padded.as_ref(),
        topk_weights: None,
        out: out.as_mut(),
    };
    let e = MoeGroupedGemm::run(b, &plan, args, None, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("sorted_token_ids"), "{e}");

    // Combine.
    let cplan = MoeCombine::plan(b, &MoeCombineParams { tokens: 3, top_k: 2, hidden: 8 }).expect("plan");
    assert_eq!(
        MoeCombine::plan(b, &MoeCombineParams { tokens: 3, top_k: 0, hidden: 8 }).unwrap_err().field(),
        Some("params.top_k")
    );
    let crun = |y: &DeviceTensor<B>, out_dt: DType, out_shape: &[usize]| {
        let mut out = t(out_dt, out_shape);
        MoeCombine::run(b, &cplan, MoeCombineArgs { y: y.as_ref(), out: out.as_mut() }, None, b.default_stream())
            .err()
            .and_then(|e| e.field().map(str::to_string))
    };
    assert_eq!(crun(&t(DType::BF16, &[6, 8]), DType::F32, &[3, 8]).as_deref(), Some("y"), "y must be f32");
    assert_eq!(crun(&t(DType::F32, &[3, 8]), DType::F32, &[3, 8]).as_deref(), Some("y"), "y has tokens·top_k rows");
    assert_eq!(crun(&t(DType::F32, &[6, 8]), DType::F32, &[3, 9]).as_deref(), Some("out"));
    assert_eq!(crun(&t(DType::F32, &[6, 8]), DType::I32, &[3, 8]).as_deref(), Some("out"));
    assert_eq!(crun(&t(DType::F32, &[6, 8]), DType::BF16, &[3, 8]), None, "well-formed combine must succeed");
}


/// The GEMMs write exactly the rows the align outputs list, on an output that starts as NaN:
/// served pairs get values, pairs listed after the runs (served by no expert) get zeros, and a
/// pair listed nowhere (only possible with hand-built routing) keeps its row. Routing by hand:
/// 6 pairs, 2 experts, block_m 4: expert 0 serves pairs 0 and 2, expert 1 pairs 1 and 4, pair 3
/// is listed after the runs, pair 5 nowhere. Both stages, on the MMA path (bf16 input) and the
/// f32 one.
pub fn moe_gemm_writes_exactly_the_listed_rows<B: Backend + MoeGroupedGemm>(b: &B) {
    let r = MoeRouting { tokens: 3, top_k: 2, experts: 2, block_m: 4 };
    let s = 6; // sentinel
    let sorted = upload_i32(b, &[12], &[0, 2, s, s, 1, 4, s, s, 3, s, s, s]);
    let expert_ids = upload_i32(b, &[3], &[0, 1, -1]);
    let used = upload_i32(b, &[1], &[8]);
    let mut rng = TestRng::new(57);
    let (k, n) = (32, 8);
    for (stage, in_dt) in [
        (gate_up_stage(Some(25.0)), DType::BF16),
        (gate_up_stage(Some(25.0)), DType::F32),
        (MoeGemmStage::Down, DType::BF16),
        (MoeGemmStage::Down, DType::F32),
    ] {
        let params = MoeGemmParams { routing: r.clone(), k, n, stage, weights: MoeWeightFormat::Dense, activation_quant: None };
        let plan = MoeGroupedGemm::plan(b, &params).expect("plan");
        let in_rows = if stage == MoeGemmStage::Down { 6 } else { 3 };
        let input = upload_f32(b, in_dt, &[in_rows, k], &round_through(DType::BF16, &rng.normals(in_rows * k, 1.0))).unwrap();
        let w = upload_f32(b, DType::BF16, &[2, plan.weight_rows, k], &rng.normals(2 * plan.weight_rows * k, 0.2)).unwrap();
        let router_w = (stage == MoeGemmStage::Down).then(|| upload_f32(b, DType::F32, &[3, 2], &[0.5; 6]).unwrap());
        let mut out = upload_f32(b, DType::F32, &[6, n], &[f32::NAN; 48]).unwrap();
        let args = MoeGemmArgs {
            input: input.as_ref(),
            weight: w.as_ref(),
            weight_scale: None,
            sorted_token_ids: sorted.as_ref(),
            expert_ids: expert_ids.as_ref(),
            num_tokens_post_padded: used.as_ref(),
            topk_weights: router_w.as_ref().map(DeviceTensor::as_ref),
            out: out.as_mut(),
        };
        let mut ws = b.workspace(MoeGroupedGemm::workspace_size(b, &plan)).unwrap();
        MoeGroupedGemm::run(b, &plan, args, ws.as_mut(), b.default_stream()).expect("run");
        let got = download_f32(b, &out).unwrap();
        let row = |p: usize| &got[p * n..(p + 1) * n];
        for p in [0, 1, 2, 4] {
            let served = row(p).iter().all(|v| v.is_finite()) && row(p).iter().any(|&v| v != 0.0);
            assert!(served, "{stage:?} {in_dt}: served row {p}: {:?}", row(p));
        }
        assert!(row(3).iter().all(|&v| v == 0.0), "{stage:?} {in_dt}: unserved row 3 is zeros: {:?}", row(3));
        assert!(row(5).iter().all(|v| v.is_nan()), "{stage:?} {in_dt}: row 5 (listed nowhere) untouched: {:?}", row(5));
    }
}
