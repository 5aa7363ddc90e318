//! Bad device ids for [`EmbeddingGather`]: planned ids are valid, the device copy is not.

use super::{assert_rejected, cases, outside, run_synced, upload_index, Tally};
use crate::backend::{Backend, BackendExt};
use crate::conformance::{upload_f32, TestRng};
use crate::dtype::DType;
use crate::ops::{EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams};

/// Plans a gather of valid ids and runs it with `device_ids` instead.
fn gather_with<B: Backend + EmbeddingGather>(b: &B, p: &EmbeddingGatherParams, device_ids: &[i64], wide: bool) -> crate::Result<()> {
    let host_ids: Vec<i64> = (0..p.m).map(|i| (i % p.vocab) as i64).collect();
    let plan = EmbeddingGather::plan(b, p, &host_ids).expect("plan of valid ids");
    let table = upload_f32(b, DType::F32, &[p.vocab, p.d], &vec![1.0; p.vocab * p.d]).expect("table");
    let ids = upload_index(b, &[p.m], device_ids, wide);
    let mut out = b.zeros(DType::F32, &[p.m, p.d]).expect("out");
    run_synced(b, || {
        let args = EmbeddingGatherArgs { table: table.as_ref(), ids: ids.as_ref(), out: out.as_mut() };
        EmbeddingGather::run(b, &plan, args, None, b.default_stream())
    })
}

/// Ids one past the table, negative, and the dtype's extremes, in i32 and i64 tensors.
pub fn embedding_device_ids_out_of_range<B: Backend + EmbeddingGather>(b: &B) {
    let p = EmbeddingGatherParams { vocab: 10, d: 4, m: 3 };
    for (ids, wide) in [
        (vec![0, 10, 1], false),
        (vec![-1, 2, 3], false),
        (vec![0, 0, i32::MAX as i64], false),
        (vec![i32::MIN as i64, 0, 0], false),
        (vec![0, 100_000, 0], true),
        (vec![i64::MIN, 0, 0], true),
        (vec![0, 0, i64::MAX], true),
    ] {
        assert_rejected(gather_with(b, &p, &ids, wide), "ids", format!("device ids {ids:?}"));
    }
    // The backend is usable afterwards: a valid gather succeeds.
    assert!(gather_with(b, &p, &[9, 0, 5], false).is_ok());
}

/// Random batches with random entries replaced by bad ids.
pub fn embedding_generated_bad_ids<B: Backend + EmbeddingGather>(b: &B) {
    let mut rng = TestRng::new(0xE3B);
    let mut tally = Tally::new(b, "embedding_gather ids");
    for case in 0..cases(3500) {
        let p = EmbeddingGatherParams { vocab: 1 + rng.below(40), d: 1 + rng.below(8), m: 1 + rng.below(12) };
        let wide = rng.below(2) == 1;
        let mut ids: Vec<i64> = (0..p.m).map(|_| rng.below(p.vocab) as i64).collect();
        for _ in 0..1 + rng.below(p.m) {
            let at = rng.below(p.m);
            ids[at] = outside(&mut rng, 0, p.vocab as i64, wide);
        }
        assert_rejected(gather_with(b, &p, &ids, wide), "ids", format!("case {case}: {p:?}, device ids {ids:?}"));
        tally.cases += 1;
    }
}
