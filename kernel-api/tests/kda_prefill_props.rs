//! Properties of KDA prefill planning and argument checks: malformed descriptors give `Err`,
//! never a panic; valid plans give a chunk schedule that tiles each sequence and lands on every
//! checkpoint; the CPU backend rejects device metadata that differs from the planned host copy.

use kernel_api::conformance::upload_f32;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::{
    KdaCheckpointOffsets, KdaGateMode, KdaPrefill, KdaPrefillArgs, KdaPrefillBatch, KdaPrefillParams, KdaPrefillPlan,
    KdaStateLayout,
};
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor, Layout};
use proptest::prelude::*;

fn gate() -> impl Strategy<Value = KdaGateMode> {
    prop_oneof![
        Just(KdaGateMode::Softplus),
        Just(KdaGateMode::Precomputed),
        prop_oneof![Just(-5.0f32), Just(0.0), Just(1.0), Just(f32::NAN), Just(f32::NEG_INFINITY), -10.0f32..1.0]
            .prop_map(|lower_bound| KdaGateMode::LowerBound { lower_bound }),
    ]
}

fn params() -> impl Strategy<Value = KdaPrefillParams> {
    (
        (0usize..5, 0usize..40, 0usize..40, 0usize..8, gate()),
        (any::<bool>(), any::<bool>(), prop_oneof![Just(0.25f32), Just(f32::NAN), Just(f32::INFINITY)]),
        (prop_oneof![Just(0usize), Just(8), Just(16), Just(24), Just(32), Just(64), Just(128), Just(usize::MAX)], any::<bool>()),
        (prop_oneof![0usize..8, Just(usize::MAX)], any::<bool>(), any::<bool>()),
    )
        .prop_map(|((heads, k_dim, v_dim, a_log_len, gate), (beta_sigmoid, l2, q_scale), (chunk, vmajor), (slots, r, w))| {
            KdaPrefillParams {
                heads,
                k_dim,
                v_dim,
                a_log_len,
                gate,
                beta_sigmoid,
                use_qk_l2norm: l2,
                q_scale,
                chunk_size: chunk,
                state_layout: if vmajor { KdaStateLayout::VMajor } else { KdaStateLayout::KMajor },
                state_slots: slots,
                read_initial_state: r,
                write_final_state: w,
            }
        })
}

fn small_i64() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -2i64..40, 1 => Just(i64::MAX), 1 => Just(i64::MIN)]
}

/// A valid one: 3 sequences, pool of 4 slots, 2 checkpoints per sequence.
fn valid() -> (KdaPrefillParams, Vec<i64>, Vec<i64>, Vec<i64>) {
    let p = KdaPrefillParams {
        state_slots: 4,
        read_initial_state: true,
        write_final_state: true,
        a_log_len: 4,
        chunk_size: 16,
        ..KdaPrefillParams::k3_defaults(2, 8, 8)
    };
    (p, vec![0, 5, 5, 21], vec![3, 0, 1], vec![2, 5, -1, -1, 16, -1])
}

fn plan_of(p: &KdaPrefillParams, cu: &[i64], idx: Option<&[i64]>, ck: Option<(usize, &[i64])>) -> kernel_api::Result<KdaPrefillPlan> {
    let batch = KdaPrefillBatch {
        cu_seqlens: cu,
        state_indices: idx,
        checkpoints: ck.map(|(per_seq, offsets)| KdaCheckpointOffsets { per_seq, offsets }),
    };
    KdaPrefillPlan::new(p, &batch)
}

