//! Bad device metadata for the MLA ops: slot mappings of the cache write; sequence lengths and
//! block tables of the decode (both variants) and of the absorbed prefill; cu_seqlens of the
//! ragged prefill.

use super::{assert_rejected, cases, offsets, outside, rejected_or_ok, run_synced, upload_i32, upload_index, Tally};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::conformance::mla_decode::oracle::PagedCase;
use crate::conformance::mla_decode::Decode;
use crate::conformance::{download_f32, upload_f32, TestRng};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::kv_cache::{encode_token, Fp8Flavor, KvCacheFormat, KvDims};
use crate::ops::mla_decode::{
    MlaDecode, MlaDecodeBatch, MlaDecodeParams, MlaDecodeVariant, MlaPagedCache, MlaPrefillAbsorbed,
    MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaSplitPolicy,
};
use crate::ops::{
    MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams, MlaPrefill, MlaPrefillArgs, MlaPrefillBatch,
    MlaPrefillParams,
};
use crate::ops::tensor_ops::{CopyCast, CopyCastArgs, ElementwiseParams};
use crate::tensor::{HostTensor, TensorMut};

const DIMS: KvDims = KvDims { latent: 32, rope: 8 };
const FORMATS: [KvCacheFormat; 3] =
    [KvCacheFormat::Bf16, KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn), KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fnuz)];

// ---- cache write -------------------------------------------------------------------------------

fn cache_write_params(format: KvCacheFormat, num_pages: usize, page_size: usize) -> MlaCacheWriteParams {
    MlaCacheWriteParams { dims: DIMS, num_pages, page_size, format, kv_scale: 1.0 }
}

/// The cache bytes after writing `kv` rows with `device_slots` under a plan of `planned` slots.
fn cache_write_with<B: Backend + MlaCacheWrite>(
    b: &B,
    p: &MlaCacheWriteParams,
    planned: &[i64],
    device_slots: &[i64],
    wide: bool,
    kv: &[f32],
    before: &[u8],
) -> (Result<()>, Vec<u8>) {
    let n = planned.len();
    let plan = MlaCacheWrite::plan(b, p, &MlaCacheWriteBatch { slot_mapping: planned.to_vec() }).expect("plan of valid slots");
    let kv_t = upload_f32(b, DType::F32, &[n, DIMS.width()], kv).expect("kv");
    let slots = upload_index(b, &[n], device_slots, wide);
    let bpt = p.format.bytes_per_token(DIMS);
    let t = HostTensor::from_bytes(DType::U8, &[p.num_pages, p.page_size, bpt], before.to_vec()).expect("cache");
    let mut cache = b.upload_tensor(&t).expect("cache");
    let r = run_synced(b, || {
        let args = MlaCacheWriteArgs { kv: kv_t.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
        MlaCacheWrite::run(b, &plan, args, None, b.default_stream())
    });
    let mut after = vec![0u8; before.len()];
    b.download(&cache.buf, &mut after).expect("download cache");
    (r, after)
}

/// A device slot of 1,000,000 (and the i32 / i64 extremes) in a 4-page cache.
pub fn mla_cache_write_device_slot_out_of_range<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(0x5107);
    for format in FORMATS {
        let p = cache_write_params(format, 4, 2);
        let bytes = 4 * 2 * format.bytes_per_token(DIMS);
        let before: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
        let kv = rng.normals(3 * DIMS.width(), 1.0);
        for (slots, wide) in [(vec![0, 1_000_000, 2], false), (vec![8, 1, 2], false), (vec![0, i32::MAX as i64, 2], false), (vec![0, 1, i64::MAX], true)] {
            let (r, _) = cache_write_with(b, &p, &[0, 1, 2], &slots, wide, &kv, &before);
            assert_rejected(r, "slot_mapping", format!("{} cache, device slots {slots:?}", format.name()));
        }
    }
}

