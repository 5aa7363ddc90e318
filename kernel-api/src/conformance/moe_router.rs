//! Conformance tests of [`crate::ops::MoeRouter`] (k3-architecture.md 2.5 and 5.4 item 4).

use super::moe_align::download_i32;
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{MoeRouter, MoeRouterArgs, MoeRouterParams};
use crate::tolerance::{assert_close, Tolerance};


/// Host inputs of one routing problem (values already rounded to their stored dtypes).
#[derive(Clone)]
struct RouterCase {
    p: MoeRouterParams,
    x: Vec<f32>,
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    in_dtype: DType,
    /// The router weight's dtype (`in_dtype` unless a case mixes them).
    w_dtype: DType,
}

fn params(tokens: usize, hidden: usize, experts: usize, top_k: usize) -> MoeRouterParams {
    MoeRouterParams::sigmoid(tokens, hidden, experts, top_k)
}

fn random_case(rng: &mut TestRng, p: MoeRouterParams, in_dtype: DType, bias_scale: Option<f32>) -> RouterCase {
    let x = round_through(in_dtype, &rng.normals(p.tokens * p.hidden, 1.0));
    let w = round_through(in_dtype, &rng.normals(p.experts * p.hidden, 1.0 / (p.hidden as f32).sqrt()));
    let bias = bias_scale.map(|s| rng.uniforms(p.experts, -s, s));
    RouterCase { p, x, w, bias, in_dtype, w_dtype: in_dtype }
}

/// x of dtype `x_dt`, the weight of dtype `w_dt` (the GPU logits kernel has a path per pair).
fn mixed_case(rng: &mut TestRng, p: MoeRouterParams, x_dt: DType, w_dt: DType) -> RouterCase {
    let x = round_through(x_dt, &rng.normals(p.tokens * p.hidden, 1.0));
    let w = round_through(w_dt, &rng.normals(p.experts * p.hidden, 1.0 / (p.hidden as f32).sqrt()));
    let bias = Some(rng.uniforms(p.experts, -0.05, 0.05));
    RouterCase { p, x, w, bias, in_dtype: x_dt, w_dtype: w_dt }
}

/// Runs the backend's router: (ids, weights).
fn route<B: Backend + MoeRouter>(b: &B, c: &RouterCase) -> Result<(Vec<i32>, Vec<f32>)> {
    let p = &c.p;
    let plan = MoeRouter::plan(b, p)?;
    let x = upload_f32(b, c.in_dtype, &[p.tokens, p.hidden], &c.x)?;
    let w = upload_f32(b, c.w_dtype, &[p.experts, p.hidden], &c.w)?;
    let bias = c.bias.as_ref().map(|v| upload_f32(b, DType::F32, &[p.experts], v)).transpose()?;
    let mut ids = b.zeros(DType::I32, &[p.tokens, p.top_k])?;
    let mut weights = b.zeros(DType::F32, &[p.tokens, p.top_k])?;
    let args = MoeRouterArgs {
        x: x.as_ref(),
        weight: w.as_ref(),
        bias: bias.as_ref().map(DeviceTensor::as_ref),
        topk_ids: ids.as_mut(),
        topk_weights: weights.as_mut(),
    };
    let mut ws = b.workspace(MoeRouter::workspace_size(b, &plan))?;
    MoeRouter::run(b, &plan, args, ws.as_mut(), b.default_stream())?;
    Ok((download_i32(b, &ids), download_f32(b, &weights)?))
}

/// f64 sigmoid scores of token t.
fn oracle_scores(c: &RouterCase, t: usize) -> Vec<f64> {
    let h = c.p.hidden;
    (0..c.p.experts)
        .map(|e| {
            let l: f64 = (0..h).map(|i| c.x[t * h + i] as f64 * c.w[e * h + i] as f64).sum();
            1.0 / (1.0 + (-l).exp())
        })
        .collect()
}

