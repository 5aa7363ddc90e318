//! Properties of MLA decode / absorbed prefill plans (random malformed descriptors give an
//! `Err`, never a panic; valid ones give a schedule that covers every key exactly once) and
//! CPU-only properties of `run` (device metadata re-checked, variants agree).

use kernel_api::conformance::mla_decode::oracle::PagedCase;
use kernel_api::conformance::TestRng;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::kv_cache::{KvCacheFormat, KvDims};
use kernel_api::ops::mla_decode::{
    MlaDecode, MlaDecodeArgs, MlaDecodeBatch, MlaDecodeParams, MlaDecodePlan, MlaDecodeVariant, MlaKernel, MlaPagedCache,
    MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaPrefillAbsorbedPlan, MlaSplitPolicy, ASM_MIN_CHUNK_TOKENS,
    HEAD_GROUP, MLA_MAX_DIM,
};
use kernel_api::tolerance::{check_close, Tolerance};
use kernel_api::{Backend, BackendExt, DType, Error, HostTensor};
use proptest::prelude::*;

fn any_format() -> impl Strategy<Value = KvCacheFormat> {
    proptest::sample::select(KvCacheFormat::ALL.to_vec())
}

/// Cache descriptors with every field sometimes out of range.
fn wild_cache() -> impl Strategy<Value = MlaPagedCache> {
    (
        prop_oneof![Just(0usize), 1..80usize, Just(MLA_MAX_DIM + 1), Just(usize::MAX)],
        prop_oneof![0..20usize, Just(usize::MAX)],
        any_format(),
        proptest::sample::select(vec![0usize, 1, 2, 32, 64, 128, 129, usize::MAX]),
        prop_oneof![0..40usize, Just(usize::MAX)],
        proptest::sample::select(vec![1.0f32, 0.5, 0.0, -1.0, f32::NAN, f32::INFINITY]),
    )
        .prop_map(|(latent, rope, format, page_size, num_pages, kv_scale)| MlaPagedCache {
            dims: KvDims { latent, rope },
            format,
            page_size,
            num_pages,
            kv_scale,
        })
}

fn any_variant() -> impl Strategy<Value = MlaDecodeVariant> {
    proptest::sample::select(vec![MlaDecodeVariant::Auto, MlaDecodeVariant::AsmStyle, MlaDecodeVariant::GluonStyle])
}

fn wild_splits() -> impl Strategy<Value = MlaSplitPolicy> {
    prop_oneof![
        Just(MlaSplitPolicy::Auto),
        any::<u32>().prop_map(MlaSplitPolicy::ComputeUnits),
        (0..400u32).prop_map(MlaSplitPolicy::ComputeUnits),
        any::<usize>().prop_map(MlaSplitPolicy::NumSplits),
        (0..10usize).prop_map(MlaSplitPolicy::NumSplits),
    ]
}

