//! Properties of the dense op family (GEMM, norms, AttnRes, elementwise) on the CPU backend:
//! random malformed descriptors give an `Err` and never panic, plus CPU-only guarantees
//! (GEMM determinism across thread counts, the embedding re-check, mix and SiTU bounds).

use kernel_api::conformance::{download_f32, upload_f32, TestRng};
use kernel_api::cpu::{CpuBackend, HostBuffer};
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, DType, HostTensor, Layout, TensorMut, TensorRef};
use proptest::prelude::*;
use proptest::sample::select;

const FLOATS: &[DType] = &[DType::F32, DType::BF16];
const IDS: &[DType] = &[DType::I32, DType::I64];

/// A tensor argument to build: its layout and the length of the buffer it lives in.
#[derive(Clone, Debug)]
struct Spec {
    layout: Layout,
    buf_len: usize,
    seed: u64,
}

impl Spec {
    /// A buffer of pseudo-random bytes (random ids, NaNs and all), never larger than 64 KiB.
    fn buffer(&self) -> HostBuffer {
        let mut rng = TestRng::new(self.seed);
        HostBuffer((0..self.buf_len.min(1 << 16)).map(|_| rng.next_u64() as u8).collect())
    }
}

/// Mostly well-formed layouts of `shape` (padded rows, an offset, a buffer that fits or falls
/// a little short), sometimes an arbitrary one (any rank, dtype, strides, offset, buffer).
fn spec(shape: Vec<usize>, dtypes: &'static [DType]) -> impl Strategy<Value = Spec> {
    let well_formed = (select(dtypes), 0usize..3, 0usize..4, prop_oneof![4 => Just(0usize), 1 => 1usize..8], any::<u64>())
        .prop_map(move |(dtype, pad, offset, short, seed)| {
            let rank = shape.len();
            let mut strides = vec![1usize; rank];
            let mut s = shape.last().map_or(1, |&c| c.saturating_add(pad));
            for d in (0..rank.saturating_sub(1)).rev() {
                strides[d] = s;
                s = s.saturating_mul(shape[d]);
            }
            let layout = Layout { dtype, shape: shape.clone(), strides, offset };
            let span = layout.span_bytes().unwrap_or(usize::MAX);
            Spec { buf_len: span.saturating_sub(short).min(1 << 16), layout, seed }
        });
    let arbitrary = (
        select(&DType::ALL[..]),
        prop::collection::vec(0usize..6, 0..4),
        prop::collection::vec(0usize..12, 0..4),
        0usize..8,
        0usize..600,
        any::<u64>(),
    )
        .prop_map(|(dtype, shape, strides, offset, buf_len, seed)| Spec { layout: Layout { dtype, shape, strides, offset }, buf_len, seed });
    prop_oneof![4 => well_formed, 1 => arbitrary]
}

/// Sizes: mostly small, sometimes zero or absurdly large.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 1usize..7, 1 => Just(0usize), 1 => Just(usize::MAX / 3), 1 => Just(1usize << 40)]
}

fn eps() -> impl Strategy<Value = f32> {
    prop_oneof![4 => Just(1e-5f32), 1 => Just(0.0f32), 1 => Just(-1e-6f32), 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => any::<f32>()]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![4 => select(FLOATS), 1 => select(&DType::ALL[..])]
}

fn tref<'a>(b: &'a HostBuffer, s: &Spec) -> TensorRef<'a, CpuBackend> {
    TensorRef::new(b, s.layout.clone())
}
fn tmut<'a>(b: &'a mut HostBuffer, s: &Spec) -> TensorMut<'a, CpuBackend> {
    TensorMut::new(b, s.layout.clone())
}

fn gemm_case() -> impl Strategy<Value = (GemmParams, Spec, Spec, Option<Spec>, Spec)> {
    (dim(), dim(), dim(), dtype(), dtype(), dtype(), prop::option::of(dtype())).prop_flat_map(|(m, n, k, xd, wd, od, bd)| {
        let p = GemmParams { m, n, k, x_dtype: xd, w_dtype: wd, out_dtype: od, bias_dtype: bd };
        (Just(p), spec(vec![m, k], FLOATS), spec(vec![n, k], FLOATS), prop::option::of(spec(vec![n], FLOATS)), spec(vec![m, n], FLOATS))
    })
}

fn rms_case() -> impl Strategy<Value = (RmsNormParams, bool, Spec, Spec, Spec)> {
    (dim(), dim(), eps(), any::<bool>()).prop_flat_map(|(m, d, eps, hf)| {
        let order = if hf { RmsWeightOrder::CastBeforeWeight } else { RmsWeightOrder::F32 };
        (Just(RmsNormParams { m, d, eps, weight_order: order }), Just(hf), spec(vec![m, d], FLOATS), spec(vec![d], FLOATS), spec(vec![m, d], FLOATS))
    })
}