/// Two tokens with one device slot (the plan's host slots were distinct) is a caller error that
/// the GPU kernels do not look for (it would cost a pass over the batch per token): the CPU
/// reference rejects it, a GPU backend writes both rows to the slot. What the test pins down for
/// a GPU backend: every other row keeps its bytes and each byte of the shared row comes from one
/// of the two tokens' encodings.
pub fn mla_cache_write_duplicate_device_slot<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(0x5108);
    for format in FORMATS {
        let p = cache_write_params(format, 3, 2);
        let bpt = format.bytes_per_token(DIMS);
        let before: Vec<u8> = (0..3 * 2 * bpt).map(|_| rng.next_u64() as u8).collect();
        let kv = rng.normals(3 * DIMS.width(), 1.0);
        let (r, after) = cache_write_with(b, &p, &[0, 1, 2], &[5, 5, 2], false, &kv, &before);
        if rejected_or_ok(r, "slot_mapping", "device slots [5, 5, 2]") {
            continue;
        }
        let token = |t: usize| {
            let mut out = vec![0u8; bpt];
            encode_token(format, DIMS, &kv[t * DIMS.width()..(t + 1) * DIMS.width()], 1.0, &mut out).expect("encode");
            out
        };
        let row = |s: usize| s * bpt..(s + 1) * bpt;
        for s in [0, 1, 3, 4] {
            assert_eq!(after[row(s)], before[row(s)], "{}: row {s} was not written by any token", format.name());
        }
        assert_eq!(after[row(2)], token(2)[..], "{}: token 2 owns slot 2", format.name());
        let (t0, t1) = (token(0), token(1));
        for (i, &got) in after[row(5)].iter().enumerate() {
            assert!(got == t0[i] || got == t1[i], "{}: byte {i} of the shared slot is neither token's", format.name());
        }
    }
}

/// Random caches and batches with random slots pushed past the cache.
pub fn mla_cache_write_generated_bad_slots<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(0x5109);
    let mut tally = Tally::new(b, "mla_cache_write slot_mapping");
    for case in 0..cases(1600) {
        let format = FORMATS[rng.below(3)];
        let p = cache_write_params(format, 1 + rng.below(4), [1, 2, 3][rng.below(3)]);
        let total = p.num_pages * p.page_size;
        let n = 1 + rng.below(total);
        let perm = rng.permutation(total);
        let planned: Vec<i64> = perm[..n].iter().map(|&s| s as i64).collect();
        let wide = rng.below(2) == 1;
        let mut device = planned.clone();
        for _ in 0..1 + rng.below(n) {
            let at = rng.below(n);
            // Past the cache: negative slots are padding, not errors.
            device[at] = outside(&mut rng, i64::MIN, total as i64, wide);
        }
        let before = vec![0x5Au8; total * format.bytes_per_token(DIMS)];
        let kv = vec![0.5f32; n * DIMS.width()];
        let (r, _) = cache_write_with(b, &p, &planned, &device, wide, &kv, &before);
        assert_rejected(r, "slot_mapping", format!("case {case}: {p:?} planned {planned:?} device {device:?}"));
        tally.cases += 1;
    }
}

// ---- decode ------------------------------------------------------------------------------------

fn decode_params(c: &PagedCase, heads: usize, q_len: usize, variant: MlaDecodeVariant, splits: MlaSplitPolicy) -> MlaDecodeParams {
    MlaDecodeParams {
        cache: MlaPagedCache { dims: c.dims, format: c.format, page_size: c.page_size, num_pages: c.num_pages, kv_scale: c.kv_scale },
        heads,
        q_len,
        softmax_scale: 0.25,
        variant,
        splits,
    }
}

/// Plans a decode of `c` as it is, runs it with the given device seq_lens and block table, and
/// returns the outcome with the output and LSE.
fn decode_with<B: Backend + MlaDecode>(b: &B, c: &PagedCase, p: &MlaDecodeParams, lens: &[i32], table: &[i32]) -> (Result<()>, Vec<f32>, Vec<f32>) {
    let batch = MlaDecodeBatch { seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages };
    let plan = MlaDecode::plan(b, p, &batch).expect("plan of a valid batch");
    let n = c.seq_lens.len();
    let mut d = Decode::new(b, c, p, &vec![0.125; n * p.q_len * p.heads * c.dims.width()], DType::F32, DType::F32);
    (d.table, d.lens) = (upload_i32(b, &[n, c.max_pages], table), upload_i32(b, &[n], lens));
    let mut ws = b.workspace(MlaDecode::workspace_size(b, &plan)).expect("workspace");
    let r = run_synced(b, || MlaDecode::run(b, &plan, d.args(), ws.as_mut(), b.default_stream()));
    (r, download_f32(b, &d.out).expect("out"), download_f32(b, &d.lse).expect("lse"))
}

