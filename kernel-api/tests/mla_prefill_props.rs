//! Properties of MLA prefill and MLA cache-write validation (random malformed descriptors give
//! an `Err`, never a panic) and CPU-only properties of the reference.

use kernel_api::cpu::{CpuBackend, HostBuffer};
use kernel_api::ops::kv_cache::{encode_token, Fp8Flavor, KvCacheFormat, KvDims};
use kernel_api::ops::{
    MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams, MlaPrefill, MlaPrefillArgs,
    MlaPrefillBatch, MlaPrefillKv, MlaPrefillParams,
};
use kernel_api::{BackendExt, DType, Error, HostTensor, Layout, TensorMut, TensorRef};
use proptest::prelude::*;

const PREFILL_FIELDS: &[&str] = &[
    "params.heads",
    "params.qk_dim",
    "params.v_dim",
    "params.softmax_scale",
    "cu_seqlens",
    "cu_seqlens_k",
    "total_tokens",
    "total_kv_tokens",
];
const PREFILL_ARG_FIELDS: &[&str] = &["q", "k", "v", "cu_seqlens", "cu_seqlens_k", "out", "lse", "workspace"];
const CACHE_FIELDS: &[&str] =
    &["params.dims.latent", "params.dims", "params.page_size", "params.num_pages", "params.kv_scale", "slot_mapping"];
const CACHE_ARG_FIELDS: &[&str] = &["kv", "slot_mapping", "cache", "workspace"];

fn assert_named(e: &Error, allowed: &[&str]) {
    match e.field() {
        Some(f) => assert!(allowed.contains(&f), "unexpected field `{f}` in {e}"),
        None => panic!("expected InvalidInput, got {e}"),
    }
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0usize..40, 1 => Just(usize::MAX), 1 => Just(1usize << 40)]
}

fn scale() -> impl Strategy<Value = f32> {
    prop_oneof![4 => 0.01f32..2.0, 1 => Just(0.0f32), 1 => Just(f32::NAN), 1 => Just(f32::INFINITY), 1 => Just(-0.5f32)]
}

fn offsets() -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        // Mostly well-formed offsets, sometimes with an entry disturbed.
        3 => (proptest::collection::vec(0i64..8, 0..5), any::<prop::sample::Index>(), -3i64..3).prop_map(|(lens, at, delta)| {
            let mut cu = vec![0i64];
            for l in lens {
                cu.push(cu[cu.len() - 1] + l);
            }
            let i = at.index(cu.len());
            cu[i] += delta;
            cu
        }),
        1 => proptest::collection::vec(prop_oneof![-5i64..40, Just(i64::MAX), Just(i64::MIN)], 0..6),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8])
}

/// A layout near `shape` (sometimes a different rank, size, stride or offset) over a buffer
/// that is sometimes too small.
fn layout_near(shape: Vec<usize>, dt: DType) -> impl Strategy<Value = (Layout, usize)> {
    let rank = shape.len();
    (
        prop_oneof![6 => Just(dt), 1 => dtype()],
        prop_oneof![6 => Just(shape.clone()), 1 => proptest::collection::vec(0usize..6, 0..4)],
        proptest::collection::vec(prop_oneof![4 => Just(None), 1 => (0usize..64).prop_map(Some), 1 => Just(Some(usize::MAX / 2))], rank.max(1)),
        prop_oneof![4 => Just(0usize), 1 => 0usize..16, 1 => Just(usize::MAX / 4)],
        prop_oneof![4 => Just(None), 1 => (0usize..4096).prop_map(Some)],
    )
        .prop_map(|(dt, shape, stride_over, offset, buf)| {
            let mut l = Layout::contiguous(dt, &shape);
            for (s, o) in l.strides.iter_mut().zip(stride_over) {
                if let Some(o) = o {
                    *s = o;
                }
            }
            l.offset = offset;
            let len = buf.unwrap_or_else(|| l.span_bytes().unwrap_or(0).min(1 << 20));
            (l, len)
        })
}

fn buffer(len: usize) -> HostBuffer {
    HostBuffer(vec![0x3c; len])
}