fn gated_case() -> impl Strategy<Value = (GatedRmsNormParams, Spec, Spec, Spec, Spec)> {
    (dim(), dim(), dim(), eps()).prop_flat_map(|(m, h, dh, eps)| {
        let shape = vec![m, h, dh];
        (
            Just(GatedRmsNormParams { m, heads: h, head_dim: dh, eps }),
            spec(shape.clone(), FLOATS),
            spec(shape.clone(), FLOATS),
            spec(vec![dh], FLOATS),
            spec(shape, FLOATS),
        )
    })
}

fn mix_case() -> impl Strategy<Value = (AttnResMixParams, Spec, Spec, Spec)> {
    (dim(), dim(), dim(), eps()).prop_flat_map(|(s, m, d, eps)| {
        (Just(AttnResMixParams { sources: s, m, d, eps }), spec(vec![s, m, d], FLOATS), spec(vec![d], &[DType::F32]), spec(vec![m, d], FLOATS))
    })
}

fn situ_case() -> impl Strategy<Value = (SituGluParams, bool, Spec, Spec, Spec)> {
    let beta = prop_oneof![4 => Just(4.0f32), 1 => any::<f32>()];
    let lb = prop::option::of(prop_oneof![4 => Just(25.0f32), 1 => any::<f32>()]);
    (dim(), dim(), beta, lb, any::<bool>()).prop_flat_map(|(m, n, beta, lb, fused)| {
        let first = if fused { vec![m, n.saturating_mul(2)] } else { vec![m, n] };
        (Just(SituGluParams { m, n, beta, linear_beta: lb }), Just(fused), spec(first, FLOATS), spec(vec![m, n], FLOATS), spec(vec![m, n], FLOATS))
    })
}

