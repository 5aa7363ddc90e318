//! Bad device metadata for the MoE ops: top-k ids and expert maps of the align, and the align
//! outputs (expert ids, sorted token ids, padded count) the grouped GEMM reads.

use super::{assert_rejected, cases, outside, run_synced, upload_i32, Tally};
use crate::backend::{Backend, BackendExt};
use crate::conformance::{upload_f32, TestRng};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{MoeAlign, MoeAlignArgs, MoeAlignParams, MoeGemmArgs, MoeGemmParams, MoeGemmStage, MoeGroupedGemm, MoeRouting, MoeWeightFormat};

// ---- align -------------------------------------------------------------------------------------

/// Plans an align of `routing` (ids are device data only: the plan takes none) and runs it with
/// these top-k ids and expert map.
fn align_with<B: Backend + MoeAlign>(b: &B, routing: &MoeRouting, global: Option<usize>, ids: &[i32], map: Option<&[i32]>) -> Result<()> {
    let p = MoeAlignParams { routing: routing.clone(), global_experts: global };
    let plan = MoeAlign::plan(b, &p).expect("plan");
    let ids_t = upload_i32(b, &[routing.tokens, routing.top_k], ids);
    let map_t = map.map(|m| upload_i32(b, &[m.len()], m));
    let mut sorted = b.zeros(DType::I32, &[plan.max_padded]).expect("sorted");
    let mut eids = b.zeros(DType::I32, &[plan.num_blocks]).expect("expert ids");
    let mut used = b.zeros(DType::I32, &[1]).expect("count");
    let mut ws = b.workspace(MoeAlign::workspace_size(b, &plan)).expect("workspace");
    run_synced(b, || {
        let args = MoeAlignArgs {
            topk_ids: ids_t.as_ref(),
            expert_map: map_t.as_ref().map(|t| t.as_ref()),
            sorted_token_ids: sorted.as_mut(),
            expert_ids: eids.as_mut(),
            num_tokens_post_padded: used.as_mut(),
        };
        MoeAlign::run(b, &plan, args, ws.as_mut(), b.default_stream())
    })
}

/// The hostile run's ids with 16 experts: 16, -1 and 2^31 - 1 (each pair used to be dropped
/// silently), and an expert-map entry outside -1..local.
pub fn moe_align_device_topk_ids_out_of_range<B: Backend + MoeAlign>(b: &B) {
    let r = MoeRouting { tokens: 2, top_k: 2, experts: 16, block_m: 4 };
    for bad in [16, -1, i32::MAX, i32::MIN] {
        assert_rejected(align_with(b, &r, None, &[0, 3, bad, 7], None), "topk_ids", format!("topk id {bad}"));
    }
    let local = MoeRouting { experts: 4, ..r.clone() };
    let map: Vec<i32> = (0..16).map(|e| if e % 4 == 0 { e / 4 } else { -1 }).collect();
    assert_rejected(align_with(b, &local, Some(16), &[0, 4, 16, 8], Some(&map)), "topk_ids", "global id 16 of 16");
    for bad in [4, -2, i32::MAX] {
        let mut m = map.clone();
        m[8] = bad;
        assert_rejected(align_with(b, &local, Some(16), &[0, 4, 8, 12], Some(&m)), "expert_map", format!("map entry {bad}"));
    }
    align_with(b, &local, Some(16), &[0, 4, 8, 1], Some(&map)).expect("valid ids after the rejected ones");
}

/// Random routings with one top-k id or one used expert-map entry out of range.
pub fn moe_align_generated_bad_ids<B: Backend + MoeAlign>(b: &B) {
    let mut rng = TestRng::new(0x30E1);
    let mut tally = Tally::new(b, "moe_align topk_ids / expert_map");
    for case in 0..cases(1700) {
        let r = MoeRouting { tokens: 1 + rng.below(8), top_k: 1 + rng.below(3), experts: 1 + rng.below(8), block_m: [1, 4, 16][rng.below(3)] };
        let pairs = r.tokens * r.top_k;
        let global = (rng.below(2) == 0).then(|| r.experts + rng.below(8));
        let bound = global.unwrap_or(r.experts);
        let mut ids: Vec<i32> = (0..pairs).map(|_| rng.below(bound) as i32).collect();
        let mut map: Option<Vec<i32>> = global.map(|g| (0..g).map(|_| rng.below(r.experts + 1) as i32 - 1).collect());
        let field = match &mut map {
            Some(m) if rng.below(2) == 0 => {
                let id = ids[rng.below(pairs)] as usize;
                m[id] = outside(&mut rng, -1, r.experts as i64, false) as i32;
                "expert_map"
            }
            _ => {
                ids[rng.below(pairs)] = outside(&mut rng, 0, bound as i64, false) as i32;
                "topk_ids"
            }
        };
        let res = align_with(b, &r, global, &ids, map.as_deref());
        assert_rejected(res, field, format!("case {case}: {r:?} global {global:?} ids {ids:?} map {map:?}"));
        tally.cases += 1;
    }
}