/// Naive selection: group scores by two argmax passes, groups and experts by repeated argmax
/// (lowest index wins ties). Returns the chosen ids and the smallest gap between the compared
/// selection scores (how far the decision is from a tie).
fn oracle_select(p: &MoeRouterParams, sel: &[f64]) -> (Vec<usize>, f64) {
    let mut gap = f64::INFINITY;
    // Picks `n` indices of `scores` among `allowed` by repeated argmax, recording the gap to the
    // runner-up at each step.
    let mut pick = |scores: &[f64], allowed: &[bool], n: usize| -> Vec<usize> {
        let mut taken = vec![false; scores.len()];
        let mut out = Vec::new();
        for _ in 0..n {
            let mut best: Option<usize> = None;
            let mut second = f64::NEG_INFINITY;
            for i in 0..scores.len() {
                if !allowed[i] || taken[i] {
                    continue;
                }
                match best {
                    Some(bi) if scores[i] <= scores[bi] => second = second.max(scores[i]),
                    Some(bi) => {
                        second = second.max(scores[bi]);
                        best = Some(i);
                    }
                    None => best = Some(i),
                }
            }
            let bi = best.expect("enough candidates");
            gap = gap.min(scores[bi] - second);
            taken[bi] = true;
            out.push(bi);
        }
        out
    };
    let size = p.experts / p.n_group;
    let mut allowed = vec![true; p.experts];
    if p.n_group > 1 {
        let group_scores: Vec<f64> = (0..p.n_group)
            .map(|g| {
                let s = &sel[g * size..(g + 1) * size];
                let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
                for &v in s {
                    if v > a {
                        b = a;
                        a = v;
                    } else if v > b {
                        b = v;
                    }
                }
                if size == 1 {
                    a
                } else {
                    a + b
                }
            })
            .collect();
        let groups = pick(&group_scores, &vec![true; p.n_group], p.topk_group);
        allowed = (0..p.experts).map(|e| groups.contains(&(e / size))).collect();
    }
    (pick(sel, &allowed, p.top_k), gap)
}

/// The weights the contract defines for a chosen set, from unbiased scores.
fn oracle_weights(p: &MoeRouterParams, scores: &[f64], ids: &[usize]) -> Vec<f32> {
    let sum: f64 = ids.iter().map(|&i| scores[i]).sum();
    let denom = if p.renormalize { sum + 1e-20 } else { 1.0 };
    ids.iter().map(|&i| (scores[i] / denom * p.routed_scaling_factor as f64) as f32).collect()
}

/// Compares a routing with the oracle; tokens whose decision is within 1e-5 of a tie are
/// skipped (f32 logits may legitimately break them either way) and must stay rare.
fn check_case<B: Backend + MoeRouter>(b: &B, c: &RouterCase, what: &str) {
    let (ids, weights) = route(b, c).unwrap_or_else(|e| panic!("{what}: {e}"));
    let k = c.p.top_k;
    let mut checked = 0;
    for t in 0..c.p.tokens {
        let scores = oracle_scores(c, t);
        let sel: Vec<f64> = scores.iter().enumerate().map(|(e, s)| s + c.bias.as_ref().map_or(0.0, |b| b[e] as f64)).collect();
        let (want, gap) = oracle_select(&c.p, &sel);
        if gap < 1e-5 {
            continue;
        }
        checked += 1;
        let got: Vec<usize> = ids[t * k..(t + 1) * k].iter().map(|&i| i as usize).collect();
        assert_eq!(got, want, "{what}: token {t} ids");
        // Sigmoid of an f32 logit vs the f64 oracle: f32 rounding only, so the f32 threshold.
        assert_close(
            &format!("{what}: token {t} weights"),
            &weights[t * k..(t + 1) * k],
            &oracle_weights(&c.p, &scores, &want),
            Tolerance::F32,
        );
    }
    assert!(checked * 10 >= c.p.tokens * 9, "{what}: only {checked} of {} tokens free of near-ties", c.p.tokens);
}