const VARIANTS: [(MlaDecodeVariant, MlaSplitPolicy); 3] = [
    (MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(1)),
    (MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(3)),
    (MlaDecodeVariant::AsmStyle, MlaSplitPolicy::ComputeUnits(5)),
];

/// Device seq_lens beyond the block table's capacity, negative, or shorter than q_len are
/// rejected by every variant. A length above the planned one that stays inside the sequence's
/// pages is either rejected or computed as a batch of those lengths (Gluon kernels read the
/// length per sequence; the asm schedule finds that its counts differ from the plan's).
pub fn mla_decode_device_seq_lens_beyond_plan<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x5200);
    // 70 and 10 tokens in 64-token pages: 2 + 1 pages, one spare column (capacity 192).
    let c = PagedCase::new(&mut rng, KvCacheFormat::Bf16, DIMS, 64, &[70, 10], 1.0);
    let cap = (c.max_pages * c.page_size) as i32;
    for (variant, splits) in VARIANTS {
        let p = decode_params(&c, 20, 2, variant, splits);
        for bad in [cap + 1, 1_000_000, i32::MAX, -5, 1] {
            let (r, _, _) = decode_with(b, &c, &p, &[70, bad], &c.block_table);
            assert_rejected(r, "seq_lens", format!("{variant:?} {splits:?}: device seq_lens [70, {bad}]"));
        }
        // 100 > 70 planned, still inside sequence 0's two pages.
        let (r, out, lse) = decode_with(b, &c, &p, &[100, 10], &c.block_table);
        if !rejected_or_ok(r, "seq_lens", format!("{variant:?}: device seq_lens [100, 10]")) {
            let mut longer = c.clone();
            longer.seq_lens[0] = 100;
            let (r2, want_out, want_lse) = decode_with(b, &longer, &p, &[100, 10], &c.block_table);
            r2.expect("the same batch planned with its real lengths");
            // Bit for bit (the unwritten cache rows are random bytes: NaN can appear in both).
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&out) == bits(&want_out), "{variant:?}: accepted device lengths must give the result of those lengths");
            assert!(bits(&lse) == bits(&want_lse), "{variant:?}: LSE of the accepted device lengths");
        }
    }
}

/// Block-table entries of used pages set to 100,000, -1 and i32::MIN.
pub fn mla_decode_device_block_table_out_of_range<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x5201);
    let c = PagedCase::new(&mut rng, KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), DIMS, 64, &[70, 10], 1.0);
    for (variant, splits) in VARIANTS {
        let p = decode_params(&c, 12, 1, variant, splits);
        for (at, bad) in [(1, 100_000), (0, -1), (c.max_pages, i32::MIN), (1, c.num_pages as i32)] {
            let mut table = c.block_table.clone();
            table[at] = bad;
            let (r, _, _) = decode_with(b, &c, &p, &c.seq_lens, &table);
            assert_rejected(r, "block_table", format!("{variant:?} {splits:?}: block_table entry {at} = {bad}"));
        }
        // Entries past a sequence's pages are never read: garbage there is fine.
        let mut table = c.block_table.clone();
        table[c.max_pages - 1] = i32::MIN;
        decode_with(b, &c, &p, &c.seq_lens, &table).0.expect("unused block-table entries are not read");
    }
}

/// A bad block-table entry beyond the first 256 pages of one block's keys: the GPU kernels check
/// an item's pages in passes of the block's threads, so only a sequence of more pages than a
/// block has threads, in one split or one work item, reaches the second and third passes. 600
/// one-token pages; entries 300 and 599 (pages 44 and 87 of the later passes at 256 threads).
pub fn mla_decode_device_block_table_in_a_later_pass<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x5203);
    let c = PagedCase::new(&mut rng, KvCacheFormat::Bf16, DIMS, 1, &[600], 1.0);
    let one_block = [
        (MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(1)),
        (MlaDecodeVariant::AsmStyle, MlaSplitPolicy::ComputeUnits(1)),
    ];
    for (variant, splits) in one_block {
        let p = decode_params(&c, 4, 1, variant, splits);
        for at in [300, 599] {
            let mut table = c.block_table.clone();
            table[at] = c.num_pages as i32;
            let (r, _, _) = decode_with(b, &c, &p, &c.seq_lens, &table);
            assert_rejected(r, "block_table", format!("{variant:?} {splits:?}: block_table entry {at} of 600"));
        }
        decode_with(b, &c, &p, &c.seq_lens, &c.block_table).0.expect("the intact table");
    }
}

