//! Conformance tests of [`crate::ops::MlaPrefillAbsorbed`] (ragged absorbed attention over the
//! paged cache).

use super::oracle::{absorbed_attention, PagedCase};
use super::{decode, params, Fp8Flavor, FN, FNUZ};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::conformance::{download_f32, round_through, upload_f32, TestRng};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::kv_cache::{KvCacheFormat, KvDims};
use crate::ops::mla_decode::{
    MlaDecode, MlaDecodeVariant, MlaPagedCache, MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaSplitPolicy,
};
use crate::tensor::HostTensor;
use crate::tolerance::{assert_close, Tolerance};

/// A ragged batch: per-sequence query counts over a paged cache.
struct Ragged {
    cache: PagedCase,
    cu: Vec<i32>,
}

impl Ragged {
    fn total_q(&self) -> usize {
        *self.cu.last().unwrap_or(&0) as usize
    }
    fn batch(&self) -> MlaPrefillAbsorbedBatch<'_> {
        MlaPrefillAbsorbedBatch {
            cu_seqlens_q: &self.cu,
            seq_lens: &self.cache.seq_lens,
            block_table: &self.cache.block_table,
            max_pages_per_seq: self.cache.max_pages,
        }
    }
    fn params(&self, heads: usize, scale: f32, causal: bool) -> MlaPrefillAbsorbedParams {
        let c = &self.cache;
        MlaPrefillAbsorbedParams {
            cache: MlaPagedCache { dims: c.dims, format: c.format, page_size: c.page_size, num_pages: c.num_pages, kv_scale: c.kv_scale },
            heads,
            softmax_scale: scale,
            causal,
        }
    }
}

fn ragged(rng: &mut TestRng, fmt: KvCacheFormat, dims: KvDims, ps: usize, q_lens: &[usize], seq_lens: &[i32]) -> Ragged {
    let mut cu = vec![0i32];
    for &n in q_lens {
        cu.push(cu.last().copied().unwrap_or(0) + n as i32);
    }
    Ragged { cache: PagedCase::new(rng, fmt, dims, ps, seq_lens, 2.0), cu }
}

/// f64 oracle: query i of sequence b sees `seq_len - q_len_b + i + 1` keys (causal) or all.
fn oracle(r: &Ragged, q: &[f32], heads: usize, scale: f64, causal: bool) -> (Vec<f32>, Vec<f32>) {
    let (latent, w) = (r.cache.dims.latent, r.cache.dims.width());
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for b in 0..r.cache.seq_lens.len() {
        let keys = r.cache.decoded(b);
        let (q0, q1) = (r.cu[b] as usize, r.cu[b + 1] as usize);
        for i in 0..q1 - q0 {
            let visible = if causal { keys.len() - (q1 - q0) + i + 1 } else { keys.len() };
            for h in 0..heads {
                let row = ((q0 + i) * heads + h) * w;
                let qv: Vec<f64> = q[row..row + w].iter().map(|&x| x as f64).collect();
                let (o, l) = absorbed_attention(&qv, &keys[..visible], latent, scale);
                out.extend(o.iter().map(|&x| x as f32));
                lse.push(l as f32);
            }
        }
    }
    (out, lse)
}

/// Uploaded prefill arguments.
struct Prefill<B: Backend> {
    q: DeviceTensor<B>,
    cache: DeviceTensor<B>,
    cu: DeviceTensor<B>,
    lens: DeviceTensor<B>,
    table: DeviceTensor<B>,
    out: DeviceTensor<B>,
    lse: DeviceTensor<B>,
}

impl<B: Backend + MlaPrefillAbsorbed> Prefill<B> {
    fn new(b: &B, r: &Ragged, heads: usize, q: &[f32], q_dt: DType, out_dt: DType) -> Self {
        let c = &r.cache;
        let n = c.seq_lens.len();
        let i32s = |shape: &[usize], v: &[i32]| b.upload_tensor(&HostTensor::from_i32(shape, v).expect("i32")).expect("upload");
        Prefill {
            q: upload_f32(b, q_dt, &[r.total_q(), heads, c.dims.width()], q).expect("q"),
            cache: super::upload_cache(b, c, false),
            cu: i32s(&[n + 1], &r.cu),
            lens: i32s(&[n], &c.seq_lens),
            table: i32s(&[n, c.max_pages], &c.block_table),
            out: b.zeros(out_dt, &[r.total_q(), heads, c.dims.latent]).expect("out"),
            lse: b.zeros(DType::F32, &[r.total_q(), heads]).expect("lse"),
        }
    }