/// Ungrouped routing (K3: n_group = 1) against the f64 oracle, bf16 and f32 inputs, with and
/// without bias, renormalised or not, scaled.
pub fn moe_router_matches_oracle<B: Backend + MoeRouter>(b: &B) {
    let mut rng = TestRng::new(41);
    for &(tokens, hidden, experts, top_k, renorm, rsf, dt, bias) in &[
        (6, 32, 16, 4, true, 1.0, DType::BF16, Some(0.1)),
        (5, 24, 8, 8, true, 2.5, DType::F32, Some(0.05)),
        (4, 16, 12, 3, false, 1.0, DType::F32, None),
        (3, 8, 1, 1, true, 1.0, DType::BF16, None),
        (0, 8, 4, 2, true, 1.0, DType::F32, Some(0.1)),
        (8, 64, 40, 16, true, 1.0, DType::BF16, Some(0.02)),
        // GPU logits kernels. One token tile (<= 8 tokens: one expert per thread group): E not a
        // multiple of 4 experts per block, 25 chunks of 8 per row (a partial pass of the 64
        // threads of an expert), rows longer than one slab of chunks per thread (bf16: 64 x 8
        // chunks = 4096 values; f32: 2048).
        (7, 200, 37, 5, true, 1.0, DType::BF16, Some(0.05)),
        (2, 4608, 8, 2, true, 1.0, DType::BF16, Some(0.05)),
        (3, 2304, 6, 2, true, 1.0, DType::F32, None),
        // Past one token tile (4 experts per thread group, 16 per block): two tiles (8 + 1), E
        // not a multiple of 16, rows longer than one slab (bf16: 64 x 2 chunks = 1024 values;
        // f32: 512).
        (9, 200, 37, 5, true, 1.0, DType::BF16, Some(0.05)),
        (12, 2048, 20, 4, true, 1.0, DType::BF16, Some(0.05)),
        (10, 1024, 9, 3, true, 1.0, DType::F32, Some(0.05)),
        // hidden % 8 != 0: the unaligned logits kernel.
        (10, 20, 10, 3, true, 1.0, DType::BF16, Some(0.05)),
        (3, 13, 5, 2, false, 1.0, DType::F32, Some(0.05)),
    ] {
        let p = MoeRouterParams { renormalize: renorm, routed_scaling_factor: rsf, ..params(tokens, hidden, experts, top_k) };
        let c = random_case(&mut rng, p, dt, bias);
        check_case(b, &c, &format!("router {:?}", c.p));
    }
    for (x_dt, w_dt) in [(DType::F32, DType::BF16), (DType::BF16, DType::F32)] {
        for tokens in [5, 9] {
            let c = mixed_case(&mut rng, params(tokens, 96, 12, 3), x_dt, w_dt);
            check_case(b, &c, &format!("router {tokens} tokens, x {x_dt} weight {w_dt}"));
        }
    }
    // Past one token tile with a bf16 weight (the GPU's tensor-core logits, k split over the
    // planes the selection adds): two token tiles of 32 (the second with one live fragment of
    // 8 on m16n8k16), two expert tiles of 64 (the second with one warp past E and one partial
    // 16-row fragment), a partial last window of 32 (hidden 200 = 6 x 32 + 8), and f32 x (cut
    // into three bf16 planes) as well as bf16 x.
    for x_dt in [DType::F32, DType::BF16] {
        for (tokens, hidden, experts) in [(41, 200, 100), (33, 1056, 70)] {
            let c = mixed_case(&mut rng, params(tokens, hidden, experts, 6), x_dt, DType::BF16);
            check_case(b, &c, &format!("router {tokens} tokens, hidden {hidden}, E {experts}, x {x_dt} weight bf16"));
        }
    }
    f32_x_keeps_every_bit(b);
}