proptest! {
    /// Arbitrary descriptors: `plan` returns, and a plan it accepts has a consistent schedule.
    #[test]
    fn random_descriptors_never_panic(
        p in params(),
        cu in proptest::collection::vec(small_i64(), 0..6),
        idx in proptest::option::of(proptest::collection::vec(small_i64(), 0..6)),
        ck in proptest::option::of((0usize..4, proptest::collection::vec(small_i64(), 0..16))),
    ) {
        let res = plan_of(&p, &cu, idx.as_deref(), ck.as_ref().map(|(c, o)| (*c, o.as_slice())));
        if let Ok(plan) = res {
            for n in 0..plan.num_seqs {
                let len = plan.seq_range(n).len();
                let chunks = plan.chunks(n);
                let mut at = 0;
                for c in &chunks {
                    prop_assert_eq!(c.start, at);
                    prop_assert!(c.end > c.start && c.len() <= p.chunk_size);
                    at = c.end;
                }
                prop_assert_eq!(at, len);
                for (_, off) in plan.checkpoints(n) {
                    prop_assert!(chunks.iter().any(|c| c.end == off), "checkpoint {} is not a chunk end", off);
                }
                if p.uses_state_pool() {
                    prop_assert!(plan.slot(n) < p.state_slots);
                }
            }
        }
    }

    /// One defect injected into a valid descriptor is always an `InvalidInput` error.
    #[test]
    fn one_defect_is_an_error(defect in 0usize..14, pos in 0usize..6, val in -3i64..30) {
        let (mut p, mut cu, mut idx, mut ck) = valid();
        let mut per_seq = 2;
        match defect {
            0 => cu[0] = 1 + val.abs(),
            1 => { let i = 1 + pos % 3; cu[i] = cu[i - 1] - 1 - val.abs(); }
            2 => cu.clear(),
            3 => idx[pos % 3] = 4 + val.abs(),
            4 => idx[pos % 3] = -1 - val.abs(),
            5 => { let i = pos % 3; idx[(i + 1) % 3] = idx[i]; }
            6 => idx.push(2),
            7 => ck[pos] = if val == -1 { -2 } else { 22 + val.abs() },
            8 => ck[0] = 0,
            9 => { ck[0] = 5; ck[1] = 5 - val.rem_euclid(5); }
            10 => ck.pop().map(|_| ()).unwrap_or(()),
            11 => per_seq = 0,
            12 => p.chunk_size = [0, 8, 24, 48, 128][pos % 5],
            _ => p.a_log_len = pos % 2,
        }
        let res = plan_of(&p, &cu, Some(&idx), Some((per_seq, &ck)));
        let err = res.err();
        prop_assert!(err.as_ref().and_then(|e| e.field()).is_some(), "defect {} accepted or untyped: {:?}", defect, err);
    }
}

/// Small CPU tensors for the valid descriptor (f32, K-major).
struct Tensors {
    q: DeviceTensor<CpuBackend>,
    v: DeviceTensor<CpuBackend>,
    beta: DeviceTensor<CpuBackend>,
    a_log: DeviceTensor<CpuBackend>,
    dt_bias: DeviceTensor<CpuBackend>,
    cu: DeviceTensor<CpuBackend>,
    idx: DeviceTensor<CpuBackend>,
    pool: DeviceTensor<CpuBackend>,
    ck_off: DeviceTensor<CpuBackend>,
    ck_state: DeviceTensor<CpuBackend>,
    out: DeviceTensor<CpuBackend>,
}

fn tensors(b: &CpuBackend, cu: &[i64], idx: &[i64], ck: &[i64]) -> Tensors {
    let t = 21;
    let vals = |n: usize| (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) / 7.0).collect::<Vec<_>>();
    let i64s = |shape: &[usize], v: &[i64]| b.upload_tensor(&HostTensor::from_i64(shape, v).unwrap()).unwrap();
    Tensors {
        q: upload_f32(b, DType::F32, &[t, 2, 8], &vals(t * 16)).unwrap(),
        v: upload_f32(b, DType::F32, &[t, 2, 8], &vals(t * 16)).unwrap(),
        beta: upload_f32(b, DType::F32, &[t, 2], &vals(t * 2)).unwrap(),
        a_log: b.zeros(DType::F32, &[4]).unwrap(),
        dt_bias: b.zeros(DType::F32, &[16]).unwrap(),
        cu: i64s(&[cu.len()], cu),
        idx: i64s(&[idx.len()], idx),
        pool: upload_f32(b, DType::F32, &[4, 2, 8, 8], &vals(4 * 128)).unwrap(),
        ck_off: i64s(&[3, 2], ck),
        ck_state: b.zeros(DType::F32, &[3, 2, 2, 8, 8]).unwrap(),
        out: b.zeros(DType::F32, &[t, 2, 8]).unwrap(),
    }
}