    fn run(&mut self, b: &B, r: &Ragged, p: &MlaPrefillAbsorbedParams) -> Result<(Vec<f32>, Vec<f32>)> {
        let plan = MlaPrefillAbsorbed::plan(b, p, &r.batch())?;
        let args = MlaPrefillAbsorbedArgs {
            q: self.q.as_ref(),
            kv_cache: self.cache.as_ref(),
            cu_seqlens_q: self.cu.as_ref(),
            seq_lens: self.lens.as_ref(),
            block_table: self.table.as_ref(),
            out: self.out.as_mut(),
            lse: Some(self.lse.as_mut()),
        };
        MlaPrefillAbsorbed::run(b, &plan, args, None, b.default_stream())?;
        Ok((download_f32(b, &self.out)?, download_f32(b, &self.lse)?))
    }
}

/// Ragged causal and non-causal blocks (an empty block, a block longer than one 64-row tile, a
/// sequence without cached keys) agree with the f64 oracle to Tolerance::F32 (same algorithm on
/// identical decoded inputs, f32 queries or bf16 ones), bf16 outputs to Tolerance::BF16; causal prefill of equal blocks
/// equals MlaDecode on the same cache (Tolerance::F32: both ops share the math).
pub fn mla_prefill_absorbed_matches_oracle<B: Backend + MlaPrefillAbsorbed + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41B0);
    // (latent, rope, heads, page, format, causal, q_lens, seq_lens (None = q_lens + random context))
    type Case = (usize, usize, usize, usize, KvCacheFormat, bool, &'static [usize], Option<&'static [i32]>);
    let cases: [Case; 5] = [
        (64, 16, 4, 64, KvCacheFormat::Bf16, true, &[3, 0, 70, 1], None),
        (32, 8, 12, 1, KvCacheFormat::Fp8Flat(FN), true, &[5, 17], None),
        (64, 16, 16, 128, KvCacheFormat::Fp8Tiled(FNUZ), false, &[4, 2, 0], Some(&[90, 0, 7])),
        (32, 8, 24, 64, KvCacheFormat::Fp8Tiled(FN), false, &[66, 1], Some(&[30, 140])),
        (64, 16, 1, 1, KvCacheFormat::Fp8Flat(FNUZ), true, &[8], None),
    ];
    for (latent, rope, heads, ps, fmt, causal, q_lens, seq_lens) in cases {
        let dims = KvDims { latent, rope };
        let seq_lens: Vec<i32> = match seq_lens {
            Some(s) => s.to_vec(),
            None => q_lens.iter().map(|&n| (n + rng.below(80)) as i32).collect(),
        };
        let r = ragged(&mut rng, fmt, dims, ps, q_lens, &seq_lens);
        let q = rng.normals(r.total_q() * heads * dims.width(), 0.7);
        let scale = 1.0 / (rope as f32 + 32.0).sqrt();
        let p = r.params(heads, scale, causal);
        let what = format!("prefill {} heads {heads} page {ps} causal {causal} q_lens {q_lens:?}", fmt.name());
        let (want, want_lse) = oracle(&r, &q, heads, scale as f64, causal);
        let (out, lse) = Prefill::new(b, &r, heads, &q, DType::F32, DType::F32).run(b, &r, &p).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&what, &out, &want, Tolerance::F32);
        assert_close(&format!("{what} lse"), &lse, &want_lse, Tolerance::F32);
        if !causal && seq_lens.contains(&0) {
            let b0 = seq_lens.iter().position(|&s| s == 0).unwrap_or(0);
            let rows = r.cu[b0] as usize * heads..r.cu[b0 + 1] as usize * heads;
            assert!(lse[rows.clone()].iter().all(|&l| l == f32::NEG_INFINITY), "{what}: no keys gives lse -inf");
            assert!(out[rows.start * latent..rows.end * latent].iter().all(|&o| o == 0.0), "{what}: no keys gives out 0");
        }
        let qb = round_through(DType::BF16, &q);
        let (want_b, _) = oracle(&r, &qb, heads, scale as f64, causal);
        let (out_b, _) = Prefill::new(b, &r, heads, &qb, DType::BF16, DType::BF16).run(b, &r, &p).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&format!("{what} bf16"), &out_b, &want_b, Tolerance::BF16);
        // bf16 queries, f32 output: exact inputs, so f32 accuracy (see mla_decode_every_cache_format).
        let (out_bf, _) = Prefill::new(b, &r, heads, &qb, DType::BF16, DType::F32).run(b, &r, &p).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&format!("{what} bf16 q, f32 out"), &out_bf, &want_b, Tolerance::F32);
    }

    // Causal prefill with q_len tokens per sequence is decode.
    let dims = KvDims { latent: 32, rope: 8 };
    for (q_len, fmt) in [(3, KvCacheFormat::Fp8Flat(FNUZ)), (16, KvCacheFormat::Bf16)] {
        let heads = 12;
        let seq_lens: Vec<i32> = (0..3).map(|_| (q_len + rng.below(100)) as i32).collect();
        let r = ragged(&mut rng, fmt, dims, 64, &[q_len; 3], &seq_lens);
        let q = rng.normals(r.total_q() * heads * dims.width(), 1.0);
        let (pre, pre_lse) =
            Prefill::new(b, &r, heads, &q, DType::F32, DType::F32).run(b, &r, &r.params(heads, 0.15, true)).expect("prefill");
        let dp = params(&r.cache, heads, q_len, 0.15, MlaDecodeVariant::Auto, MlaSplitPolicy::NumSplits(2));
        let (dec, dec_lse, _) = decode(b, &r.cache, &dp, &q, DType::F32, DType::F32);
        assert_close(&format!("prefill vs decode q_len {q_len}"), &pre, &dec, Tolerance::F32);
        assert_close(&format!("prefill vs decode lse q_len {q_len}"), &pre_lse, &dec_lse, Tolerance::F32);
    }
}

