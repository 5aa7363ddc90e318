//! Properties of the KDA decode and causal conv1d plans and of their CPU reference: malformed
//! descriptors, layouts and device index contents give an `Err`, never a panic; CPU-only
//! identities of the decode.

use kernel_api::cpu::{CpuBackend, HostBuffer};
use kernel_api::ops::conv1d::validate_cu_seqlens;
use kernel_api::ops::{
    CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, CausalConv1dPlan, ConvActivation,
    HostIndices, KdaDecode, KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaDecodePlan, KdaGateMode, KdaOutputNorm,
    KdaStateLayout,
};
use kernel_api::{Backend, DType, HostTensor, Layout, TensorMut, TensorRef};
use proptest::prelude::*;

const DTYPES: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64];

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0usize..6, 1 => Just(usize::MAX / 3), 1 => any::<usize>()]
}

fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![3 => -8.0f32..8.0, 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => any::<f32>()]
}

fn gate() -> impl Strategy<Value = KdaGateMode> {
    prop_oneof![
        any_f32().prop_map(|lower_bound| KdaGateMode::LowerBound { lower_bound }),
        Just(KdaGateMode::Softplus),
        Just(KdaGateMode::Precomputed),
    ]
}

fn decode_params() -> impl Strategy<Value = KdaDecodeParams> {
    (
        (size(), size(), size(), size(), size(), size()),
        (any::<bool>(), gate(), any::<bool>(), any::<bool>(), proptest::option::of(any_f32())),
        proptest::option::of(any_f32()),
    )
        .prop_map(
            |((batch, heads, head_k, head_v, conv_width, state_slots), (vmajor, gate, bs, l2, scale), eps)| {
                KdaDecodeParams {
                    batch,
                    heads,
                    head_k,
                    head_v,
                    conv_width,
                    state_slots,
                    state_layout: if vmajor { KdaStateLayout::VMajor } else { KdaStateLayout::KMajor },
                    gate,
                    beta_sigmoid: bs,
                    qk_l2norm: l2,
                    scale,
                    output_norm: eps.map_or(KdaOutputNorm::None, |eps| KdaOutputNorm::GatedRmsNorm { eps }),
                }
            },
        )
}

/// A layout derived from `base` by two corruptions chosen by `kind` (dtype, one dim, one
/// stride, the offset, the rank), so that e.g. a huge dim over a zero stride occurs.
fn corrupt(base: &Layout, kind: u8, (a, b, c, d): (usize, usize, usize, usize), dt: usize) -> Layout {
    let once = |l: &mut Layout, kind: u8, a: usize, b: usize| match kind % 6 {
        0 => l.dtype = DTYPES[dt % DTYPES.len()],
        1 => {
            if !l.shape.is_empty() {
                let i = a % l.shape.len();
                l.shape[i] = if a.is_multiple_of(2) { b % 9 } else { b };
            }
        }
        2 => {
            if !l.strides.is_empty() {
                let i = a % l.strides.len();
                l.strides[i] = if b.is_multiple_of(2) { b % 3 } else { b };
            }
        }
        3 => l.offset = if b.is_multiple_of(2) { b % 4096 } else { b },
        4 => {
            l.shape.truncate(a % (l.shape.len() + 1));
            l.strides.truncate(b % (l.strides.len() + 1));
        }
        _ => {
            l.shape.push(a % 4);
            l.strides.push(b % 4);
        }
    };
    let mut l = base.clone();
    once(&mut l, kind, a, b);
    once(&mut l, kind / 6, c, d);
    l
}

fn r(t: &(HostBuffer, Layout)) -> TensorRef<'_, CpuBackend> {
    TensorRef::new(&t.0, t.1.clone())
}

fn host(dt: DType, shape: &[usize], fill: f32) -> (HostBuffer, Layout) {
    let n: usize = shape.iter().product();
    let t = HostTensor::from_f32(dt, shape, &vec![fill; n]).expect("host tensor");
    (HostBuffer(t.bytes.clone()), t.layout())
}

/// A small valid decode problem whose tensors can be corrupted one at a time.
struct DecodeFixture {
    p: KdaDecodeParams,
    idx: Vec<i32>,
    t: Vec<(HostBuffer, Layout)>,
}

const X: usize = 0;
const CONV_W: usize = 1;
const CONV: usize = 2;
const G: usize = 3;
const BETA: usize = 4;
const A_LOG: usize = 5;
const DT: usize = 6;
const IDX: usize = 7;
const STATE: usize = 8;
const GATE: usize = 9;
const NORM_W: usize = 10;
const OUT: usize = 11;