fn gather_case() -> impl Strategy<Value = (EmbeddingGatherParams, Vec<i64>, Spec, Spec, Spec)> {
    (dim(), dim(), dim()).prop_flat_map(|(v, d, m)| {
        let ids = prop::collection::vec(prop_oneof![8 => 0i64..8, 1 => any::<i64>()], m.min(8));
        (Just(EmbeddingGatherParams { vocab: v, d, m }), ids, spec(vec![v, d], FLOATS), spec(vec![m], IDS), spec(vec![m, d], FLOATS))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn gemm_malformed_never_panics((p, xs, ws, bs, os) in gemm_case()) {
        let b = CpuBackend::new();
        if let Ok(plan) = Gemm::plan(&b, &p) {
            let (xb, wb) = (xs.buffer(), ws.buffer());
            let bb = bs.as_ref().map(Spec::buffer);
            let mut ob = os.buffer();
            let args = GemmArgs { x: tref(&xb, &xs), w: tref(&wb, &ws), bias: bb.as_ref().zip(bs.as_ref()).map(|(b, s)| tref(b, s)), out: tmut(&mut ob, &os) };
            let _ = Gemm::run(&b, &plan, args, None, b.default_stream());
        }
    }

    #[test]
    fn rms_norm_malformed_never_panics((p, _hf, xs, ws, os) in rms_case()) {
        let b = CpuBackend::new();
        let plan = RmsNorm::plan(&b, &p);
        if !(p.eps.is_finite() && p.eps > 0.0) {
            prop_assert!(plan.is_err());
            if p.d >= 1 {
                prop_assert_eq!(plan.as_ref().err().and_then(|e| e.field()), Some("params.eps"));
            }
        }
        if let Ok(plan) = plan {
            let (xb, wb, mut ob) = (xs.buffer(), ws.buffer(), os.buffer());
            let args = RmsNormArgs { x: tref(&xb, &xs), w: tref(&wb, &ws), out: tmut(&mut ob, &os) };
            let _ = RmsNorm::run(&b, &plan, args, None, b.default_stream());
        }
    }

    #[test]
    fn gated_rms_norm_malformed_never_panics((p, o, g, w, out) in gated_case()) {
        let b = CpuBackend::new();
        if let Ok(plan) = GatedRmsNorm::plan(&b, &p) {
            let (ob, gb, wb, mut outb) = (o.buffer(), g.buffer(), w.buffer(), out.buffer());
            let args = GatedRmsNormArgs { o: tref(&ob, &o), gate: tref(&gb, &g), w: tref(&wb, &w), out: tmut(&mut outb, &out) };
            let _ = GatedRmsNorm::run(&b, &plan, args, None, b.default_stream());
        }
        let l2 = L2NormParams { m: p.m, d: p.head_dim, eps: p.eps };
        if let Ok(plan) = L2Norm::plan(&b, &l2) {
            let (ob, mut outb) = (o.buffer(), out.buffer());
            let _ = L2Norm::run(&b, &plan, L2NormArgs { x: tref(&ob, &o), out: tmut(&mut outb, &out) }, None, b.default_stream());
        }
    }

    #[test]
    fn attn_res_malformed_never_panics((p, vs, ws, os) in mix_case()) {
        let b = CpuBackend::new();
        if let Ok(plan) = AttnResMix::plan(&b, &p) {
            let (vb, wb, mut ob) = (vs.buffer(), ws.buffer(), os.buffer());
            let args = AttnResMixArgs { sources: tref(&vb, &vs), score_vector: tref(&wb, &ws), out: tmut(&mut ob, &os) };
            let _ = AttnResMix::run(&b, &plan, args, None, b.default_stream());
        }
    }

    #[test]
    fn situ_and_gate_malformed_never_panic((p, fused, gs, us, os) in situ_case()) {
        let b = CpuBackend::new();
        if let Ok(plan) = SituGlu::plan(&b, &p) {
            let (gb, ub, mut ob) = (gs.buffer(), us.buffer(), os.buffer());
            let input = if fused {
                SituGluInput::Fused(tref(&gb, &gs))
            } else {
                SituGluInput::Separate { gate: tref(&gb, &gs), up: tref(&ub, &us) }
            };
            let _ = SituGlu::run(&b, &plan, SituGluArgs { input, out: tmut(&mut ob, &os) }, None, b.default_stream());
        }
        if let Ok(plan) = SigmoidGate::plan(&b, &SigmoidGateParams { m: p.m, n: p.n }) {
            let (gb, ub, mut ob) = (gs.buffer(), us.buffer(), os.buffer());
            let args = SigmoidGateArgs { x: tref(&ub, &us), g: tref(&gb, &gs), out: tmut(&mut ob, &os) };
            let _ = SigmoidGate::run(&b, &plan, args, None, b.default_stream());
        }
    }

    /// The ids tensor holds random bytes, so the run's re-check of the ids is exercised too.
    #[test]
    fn embedding_gather_malformed_never_panics((p, host_ids, ts, is, os) in gather_case()) {
        let b = CpuBackend::new();
        if let Ok(plan) = EmbeddingGather::plan(&b, &p, &host_ids) {
            let (tb, ib, mut ob) = (ts.buffer(), is.buffer(), os.buffer());
            let args = EmbeddingGatherArgs { table: tref(&tb, &ts), ids: tref(&ib, &is), out: tmut(&mut ob, &os) };
            let _ = EmbeddingGather::run(&b, &plan, args, None, b.default_stream());
        }
    }

    /// The score vector is the exact f32 product of two bf16 weights.
    #[test]
    fn score_vector_is_exact_product(nw in prop::collection::vec(-4.0f32..4.0, 1..40), seed in any::<u64>()) {
        let d = nw.len();
        let pw = TestRng::new(seed).normals(d, 0.2);
        let nt = HostTensor::from_f32(DType::BF16, &[d], &nw).unwrap();
        let pt = HostTensor::from_f32(DType::BF16, &[1, d], &pw).unwrap();
        let w = attn_res_score_vector(&nt, &pt).unwrap();
        prop_assert_eq!(w.dtype, DType::F32);
        for ((a, c), got) in nt.to_f32().iter().zip(pt.to_f32()).zip(w.to_f32()) {
            prop_assert_eq!(*a as f64 * c as f64, got as f64);
        }
    }

    /// The mix is a convex combination: every output lies between the smallest and largest
    /// source value at that position.
    #[test]
    fn attn_res_output_is_convex_combination(s in 1usize..11, m in 1usize..4, d in 1usize..24, seed in any::<u64>(), wscale in 0.0f32..5.0) {
        let b = CpuBackend::new();
        let mut rng = TestRng::new(seed);
        let v = rng.normals(s * m * d, 3.0);
        let w = rng.normals(d, wscale);
        let vt = upload_f32(&b, DType::F32, &[s, m, d], &v).unwrap();
        let wt = upload_f32(&b, DType::F32, &[d], &w).unwrap();
        let mut out = b.zeros(DType::F32, &[m, d]).unwrap();
        let plan = AttnResMix::plan(&b, &AttnResMixParams { sources: s, m, d, eps: 1e-5 }).unwrap();
        let args = AttnResMixArgs { sources: vt.as_ref(), score_vector: wt.as_ref(), out: out.as_mut() };
        AttnResMix::run(&b, &plan, args, None, b.default_stream()).unwrap();
        let got = download_f32(&b, &out).unwrap();
        for (k, &o) in got.iter().enumerate() {
            let vals = (0..s).map(|i| v[i * m * d + k]);
            let (lo, hi) = vals.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
            let slack = 1e-6 * hi.abs().max(lo.abs());
            prop_assert!(o >= lo - slack && o <= hi + slack, "out {o} outside [{lo}, {hi}]");
        }
    }

    /// With both caps, |SiTU(g, u)| < β·β_l for any finite inputs.
    #[test]
    fn situ_is_bounded_by_the_caps(g in prop::collection::vec(-1e6f32..1e6, 1..20), seed in any::<u64>()) {
        let b = CpuBackend::new();
        let n = g.len();
        let u: Vec<f32> = TestRng::new(seed).normals(n, 1e4);
        let gt = upload_f32(&b, DType::F32, &[1, n], &g).unwrap();
        let ut = upload_f32(&b, DType::F32, &[1, n], &u).unwrap();
        let mut out = b.zeros(DType::F32, &[1, n]).unwrap();
        let plan = SituGlu::plan(&b, &SituGluParams { m: 1, n, beta: 4.0, linear_beta: Some(25.0) }).unwrap();
        let args = SituGluArgs { input: SituGluInput::Separate { gate: gt.as_ref(), up: ut.as_ref() }, out: out.as_mut() };
        SituGlu::run(&b, &plan, args, None, b.default_stream()).unwrap();
        for o in download_f32(&b, &out).unwrap() {
            prop_assert!(o.is_finite() && o.abs() <= 100.0, "SiTU output {o} exceeds beta * linear_beta = 100");
        }
    }
}

/// Runs one bf16 GEMM inside a rayon pool of `threads` threads and returns the output bits.
fn gemm_bits(threads: usize, m: usize, n: usize, k: usize) -> Vec<u8> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let b = CpuBackend::new();
        let mut rng = TestRng::new(7);
        let p = GemmParams { bias_dtype: Some(DType::F32), ..GemmParams::new(m, n, k, DType::BF16, DType::BF16, DType::F32) };
        let plan = Gemm::plan(&b, &p).unwrap();
        let x = upload_f32(&b, DType::BF16, &[m, k], &rng.normals(m * k, 1.0)).unwrap();
        let w = upload_f32(&b, DType::BF16, &[n, k], &rng.normals(n * k, 0.03)).unwrap();
        let bias = upload_f32(&b, DType::F32, &[n], &rng.normals(n, 1.0)).unwrap();
        let mut out = b.zeros(DType::F32, &[m, n]).unwrap();
        let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: Some(bias.as_ref()), out: out.as_mut() };
        Gemm::run(&b, &plan, args, None, b.default_stream()).unwrap();
        b.download_tensor(&out).unwrap().bytes
    })
}

