//! Conformance tests of [`crate::ops::MoeAlign`].

use super::TestRng;
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{MoeAlign, MoeAlignArgs, MoeAlignParams, MoeRouting};
use crate::tensor::HostTensor;


pub(super) fn upload_i32<B: Backend>(b: &B, shape: &[usize], v: &[i32]) -> DeviceTensor<B> {
    b.upload_tensor(&HostTensor::from_i32(shape, v).expect("i32 tensor")).expect("upload")
}

pub(super) fn download_i32<B: Backend>(b: &B, t: &DeviceTensor<B>) -> Vec<i32> {
    b.download_tensor(t).expect("download").to_i64().into_iter().map(|v| v as i32).collect()
}

/// The three outputs of an align call.
pub(super) struct Aligned<B: Backend> {
    pub sorted_token_ids: DeviceTensor<B>,
    pub expert_ids: DeviceTensor<B>,
    pub num_tokens_post_padded: DeviceTensor<B>,
}

/// Runs the backend's align op on host ids (and an optional expert map).
pub(super) fn align_on<B: Backend + MoeAlign>(
    b: &B,
    routing: &MoeRouting,
    topk_ids: &[i32],
    expert_map: Option<&[i32]>,
) -> Result<Aligned<B>> {
    let params = MoeAlignParams { routing: routing.clone(), global_experts: expert_map.map(<[i32]>::len) };
    let plan = MoeAlign::plan(b, &params)?;
    let ids = upload_i32(b, &[routing.tokens, routing.top_k], topk_ids);
    let map = expert_map.map(|m| upload_i32(b, &[m.len()], m));
    let mut out = Aligned {
        sorted_token_ids: b.zeros(DType::I32, &[plan.max_padded])?,
        expert_ids: b.zeros(DType::I32, &[plan.num_blocks])?,
        num_tokens_post_padded: b.zeros(DType::I32, &[1])?,
    };
    let mut ws = b.alloc_zeroed(MoeAlign::workspace_size(b, &plan))?;
    let args = MoeAlignArgs {
        topk_ids: ids.as_ref(),
        expert_map: map.as_ref().map(DeviceTensor::as_ref),
        sorted_token_ids: out.sorted_token_ids.as_mut(),
        expert_ids: out.expert_ids.as_mut(),
        num_tokens_post_padded: out.num_tokens_post_padded.as_mut(),
    };
    MoeAlign::run(b, &plan, args, Some(&mut ws), b.default_stream())?;
    Ok(out)
}

/// Naive oracle: for each local expert in order, scan all pairs; pad runs; then the pairs no
/// local expert serves, in ascending order; fill the tail.
fn naive_align(r: &MoeRouting, ids: &[i32], map: Option<&[i32]>) -> (Vec<i32>, Vec<i32>, i32) {
    let pairs = r.tokens * r.top_k;
    let local_of = |id: i32| match map {
        Some(m) => m[id as usize],
        None => id,
    };
    let mut sorted = Vec::new();
    let mut blocks = Vec::new();
    for e in 0..r.experts as i32 {
        for (p, &id) in ids.iter().enumerate() {
            if local_of(id) == e {
                sorted.push(p as i32);
            }
        }
        while sorted.len() % r.block_m != 0 {
            sorted.push(pairs as i32);
        }
        blocks.resize(sorted.len() / r.block_m, e);
    }
    let used = sorted.len() as i32;
    sorted.extend((0..pairs as i32).filter(|&p| local_of(ids[p as usize]) == -1));
    let max_padded = (pairs + r.experts * (r.block_m - 1)).div_ceil(r.block_m) * r.block_m;
    sorted.resize(max_padded, pairs as i32);
    blocks.resize(max_padded / r.block_m, -1);
    (sorted, blocks, used)
}

fn check_against_naive<B: Backend + MoeAlign>(b: &B, r: &MoeRouting, ids: &[i32], map: Option<&[i32]>, what: &str) {
    let out = align_on(b, r, ids, map).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (sorted, blocks, used) = naive_align(r, ids, map);
    assert_eq!(download_i32(b, &out.sorted_token_ids), sorted, "{what}: sorted_token_ids");
    assert_eq!(download_i32(b, &out.expert_ids), blocks, "{what}: expert_ids");
    assert_eq!(download_i32(b, &out.num_tokens_post_padded), vec![used], "{what}: num_tokens_post_padded");
}

/// Random routings (distinct experts per token, repeated experts, experts with no tokens, every
/// pair on one expert, zero tokens) sort exactly like a naive scan, sentinels and all.
pub fn moe_align_matches_naive_sort<B: Backend + MoeAlign>(b: &B) {
    let mut rng = TestRng::new(31);
    for &(tokens, top_k, experts, block_m) in
        &[(0, 2, 4, 4), (1, 1, 1, 1), (5, 2, 3, 1), (7, 4, 8, 4), (17, 3, 16, 16), (33, 8, 12, 5), (4, 2, 64, 8)]
    {
        let r = MoeRouting { tokens, top_k, experts, block_m };
        // Distinct experts per token (what a router emits).
        let distinct: Vec<i32> = (0..tokens)
            .flat_map(|_| rng.permutation(experts).into_iter().take(top_k).map(|e| e as i32).collect::<Vec<_>>())
            .collect();
        if top_k <= experts {
            check_against_naive(b, &r, &distinct, None, &format!("distinct {r:?}"));
        }
        // Only the first few experts used: the others have empty runs.
        let few: Vec<i32> = (0..tokens * top_k).map(|_| rng.below(experts.min(3)) as i32).collect();
        check_against_naive(b, &r, &few, None, &format!("few experts {r:?}"));
        // Every pair on the last expert.
        let one = vec![experts as i32 - 1; tokens * top_k];
        check_against_naive(b, &r, &one, None, &format!("one expert {r:?}"));
    }
    // The plan's worst case is roundup(P + E·(M-1), M).
    let plan = MoeAlign::plan(
        b,
        &MoeAlignParams { routing: MoeRouting { tokens: 10, top_k: 3, experts: 7, block_m: 4 }, global_experts: None },
    )
    .expect("plan");
    assert_eq!((plan.max_padded, plan.num_blocks), (52, 13));
}