/// Checks the schedule of a valid decode plan: each (sequence, head group) is covered by its
/// items exactly once, in kv order; partial slots are used once each and reduced exactly where
/// a pair has several items; asm units stay within their quota.
fn check_schedule(plan: &MlaDecodePlan, cus: u32) -> Result<(), TestCaseError> {
    let s = &plan.schedule;
    let mut slot_used = vec![false; s.num_partials];
    for b in 0..plan.batch {
        for g in 0..plan.head_groups {
            let items: Vec<_> = s.items.iter().filter(|it| it.batch as usize == b && it.head_group as usize == g).collect();
            let mut kv = 0;
            for it in &items {
                prop_assert_eq!(it.kv_start, kv, "items of ({}, {}) must tile the keys in order", b, g);
                prop_assert!(it.kv_end >= it.kv_start);
                kv = it.kv_end;
                match it.partial {
                    None => prop_assert_eq!(items.len(), 1, "a split pair must use partials"),
                    Some(p) => {
                        prop_assert!(!std::mem::replace(&mut slot_used[p as usize], true), "slot {} used twice", p);
                    }
                }
            }
            prop_assert_eq!(kv, plan.seq_lens[b]);
            let reduces: Vec<_> = s.reduce.iter().filter(|e| e.batch as usize == b && e.head_group as usize == g).collect();
            prop_assert_eq!(reduces.len(), usize::from(items.len() > 1));
            if let Some(e) = reduces.first() {
                let slots: Vec<u32> = items.iter().filter_map(|it| it.partial).collect();
                prop_assert_eq!(slots, e.partials.clone().collect::<Vec<_>>());
            }
        }
    }
    prop_assert!(slot_used.iter().all(|&u| u), "every slot is used");
    // Partial rows are latent rounded up to 4 floats apart (16-byte loads in the reduce).
    let pitch = plan.params.cache.dims.latent.div_ceil(4) * 4;
    prop_assert_eq!(plan.partial_row_pitch(), pitch);
    let (o, l) = (plan.params.q_len * HEAD_GROUP * pitch, plan.params.q_len * HEAD_GROUP);
    let partials = s.num_partials * (o + l) * 4;
    prop_assert_eq!(plan.schedule_offset(), partials);
    match plan.kernel {
        MlaKernel::Asm => {
            let (items, cu_indptr, reduce) = plan.schedule_arrays();
            // Items are 4 i32 (16 bytes: one vector load each) from a 16-byte aligned offset.
            prop_assert!(items % 16 == 0, "items at {items}");
            prop_assert_eq!((items, cu_indptr), (partials, partials + 16 * s.items.len()));
            // The reduce map follows cu_indptr at the next 16-byte boundary.
            let end = cu_indptr + 4 * s.cu_indptr.len();
            prop_assert!(reduce % 16 == 0 && reduce >= end && reduce < end + 16, "reduce map at {reduce}, cu_indptr ends at {end}");
            prop_assert_eq!(plan.workspace_bytes(), reduce + 16 * s.reduce.len());
        }
        MlaKernel::Gluon => prop_assert_eq!(plan.workspace_bytes(), partials),
    }
    match plan.kernel {
        MlaKernel::Gluon => prop_assert!(s.cu_indptr.is_empty() && s.items.len() == plan.batch * plan.head_groups * s.num_splits),
        MlaKernel::Asm => {
            prop_assert_eq!(s.cu_indptr.len(), cus as usize + 1);
            prop_assert!(s.cu_indptr.windows(2).all(|w| w[0] <= w[1]));
            prop_assert_eq!(*s.cu_indptr.last().unwrap() as usize, s.items.len());
            let total: u64 = plan.seq_lens.iter().map(|&l| l as u64 * plan.head_groups as u64).sum();
            let quota = total.div_ceil(cus as u64).max(ASM_MIN_CHUNK_TOKENS as u64);
            prop_assert_eq!(s.quota, quota);
            for w in s.cu_indptr.windows(2) {
                let load: u64 = s.items[w[0] as usize..w[1] as usize].iter().map(|it| (it.kv_end - it.kv_start) as u64).sum();
                prop_assert!(load <= quota, "unit load {} over quota {}", load, quota);
            }
        }
    }
    Ok(())
}