/// The CPU GEMM gives the same bits with 1, 2, 3 and 8 threads (documented in `ops::gemm` and
/// the tolerance policy); the 64×1024×1024 shape is above the size where the gemm crate starts
/// to split work, 70×3072×128 is the tiny model's fused KDA projection over a chunk.
#[test]
fn cpu_gemm_is_deterministic_across_thread_counts() {
    for &(m, n, k) in &[(64, 1024, 1024), (7, 160, 96), (1, 1024, 1024), (70, 3072, 128)] {
        let one = gemm_bits(1, m, n, k);
        for threads in [2, 3, 8] {
            assert_eq!(one, gemm_bits(threads, m, n, k), "m{m} n{n} k{k}: 1 vs {threads} threads");
        }
    }
}

/// The plan checked host ids in range; if the device ids differ, the CPU run catches it.
#[test]
fn cpu_embedding_gather_rechecks_ids() {
    let b = CpuBackend::new();
    let p = EmbeddingGatherParams { vocab: 6, d: 3, m: 2 };
    let plan = EmbeddingGather::plan(&b, &p, &[1, 2]).unwrap();
    let table = upload_f32(&b, DType::F32, &[6, 3], &[0.5; 18]).unwrap();
    for bad in [[1i64, 6], [-1, 0]] {
        let ids = b.upload_tensor(&HostTensor::from_i64(&[2], &bad).unwrap()).unwrap();
        let mut out = b.zeros(DType::F32, &[2, 3]).unwrap();
        let args = EmbeddingGatherArgs { table: table.as_ref(), ids: ids.as_ref(), out: out.as_mut() };
        let e = EmbeddingGather::run(&b, &plan, args, None, b.default_stream()).unwrap_err();
        assert_eq!(e.field(), Some("ids"), "{e}");
    }
}