/// f32 x whose logits live in its low 16 bits: x[t][5] = 1 + m_t 2^-23 (m_t in [2^15, 2^16),
/// so its bf16 truncation is 1.0 and m_t sits in the two lower bf16 planes a tensor-core path
/// cuts an f32 into) and x[t][21] = 1, weights w[e][5] = c_e = -w[e][21], distinct signed powers
/// of two (2^2 .. 2^9): logit_e = c_e m_t 2^-23 exactly in f32 on every path, 2^-6 to 4 in
/// magnitude. A
/// path that rounds x to bf16 (or drops a plane) loses m_t, or part of it, and picks or weighs
/// differently. 12 tokens: past one token tile. Then infinities in x.
fn f32_x_keeps_every_bit<B: Backend + MoeRouter>(b: &B) {
    let (tokens, hidden, experts) = (12, 32, 16);
    let mut rng = TestRng::new(44);
    let mut x = vec![0.0f32; tokens * hidden];
    for t in 0..tokens {
        let m = 32768.0 + (rng.uniforms(1, 0.0, 32767.0)[0] as f64).floor();
        x[t * hidden + 5] = (1.0 + m * 2f64.powi(-23)) as f32;
        x[t * hidden + 21] = 1.0;
    }
    let mut w = vec![0.0f32; experts * hidden];
    for e in 0..experts {
        let c = if e % 2 == 0 { 1.0 } else { -1.0 } * 2f32.powi(2 + ((e / 2) * 3 % 8) as i32);
        w[e * hidden + 5] = c;
        w[e * hidden + 21] = -c;
    }
    let c = RouterCase { p: params(tokens, hidden, experts, 4), x, w, bias: None, in_dtype: DType::F32, w_dtype: DType::BF16 };
    check_case(b, &c, "router: f32 x's low bits");

    // Infinities in f32 x: each logit of the token is then +-inf (no weight is 0), so its chosen
    // experts score 1 and the bias orders them; a path that lets inf - inf into a lower bf16
    // plane makes them NaN instead.
    let mut c = mixed_case(&mut rng, params(tokens, hidden, experts, 4), DType::F32, DType::BF16);
    c.bias = Some(rng.uniforms(experts, -0.5, 0.5));
    c.x[3 * hidden + 7] = f32::INFINITY;
    c.x[5 * hidden + 30] = f32::NEG_INFINITY;
    assert!(c.w.iter().all(|&v| v != 0.0), "no zero weight (inf x 0 would be NaN)");
    check_case(b, &c, "router: f32 x with infinities");
}

/// Group-limited selection (DeepSeek style) against the naive oracle, plus a hand-built case
/// where masking overrules the best single expert.
pub fn moe_router_grouped_matches_oracle<B: Backend + MoeRouter>(b: &B) {
    let mut rng = TestRng::new(42);
    for &(experts, top_k, n_group, topk_group) in &[(16, 4, 4, 2), (32, 6, 8, 3), (12, 3, 3, 1), (8, 2, 8, 4), (12, 6, 4, 2)] {
        let p = MoeRouterParams { n_group, topk_group, ..params(7, 16, experts, top_k) };
        let c = random_case(&mut rng, p, DType::F32, Some(0.1));
        check_case(b, &c, &format!("grouped router {:?}", c.p));
    }
    // x = 0: every score is 0.5 and the bias decides. Group 0 holds the best expert (0.9) but
    // group 1 has the larger top-2 sum (0.6 + 0.6 > 0.9 + 0.1); ties inside it: lowest index.
    let mut bias = vec![-0.3f32; 8];
    bias[..4].copy_from_slice(&[0.4, -0.4, 0.1, 0.1]);
    let p = MoeRouterParams { n_group: 4, topk_group: 1, ..params(1, 4, 8, 2) };
    let c = RouterCase { x: vec![0.0; 4], w: rng.normals(32, 1.0), bias: Some(bias), p, in_dtype: DType::F32, w_dtype: DType::F32 };
    let (ids, weights) = route(b, &c).expect("route");
    assert_eq!(ids, vec![2, 3], "group masking");
    assert_eq!(weights, vec![0.5, 0.5], "weights from unbiased scores 0.5 / (0.5 + 0.5)");
}

