//! [`MlaDecode::prepare_schedule`] / [`MlaDecode::run_prepared`]: one schedule for every MLA
//! layer of a decode step, and no reuse of a stale one.

use super::oracle::{decode_oracle, PagedCase};
use super::{batch_of, decode, lens, params, Decode, FN};
use crate::backend::{Backend, BackendExt};
use crate::conformance::{download_f32, TestRng};
use crate::dtype::DType;
use crate::ops::kv_cache::{KvCacheFormat, KvDims};
use crate::ops::mla_decode::{MlaDecode, MlaDecodeVariant, MlaKernel, MlaSplitPolicy};
use crate::tensor::HostTensor;
use crate::tolerance::{assert_close, Tolerance};

/// Two layers (own caches and queries, the step's sequence lengths) run from one prepared
/// schedule give exactly what `run` (schedule rebuilt per call) gives, for asm plans that split
/// sequences and for Gluon plans (Tolerance::F32 against the f64 oracle besides). A schedule is
/// refused, as an InvalidInput naming `schedule`, for the next step's sequence lengths, for
/// another workspace and without one.
pub fn mla_decode_schedule_reuse<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41A5);
    let dims = KvDims { latent: 64, rope: 16 };
    let (heads, scale, stream) = (12, 0.2, b.default_stream());
    for &(variant, q_len, ps) in &[(MlaDecodeVariant::AsmStyle, 1, 64), (MlaDecodeVariant::AsmStyle, 2, 1), (MlaDecodeVariant::GluonStyle, 3, 64)] {
        let seq_lens = lens(&mut rng, 3, q_len, 200);
        let layers: Vec<PagedCase> =
            (0..2).map(|_| PagedCase::new(&mut rng, KvCacheFormat::Fp8Tiled(FN), dims, ps, &seq_lens, 2.0)).collect();
        let splits = if variant == MlaDecodeVariant::GluonStyle { MlaSplitPolicy::NumSplits(3) } else { MlaSplitPolicy::ComputeUnits(8) };
        let p = params(&layers[0], heads, q_len, scale, variant, splits);
        let plan = MlaDecode::plan(b, &p, &batch_of(&layers[0])).expect("plan");
        let what = format!("{:?} q_len {q_len} page {ps}", plan.kernel);
        if plan.kernel == MlaKernel::Asm {
            assert!(!plan.schedule.reduce.is_empty(), "{what}: the case must split sequences");
        }
        let need = MlaDecode::workspace_size(b, &plan);
        assert!(need > 0, "{what}: split plans need a workspace");
        let mut ws = b.alloc_zeroed(need).expect("workspace");
        let lens_t = b.upload_tensor(&HostTensor::from_i32(&[seq_lens.len()], &seq_lens).expect("lens")).expect("lens");
        let prepared = MlaDecode::prepare_schedule(b, &plan, &lens_t.as_ref(), Some(&mut ws), stream).expect("prepare_schedule");
        for (l, c) in layers.iter().enumerate() {
            let q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 1.0);
            let pl = params(c, heads, q_len, scale, variant, splits);
            let layer_plan = MlaDecode::plan(b, &pl, &batch_of(c)).expect("layer plan");
            let mut d = Decode::new(b, c, &pl, &q, DType::F32, DType::F32);
            MlaDecode::run_prepared(b, &layer_plan, &prepared, d.args(), Some(&mut ws), stream)
                .unwrap_or_else(|e| panic!("{what} layer {l}: run_prepared: {e}"));
            let (out, lse) = (download_f32(b, &d.out).expect("out"), download_f32(b, &d.lse).expect("lse"));
            let (fresh, fresh_lse, _) = decode(b, c, &pl, &q, DType::F32, DType::F32);
            assert_eq!(out, fresh, "{what} layer {l}: the reused schedule must give run's output exactly");
            assert_eq!(lse, fresh_lse, "{what} layer {l}: lse");
            let (want, want_lse) = decode_oracle(c, &q, q_len, heads, scale as f64);
            assert_close(&format!("{what} layer {l} vs oracle"), &out, &want, Tolerance::F32);
            assert_close(&format!("{what} layer {l} lse vs oracle"), &lse, &want_lse, Tolerance::F32);
        }
        // Refusals: the next step (one more token per sequence), another workspace, none.
        let next: Vec<i32> = seq_lens.iter().map(|&n| n + 1).collect();
        let c_next = PagedCase::new(&mut rng, KvCacheFormat::Fp8Tiled(FN), dims, ps, &next, 2.0);
        let p_next = params(&c_next, heads, q_len, scale, variant, splits);
        let plan_next = MlaDecode::plan(b, &p_next, &batch_of(&c_next)).expect("next plan");
        let q = rng.normals(next.len() * q_len * heads * dims.width(), 1.0);
        let mut d = Decode::new(b, &c_next, &p_next, &q, DType::F32, DType::F32);
        let mut ws_next = b.alloc_zeroed(MlaDecode::workspace_size(b, &plan_next).max(need)).expect("workspace");
        let e = MlaDecode::run_prepared(b, &plan_next, &prepared, d.args(), Some(&mut ws_next), stream)
            .expect_err("a schedule prepared for other sequence lengths must be refused");
        assert_eq!(e.field(), Some("schedule"), "{what}: {e}");
        let c = &layers[0];
        let q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 1.0);
        let mut d = Decode::new(b, c, &p, &q, DType::F32, DType::F32);
        let mut other = b.alloc_zeroed(need).expect("workspace");
        let e = MlaDecode::run_prepared(b, &plan, &prepared, d.args(), Some(&mut other), stream)
            .expect_err("a schedule must be refused in another workspace");
        assert_eq!(e.field(), Some("schedule"), "{what}: {e}");
        let e = MlaDecode::run_prepared(b, &plan, &prepared, d.args(), None, stream).expect_err("and without one");
        assert_eq!(e.field(), Some("schedule"), "{what}: {e}");
    }
}