/// With an expert map, pairs of experts not on this rank are served by no run: they are listed
/// once each right after the runs (so the GEMMs zero their rows), and runs follow local ids.
pub fn moe_align_expert_map_drops_pairs<B: Backend + MoeAlign>(b: &B) {
    let mut rng = TestRng::new(32);
    for &(tokens, top_k, global, local, block_m) in &[(6, 2, 12, 5, 4), (9, 4, 16, 3, 1), (0, 2, 8, 2, 8), (11, 3, 6, 6, 3)] {
        let r = MoeRouting { tokens, top_k, experts: local, block_m };
        // A random subset of `local` global experts gets a permuted local id; the rest are -1.
        let mut map = vec![-1i32; global];
        let owners = rng.permutation(global);
        for (l, &g) in rng.permutation(local).iter().zip(&owners) {
            map[g] = *l as i32;
        }
        let ids: Vec<i32> = (0..tokens)
            .flat_map(|_| rng.permutation(global).into_iter().take(top_k).map(|e| e as i32).collect::<Vec<_>>())
            .collect();
        check_against_naive(b, &r, &ids, Some(&map), &format!("expert map {r:?}"));
        let out = align_on(b, &r, &ids, Some(&map)).expect("align");
        let sorted = download_i32(b, &out.sorted_token_ids);
        let used = download_i32(b, &out.num_tokens_post_padded)[0] as usize;
        for (p, &id) in ids.iter().enumerate() {
            let at: Vec<usize> = (0..sorted.len()).filter(|&i| sorted[i] == p as i32).collect();
            assert_eq!(at.len(), 1, "pair {p} (expert {id}) listed once");
            assert_eq!(at[0] < used, map[id as usize] >= 0, "pair {p} (expert {id}) served iff mapped");
        }
    }
}

/// Malformed shapes, dtypes and params are typed errors naming the field.
pub fn moe_align_rejects_bad_shapes<B: Backend + MoeAlign>(b: &B) {
    let r = MoeRouting { tokens: 3, top_k: 2, experts: 4, block_m: 4 };
    let bad = |routing: MoeRouting| MoeAlign::plan(b, &MoeAlignParams { routing, global_experts: None }).unwrap_err();
    assert_eq!(bad(MoeRouting { block_m: 0, ..r.clone() }).field(), Some("params.routing.block_m"));
    assert_eq!(bad(MoeRouting { experts: 0, ..r.clone() }).field(), Some("params.routing.experts"));
    assert_eq!(bad(MoeRouting { tokens: usize::MAX / 2, ..r.clone() }).field(), Some("params.routing.tokens"));
    let plan = MoeAlign::plan(b, &MoeAlignParams { routing: r.clone(), global_experts: None }).expect("plan");
    let ids_i32 = upload_i32(b, &[3, 2], &[0, 1, 2, 3, 0, 1]);
    let ids_i64 = b.upload_tensor(&HostTensor::from_i64(&[3, 2], &[0, 1, 2, 3, 0, 1]).unwrap()).unwrap();
    let map = upload_i32(b, &[4], &[0, 1, 2, 3]);
    let mut sorted = b.zeros(DType::I32, &[plan.max_padded]).unwrap();
    let mut short = b.zeros(DType::I32, &[plan.max_padded - 1]).unwrap();
    let mut blocks = b.zeros(DType::I32, &[plan.num_blocks]).unwrap();
    let mut used = b.zeros(DType::I32, &[1]).unwrap();
    let mut used_i64 = b.zeros(DType::I64, &[1]).unwrap();
    let mut ws = b.alloc_zeroed(MoeAlign::workspace_size(b, &plan)).unwrap();
    let s = b.default_stream();
    let mut run = |ids: &DeviceTensor<B>,
                   map: Option<&DeviceTensor<B>>,
                   st: &mut DeviceTensor<B>,
                   u: &mut DeviceTensor<B>,
                   ws: Option<&mut B::Buffer>| {
        let args = MoeAlignArgs {
            topk_ids: ids.as_ref(),
            expert_map: map.map(DeviceTensor::as_ref),
            sorted_token_ids: st.as_mut(),
            expert_ids: blocks.as_mut(),
            num_tokens_post_padded: u.as_mut(),
        };
        MoeAlign::run(b, &plan, args, ws, s).err().and_then(|e| e.field().map(str::to_string))
    };
    assert_eq!(run(&ids_i64, None, &mut sorted, &mut used, Some(&mut ws)).as_deref(), Some("topk_ids"));
    assert_eq!(run(&ids_i32, Some(&map), &mut sorted, &mut used, Some(&mut ws)).as_deref(), Some("expert_map"));
    assert_eq!(run(&ids_i32, None, &mut short, &mut used, Some(&mut ws)).as_deref(), Some("sorted_token_ids"));
    assert_eq!(run(&ids_i32, None, &mut sorted, &mut used_i64, Some(&mut ws)).as_deref(), Some("num_tokens_post_padded"));
    if MoeAlign::workspace_size(b, &plan) > 0 {
        assert_eq!(run(&ids_i32, None, &mut sorted, &mut used, None).as_deref(), Some("workspace"));
    }
    assert_eq!(run(&ids_i32, None, &mut sorted, &mut used, Some(&mut ws)), None, "well-formed call must succeed");
}