impl DecodeFixture {
    fn new(layout: KdaStateLayout, state_dt: DType) -> Self {
        let (h, k, v, w, bt, slots) = (2, 3, 4, 4, 2, 4);
        let d = h * (2 * k + v);
        let p = KdaDecodeParams {
            batch: bt,
            heads: h,
            head_k: k,
            head_v: v,
            conv_width: w,
            state_slots: slots,
            state_layout: layout,
            gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
            beta_sigmoid: true,
            qk_l2norm: true,
            scale: None,
            output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
        };
        let state_shape = match layout {
            KdaStateLayout::KMajor => [slots, h, k, v],
            KdaStateLayout::VMajor => [slots, h, v, k],
        };
        let idx_t = HostTensor::from_i32(&[bt], &[2, 1]).expect("indices");
        let t = vec![
            host(DType::BF16, &[bt, d], 0.5),
            host(DType::F32, &[d, w], 0.25),
            host(DType::BF16, &[slots, d, w - 1], 0.125),
            host(DType::F32, &[bt, h, k], 0.0),
            host(DType::F32, &[bt, h], 0.0),
            host(DType::F32, &[h], 0.0),
            host(DType::F32, &[h * k], 0.0),
            (HostBuffer(idx_t.bytes.clone()), idx_t.layout()),
            host(state_dt, &state_shape, 0.5),
            host(DType::BF16, &[bt, h, v], 1.0),
            host(DType::F32, &[v], 1.0),
            host(DType::F32, &[bt, h, v], 0.0),
        ];
        DecodeFixture { p, idx: vec![2, 1], t }
    }

    fn plan(&self) -> KdaDecodePlan {
        KdaDecode::plan(&CpuBackend::new(), &self.p, &KdaDecodeBatch { state_indices: &self.idx }).expect("valid plan")
    }

    fn run(&mut self, plan: &KdaDecodePlan) -> kernel_api::Result<()> {
        let cpu = CpuBackend::new();
        let [x, cw, conv, g, beta, a, dt, idx, state, gate, nw, out] = &mut self.t[..] else { unreachable!() };
        let args = KdaDecodeArgs {
            x_qkv: r(x),
            conv_weight: r(cw),
            conv_state: TensorMut::new(&mut conv.0, conv.1.clone()),
            g_raw: r(g),
            beta: r(beta),
            a_log: Some(r(a)),
            dt_bias: Some(r(dt)),
            state_indices: r(idx),
            recurrent_state: TensorMut::new(&mut state.0, state.1.clone()),
            output_gate: Some(r(gate)),
            norm_weight: Some(r(nw)),
            out: TensorMut::new(&mut out.0, out.1.clone()),
        };
        KdaDecode::run(&cpu, plan, args, None, cpu.default_stream())
    }
}

/// A_log may be longer than H: a huge declared length over a zero stride fits any buffer, and
/// must not make the reference decode (or allocate) more than the H entries it uses.
#[test]
fn decode_reads_only_h_entries_of_a_long_a_log() {
    let mut fx = DecodeFixture::new(KdaStateLayout::KMajor, DType::F32);
    let plan = fx.plan();
    fx.t[A_LOG].1 = Layout { dtype: DType::F32, shape: vec![usize::MAX / 8], strides: vec![0], offset: 0 };
    fx.run(&plan).expect("a long broadcast A_log is valid");
}