// ---- grouped GEMM ------------------------------------------------------------------------------

/// The align outputs of `ids` (local experts), as the contract defines them: pairs sorted by
/// expert (stable), each run padded to block_m with the sentinel, -1 for unused blocks.
fn host_align(r: &MoeRouting, ids: &[i32]) -> (Vec<i32>, Vec<i32>, i32) {
    let max_padded = r.max_padded().expect("small routing");
    let pairs = ids.len() as i32;
    let mut sorted = vec![pairs; max_padded];
    let mut eids = vec![-1i32; max_padded / r.block_m];
    let mut pos = 0;
    for e in 0..r.experts as i32 {
        let run: Vec<i32> = (0..pairs).filter(|&p| ids[p as usize] == e).collect();
        sorted[pos..pos + run.len()].copy_from_slice(&run);
        let padded = run.len().div_ceil(r.block_m) * r.block_m;
        eids[pos / r.block_m..(pos + padded) / r.block_m].fill(e);
        pos += padded;
    }
    (sorted, eids, pos as i32)
}

/// Runs a grouped GEMM stage over device align outputs (k = 32, n = 8, dense weights): `dt` the
/// input's dtype (and the gate-up output's), `w_dt` the weights' (f32 input with bf16 weights
/// takes the f32-input MMA form at block_m <= 16).
#[allow(clippy::too_many_arguments)]
fn gemm_with<B: Backend + MoeGroupedGemm>(b: &B, r: &MoeRouting, down: bool, dt: DType, w_dt: DType, sorted: &[i32], eids: &[i32], used: i32) -> Result<()> {
    let (k, n) = (32, 8);
    let stage = if down { MoeGemmStage::Down } else { MoeGemmStage::GateUp { beta: 4.0, linear_beta: Some(25.0) } };
    let p = MoeGemmParams { routing: r.clone(), k, n, stage, weights: MoeWeightFormat::Dense, activation_quant: None };
    let plan = MoeGroupedGemm::plan(b, &p).expect("plan");
    let pairs = r.tokens * r.top_k;
    let rows = if down { n } else { 2 * n };
    let in_rows = if down { pairs } else { r.tokens };
    let input = upload_f32(b, dt, &[in_rows, k], &vec![0.5; in_rows * k]).expect("input");
    let weight = upload_f32(b, w_dt, &[r.experts, rows, k], &vec![0.25; r.experts * rows * k]).expect("weight");
    let (sorted_t, eids_t, used_t) = (upload_i32(b, &[sorted.len()], sorted), upload_i32(b, &[eids.len()], eids), upload_i32(b, &[1], &[used]));
    let tw = down.then(|| upload_f32(b, DType::F32, &[r.tokens, r.top_k], &vec![0.5; pairs]).expect("topk weights"));
    let mut out = b.zeros(if down { DType::F32 } else { dt }, &[pairs, n]).expect("out");
    let mut ws = b.workspace(MoeGroupedGemm::workspace_size(b, &plan)).expect("workspace");
    run_synced(b, || {
        let args = MoeGemmArgs {
            input: input.as_ref(),
            weight: weight.as_ref(),
            weight_scale: None,
            sorted_token_ids: sorted_t.as_ref(),
            expert_ids: eids_t.as_ref(),
            num_tokens_post_padded: used_t.as_ref(),
            topk_weights: tw.as_ref().map(|t| t.as_ref()),
            out: out.as_mut(),
        };
        MoeGroupedGemm::run(b, &plan, args, ws.as_mut(), b.default_stream())
    })
}