fn i64_tensor(v: &[i64]) -> HostBuffer {
    HostBuffer(HostTensor::from_i64(&[v.len()], v).unwrap().bytes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random prefill descriptors: a plan is an `Err` naming a field, or consistent offsets.
    #[test]
    fn prefill_plan_never_panics(
        heads in size(), qk in size(), v in size(), s in scale(), causal in any::<bool>(),
        cu in offsets(), total in prop_oneof![0usize..40, Just(usize::MAX)],
        kv in proptest::option::of((offsets(), 0usize..40)),
    ) {
        let p = MlaPrefillParams { heads, qk_dim: qk, v_dim: v, softmax_scale: s, causal };
        let batch = MlaPrefillBatch {
            total_tokens: total,
            cu_seqlens: cu.clone(),
            kv: kv.map(|(c, t)| MlaPrefillKv { total_kv_tokens: t, cu_seqlens_k: c }),
        };
        match MlaPrefill::plan(&CpuBackend::new(), &p, &batch) {
            Err(e) => assert_named(&e, PREFILL_FIELDS),
            Ok(plan) => {
                prop_assert!(heads >= 1 && qk >= 1 && v >= 1 && s.is_finite() && s > 0.0);
                prop_assert_eq!(cu[0], 0);
                prop_assert!(cu.windows(2).all(|w| w[0] <= w[1]));
                prop_assert_eq!(*cu.last().unwrap(), total as i64);
                prop_assert_eq!(plan.batch_size, cu.len() - 1);
            }
        }
    }

    /// Malformed offsets derived from valid ones are always rejected, naming `cu_seqlens`.
    #[test]
    fn prefill_malformed_offsets_rejected(lens in proptest::collection::vec(0usize..9, 1..6), which in 0usize..3, at in any::<prop::sample::Index>()) {
        let p = MlaPrefillParams { heads: 3, qk_dim: 8, v_dim: 4, softmax_scale: 0.3, causal: true };
        let mut batch = MlaPrefillBatch::from_seq_lens(&lens);
        match which {
            0 => batch.cu_seqlens[0] = 1,                       // not starting at 0
            1 => batch.total_tokens += 1,                       // not ending at total
            _ => {                                              // decreasing somewhere
                let i = 1 + at.index(batch.cu_seqlens.len() - 1);
                batch.cu_seqlens[i] = batch.cu_seqlens[i - 1] - 1;
            }
        }
        let e = MlaPrefill::plan(&CpuBackend::new(), &p, &batch).unwrap_err();
        prop_assert_eq!(e.field(), Some("cu_seqlens"), "{}", e);
    }

    /// The CPU prefill with random (often wrong) tensor layouts returns `Ok` or an `Err`
    /// naming an argument; it never panics or reads outside a buffer.
    #[test]
    fn prefill_run_random_layouts_never_panic(
        q in layout_near(vec![5, 2, 8], DType::F32),
        k in layout_near(vec![5, 2, 8], DType::BF16),
        v in layout_near(vec![5, 2, 4], DType::F32),
        out in layout_near(vec![5, 2, 4], DType::BF16),
        lse in proptest::option::of(layout_near(vec![5, 2], DType::F32)),
        cu_dev in prop_oneof![Just(vec![0i64, 3, 3, 5]), offsets()],
    ) {
        let b = CpuBackend::new();
        let p = MlaPrefillParams { heads: 2, qk_dim: 8, v_dim: 4, softmax_scale: 0.35, causal: true };
        let plan = MlaPrefill::plan(&b, &p, &MlaPrefillBatch::from_seq_lens(&[3, 0, 2])).unwrap();
        let (qb, kb, vb, cb) = (buffer(q.1), buffer(k.1), buffer(v.1), i64_tensor(&cu_dev));
        let mut ob = buffer(out.1);
        let mut lb = lse.as_ref().map(|l| buffer(l.1));
        let args = MlaPrefillArgs {
            q: TensorRef::new(&qb, q.0),
            k: TensorRef::new(&kb, k.0),
            v: TensorRef::new(&vb, v.0),
            cu_seqlens: TensorRef::new(&cb, Layout::contiguous(DType::I64, &[cu_dev.len()])),
            cu_seqlens_k: None,
            out: TensorMut::new(&mut ob, out.0),
            lse: lb.as_mut().zip(lse).map(|(buf, l)| TensorMut::new(buf, l.0)),
        };
        if let Err(e) = MlaPrefill::run(&b, &plan, args, None, &Default::default()) {
            assert_named(&e, PREFILL_ARG_FIELDS);
        }
    }

    /// Random cache-write descriptors: an `Err` naming a field, or in-range distinct slots.
    #[test]
    fn cache_write_plan_never_panics(
        latent in size(), rope in size(), pages in size(), page_size in size(), s in scale(),
        fmt in prop::sample::select(KvCacheFormat::ALL.to_vec()),
        slots in proptest::collection::vec(prop_oneof![-3i64..24, Just(i64::MAX), Just(i64::MIN)], 0..10),
    ) {
        let p = MlaCacheWriteParams { dims: KvDims { latent, rope }, num_pages: pages, page_size, format: fmt, kv_scale: s };
        match MlaCacheWrite::plan(&CpuBackend::new(), &p, &MlaCacheWriteBatch { slot_mapping: slots.clone() }) {
            Err(e) => assert_named(&e, CACHE_FIELDS),
            Ok(plan) => {
                let total = pages as u128 * page_size as u128;
                let mut used: Vec<i64> = slots.iter().copied().filter(|&x| x >= 0).collect();
                prop_assert!(used.iter().all(|&x| (x as u128) < total));
                used.sort_unstable();
                prop_assert!(used.windows(2).all(|w| w[0] != w[1]));
                prop_assert_eq!(plan.written_tokens, used.len());
            }
        }
    }

    /// The CPU cache write with random (often wrong) layouts never panics.
    #[test]
    fn cache_write_run_random_layouts_never_panic(
        kv in layout_near(vec![4, 80], DType::F32),
        cache in layout_near(vec![2, 4, 80], DType::U8),
        slot_dev in prop_oneof![Just(vec![5i64, -1, 0, 7]), proptest::collection::vec(-2i64..12, 0..6)],
        fmt in prop::sample::select(KvCacheFormat::ALL.to_vec()),
    ) {
        let b = CpuBackend::new();
        let p = MlaCacheWriteParams { dims: KvDims { latent: 64, rope: 16 }, num_pages: 2, page_size: 4, format: fmt, kv_scale: 0.25 };
        let plan = MlaCacheWrite::plan(&b, &p, &MlaCacheWriteBatch { slot_mapping: vec![5, -1, 0, 7] }).unwrap();
        let (kb, sb) = (buffer(kv.1), i64_tensor(&slot_dev));
        let mut cb = buffer(cache.1);
        let args = MlaCacheWriteArgs {
            kv: TensorRef::new(&kb, kv.0),
            slot_mapping: TensorRef::new(&sb, Layout::contiguous(DType::I64, &[slot_dev.len()])),
            cache: TensorMut::new(&mut cb, cache.0),
        };
        if let Err(e) = MlaCacheWrite::run(&b, &plan, args, None, &Default::default()) {
            assert_named(&e, CACHE_ARG_FIELDS);
        }
    }

    /// CPU: the cache does not depend on token order (each token's row is its own encoding).
    #[test]
    fn cache_write_order_independent(seed in any::<u64>(), fmt in prop::sample::select(KvCacheFormat::ALL.to_vec())) {
        let mut rng = kernel_api::conformance::TestRng::new(seed);
        let dims = KvDims { latent: 160, rope: 8 }; // two tiles, the second partial
        let n = 6;
        let values = rng.normals(n * dims.width(), 2.0);
        let slot_perm = rng.permutation(12);
        let slots: Vec<i64> = (0..n).map(|t| if t == 2 { -1 } else { slot_perm[t] as i64 }).collect();
        let order = rng.permutation(n);
        let p = MlaCacheWriteParams { dims, num_pages: 3, page_size: 4, format: fmt, kv_scale: 0.02 };
        let write = |vals: &[f32], slots: &[i64]| -> Vec<u8> {
            let b = CpuBackend::new();
            let plan = MlaCacheWrite::plan(&b, &p, &MlaCacheWriteBatch { slot_mapping: slots.to_vec() }).unwrap();
            let kv = b.upload_tensor(&HostTensor::from_f32(DType::F32, &[n, dims.width()], vals).unwrap()).unwrap();
            let st = b.upload_tensor(&HostTensor::from_i64(&[n], slots).unwrap()).unwrap();
            let mut cache = b.zeros(DType::U8, &[3, 4, fmt.bytes_per_token(dims)]).unwrap();
            let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: st.as_ref(), cache: cache.as_mut() };
            MlaCacheWrite::run(&b, &plan, args, None, &Default::default()).unwrap();
            cache.buf.0
        };
        let w = dims.width();
        let permuted_vals: Vec<f32> = order.iter().flat_map(|&t| values[t * w..(t + 1) * w].to_vec()).collect();
        let permuted_slots: Vec<i64> = order.iter().map(|&t| slots[t]).collect();
        let a = write(&values, &slots);
        prop_assert_eq!(&a, &write(&permuted_vals, &permuted_slots));
        // And the bytes of token 0 are its encode_token.
        let bpt = fmt.bytes_per_token(dims);
        let mut tok = vec![0u8; bpt];
        encode_token(fmt, dims, &values[..w], p.kv_scale, &mut tok).unwrap();
        let s0 = slots[0] as usize;
        prop_assert_eq!(&a[s0 * bpt..(s0 + 1) * bpt], &tok[..]);
    }
}