/// Malformed ragged metadata and tensors are typed errors naming the field.
pub fn mla_prefill_absorbed_rejects_bad_input<B: Backend + MlaPrefillAbsorbed>(b: &B) {
    let mut rng = TestRng::new(0x41B1);
    let dims = KvDims { latent: 32, rope: 8 };
    let r = ragged(&mut rng, KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), dims, 64, &[4, 9], &[10, 9]);
    let good = r.params(4, 0.2, true);
    let expect = |e: Error, field: &str| assert_eq!(e.field(), Some(field), "{e}");
    let plan_err = |p: &MlaPrefillAbsorbedParams, cu: &[i32], lens: &[i32]| {
        let batch = MlaPrefillAbsorbedBatch { cu_seqlens_q: cu, seq_lens: lens, ..r.batch() };
        MlaPrefillAbsorbed::plan(b, p, &batch).expect_err("must be rejected")
    };
    let lens = r.cache.seq_lens.clone();
    expect(plan_err(&good, &[0, 4], &lens), "batch.cu_seqlens_q");
    expect(plan_err(&good, &[1, 4, 13], &lens), "batch.cu_seqlens_q");
    expect(plan_err(&good, &[0, 5, 4], &lens), "batch.cu_seqlens_q");
    expect(plan_err(&good, &[0, 4, 14], &lens), "batch.seq_lens"); // 10 causal queries, 9 keys
    MlaPrefillAbsorbed::plan(
        b,
        &MlaPrefillAbsorbedParams { causal: false, ..good.clone() },
        &MlaPrefillAbsorbedBatch { cu_seqlens_q: &[0, 4, 14], ..r.batch() },
    )
    .expect("without the causal mask a block may outnumber its keys");
    expect(plan_err(&MlaPrefillAbsorbedParams { heads: 0, ..good.clone() }, &r.cu, &lens), "params.heads");
    let mut p = good.clone();
    p.cache.page_size = 16;
    expect(plan_err(&p, &r.cu, &lens), "params.cache.page_size");
    expect(plan_err(&good, &r.cu, &[10, 200]), "batch.seq_lens");

    let q = rng.normals(r.total_q() * 4 * dims.width(), 1.0);
    let run = |edit: &dyn Fn(&mut Prefill<B>)| -> Error {
        let mut d = Prefill::new(b, &r, 4, &q, DType::F32, DType::F32);
        edit(&mut d);
        d.run(b, &r, &good).expect_err("must be rejected")
    };
    let zeros = |dt, shape: &[usize]| b.zeros(dt, shape).expect("zeros");
    expect(run(&|d| d.q = zeros(DType::F32, &[r.total_q() + 1, 4, dims.width()])), "q");
    expect(run(&|d| d.cu = zeros(DType::I64, &[3])), "cu_seqlens_q");
    expect(run(&|d| d.out = zeros(DType::F32, &[r.total_q(), 4, dims.width()])), "out");
    expect(run(&|d| d.lse = zeros(DType::F32, &[r.total_q(), 5])), "lse");
    expect(run(&|d| d.table = zeros(DType::I32, &[2, r.cache.max_pages + 1])), "block_table");
}