/// Random small decodes with a used block-table entry or a sequence length corrupted.
pub fn mla_decode_generated_bad_metadata<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x5202);
    let mut tally = Tally::new(b, "mla_decode seq_lens / block_table");
    let mut case = 0;
    while case < cases(600) {
        let page_size = [1, 64][rng.below(2)];
        let q_len = [1, 2, 4][rng.below(3)];
        let n = 1 + rng.below(2);
        let lens: Vec<i32> = (0..n).map(|_| (q_len + rng.below(80)) as i32).collect();
        let format = FORMATS[rng.below(3)];
        let c = PagedCase::new(&mut rng, format, DIMS, page_size, &lens, 1.0);
        let (variant, splits) = VARIANTS[rng.below(3)];
        let p = decode_params(&c, 1 + rng.below(16), q_len, variant, splits);
        // Several corruptions of one batch (the cache is the expensive part to build).
        for _ in 0..8 {
            let (mut lens, mut table) = (c.seq_lens.clone(), c.block_table.clone());
            let s = rng.below(n);
            let field = if rng.below(2) == 0 {
                let used = (c.seq_lens[s] as usize).div_ceil(page_size);
                table[s * c.max_pages + rng.below(used)] = outside(&mut rng, 0, c.num_pages as i64, false) as i32;
                "block_table"
            } else {
                lens[s] = outside(&mut rng, q_len as i64, (c.max_pages * page_size) as i64 + 1, false) as i32;
                "seq_lens"
            };
            let (r, _, _) = decode_with(b, &c, &p, &lens, &table);
            assert_rejected(r, field, format!("case {case}: {variant:?} {splits:?} q_len {q_len} planned {:?} device lens {lens:?}", c.seq_lens));
            tally.cases += 1;
            case += 1;
        }
    }
}

/// One i32 of the workspace overwritten with the bits of `value` through `CopyCast` (an f32 copy:
/// the values used are normal floats, so the copy keeps their bits), as another op writing into a
/// shared workspace between `prepare_schedule` and `run_prepared` would.
fn overwrite_i32<B: Backend + CopyCast>(b: &B, ws: &mut B::Buffer, byte_offset: usize, value: i32) -> Result<()> {
    let x = upload_f32(b, DType::F32, &[1], &[f32::from_bits(value as u32)])?;
    let mut layout = crate::tensor::Layout::contiguous(DType::F32, &[1]);
    layout.offset = byte_offset / 4;
    let plan = CopyCast::plan(b, &ElementwiseParams { shape: vec![1] })?;
    CopyCast::run(b, &plan, CopyCastArgs { x: x.as_ref(), out: TensorMut { buf: ws, layout } }, b.default_stream())?;
    b.synchronize(b.default_stream())
}