/// The bias changes which experts are chosen but never the weights: they are always the
/// unbiased renormalised sigmoid scores of the chosen set, summing to 1 (times the scaling).
pub fn moe_router_bias_selects_only<B: Backend + MoeRouter>(b: &B) {
    let mut rng = TestRng::new(43);
    let base = random_case(&mut rng, params(16, 32, 16, 4), DType::BF16, None);
    let k = 4;
    let mut any_changed = false;
    let (ids0, _) = route(b, &base).expect("route");
    for scale in [0.05f32, 0.3, 1.0] {
        let bias = Some(rng.uniforms(16, -scale, scale));
        for rsf in [1.0f32, 2.5] {
            for renormalize in [true, false] {
                let p = MoeRouterParams { routed_scaling_factor: rsf, renormalize, ..base.p.clone() };
                let c = RouterCase { p, bias: bias.clone(), ..base.clone() };
                let (ids, weights) = route(b, &c).expect("route");
                any_changed |= ids != ids0;
                for t in 0..c.p.tokens {
                    let chosen: Vec<usize> = ids[t * k..(t + 1) * k].iter().map(|&i| i as usize).collect();
                    let scores = oracle_scores(&c, t);
                    let want = oracle_weights(&c.p, &scores, &chosen);
                    let got = &weights[t * k..(t + 1) * k];
                    assert_close(&format!("bias {scale} rsf {rsf} renorm {renormalize} token {t}"), got, &want, Tolerance::F32);
                    if renormalize {
                        let sum: f64 = got.iter().map(|&w| w as f64).sum();
                        assert!((sum - rsf as f64).abs() <= 1e-6 * rsf as f64, "token {t}: weights sum to {sum}, want {rsf}");
                    }
                }
            }
        }
    }
    assert!(any_changed, "a bias of scale up to 1 must change some selection");
}

/// Exact ties go to the lowest expert index, in the selection and in the output order.
pub fn moe_router_ties_lowest_index<B: Backend + MoeRouter>(b: &B) {
    // Only x[0] is non-zero, so logits are column 0 of W: experts 1, 4, 6 tie at 2.0, experts
    // 2, 5 tie at 1.0, the rest sit at -1.0.
    let logit = [-1.0, 2.0, 1.0, -1.0, 2.0, 1.0, 2.0, -1.0];
    let mut w = vec![0.0f32; 8 * 4];
    for (e, &l) in logit.iter().enumerate() {
        w[e * 4] = l;
        w[e * 4 + 1] = e as f32 + 0.5; // multiplied by x[1] = 0: must not break the tie
    }
    let x = vec![1.0, 0.0, 0.0, 0.0];
    for dt in [DType::F32, DType::BF16] {
        let c = RouterCase { p: params(1, 4, 8, 4), x: x.clone(), w: w.clone(), bias: None, in_dtype: dt, w_dtype: dt };
        let (ids, _) = route(b, &c).expect("route");
        assert_eq!(ids, vec![1, 4, 6, 2], "{dt}: tied experts in index order");
    }
    // All scores equal (x = 0): experts 0..k, each weight 1/k; grouped: the first groups.
    for (n_group, topk_group) in [(1, 1), (2, 1), (4, 2), (8, 4)] {
        let c = RouterCase {
            p: MoeRouterParams { n_group, topk_group, ..params(2, 4, 8, 4) },
            x: vec![0.0; 8],
            w: w.clone(),
            bias: None,
            in_dtype: DType::F32,
            w_dtype: DType::F32,
        };
        let (ids, weights) = route(b, &c).expect("route");
        assert_eq!(ids, vec![0, 1, 2, 3, 0, 1, 2, 3], "all-equal scores, groups {n_group}/{topk_group}");
        assert_eq!(weights, vec![0.25; 8]);
    }
}