/// CPU: device offsets that differ from the planned ones are an error, not a silent use of
/// either copy.
#[test]
fn prefill_device_offsets_must_match_plan() {
    let b = CpuBackend::new();
    let p = MlaPrefillParams { heads: 1, qk_dim: 4, v_dim: 2, softmax_scale: 0.5, causal: true };
    let plan = MlaPrefill::plan(&b, &p, &MlaPrefillBatch::from_seq_lens(&[2, 3])).unwrap();
    let (q, k, v) = (b.zeros(DType::F32, &[5, 1, 4]).unwrap(), b.zeros(DType::F32, &[5, 1, 4]).unwrap(), b.zeros(DType::F32, &[5, 1, 2]).unwrap());
    let cu = b.upload_tensor(&HostTensor::from_i32(&[3], &[0, 3, 5]).unwrap()).unwrap();
    let mut out = b.zeros(DType::F32, &[5, 1, 2]).unwrap();
    let args = MlaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        cu_seqlens: cu.as_ref(),
        cu_seqlens_k: None,
        out: out.as_mut(),
        lse: None,
    };
    let e = MlaPrefill::run(&b, &plan, args, None, &Default::default()).unwrap_err();
    assert_eq!(e.field(), Some("cu_seqlens"), "{e}");
}

/// CPU: a device slot mapping that differs from the planned one is an error.
#[test]
fn cache_write_device_slots_must_match_plan() {
    let b = CpuBackend::new();
    let fmt = KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fnuz);
    let dims = KvDims { latent: 64, rope: 16 };
    let p = MlaCacheWriteParams { dims, num_pages: 1, page_size: 4, format: fmt, kv_scale: 1.0 };
    let plan = MlaCacheWrite::plan(&b, &p, &MlaCacheWriteBatch { slot_mapping: vec![0, 1] }).unwrap();
    let kv = b.zeros(DType::BF16, &[2, 80]).unwrap();
    let slots = b.upload_tensor(&HostTensor::from_i32(&[2], &[1, 1]).unwrap()).unwrap();
    let mut cache = b.zeros(DType::U8, &[1, 4, fmt.bytes_per_token(dims)]).unwrap();
    let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
    let e = MlaCacheWrite::run(&b, &plan, args, None, &Default::default()).unwrap_err();
    assert_eq!(e.field(), Some("slot_mapping"), "{e}");
    assert!(cache.buf.0.iter().all(|&x| x == 0), "nothing may be written after a rejected call");
}