/// A prepared asm schedule whose workspace bytes were overwritten before `run_prepared` (a
/// cu_indptr entry, each column of a work item, each column of a reduce entry, with a large and
/// a negative value): GPU kernels reject it with an error naming `workspace`; a backend that
/// keeps the schedule elsewhere (the CPU reference executes its host copy) gives the result of
/// the intact schedule. Either way nothing outside the tensors is touched.
pub fn mla_decode_prepared_schedule_overwritten<B: Backend + MlaDecode + CopyCast>(b: &B) {
    let mut rng = TestRng::new(0x5203);
    let c = PagedCase::new(&mut rng, KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), DIMS, 64, &[150, 90, 120], 1.0);
    let p = decode_params(&c, 20, 1, MlaDecodeVariant::AsmStyle, MlaSplitPolicy::ComputeUnits(6));
    let n = c.seq_lens.len();
    let batch = MlaDecodeBatch { seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages };
    let plan = MlaDecode::plan(b, &p, &batch).expect("plan of a valid batch");
    let s = &plan.schedule;
    assert!(!s.reduce.is_empty() && s.items.len() > 1, "the case must split sequences: {s:?}");
    let q = rng.normals(n * p.heads * c.dims.width(), 1.0);
    let mut ws = b.alloc_zeroed(MlaDecode::workspace_size(b, &plan)).expect("workspace");
    let run = |ws: &mut B::Buffer, corrupt: Option<(usize, i32)>| -> (Result<()>, Vec<f32>, Vec<f32>) {
        let mut d = Decode::new(b, &c, &p, &q, DType::F32, DType::F32);
        let prepared = MlaDecode::prepare_schedule(b, &plan, &d.lens.as_ref(), Some(&mut *ws), b.default_stream()).expect("prepare_schedule");
        if let Some((at, v)) = corrupt {
            overwrite_i32(b, ws, at, v).expect("overwrite");
        }
        let r = run_synced(b, || MlaDecode::run_prepared(b, &plan, &prepared, d.args(), Some(&mut *ws), b.default_stream()));
        (r, download_f32(b, &d.out).expect("out"), download_f32(b, &d.lse).expect("lse"))
    };
    let (r, want, want_lse) = run(&mut ws, None);
    r.expect("the intact schedule");
    let (items, cu_indptr, reduce) = plan.schedule_arrays();
    let mut targets = vec![("cu_indptr[1]", cu_indptr + 4)];
    let w = s.items.len() - 1;
    for (col, name) in ["batch x head groups + head group", "kv_start", "kv_end", "slot"].iter().enumerate() {
        targets.push((name, items + 16 * w + 4 * col));
    }
    for (col, name) in ["reduce batch", "reduce head group", "reduce first slot", "reduce count"].iter().enumerate() {
        targets.push((name, reduce + 4 * col));
    }
    // 1e6 and -1.0 as f32 bits: 1232348160 and -1082130432.
    for (what, at) in targets {
        for v in [1e6f32.to_bits() as i32, (-1.0f32).to_bits() as i32] {
            let (r, out, lse) = run(&mut ws, Some((at, v)));
            let case = format!("{what} (workspace byte {at}) = {v}");
            if !rejected_or_ok(r, "workspace", &case) {
                assert!(out == want && lse == want_lse, "{case}: accepted, so it must give the intact schedule's result");
            }
        }
    }
}

// ---- absorbed prefill --------------------------------------------------------------------------

/// Plans an absorbed prefill of `c` with `q_lens` queries per sequence and runs it with the given
/// device metadata.
fn absorbed_with<B: Backend + MlaPrefillAbsorbed>(b: &B, c: &PagedCase, q_lens: &[i32], causal: bool, cu: &[i32], lens: &[i32], table: &[i32]) -> Result<()> {
    let n = c.seq_lens.len();
    let planned_cu = offsets_i32(q_lens);
    let total_q = planned_cu[n] as usize;
    let p = MlaPrefillAbsorbedParams {
        cache: MlaPagedCache { dims: c.dims, format: c.format, page_size: c.page_size, num_pages: c.num_pages, kv_scale: c.kv_scale },
        heads: 3,
        softmax_scale: 0.25,
        causal,
    };
    let batch = MlaPrefillAbsorbedBatch { cu_seqlens_q: &planned_cu, seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages };
    let plan = MlaPrefillAbsorbed::plan(b, &p, &batch).expect("plan of a valid batch");
    let q = upload_f32(b, DType::F32, &[total_q, 3, c.dims.width()], &vec![0.125; total_q * 3 * c.dims.width()]).expect("q");
    let t = HostTensor::from_bytes(DType::U8, &[c.num_pages, c.page_size, c.format.bytes_per_token(c.dims)], c.bytes.clone());
    let cache = b.upload_tensor(&t.expect("cache")).expect("cache");
    let (cu_t, lens_t, table_t) = (upload_i32(b, &[n + 1], cu), upload_i32(b, &[n], lens), upload_i32(b, &[n, c.max_pages], table));
    let mut out = b.zeros(DType::F32, &[total_q, 3, c.dims.latent]).expect("out");
    let mut ws = b.workspace(MlaPrefillAbsorbed::workspace_size(b, &plan)).expect("workspace");
    run_synced(b, || {
        let args = MlaPrefillAbsorbedArgs {
            q: q.as_ref(),
            kv_cache: cache.as_ref(),
            cu_seqlens_q: cu_t.as_ref(),
            seq_lens: lens_t.as_ref(),
            block_table: table_t.as_ref(),
            out: out.as_mut(),
            lse: None,
        };
        MlaPrefillAbsorbed::run(b, &plan, args, ws.as_mut(), b.default_stream())
    })
}