/// A valid decode request and its batch: (params, seq_lens, block_table, max_pages, compute units).
fn valid_decode() -> impl Strategy<Value = (MlaDecodeParams, Vec<i32>, Vec<i32>, usize, u32)> {
    (
        (1..80usize, 0..20usize, any_format(), proptest::sample::select(vec![1usize, 64, 128])),
        (1..100usize, 1..=16usize, any_variant()),
        prop_oneof![
            Just(MlaSplitPolicy::Auto),
            (1..300u32).prop_map(MlaSplitPolicy::ComputeUnits),
            (1..10usize).prop_map(MlaSplitPolicy::NumSplits)
        ],
        proptest::collection::vec(0..300usize, 0..5),
        (0..3usize, 1..300u32, any::<u64>()),
    )
        .prop_map(|((latent, rope, format, page_size), (heads, q_len, variant), splits, extra, (spare, cus, seed))| {
            let seq_lens: Vec<i32> = extra.iter().map(|&e| (q_len + e) as i32).collect();
            let max_pages = seq_lens.iter().map(|&l| (l as usize).div_ceil(page_size)).max().unwrap_or(0) + spare;
            let num_pages = max_pages.max(1) + spare;
            let mut rng = TestRng::new(seed);
            let table: Vec<i32> = (0..seq_lens.len() * max_pages).map(|_| rng.below(num_pages) as i32).collect();
            let cache = MlaPagedCache { dims: KvDims { latent, rope }, format, page_size, num_pages, kv_scale: 0.25 };
            let p = MlaDecodeParams { cache, heads, q_len, softmax_scale: 0.1, variant, splits };
            (p, seq_lens, table, max_pages, cus)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary (mostly malformed) params and batch metadata: `Ok` or `Err`, never a panic;
    /// an `Ok` plan only for inputs that satisfy the contract.
    #[test]
    fn decode_plan_never_panics(
        cache in wild_cache(),
        heads in prop_oneof![0..40usize, Just(usize::MAX)],
        q_len in 0..20usize,
        scale in proptest::sample::select(vec![0.1f32, 0.0, -0.1, f32::NAN]),
        variant in any_variant(),
        splits in wild_splits(),
        seq_lens in proptest::collection::vec(-3..300i32, 0..5),
        max_pages in prop_oneof![0..8usize, Just(usize::MAX)],
        table_delta in -1..2i64,
        table_vals in proptest::collection::vec(-2..42i32, 0..64),
        cus in any::<u32>(),
    ) {
        let n = (seq_lens.len().saturating_mul(max_pages) as i64 + table_delta).clamp(0, 64) as usize;
        let table: Vec<i32> = (0..n).map(|i| table_vals.get(i).copied().unwrap_or(0)).collect();
        let p = MlaDecodeParams { cache, heads, q_len, softmax_scale: scale, variant, splits };
        let batch = MlaDecodeBatch { seq_lens: &seq_lens, block_table: &table, max_pages_per_seq: max_pages };
        if let Ok(plan) = MlaDecodePlan::new(&p, &batch, cus) {
            prop_assert!((1..=16).contains(&q_len) && heads >= 1 && scale > 0.0);
            prop_assert!(seq_lens.iter().all(|&l| l as usize >= q_len));
            let cus = match splits { MlaSplitPolicy::ComputeUnits(c) => c, _ => cus.clamp(1, 1 << 16) };
            check_schedule(&plan, cus)?;
        }
    }

    /// Valid requests plan (asm only for its q_lens) with a schedule that covers every key once;
    /// one corruption of the batch metadata is an error naming it.
    #[test]
    fn decode_plan_valid_and_corrupted((p, seq_lens, table, max_pages, cus) in valid_decode(), corrupt in 0..5usize, at in any::<usize>()) {
        let batch = MlaDecodeBatch { seq_lens: &seq_lens, block_table: &table, max_pages_per_seq: max_pages };
        let asm_can = [1, 2, 4].contains(&p.q_len) && !matches!(p.splits, MlaSplitPolicy::NumSplits(_));
        match MlaDecodePlan::new(&p, &batch, cus) {
            Ok(plan) => {
                prop_assert!(p.variant != MlaDecodeVariant::AsmStyle || asm_can);
                prop_assert_eq!(plan.kernel == MlaKernel::Asm, p.variant == MlaDecodeVariant::AsmStyle || (p.variant == MlaDecodeVariant::Auto && asm_can));
                let cus = match p.splits { MlaSplitPolicy::ComputeUnits(c) => c, _ => cus };
                check_schedule(&plan, cus)?;
            }
            Err(Error::Unsupported { reasons }) => prop_assert!(p.variant == MlaDecodeVariant::AsmStyle && !asm_can, "{:?}", reasons),
            Err(e) => prop_assert!(false, "valid request rejected: {}", e),
        }
        if seq_lens.is_empty() {
            return Ok(());
        }
        let b = at % seq_lens.len();
        let (mut lens, mut tab) = (seq_lens.clone(), table.clone());
        let field = match corrupt {
            0 => { lens[b] = p.q_len as i32 - 1; "batch.seq_lens" }
            1 => { lens[b] = (max_pages * p.cache.page_size + 1) as i32; "batch.seq_lens" }
            2 => { tab[b * max_pages] = if at % 2 == 0 { -1 } else { p.cache.num_pages as i32 }; "batch.block_table" }
            3 => { tab.push(0); "batch.block_table" }
            _ => { lens[b] = -1; "batch.seq_lens" }
        };
        let batch = MlaDecodeBatch { seq_lens: &lens, block_table: &tab, max_pages_per_seq: max_pages };
        let e = MlaDecodePlan::new(&MlaDecodeParams { variant: MlaDecodeVariant::GluonStyle, ..p.clone() }, &batch, cus);
        prop_assert_eq!(e.err().and_then(|e| e.field().map(str::to_string)), Some(field.to_string()));
    }

    /// Arbitrary prefill metadata: `Ok` or `Err`, never a panic; an `Ok` plan's items cover
    /// every query row of every head exactly once.
    #[test]
    fn prefill_plan_never_panics(
        cache in wild_cache(),
        heads in prop_oneof![0..40usize, Just(usize::MAX)],
        causal in any::<bool>(),
        cu in proptest::collection::vec(-2..200i32, 0..6),
        seq_lens in proptest::collection::vec(-2..300i32, 0..5),
        max_pages in 0..8usize,
        table_vals in proptest::collection::vec(-2..42i32, 0..40),
    ) {
        let n = (seq_lens.len() * max_pages).min(40);
        let table: Vec<i32> = (0..n).map(|i| table_vals.get(i).copied().unwrap_or(0)).collect();
        let p = MlaPrefillAbsorbedParams { cache, heads, softmax_scale: 0.1, causal };
        let batch = MlaPrefillAbsorbedBatch { cu_seqlens_q: &cu, seq_lens: &seq_lens, block_table: &table, max_pages_per_seq: max_pages };
        if let Ok(plan) = MlaPrefillAbsorbedPlan::new(&p, &batch) {
            let mut seen = vec![0u32; plan.total_q * plan.head_groups];
            for it in &plan.items {
                prop_assert!(it.q_end - it.q_start <= 64);
                for r in it.q_start..it.q_end {
                    seen[r as usize * plan.head_groups + it.head_group as usize] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&c| c == 1), "every (row, head group) once");
        }
    }
}

/// A small valid decode case uploaded to the CPU backend.
#[derive(Debug)]
struct CpuCase {
    c: PagedCase,
    q: Vec<f32>,
    heads: usize,
    q_len: usize,
}

impl CpuCase {
    fn new(seed: u64, fmt: KvCacheFormat, page_size: usize, heads: usize, q_len: usize) -> Self {
        let mut rng = TestRng::new(seed);
        let dims = KvDims { latent: 8 + rng.below(24), rope: rng.below(9) };
        let lens: Vec<i32> = (0..1 + rng.below(3)).map(|_| (q_len + rng.below(40)) as i32).collect();
        let c = PagedCase::new(&mut rng, fmt, dims, page_size, &lens, 2.0);
        let q = rng.normals(lens.len() * q_len * heads * dims.width(), 1.0);
        CpuCase { c, q, heads, q_len }
    }

    fn params(&self, variant: MlaDecodeVariant, splits: MlaSplitPolicy) -> MlaDecodeParams {
        let c = &self.c;
        MlaDecodeParams {
            cache: MlaPagedCache { dims: c.dims, format: c.format, page_size: c.page_size, num_pages: c.num_pages, kv_scale: c.kv_scale },
            heads: self.heads,
            q_len: self.q_len,
            softmax_scale: 0.3,
            variant,
            splits,
        }
    }

    /// Runs with device tensors built from `table`/`lens` (which may differ from the plan's)
    /// and the given dtypes; returns (out, lse) or the error.
    fn run(&self, p: &MlaDecodeParams, table: &[i32], lens: &[i32], q_dt: DType, out_dt: DType) -> Result<(Vec<f32>, Vec<f32>), Error> {
        let cpu = CpuBackend::new();
        let c = &self.c;
        let n = c.seq_lens.len();
        let plan = MlaDecode::plan(
            &cpu,
            p,
            &MlaDecodeBatch { seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages },
        )?;
        let q = cpu.upload_tensor(&HostTensor::from_f32(q_dt, &[n, self.q_len, self.heads, c.dims.width()], &self.q)?)?;
        let bpt = c.format.bytes_per_token(c.dims);
        let cache = cpu.upload_tensor(&HostTensor::from_bytes(DType::U8, &[c.num_pages, c.page_size, bpt], c.bytes.clone())?)?;
        let table = cpu.upload_tensor(&HostTensor::from_i32(&[n, c.max_pages], table)?)?;
        let lens = cpu.upload_tensor(&HostTensor::from_i32(&[n], lens)?)?;
        let mut out = cpu.zeros(out_dt, &[n, self.q_len, self.heads, c.dims.latent])?;
        let mut lse = cpu.zeros(DType::F32, &[n, self.q_len, self.heads])?;
        let mut ws = cpu.alloc_zeroed(MlaDecode::workspace_size(&cpu, &plan))?;
        let args = MlaDecodeArgs {
            q: q.as_ref(),
            kv_cache: cache.as_ref(),
            block_table: table.as_ref(),
            seq_lens: lens.as_ref(),
            out: out.as_mut(),
            lse: Some(lse.as_mut()),
        };
        MlaDecode::run(&cpu, &plan, args, Some(&mut ws), cpu.default_stream())?;
        Ok((cpu.download_tensor(&out)?.to_f32(), cpu.download_tensor(&lse)?.to_f32()))
    }
}

fn small_case() -> impl Strategy<Value = CpuCase> {
    (any::<u64>(), any_format(), proptest::sample::select(vec![1usize, 64, 128]), 1..40usize, proptest::sample::select(vec![1usize, 2, 4]))
        .prop_map(|(seed, fmt, ps, heads, q_len)| CpuCase::new(seed, fmt, ps, heads, q_len))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// CPU: asm partitions over any number of units and Gluon with any split count give the same
    /// result as one unsplit item per (sequence, head group) (Tolerance::F32: the same partials,
    /// merged in another order).
    #[test]
    fn cpu_partitions_agree(case in small_case(), cus in 1..200u32, splits in 1..9usize) {
        let c = &case.c;
        let run = |v, s| case.run(&case.params(v, s), &c.block_table, &c.seq_lens, DType::F32, DType::F32);
        let (o1, l1) = run(MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(1)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (v, s) in [(MlaDecodeVariant::AsmStyle, MlaSplitPolicy::ComputeUnits(cus)), (MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(splits))] {
            let (o, l) = run(v, s).map_err(|e| TestCaseError::fail(e.to_string()))?;
            check_close("out", &o, &o1, Tolerance::F32).map_err(TestCaseError::fail)?;
            check_close("lse", &l, &l1, Tolerance::F32).map_err(TestCaseError::fail)?;
        }
    }

    /// CPU: device metadata that differs from the planned batch (a used page id out of range,
    /// other seq_lens) and tensors of the wrong dtype are errors naming the field, not panics.
    #[test]
    fn cpu_run_rechecks_device_metadata(case in small_case(), at in any::<usize>(), bad_page in prop_oneof![Just(-1i32), 1000..2000i32], dt in 0..4usize) {
        let c = &case.c;
        let p = case.params(MlaDecodeVariant::Auto, MlaSplitPolicy::ComputeUnits(7));
        let b = at % c.seq_lens.len();
        let mut table = c.block_table.clone();
        table[b * c.max_pages + (at / 7) % (c.seq_lens[b] as usize).div_ceil(c.page_size)] = bad_page;
        let e = case.run(&p, &table, &c.seq_lens, DType::F32, DType::F32).expect_err("bad device page id");
        prop_assert_eq!(e.field(), Some("block_table"));
        let mut lens = c.seq_lens.clone();
        lens[b] += 1;
        let e = case.run(&p, &c.block_table, &lens, DType::F32, DType::F32).expect_err("other seq_lens");
        prop_assert_eq!(e.field(), Some("seq_lens"));
        let (q_dt, out_dt, field) = [(DType::F16, DType::F32, "q"), (DType::I32, DType::F32, "q"), (DType::F32, DType::F16, "out"), (DType::F32, DType::U8, "out")][dt];
        let e = case.run(&p, &c.block_table, &c.seq_lens, q_dt, out_dt).expect_err("bad dtype");
        prop_assert_eq!(e.field(), Some(field));
    }
}

/// CPU: prefill device cu_seqlens / seq_lens that differ from the plan are errors.
#[test]
fn cpu_prefill_rechecks_device_metadata() {
    let cpu = CpuBackend::new();
    let mut rng = TestRng::new(5);
    let dims = KvDims { latent: 16, rope: 4 };
    let c = PagedCase::new(&mut rng, KvCacheFormat::Bf16, dims, 64, &[10, 6], 1.0);
    let cu = [0, 3, 5];
    let p = MlaPrefillAbsorbedParams {
        cache: MlaPagedCache { dims, format: c.format, page_size: 64, num_pages: c.num_pages, kv_scale: 1.0 },
        heads: 3,
        softmax_scale: 0.3,
        causal: true,
    };
    let plan = MlaPrefillAbsorbed::plan(
        &cpu,
        &p,
        &MlaPrefillAbsorbedBatch { cu_seqlens_q: &cu, seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages },
    )
    .unwrap();
    for (dev_cu, dev_lens, field) in [([0, 2, 5], [10, 6], "cu_seqlens_q"), ([0, 3, 5], [10, 5], "seq_lens")] {
        let up = |shape: &[usize], v: &[i32]| cpu.upload_tensor(&HostTensor::from_i32(shape, v).unwrap()).unwrap();
        let q = cpu.zeros(DType::F32, &[5, 3, dims.width()]).unwrap();
        let cache =
            cpu.upload_tensor(&HostTensor::from_bytes(DType::U8, &[c.num_pages, 64, 2 * dims.width()], c.bytes.clone()).unwrap()).unwrap();
        let (cu_t, lens_t, table_t) = (up(&[3], &dev_cu), up(&[2], &dev_lens), up(&[2, c.max_pages], &c.block_table));
        let mut out = cpu.zeros(DType::F32, &[5, 3, dims.latent]).unwrap();
        let args = MlaPrefillAbsorbedArgs {
            q: q.as_ref(),
            kv_cache: cache.as_ref(),
            cu_seqlens_q: cu_t.as_ref(),
            seq_lens: lens_t.as_ref(),
            block_table: table_t.as_ref(),
            out: out.as_mut(),
            lse: None,
        };
        let e = MlaPrefillAbsorbed::run(&cpu, &plan, args, None, cpu.default_stream()).unwrap_err();
        assert_eq!(e.field(), Some(field), "{e}");
    }
}