fn run_with(b: &CpuBackend, plan: &KdaPrefillPlan, x: &mut Tensors) -> kernel_api::Result<()> {
    let args = KdaPrefillArgs {
        q: x.q.as_ref(),
        k: x.q.as_ref(),
        v: x.v.as_ref(),
        g_raw: x.q.as_ref(),
        beta: x.beta.as_ref(),
        a_log: Some(x.a_log.as_ref()),
        dt_bias: Some(x.dt_bias.as_ref()),
        cu_seqlens: x.cu.as_ref(),
        state_indices: Some(x.idx.as_ref()),
        state: Some(x.pool.as_mut()),
        checkpoint_offsets: Some(x.ck_off.as_ref()),
        checkpoint_state: Some(x.ck_state.as_mut()),
        out: x.out.as_mut(),
    };
    let mut ws = b.alloc_zeroed(KdaPrefill::workspace_size(b, plan))?;
    KdaPrefill::run(b, plan, args, Some(&mut ws), b.default_stream())
}

/// The CPU backend reads the device metadata and rejects contents that differ from the plan.
#[test]
fn cpu_rejects_device_metadata_unlike_the_plan() {
    let b = CpuBackend::new();
    let (p, cu, idx, ck) = valid();
    let plan = plan_of(&p, &cu, Some(&idx), Some((2, &ck))).unwrap();
    assert!(run_with(&b, &plan, &mut tensors(&b, &cu, &idx, &ck)).is_ok());
    let field = |cu: &[i64], idx: &[i64], ck: &[i64]| {
        run_with(&b, &plan, &mut tensors(&b, cu, idx, ck)).unwrap_err().field().map(str::to_string)
    };
    assert_eq!(field(&[0, 4, 5, 21], &idx, &ck).as_deref(), Some("cu_seqlens"));
    assert_eq!(field(&cu, &[3, 2, 1], &ck).as_deref(), Some("state_indices"));
    assert_eq!(field(&cu, &idx, &[2, 4, -1, -1, 16, -1]).as_deref(), Some("checkpoint_offsets"));
}

proptest! {
    /// Random layouts (shape, strides, offset) on one tensor: the CPU run errors or succeeds,
    /// never panics, and a wrong shape is always rejected.
    #[test]
    fn random_layouts_never_panic(
        which in 0usize..6,
        shape in proptest::collection::vec(0usize..25, 0..5),
        strides in proptest::collection::vec(prop_oneof![0usize..300, Just(usize::MAX / 2)], 0..5),
        offset in prop_oneof![0usize..64, Just(usize::MAX / 4)],
    ) {
        let b = CpuBackend::new();
        let (p, cu, idx, ck) = valid();
        let plan = plan_of(&p, &cu, Some(&idx), Some((2, &ck))).unwrap();
        let mut x = tensors(&b, &cu, &idx, &ck);
        let layout = |d: DType| Layout { dtype: d, shape: shape.clone(), strides: strides.clone(), offset };
        let target: &mut DeviceTensor<CpuBackend> = match which {
            0 => &mut x.q,
            1 => &mut x.beta,
            2 => &mut x.pool,
            3 => &mut x.ck_state,
            4 => &mut x.cu,
            _ => &mut x.out,
        };
        let original = target.layout.clone();
        target.layout = layout(original.dtype);
        let res = run_with(&b, &plan, &mut x);
        if shape != original.shape {
            prop_assert!(res.is_err(), "tensor {} accepted shape {:?}", which, shape);
        }
    }
}