/// Random absorbed prefills with cu_seqlens_q, seq_lens or a used block-table entry corrupted.
/// Only entries some block reads are corrupted: a sequence without queries runs no block.
pub fn mla_prefill_absorbed_generated_bad_metadata<B: Backend + MlaPrefillAbsorbed>(b: &B) {
    let mut rng = TestRng::new(0x5203);
    let mut tally = Tally::new(b, "mla_prefill_absorbed cu_seqlens_q / seq_lens / block_table");
    let mut case = 0;
    while case < cases(400) {
        let n = 1 + rng.below(3);
        let q_lens: Vec<i32> = (0..n).map(|_| 1 + rng.below(5) as i32).collect();
        let lens: Vec<i32> = q_lens.iter().map(|&q| q + rng.below(70) as i32).collect();
        let (format, page_size) = (FORMATS[rng.below(3)], [1, 64][rng.below(2)]);
        let c = PagedCase::new(&mut rng, format, DIMS, page_size, &lens, 1.0);
        let causal = rng.below(2) == 0;
        let planned_cu = offsets_i32(&q_lens);
        let total_q = planned_cu[n] as i64;
        let max_q = *q_lens.iter().max().unwrap_or(&0) as i64;
        for _ in 0..6 {
            let (mut cu, mut dl, mut table) = (planned_cu.clone(), c.seq_lens.clone(), c.block_table.clone());
            let s = rng.below(n);
            let field = match rng.below(3) {
                0 => {
                    // An end past the queries, before the start, or past the grid's rows.
                    cu[s + 1] = match rng.below(3) {
                        0 => outside(&mut rng, 0, total_q + 1, false) as i32,
                        1 => cu[s] - 1 - rng.below(5) as i32,
                        _ => (cu[s] as i64 + max_q + 1 + rng.below(4) as i64) as i32,
                    };
                    "cu_seqlens_q"
                }
                1 => {
                    let lo = if causal { q_lens[s] as i64 } else { 0 };
                    dl[s] = outside(&mut rng, lo, (c.max_pages * c.page_size) as i64 + 1, false) as i32;
                    "seq_lens"
                }
                _ => {
                    let used = (c.seq_lens[s] as usize).div_ceil(c.page_size);
                    table[s * c.max_pages + rng.below(used)] = outside(&mut rng, 0, c.num_pages as i64, false) as i32;
                    "block_table"
                }
            };
            let r = absorbed_with(b, &c, &q_lens, causal, &cu, &dl, &table);
            assert_rejected(r, field, format!("case {case}: causal {causal} q_lens {q_lens:?} lens {:?}: device cu {cu:?} lens {dl:?}", c.seq_lens));
            tally.cases += 1;
            case += 1;
        }
    }
}

/// [`offsets`] as i32 (the absorbed prefill's index dtype).
fn offsets_i32(lens: &[i32]) -> Vec<i32> {
    offsets(&lens.iter().map(|&l| l as usize).collect::<Vec<_>>()).into_iter().map(|x| x as i32).collect()
}

// ---- ragged prefill ----------------------------------------------------------------------------