/// Malformed params and arguments are typed errors naming the field.
pub fn moe_router_rejects_bad_input<B: Backend + MoeRouter>(b: &B) {
    let p = params(2, 8, 6, 2);
    let plan_err = |q: MoeRouterParams| MoeRouter::plan(b, &q).unwrap_err().field().map(str::to_string);
    assert_eq!(plan_err(MoeRouterParams { top_k: 7, ..p.clone() }).as_deref(), Some("params.top_k"));
    assert_eq!(plan_err(MoeRouterParams { top_k: 0, ..p.clone() }).as_deref(), Some("params.top_k"));
    assert_eq!(plan_err(MoeRouterParams { experts: 0, ..p.clone() }).as_deref(), Some("params.experts"));
    assert_eq!(plan_err(MoeRouterParams { n_group: 4, ..p.clone() }).as_deref(), Some("params.n_group"));
    assert_eq!(plan_err(MoeRouterParams { n_group: 3, topk_group: 4, ..p.clone() }).as_deref(), Some("params.topk_group"));
    assert_eq!(plan_err(MoeRouterParams { n_group: 3, topk_group: 1, top_k: 3, ..p.clone() }).as_deref(), Some("params.top_k"));
    assert_eq!(
        plan_err(MoeRouterParams { routed_scaling_factor: f32::NAN, ..p.clone() }).as_deref(),
        Some("params.routed_scaling_factor")
    );

    let plan = MoeRouter::plan(b, &p).expect("plan");
    let t = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let (x, w) = (t(DType::BF16, &[2, 8]), t(DType::BF16, &[6, 8]));
    let (bias_f32, bias_bf16) = (t(DType::F32, &[6]), t(DType::BF16, &[6]));
    let run = |x: &DeviceTensor<B>, w: &DeviceTensor<B>, bias: &DeviceTensor<B>, id_dt: DType, wt_dt: DType| {
        let (mut ids, mut wts) = (t(id_dt, &[2, 2]), t(wt_dt, &[2, 2]));
        let args = MoeRouterArgs {
            x: x.as_ref(),
            weight: w.as_ref(),
            bias: Some(bias.as_ref()),
            topk_ids: ids.as_mut(),
            topk_weights: wts.as_mut(),
        };
        let mut ws = b.workspace(MoeRouter::workspace_size(b, &plan)).unwrap();
        MoeRouter::run(b, &plan, args, ws.as_mut(), b.default_stream()).err().and_then(|e| e.field().map(str::to_string))
    };
    assert_eq!(run(&x, &w, &bias_bf16, DType::I32, DType::F32).as_deref(), Some("bias"), "a bf16 bias must be rejected");
    assert_eq!(run(&t(DType::I32, &[2, 8]), &w, &bias_f32, DType::I32, DType::F32).as_deref(), Some("x"));
    assert_eq!(run(&x, &t(DType::BF16, &[6, 9]), &bias_f32, DType::I32, DType::F32).as_deref(), Some("weight"));
    assert_eq!(run(&x, &w, &t(DType::F32, &[5]), DType::I32, DType::F32).as_deref(), Some("bias"));
    assert_eq!(run(&x, &w, &bias_f32, DType::I64, DType::F32).as_deref(), Some("topk_ids"));
    assert_eq!(run(&x, &w, &bias_f32, DType::I32, DType::BF16).as_deref(), Some("topk_weights"));
    assert_eq!(run(&x, &w, &bias_f32, DType::I32, DType::F32), None, "well-formed call must succeed");
    // A backend that stages the logits (GPU) refuses a call without its workspace.
    if MoeRouter::workspace_size(b, &plan) > 0 {
        let (mut ids, mut wts) = (t(DType::I32, &[2, 2]), t(DType::F32, &[2, 2]));
        let args = MoeRouterArgs { x: x.as_ref(), weight: w.as_ref(), bias: None, topk_ids: ids.as_mut(), topk_weights: wts.as_mut() };
        let e = MoeRouter::run(b, &plan, args, None, b.default_stream()).expect_err("no workspace");
        assert_eq!(e.field(), Some("workspace"), "{e}");
    }
}