/// The hostile run's align outputs: an expert id past the experts, sorted token ids 10^6 and -5,
/// and num_tokens_post_padded -4 (each used to leave rows silently zero).
pub fn moe_gemm_device_align_outputs_out_of_range<B: Backend + MoeGroupedGemm>(b: &B) {
    let r = MoeRouting { tokens: 3, top_k: 2, experts: 4, block_m: 4 };
    let ids = [0, 1, 1, 2, 3, 0];
    let (sorted, eids, used) = host_align(&r, &ids);
    for (down, dt, w_dt) in [(false, DType::BF16, DType::BF16), (true, DType::F32, DType::F32), (true, DType::F32, DType::BF16), (false, DType::F32, DType::BF16)] {
        let case = |what: &str| format!("{} {dt} x {w_dt}: {what}", if down { "down" } else { "gate/up" });
        for bad in [4, -2, i32::MAX] {
            let mut e = eids.clone();
            e[0] = bad;
            assert_rejected(gemm_with(b, &r, down, dt, w_dt, &sorted, &e, used), "expert_ids", case(&format!("expert id {bad}")));
        }
        for bad in [1_000_000, -5, 7] {
            let mut s = sorted.clone();
            s[1] = bad;
            assert_rejected(gemm_with(b, &r, down, dt, w_dt, &s, &eids, used), "sorted_token_ids", case(&format!("sorted id {bad}")));
        }
        for bad in [-4, used + 1, sorted.len() as i32 + 4] {
            assert_rejected(gemm_with(b, &r, down, dt, w_dt, &sorted, &eids, bad), "num_tokens_post_padded", case(&format!("count {bad}")));
        }
        gemm_with(b, &r, down, dt, w_dt, &sorted, &eids, used).expect("valid align outputs after the rejected ones");
    }
}

/// Random routings whose align outputs get one used expert id, one real sorted entry or the
/// padded count corrupted.
pub fn moe_gemm_generated_bad_align_outputs<B: Backend + MoeGroupedGemm>(b: &B) {
    let mut rng = TestRng::new(0x30E2);
    let mut tally = Tally::new(b, "moe_grouped_gemm expert_ids / sorted_token_ids / num_tokens_post_padded");
    for case in 0..cases(1700) {
        let r = MoeRouting { tokens: 1 + rng.below(6), top_k: 1 + rng.below(3), experts: 1 + rng.below(5), block_m: [1, 4, 16][rng.below(3)] };
        let pairs = r.tokens * r.top_k;
        let ids: Vec<i32> = (0..pairs).map(|_| rng.below(r.experts) as i32).collect();
        let (mut sorted, mut eids, mut used) = host_align(&r, &ids);
        let max_padded = sorted.len() as i64;
        let field = match rng.below(3) {
            0 => {
                eids[rng.below(used as usize / r.block_m)] = outside(&mut rng, -1, r.experts as i64, false) as i32;
                "expert_ids"
            }
            1 => {
                let real: Vec<usize> = (0..sorted.len()).filter(|&i| sorted[i] < pairs as i32).collect();
                sorted[real[rng.below(real.len())]] = outside(&mut rng, 0, pairs as i64 + 1, false) as i32;
                "sorted_token_ids"
            }
            _ => {
                used = if r.block_m > 1 && rng.below(2) == 0 {
                    (used + 1 + rng.below(r.block_m - 1) as i32).min(max_padded as i32 - 1).max(1) // not a multiple
                } else {
                    outside(&mut rng, 0, max_padded + 1, false) as i32
                };
                if used >= 0 && used as i64 <= max_padded && used % r.block_m as i32 == 0 {
                    continue; // the clamp landed on a valid count
                }
                "num_tokens_post_padded"
            }
        };
        let (down, dt, w_dt) = [
            (false, DType::BF16, DType::BF16),
            (true, DType::F32, DType::F32),
            (false, DType::F32, DType::F32),
            (true, DType::BF16, DType::BF16),
            (false, DType::F32, DType::BF16),
            (true, DType::F32, DType::BF16),
        ][rng.below(6)];
        let res = gemm_with(b, &r, down, dt, w_dt, &sorted, &eids, used);
        assert_rejected(res, field, format!("case {case}: {r:?} down {down} {dt} x {w_dt}: sorted {sorted:?} expert ids {eids:?} count {used}"));
        tally.cases += 1;
    }
}