fn prefill_with<B: Backend + MlaPrefill>(b: &B, q_lens: &[usize], kv_lens: Option<&[usize]>, cu: &[i64], cu_k: Option<&[i64]>, wide: bool) -> Result<()> {
    let p = MlaPrefillParams { heads: 2, qk_dim: 8, v_dim: 4, softmax_scale: 0.3, causal: kv_lens.is_none() };
    let batch = match kv_lens {
        Some(k) => MlaPrefillBatch::with_kv_lens(q_lens, k),
        None => MlaPrefillBatch::from_seq_lens(q_lens),
    };
    let plan = MlaPrefill::plan(b, &p, &batch).expect("plan of a valid batch");
    let t = batch.total_tokens;
    let tk = batch.kv.as_ref().map_or(t, |k| k.total_kv_tokens);
    let n = q_lens.len();
    let up = |rows: usize, d: usize| upload_f32(b, DType::F32, &[rows, 2, d], &vec![0.5; rows * 2 * d]).expect("input");
    let (q, k, v) = (up(t, 8), up(tk, 8), up(tk, 4));
    let cu_t = upload_index(b, &[n + 1], cu, wide);
    let cu_k_t: Option<DeviceTensor<B>> = cu_k.map(|c| upload_index(b, &[n + 1], c, wide));
    let mut out = b.zeros(DType::F32, &[t, 2, 4]).expect("out");
    let mut ws = b.workspace(MlaPrefill::workspace_size(b, &plan)).expect("workspace");
    run_synced(b, || {
        let args = MlaPrefillArgs {
            q: q.as_ref(),
            k: k.as_ref(),
            v: v.as_ref(),
            cu_seqlens: cu_t.as_ref(),
            cu_seqlens_k: cu_k_t.as_ref().map(DeviceTensor::as_ref),
            out: out.as_mut(),
            lse: None,
        };
        MlaPrefill::run(b, &plan, args, ws.as_mut(), b.default_stream())
    })
}

/// The hostile run's cu_seqlens: `[0, 4, 100000]` and `[0, -100000, 10]` for a [4, 6] batch, and
/// a key-side entry past the keys.
pub fn mla_prefill_device_cu_seqlens_out_of_range<B: Backend + MlaPrefill>(b: &B) {
    for wide in [false, true] {
        for cu in [[0i64, 4, 100_000], [0, -100_000, 10], [0, 7, 10]] {
            assert_rejected(prefill_with(b, &[4, 6], None, &cu, None, wide), "cu_seqlens", format!("device cu_seqlens {cu:?}"));
        }
        let r = prefill_with(b, &[4, 6], Some(&[5, 9]), &[0, 4, 10], Some(&[0, 5, 100_000]), wide);
        assert_rejected(r, "cu_seqlens_k", "device cu_seqlens_k [0, 5, 100000]");
    }
}

/// Random ragged prefills with a query or key offset corrupted.
pub fn mla_prefill_generated_bad_cu_seqlens<B: Backend + MlaPrefill>(b: &B) {
    let mut rng = TestRng::new(0x5204);
    let mut tally = Tally::new(b, "mla_prefill cu_seqlens");
    for case in 0..cases(900) {
        let n = 1 + rng.below(3);
        let q_lens: Vec<usize> = (0..n).map(|_| 1 + rng.below(20)).collect();
        let kv_lens: Option<Vec<usize>> = (rng.below(2) == 0).then(|| (0..n).map(|_| rng.below(20)).collect());
        let (mut cu, mut cu_k) = (offsets(&q_lens), kv_lens.as_deref().map(offsets));
        let total_q = cu[n];
        let max_q = *q_lens.iter().max().unwrap_or(&0) as i64;
        let wide = rng.below(2) == 1;
        let e = rng.below(n + 1);
        let field = match &mut cu_k {
            Some(k) if rng.below(2) == 0 => {
                let total_k = k[n];
                k[e] = outside(&mut rng, 0, total_k + 1, wide);
                "cu_seqlens_k"
            }
            _ => {
                cu[e] = if e > 0 && rng.below(2) == 0 {
                    // Within range but more queries than the grid holds, or decreasing.
                    [cu[e - 1] + max_q + 1, cu[e - 1] - 1][rng.below(2)]
                } else {
                    outside(&mut rng, 0, total_q + 1, wide)
                };
                "cu_seqlens"
            }
        };
        let r = prefill_with(b, &q_lens, kv_lens.as_deref(), &cu, cu_k.as_deref(), wide);
        assert_rejected(r, field, format!("case {case}: q_lens {q_lens:?} kv_lens {kv_lens:?}: device cu {cu:?} cu_k {cu_k:?}"));
        tally.cases += 1;
    }
}