fn conv1d_plan(p: &CausalConv1dParams, cu: &[i64], idx: Option<&[i32]>) -> kernel_api::Result<CausalConv1dPlan> {
    CausalConv1dPlan::new(p, &CausalConv1dBatch { cu_seqlens: HostIndices::I64(cu), state_indices: idx })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any decode descriptor plans or errors; an accepted plan has in-range, distinct live slots.
    #[test]
    fn decode_plan_never_panics(p in decode_params(), idx in proptest::collection::vec(-3i32..10, 0..8)) {
        if let Ok(plan) = KdaDecodePlan::new(&p, &KdaDecodeBatch { state_indices: &idx }) {
            prop_assert_eq!(idx.len(), p.batch);
            let mut live: Vec<i32> = idx.iter().copied().filter(|&s| s != 0).collect();
            prop_assert!(live.iter().all(|&s| s > 0 && (s as usize) < p.state_slots));
            live.sort_unstable();
            live.dedup();
            prop_assert_eq!(live.len(), plan.active_rows);
            prop_assert!(p.heads >= 1 && p.head_k >= 1 && p.head_v >= 1 && p.conv_width >= 1);
        }
    }

    /// Any conv1d descriptor plans or errors; an accepted plan has valid offsets and slots.
    #[test]
    fn conv1d_plan_never_panics(
        dim in size(), width in size(), slots in size(), read in any::<bool>(), write in any::<bool>(),
        cu in proptest::collection::vec(prop_oneof![5 => -2i64..12, 1 => any::<i64>()], 0..6),
        idx in proptest::option::of(proptest::collection::vec(-2i32..8, 0..6)),
    ) {
        let p = CausalConv1dParams { dim, width, activation: ConvActivation::Silu, read_initial_state: read, write_final_state: write, state_slots: slots };
        if let Ok(plan) = conv1d_plan(&p, &cu, idx.as_deref()) {
            let (n, t, _) = validate_cu_seqlens(&cu, None, "cu").expect("accepted offsets are valid");
            prop_assert_eq!((n, t), (plan.num_seqs, plan.total_tokens));
            if let Some(ix) = &idx {
                prop_assert!(ix.iter().all(|&s| s >= 0 && (s as usize) < slots));
            }
        }
    }

    /// One corrupted tensor descriptor (dtype, shape, stride, offset, rank) makes the CPU decode
    /// return an error or run, never panic; the clean fixture always runs.
    #[test]
    fn decode_run_survives_corrupt_layouts(field in 0usize..12, kind in any::<u8>(), v in any::<(usize, usize, usize, usize)>(), dt in 0usize..5, vmajor in any::<bool>()) {
        let layout = if vmajor { KdaStateLayout::VMajor } else { KdaStateLayout::KMajor };
        let mut fx = DecodeFixture::new(layout, DType::F32);
        let plan = fx.plan();
        let clean = fx.t[field].1.clone();
        fx.t[field].1 = corrupt(&clean, kind, v, dt);
        let changed = fx.t[field].1 != clean;
        let r = fx.run(&plan);
        if !changed {
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }

    /// A hand-built plan (its fields are public) with arbitrary params is re-validated by
    /// `run`: an error or a run, never a panic.
    #[test]
    fn decode_run_survives_hand_built_plans(p in decode_params(), active_rows in size()) {
        let mut fx = DecodeFixture::new(KdaStateLayout::KMajor, DType::F32);
        let _ = fx.run(&KdaDecodePlan { params: p, active_rows });
    }

    /// Device index contents that disagree with the host plan (out of range, repeated live slots)
    /// are rejected by the CPU reference, never read out of bounds.
    #[test]
    fn decode_run_rechecks_device_indices(i0 in -3i32..7, i1 in -3i32..7) {
        let mut fx = DecodeFixture::new(KdaStateLayout::VMajor, DType::BF16);
        let plan = fx.plan();
        fx.t[IDX].0 = HostBuffer([i0, i1].iter().flat_map(|v| v.to_le_bytes()).collect());
        let valid = (0..4).contains(&i0) && (0..4).contains(&i1) && (i0 == 0 || i0 != i1);
        let r = fx.run(&plan);
        prop_assert_eq!(r.is_ok(), valid, "{:?}", r);
        if let Err(e) = r {
            prop_assert_eq!(e.field(), Some("state_indices"));
        }
    }

    /// A corrupted conv1d descriptor or device offsets: error or run, never panic.
    #[test]
    fn conv1d_run_survives_corrupt_input(
        field in 0usize..6, kind in any::<u8>(), v in any::<(usize, usize, usize, usize)>(), dt in 0usize..5,
        device_cu in proptest::option::of(proptest::collection::vec(-3i64..10, 3)),
    ) {
        let cpu = CpuBackend::new();
        let p = CausalConv1dParams { dim: 3, width: 4, activation: ConvActivation::Silu, read_initial_state: true, write_final_state: true, state_slots: 3 };
        let cu = [0i64, 2, 5];
        let plan = conv1d_plan(&p, &cu, Some(&[2, 0])).expect("valid plan");
        let cu_t = HostTensor::from_i64(&[3], device_cu.as_deref().unwrap_or(&cu)).expect("offsets");
        let idx_t = HostTensor::from_i32(&[2], &[2, 0]).expect("indices");
        let mut t = [
            host(DType::F32, &[5, 3], 0.5),
            host(DType::F32, &[3, 4], 0.5),
            (HostBuffer(cu_t.bytes.clone()), cu_t.layout()),
            (HostBuffer(idx_t.bytes.clone()), idx_t.layout()),
            host(DType::BF16, &[3, 3, 3], 0.5),
            host(DType::F32, &[5, 3], 0.0),
        ];
        let clean = t[field].1.clone();
        t[field].1 = corrupt(&clean, kind, v, dt);
        let changed = t[field].1 != clean;
        let [x, w, cu_d, idx, state, out] = &mut t;
        let args = CausalConv1dArgs {
            x: r(x),
            weight: r(w),
            cu_seqlens: r(cu_d),
            state_indices: Some(r(idx)),
            conv_state: Some(TensorMut::new(&mut state.0, state.1.clone())),
            out: TensorMut::new(&mut out.0, out.1.clone()),
        };
        let res = CausalConv1d::run(&cpu, &plan, args, None, cpu.default_stream());
        // The plan keeps the host offsets' count and total, not the values: device offsets that
        // differ from the host copy but are valid offsets for the same count and total describe
        // another legal batch and run; any other device offsets are named errors.
        let device_ok = device_cu.as_deref().is_none_or(|c| validate_cu_seqlens(c, Some(cu[2] as usize), "cu").is_ok());
        if !changed && device_ok {
            prop_assert!(res.is_ok(), "{:?}", res);
        }
        if !changed && !device_ok {
            prop_assert_eq!(res.map_err(|e| e.field().map(str::to_string)), Err(Some("cu_seqlens".to_string())));
        }
    }

    /// CPU only: the K-major and V-major pools run the identical f32 computation, so outputs
    /// agree bit for bit and the states are exact transposes.
    #[test]
    fn decode_layouts_bit_identical_on_cpu(seed in any::<u64>()) {
        let mut rng = kernel_api::conformance::TestRng::new(seed);
        let mut fk = DecodeFixture::new(KdaStateLayout::KMajor, DType::F32);
        let mut fv = DecodeFixture::new(KdaStateLayout::VMajor, DType::F32);
        let (h, k, v) = (fk.p.heads, fk.p.head_k, fk.p.head_v);
        for f in [X, CONV_W, CONV, G, BETA, A_LOG, DT, GATE, NORM_W] {
            let l = fk.t[f].1.clone();
            let vals = rng.normals(l.numel().unwrap_or(0), 1.0);
            let t = HostTensor::from_f32(l.dtype, &l.shape, &vals).expect("values");
            fk.t[f].0 = HostBuffer(t.bytes.clone());
            fv.t[f].0 = HostBuffer(t.bytes);
        }
        let kstate = rng.normals(4 * h * k * v, 1.0);
        let mut vstate = vec![0f32; kstate.len()];
        for hs in 0..4 * h {
            for i in 0..k {
                for j in 0..v {
                    vstate[hs * k * v + j * k + i] = kstate[hs * k * v + i * v + j];
                }
            }
        }
        fk.t[STATE].0 = HostBuffer(HostTensor::from_f32(DType::F32, &[4, h, k, v], &kstate).expect("state").bytes);
        fv.t[STATE].0 = HostBuffer(HostTensor::from_f32(DType::F32, &[4, h, v, k], &vstate).expect("state").bytes);
        let (pk, pv) = (fk.plan(), fv.plan());
        fk.run(&pk).expect("K-major run");
        fv.run(&pv).expect("V-major run");
        prop_assert_eq!(&fk.t[OUT].0, &fv.t[OUT].0);
        prop_assert_eq!(&fk.t[CONV].0, &fv.t[CONV].0);
        let ks = HostTensor::from_bytes(DType::F32, &[4, h, k, v], fk.t[STATE].0 .0.clone()).expect("k").to_f32();
        let vs = HostTensor::from_bytes(DType::F32, &[4, h, v, k], fv.t[STATE].0 .0.clone()).expect("v").to_f32();
        for hs in 0..4 * h {
            for i in 0..k {
                for j in 0..v {
                    prop_assert_eq!(ks[hs * k * v + i * v + j].to_bits(), vs[hs * k * v + j * k + i].to_bits());
                }
            }
        }
    }

    /// CPU only: with no decay (precomputed g = 0) and no write (β = 0) the recurrent state is
    /// bit-identical after the step, whatever q, k, v are.
    #[test]
    fn decode_identity_step_keeps_state(seed in any::<u64>(), bf16_state in any::<bool>()) {
        let mut rng = kernel_api::conformance::TestRng::new(seed);
        let dt = if bf16_state { DType::BF16 } else { DType::F32 };
        let mut fx = DecodeFixture::new(KdaStateLayout::VMajor, dt);
        fx.p.gate = KdaGateMode::Precomputed;
        fx.p.beta_sigmoid = false;
        let l = fx.t[X].1.clone();
        fx.t[X].0 = HostBuffer(HostTensor::from_f32(l.dtype, &l.shape, &rng.normals(l.numel().unwrap_or(0), 2.0)).expect("x").bytes);
        let l = fx.t[STATE].1.clone();
        fx.t[STATE].0 = HostBuffer(HostTensor::from_f32(dt, &l.shape, &rng.normals(l.numel().unwrap_or(0), 1.0)).expect("s").bytes);
        let before = fx.t[STATE].0.clone();
        let plan = fx.plan();
        fx.run(&plan).expect("run");
        prop_assert_eq!(&fx.t[STATE].0, &before);
    }
}
