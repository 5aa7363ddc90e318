//! Conformance tests of [`crate::ops::MlaDecode`] and [`crate::ops::MlaPrefillAbsorbed`].
//!
//! Oracles (in [`oracle`]) decode the cache bytes with their own decoder and compute attention
//! in f64, in the absorbed form and in the naive decompressed form with per-head W_UK / W_UV.

pub mod oracle;
pub mod prefill;
mod schedule_reuse;

pub use prefill::{mla_prefill_absorbed_matches_oracle, mla_prefill_absorbed_rejects_bad_input};
pub use schedule_reuse::mla_decode_schedule_reuse;

use self::oracle::{decode_oracle, e4m3_value, softmax_attention, PagedCase};
use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::kv_cache::{encode_token, Fp8Flavor, KvCacheFormat, KvDims};
use crate::ops::mla_decode::{
    MlaDecode, MlaDecodeArgs, MlaDecodeBatch, MlaDecodeParams, MlaDecodePlan, MlaDecodeVariant, MlaKernel, MlaPagedCache, MlaSplitPolicy,
    K3_QK_HEAD_DIM, K3_SOFTMAX_SCALE,
};
use crate::tensor::{HostTensor, Layout};
use crate::tolerance::{assert_close, Tolerance};


const FN: Fp8Flavor = Fp8Flavor::E4M3Fn;
const FNUZ: Fp8Flavor = Fp8Flavor::E4M3Fnuz;

/// Decode params over a test cache.
fn params(c: &PagedCase, heads: usize, q_len: usize, scale: f32, variant: MlaDecodeVariant, splits: MlaSplitPolicy) -> MlaDecodeParams {
    MlaDecodeParams {
        cache: MlaPagedCache { dims: c.dims, format: c.format, page_size: c.page_size, num_pages: c.num_pages, kv_scale: c.kv_scale },
        heads,
        q_len,
        softmax_scale: scale,
        variant,
        splits,
    }
}

fn batch_of(c: &PagedCase) -> MlaDecodeBatch<'_> {
    MlaDecodeBatch { seq_lens: &c.seq_lens, block_table: &c.block_table, max_pages_per_seq: c.max_pages }
}

/// The cache tensor as u8 rows, or as bf16 values when `as_bf16`.
fn upload_cache<B: Backend>(b: &B, c: &PagedCase, as_bf16: bool) -> DeviceTensor<B> {
    let t = if as_bf16 {
        HostTensor::from_bytes(DType::BF16, &[c.num_pages, c.page_size, c.dims.width()], c.bytes.clone())
    } else {
        HostTensor::from_bytes(DType::U8, &[c.num_pages, c.page_size, c.format.bytes_per_token(c.dims)], c.bytes.clone())
    };
    b.upload_tensor(&t.expect("cache tensor")).expect("upload cache")
}

/// Everything a decode run needs, uploaded (the bad-input suite swaps in its own table and lens).
pub(crate) struct Decode<B: Backend> {
    q: DeviceTensor<B>,
    cache: DeviceTensor<B>,
    pub(crate) table: DeviceTensor<B>,
    pub(crate) lens: DeviceTensor<B>,
    pub(crate) out: DeviceTensor<B>,
    pub(crate) lse: DeviceTensor<B>,
}

impl<B: Backend + MlaDecode> Decode<B> {
    pub(crate) fn new(b: &B, c: &PagedCase, p: &MlaDecodeParams, q: &[f32], q_dt: DType, out_dt: DType) -> Self {
        let n = c.seq_lens.len();
        Decode {
            q: upload_f32(b, q_dt, &[n, p.q_len, p.heads, c.dims.width()], q).expect("q"),
            cache: upload_cache(b, c, false),
            table: b.upload_tensor(&HostTensor::from_i32(&[n, c.max_pages], &c.block_table).expect("table")).expect("table"),
            lens: b.upload_tensor(&HostTensor::from_i32(&[n], &c.seq_lens).expect("lens")).expect("lens"),
            out: b.zeros(out_dt, &[n, p.q_len, p.heads, c.dims.latent]).expect("out"),
            lse: b.zeros(DType::F32, &[n, p.q_len, p.heads]).expect("lse"),
        }
    }

    pub(crate) fn args(&mut self) -> MlaDecodeArgs<'_, B> {
        MlaDecodeArgs {
            q: self.q.as_ref(),
            kv_cache: self.cache.as_ref(),
            block_table: self.table.as_ref(),
            seq_lens: self.lens.as_ref(),
            out: self.out.as_mut(),
            lse: Some(self.lse.as_mut()),
        }
    }

    /// Plans, allocates the plan's workspace and runs; returns (out, lse, plan).
    fn run(&mut self, b: &B, c: &PagedCase, p: &MlaDecodeParams) -> Result<(Vec<f32>, Vec<f32>, MlaDecodePlan)> {
        let plan = MlaDecode::plan(b, p, &batch_of(c))?;
        let need = MlaDecode::workspace_size(b, &plan);
        let mut ws = if need > 0 { Some(b.alloc_zeroed(need)?) } else { None };
        MlaDecode::run(b, &plan, self.args(), ws.as_mut(), b.default_stream())?;
        Ok((download_f32(b, &self.out)?, download_f32(b, &self.lse)?, plan))
    }
}

/// Plans and runs one decode of `q` (rounded through `q_dt` by the caller) over `c`.
fn decode<B: Backend + MlaDecode>(
    b: &B,
    c: &PagedCase,
    p: &MlaDecodeParams,
    q: &[f32],
    q_dt: DType,
    out_dt: DType,
) -> (Vec<f32>, Vec<f32>, MlaDecodePlan) {
    Decode::new(b, c, p, q, q_dt, out_dt).run(b, c, p).unwrap_or_else(|e| panic!("decode {p:?}: {e}"))
}

/// Random sequence lengths in `q_len..q_len + extra`.
fn lens(rng: &mut TestRng, n: usize, q_len: usize, extra: usize) -> Vec<i32> {
    (0..n).map(|_| (q_len + rng.below(extra)) as i32).collect()
}

/// Absorbed decode equals the naive decompressed form: per-head keys `[W_UK c | k_pe]`, values
/// `W_UV c`, scale `1/sqrt(nope + rope)`; the test applies W_UV to the op's ĉ. Tolerance
/// F32_ALGO on the output (absorption reassociates the W_UK product and q̂ is stored in f32),
/// F32 on the LSE (well conditioned; only q̂'s f32 rounding differs).
pub fn mla_decode_absorbed_matches_naive<B: Backend + MlaDecode>(b: &B) {
    assert!(((K3_SOFTMAX_SCALE as f64) - 1.0 / (K3_QK_HEAD_DIM as f64).sqrt()).abs() < 1e-8, "K3 scale must be 1/sqrt(192)");
    let mut rng = TestRng::new(0x41A0);
    // (latent, rope, nope, v, heads, page, q_len, format, variant, batch, extra keys)
    use MlaDecodeVariant::{AsmStyle as A, Auto, GluonStyle as G};
    let cases = [
        (64, 16, 16, 16, 1, 1, 1, KvCacheFormat::Bf16, Auto, 2, 60),
        (32, 8, 16, 8, 4, 64, 7, KvCacheFormat::Fp8Flat(FN), G, 3, 90),
        (64, 16, 16, 16, 12, 128, 16, KvCacheFormat::Fp8Tiled(FNUZ), Auto, 2, 70),
        (32, 8, 8, 16, 16, 1, 3, KvCacheFormat::Fp8Flat(FNUZ), G, 2, 40),
        (64, 16, 16, 16, 24, 64, 2, KvCacheFormat::Fp8Tiled(FN), A, 2, 80),
        (64, 16, 16, 16, 4, 128, 4, KvCacheFormat::Bf16, A, 3, 150),
        // K3 dims and scale: 512 latent + 64 rope, nope 128, v 128, 12 heads (TP8), 656-B cache.
        (512, 64, 128, 128, 12, 64, 2, KvCacheFormat::Fp8Tiled(FN), Auto, 1, 40),
    ];
    for (latent, rope, nope, dv, heads, ps, q_len, fmt, variant, n, extra) in cases {
        let dims = KvDims { latent, rope };
        let seq_lens = lens(&mut rng, n, q_len, extra);
        let c = PagedCase::new(&mut rng, fmt, dims, ps, &seq_lens, 2.0);
        let w_uk: Vec<Vec<f64>> =
            (0..heads).map(|_| rng.normals(nope * latent, 1.0 / (latent as f32).sqrt()).iter().map(|&x| x as f64).collect()).collect();
        let w_uv: Vec<Vec<f64>> =
            (0..heads).map(|_| rng.normals(dv * latent, 1.0 / (latent as f32).sqrt()).iter().map(|&x| x as f64).collect()).collect();
        // Naive queries [q_nope | q_pe] per (b, i, h), and the absorbed rows [W_UKᵀ q_nope | q_pe].
        let naive_q: Vec<Vec<f64>> =
            (0..n * q_len * heads).map(|_| rng.normals(nope + rope, 1.0).iter().map(|&x| x as f64).collect()).collect();
        let mut q = Vec::with_capacity(n * q_len * heads * dims.width());
        for (row, nq) in naive_q.iter().enumerate() {
            let h = row % heads;
            q.extend((0..latent).map(|j| (0..nope).map(|r| w_uk[h][r * latent + j] * nq[r]).sum::<f64>() as f32));
            q.extend(nq[nope..].iter().map(|&x| x as f32));
        }
        let scale = 1.0 / ((nope + rope) as f64).sqrt();
        let scale32 = if nope + rope == K3_QK_HEAD_DIM { K3_SOFTMAX_SCALE } else { scale as f32 };
        let p = params(&c, heads, q_len, scale32, variant, MlaSplitPolicy::Auto);
        let (out, lse, _) = decode(b, &c, &p, &q, DType::F32, DType::F32);

        let (mut got, mut want, mut want_lse) = (Vec::new(), Vec::new(), vec![0f32; lse.len()]);
        for bi in 0..n {
            let keys = c.decoded(bi);
            for h in 0..heads {
                let mat = |w: &[f64], rows: usize, x: &[f64]| -> Vec<f64> {
                    (0..rows).map(|r| (0..latent).map(|j| w[r * latent + j] * x[j]).sum()).collect()
                };
                let k_h: Vec<Vec<f64>> = keys.iter().map(|k| [mat(&w_uk[h], nope, &k[..latent]), k[latent..].to_vec()].concat()).collect();
                let v_h: Vec<Vec<f64>> = keys.iter().map(|k| mat(&w_uv[h], dv, &k[..latent])).collect();
                for i in 0..q_len {
                    let row = (bi * q_len + i) * heads + h;
                    let visible = seq_lens[bi] as usize - q_len + i + 1;
                    let kr: Vec<&[f64]> = k_h[..visible].iter().map(|k| k.as_slice()).collect();
                    let vr: Vec<&[f64]> = v_h[..visible].iter().map(|v| v.as_slice()).collect();
                    let (o, l) = softmax_attention(&naive_q[row], &kr, &vr, dv, scale);
                    let c_hat: Vec<f64> = out[row * latent..(row + 1) * latent].iter().map(|&x| x as f64).collect();
                    got.extend(mat(&w_uv[h], dv, &c_hat).iter().map(|&x| x as f32));
                    want.extend(o.iter().map(|&x| x as f32));
                    want_lse[row] = l as f32;
                }
            }
        }
        let what = format!("naive vs absorbed: dims ({latent},{rope}) heads {heads} page {ps} q_len {q_len} {} {variant:?}", fmt.name());
        assert_close(&what, &got, &want, Tolerance::F32_ALGO);
        assert_close(&format!("{what} lse"), &lse, &want_lse, Tolerance::F32);
    }
}

/// Hand check of the 656-byte tile-scaled layout of one K3 token: 512 fp8 bytes, 4 f32
/// power-of-two scales 2^ceil(log2(amax/fp8_max)) at byte 512, 64 bf16 rope values at byte 528.
fn check_tiled_layout(rng: &mut TestRng, f: Fp8Flavor) {
    let d = KvDims::K3;
    let max = match f {
        Fp8Flavor::E4M3Fn => 448.0f32,
        Fp8Flavor::E4M3Fnuz => 240.0,
    };
    let mut v = rng.normals(d.width(), 1.0);
    let tile_amax = [max * 0.25, 3.0, 0.01, max * 8.0]; // exact powers of two times fp8_max for tiles 0 and 3
    for (t, &a) in tile_amax.iter().enumerate() {
        for x in &mut v[t * 128..(t + 1) * 128] {
            *x = x.clamp(-1.0, 1.0) * a * 0.99;
        }
        v[t * 128 + 5] = a;
    }
    let mut bytes = vec![0u8; 656];
    encode_token(KvCacheFormat::Fp8Tiled(f), d, &v, 1.0, &mut bytes).expect("encode");
    assert_eq!(KvCacheFormat::Fp8Tiled(f).bytes_per_token(d), 656);
    for (t, &a) in tile_amax.iter().enumerate() {
        let scale = f32::from_le_bytes(bytes[512 + 4 * t..516 + 4 * t].try_into().unwrap());
        let want = 2f64.powf((a as f64 / max as f64).log2().ceil()) as f32;
        assert_eq!(scale, want, "tile {t} scale");
        if t == 0 || t == 3 {
            // amax / scale == fp8_max exactly: the largest finite code 0x7E (fn) / 0x7F (fnuz).
            assert_eq!(bytes[t * 128 + 5], if f == FN { 0x7E } else { 0x7F }, "tile {t} amax code");
        }
        for i in t * 128..(t + 1) * 128 {
            let back = e4m3_value(bytes[i], f) * scale as f64;
            let tol = (v[i].abs() as f64) / 16.0 + scale as f64 * 2f64.powi(-9);
            assert!((back - v[i] as f64).abs() <= tol, "latent {i}: {} decoded as {back}", v[i]);
        }
    }
    for j in 0..64 {
        let bits = u16::from_le_bytes([bytes[528 + 2 * j], bytes[529 + 2 * j]]);
        assert_eq!(bits, crate::formats::bf16::from_f32(v[512 + j]).to_bits(), "rope {j} must be bf16");
    }
}

/// Every cache format: the op on the same cache bytes agrees with the oracle's own decoder to
/// f32 level (Tolerance::F32: same algorithm on identical decoded inputs, f32 output), also
/// with bf16 queries (exact inputs: a tensor-core path must keep f32 accuracy); bf16
/// outputs within Tolerance::BF16; a bf16-typed view of the Bf16 cache and a strided layer
/// slice of the pool give the same result; fp8 caches agree with the bf16 cache of the same
/// raw values within Tolerance::FP8_E4M3 (the error of e4m3 storage of c and k_pe). First the
/// f32 queries at f32's extremes (`f32_query_extremes`).
pub fn mla_decode_every_cache_format<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41A1);
    check_tiled_layout(&mut rng, FN);
    check_tiled_layout(&mut rng, FNUZ);
    f32_query_extremes(b, &mut rng);
    // (latent, rope, heads, page, q_len); (37, ..): a latent that is no multiple of 8, so the
    // MMA kernels' last output columns go out one at a time (mla_attend_mma.cuh, epilogue); the
    // last: K3's dims, where every format (the tile-scaled one included) takes the GPU kernels'
    // 16-byte path.
    let shapes =
        [(64, 16, 4, 1, 1), (32, 8, 12, 64, 3), (64, 16, 16, 128, 16), (160, 16, 24, 64, 4), (32, 8, 1, 128, 7), (37, 8, 12, 64, 2), (512, 64, 12, 64, 2)];
    for (k, &(latent, rope, heads, ps, q_len)) in shapes.iter().enumerate() {
        let dims = KvDims { latent, rope };
        let seq_lens = lens(&mut rng, 2, q_len, 130);
        let bf16_case = PagedCase::new(&mut rng, KvCacheFormat::Bf16, dims, ps, &seq_lens, 2.0);
        let q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 0.5);
        let scale = 1.0 / (latent as f32 / 4.0 + rope as f32).sqrt();
        let mut bf16_out = Vec::new();
        for fmt in KvCacheFormat::ALL {
            let c = PagedCase::from_raw(&mut rng, fmt, dims, ps, bf16_case.raw.clone());
            let variant = if k % 2 == 0 { MlaDecodeVariant::Auto } else { MlaDecodeVariant::GluonStyle };
            let p = params(&c, heads, q_len, scale, variant, MlaSplitPolicy::Auto);
            let what = format!("{} dims ({latent},{rope}) heads {heads} page {ps} q_len {q_len}", fmt.name());
            let (want, want_lse) = decode_oracle(&c, &q, q_len, heads, scale as f64);
            let (out, lse, _) = decode(b, &c, &p, &q, DType::F32, DType::F32);
            assert_close(&what, &out, &want, Tolerance::F32);
            assert_close(&format!("{what} lse"), &lse, &want_lse, Tolerance::F32);
            let qb = round_through(DType::BF16, &q);
            let (want_b, want_lse_b) = decode_oracle(&c, &qb, q_len, heads, scale as f64);
            let (out_b, lse_b, _) = decode(b, &c, &p, &qb, DType::BF16, DType::BF16);
            assert_close(&format!("{what} bf16 q/out"), &out_b, &want_b, Tolerance::BF16);
            assert!(lse_b.iter().all(|l| l.is_finite()), "{what}: bf16 lse must be finite");
            // bf16 queries with an f32 output: the inputs are exact, so the output is held to f32
            // accuracy (a GPU may run bf16 tensor-core products, but must keep P to ~16 bits).
            let (out_bf, lse_bf, _) = decode(b, &c, &p, &qb, DType::BF16, DType::F32);
            assert_close(&format!("{what} bf16 q, f32 out"), &out_bf, &want_b, Tolerance::F32);
            assert_close(&format!("{what} bf16 q, f32 out lse"), &lse_bf, &want_lse_b, Tolerance::F32);
            match fmt {
                KvCacheFormat::Bf16 => {
                    let mut d = Decode::new(b, &c, &p, &q, DType::F32, DType::F32);
                    d.cache = upload_cache(b, &c, true);
                    let (o2, l2, _) = d.run(b, &c, &p).expect("bf16-typed cache");
                    assert_close(&format!("{what} bf16-typed cache"), &o2, &out, Tolerance::F32);
                    assert_close(&format!("{what} bf16-typed cache lse"), &l2, &lse, Tolerance::F32);
                    bf16_out = out.clone();
                }
                _ => {
                    // Measured on the CPU reference: rel RMSE 3.0e-2 .. 5.2e-2.
                    assert_close(&format!("{what} vs bf16 cache"), &out, &bf16_out, Tolerance::FP8_E4M3);
                }
            }
            if k == 1 {
                // The cache as layer 1 of a [2, num_pages, page_size, bpt] pool (strided pages).
                let bpt = fmt.bytes_per_token(dims);
                let layer = c.num_pages * ps * bpt;
                let mut pool = vec![0xFFu8; 2 * layer];
                pool[layer..].copy_from_slice(&c.bytes);
                let mut d = Decode::new(b, &c, &p, &q, DType::F32, DType::F32);
                d.cache = DeviceTensor {
                    buf: b.upload(&pool).expect("pool"),
                    layout: Layout { dtype: DType::U8, shape: vec![c.num_pages, ps, bpt], strides: vec![ps * bpt, bpt, 1], offset: layer },
                };
                let (o2, _, _) = d.run(b, &c, &p).expect("layer slice");
                assert_close(&format!("{what} layer slice"), &o2, &out, Tolerance::F32);
            }
        }
    }
}

/// f32 queries at f32's largest magnitudes: at K3's dims (where GPU kernels run f32 queries on
/// the matrix units as bf16 hi + lo planes) one latent and one rope column of every query row
/// hold +-f32::MAX (an infinity when rounded to bf16) and +-3e38 (finite in bf16, with a large
/// remainder), the matching key columns of the bf16 cache tiny normals (m 2^-126, m in [1, 2)
/// varying per token), so those columns add finite terms of 4 to 8 that differ per token. A path
/// that rounds such a query into an infinity, or lets the remainder of one overflow, gives
/// infinite or NaN scores; f32 accuracy otherwise (Tolerance::F32).
fn f32_query_extremes<B: Backend + MlaDecode>(b: &B, rng: &mut TestRng) {
    let (dims, heads, q_len) = (KvDims::K3, 12, 2);
    let seq_lens = lens(rng, 2, q_len, 90);
    let mut raw = PagedCase::new(rng, KvCacheFormat::Bf16, dims, 64, &seq_lens, 2.0).raw;
    let (lat_col, rope_col) = (3, dims.latent + 5);
    for tok in raw.iter_mut().flatten() {
        for col in [lat_col, rope_col] {
            tok[col] = (1.0 + rng.below(128) as f32 / 128.0) * 2f32.powi(-126);
        }
    }
    let c = PagedCase::from_raw(rng, KvCacheFormat::Bf16, dims, 64, raw);
    let mut q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 0.5);
    for (r, row) in q.chunks_mut(dims.width()).enumerate() {
        let sign = if r % 2 == 0 { 1.0 } else { -1.0 };
        row[lat_col] = sign * f32::MAX;
        row[rope_col] = -sign * 3.0e38;
    }
    for variant in [MlaDecodeVariant::AsmStyle, MlaDecodeVariant::GluonStyle] {
        let p = params(&c, heads, q_len, K3_SOFTMAX_SCALE, variant, MlaSplitPolicy::Auto);
        let (want, want_lse) = decode_oracle(&c, &q, q_len, heads, K3_SOFTMAX_SCALE as f64);
        let (out, lse, _) = decode(b, &c, &p, &q, DType::F32, DType::F32);
        assert!(want.iter().chain(&want_lse).all(|v| v.is_finite()), "the oracle's results are finite");
        assert_close(&format!("f32 query extremes {variant:?}"), &out, &want, Tolerance::F32);
        assert_close(&format!("f32 query extremes {variant:?} lse"), &lse, &want_lse, Tolerance::F32);
    }
}

/// Split-KV + LSE merge equals the unsplit result: Gluon with 1 vs 2, 3, 7 splits per
/// sequence, asm partition over 1 vs 3, 64, 1000 compute units (Tolerance::F32: the same f32
/// partials, only the merge order differs). The split plans must actually produce partials.
pub fn mla_decode_split_equals_unsplit<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41A2);
    // The last case: a latent that is no multiple of 4, so the partial rows carry pad floats
    // (MlaDecodePlan::partial_row_pitch) and the reduce's last thread stores one of its 4 lanes.
    for &(heads, ps, q_len, fmt, latent) in &[
        (12, 1, 4, KvCacheFormat::Bf16, 64),
        (24, 64, 2, KvCacheFormat::Fp8Tiled(FN), 64),
        (4, 128, 1, KvCacheFormat::Fp8Flat(FNUZ), 64),
        (12, 64, 2, KvCacheFormat::Bf16, 37),
    ] {
        let dims = KvDims { latent, rope: 16 };
        let mut seq_lens = lens(&mut rng, 3, q_len, 150);
        seq_lens[0] = q_len as i32 + 5; // short enough that 7 splits leave some empty
        seq_lens[2] = 140; // 70 splits of 2 keys each: none empty
        let c = PagedCase::new(&mut rng, fmt, dims, ps, &seq_lens, 2.0);
        let q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 1.0);
        let scale = 0.125;
        let what = format!("{} latent {latent} heads {heads} page {ps} q_len {q_len}", fmt.name());
        let (want, want_lse) = decode_oracle(&c, &q, q_len, heads, scale as f64);
        let gluon = |splits| params(&c, heads, q_len, scale, MlaDecodeVariant::GluonStyle, splits);
        let (base, base_lse, plan) = decode(b, &c, &gluon(MlaSplitPolicy::NumSplits(1)), &q, DType::F32, DType::F32);
        assert_eq!((plan.schedule.num_partials, MlaDecode::workspace_size(b, &plan)), (0, 0), "{what}: one split needs no partials");
        assert_close(&format!("{what} unsplit vs oracle"), &base, &want, Tolerance::F32);
        assert_close(&format!("{what} unsplit lse vs oracle"), &base_lse, &want_lse, Tolerance::F32);
        // 70 splits: more than a reduce block's threads (64): the reduce weighs them in two rounds.
        for n in [2, 3, 7, 70] {
            let (o, l, plan) = decode(b, &c, &gluon(MlaSplitPolicy::NumSplits(n)), &q, DType::F32, DType::F32);
            assert_eq!(plan.schedule.items.len(), seq_lens.len() * plan.head_groups * n);
            assert!(plan.schedule.num_partials > 0 && MlaDecode::workspace_size(b, &plan) > 0, "{what}: {n} splits must use partials");
            assert_close(&format!("{what} {n} splits"), &o, &base, Tolerance::F32);
            assert_close(&format!("{what} {n} splits lse"), &l, &base_lse, Tolerance::F32);
        }
        if q_len != 3 {
            let asm = |cus| params(&c, heads, q_len, scale, MlaDecodeVariant::AsmStyle, MlaSplitPolicy::ComputeUnits(cus));
            let (one, one_lse, plan) = decode(b, &c, &asm(1), &q, DType::F32, DType::F32);
            assert_eq!((plan.kernel, plan.schedule.num_partials), (MlaKernel::Asm, 0), "{what}: one compute unit splits nothing");
            assert_close(&format!("{what} asm 1 CU"), &one, &base, Tolerance::F32);
            assert_close(&format!("{what} asm 1 CU lse"), &one_lse, &base_lse, Tolerance::F32);
            for cus in [3, 64, 1000] {
                let (o, l, plan) = decode(b, &c, &asm(cus), &q, DType::F32, DType::F32);
                assert_eq!(plan.schedule.cu_indptr.len(), cus as usize + 1);
                assert!(!plan.schedule.reduce.is_empty(), "{what}: {cus} CUs must split some sequence");
                assert_close(&format!("{what} asm {cus} CUs"), &o, &one, Tolerance::F32);
                assert_close(&format!("{what} asm {cus} CUs lse"), &l, &one_lse, Tolerance::F32);
            }
        }
    }
}

/// Asm and Gluon plans agree (Tolerance::F32: same per-item math, different partitions); Auto
/// picks asm exactly when asm can serve; asm rejects q_len 3 as unsupported naming q_len; 12
/// heads run as one masked group of 16 with a 12-head output (a 16-head output is rejected).
pub fn mla_decode_variants_agree<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41A3);
    let dims = KvDims { latent: 32, rope: 8 };
    for &(heads, q_len, ps) in &[(1, 1, 64), (12, 2, 1), (16, 4, 128), (24, 1, 64), (12, 4, 64)] {
        let seq_lens = lens(&mut rng, 2, q_len, 100);
        let c = PagedCase::new(&mut rng, KvCacheFormat::Fp8Flat(FN), dims, ps, &seq_lens, 2.0);
        let q = rng.normals(seq_lens.len() * q_len * heads * dims.width(), 1.0);
        let p = |v| params(&c, heads, q_len, 0.2, v, MlaSplitPolicy::ComputeUnits(8));
        let (asm, asm_lse, plan) = decode(b, &c, &p(MlaDecodeVariant::AsmStyle), &q, DType::F32, DType::F32);
        assert_eq!((plan.kernel, plan.head_groups), (MlaKernel::Asm, heads.div_ceil(16)));
        let (gl, gl_lse, _) = decode(b, &c, &p(MlaDecodeVariant::GluonStyle), &q, DType::F32, DType::F32);
        assert_eq!(asm.len(), seq_lens.len() * q_len * heads * dims.latent, "output has exactly {heads} heads");
        assert_close(&format!("asm vs gluon heads {heads} q_len {q_len}"), &asm, &gl, Tolerance::F32);
        assert_close(&format!("asm vs gluon lse heads {heads} q_len {q_len}"), &asm_lse, &gl_lse, Tolerance::F32);
        let auto = MlaDecode::plan(b, &p(MlaDecodeVariant::Auto), &batch_of(&c)).expect("auto plan");
        assert_eq!(auto.kernel, MlaKernel::Asm, "Auto takes asm for q_len {q_len}");
        if heads == 12 {
            let pp = p(MlaDecodeVariant::AsmStyle);
            let mut d = Decode::new(b, &c, &pp, &q, DType::F32, DType::F32);
            d.out = b.zeros(DType::F32, &[seq_lens.len(), q_len, 16, dims.latent]).expect("out16");
            let e = d.run(b, &c, &pp).expect_err("a padded 16-head output must be rejected");
            assert_eq!(e.field(), Some("out"), "{e}");
        }
    }
    // Auto rule and the asm q_len set.
    let c = PagedCase::new(&mut rng, KvCacheFormat::Bf16, dims, 64, &[20, 17], 1.0);
    for q_len in 1..=16 {
        let p = params(&c, 8, q_len, 0.2, MlaDecodeVariant::Auto, MlaSplitPolicy::Auto);
        let plan = MlaDecode::plan(b, &p, &batch_of(&c)).expect("auto");
        let want = if [1, 2, 4].contains(&q_len) { MlaKernel::Asm } else { MlaKernel::Gluon };
        assert_eq!(plan.kernel, want, "Auto at q_len {q_len}");
    }
    let p = params(&c, 8, 2, 0.2, MlaDecodeVariant::Auto, MlaSplitPolicy::NumSplits(2));
    assert_eq!(MlaDecode::plan(b, &p, &batch_of(&c)).expect("auto").kernel, MlaKernel::Gluon, "a fixed num_splits is Gluon's");
    let p = params(&c, 8, 3, 0.2, MlaDecodeVariant::AsmStyle, MlaSplitPolicy::Auto);
    match MlaDecode::plan(b, &p, &batch_of(&c)) {
        Err(Error::Unsupported { reasons }) => assert!(reasons.iter().any(|r| r.subject == "params.q_len"), "{reasons:?}"),
        other => panic!("asm at q_len 3 must be Unsupported naming q_len, got {other:?}"),
    }
}

/// Bad params, batch metadata, tensors and workspaces are typed errors naming the field.
pub fn mla_decode_rejects_bad_input<B: Backend + MlaDecode>(b: &B) {
    let mut rng = TestRng::new(0x41A4);
    let dims = KvDims { latent: 32, rope: 8 };
    let c = PagedCase::new(&mut rng, KvCacheFormat::Fp8Flat(FN), dims, 64, &[70, 3], 2.0);
    let good = params(&c, 12, 2, 0.2, MlaDecodeVariant::GluonStyle, MlaSplitPolicy::NumSplits(3));
    let plan_err = |p: &MlaDecodeParams, c: &PagedCase| MlaDecode::plan(b, p, &batch_of(c)).expect_err("must be rejected");
    let expect = |e: Error, field: &str| assert_eq!(e.field(), Some(field), "{e}");

    expect(plan_err(&MlaDecodeParams { q_len: 0, ..good.clone() }, &c), "params.q_len");
    expect(plan_err(&MlaDecodeParams { q_len: 17, ..good.clone() }, &c), "params.q_len");
    expect(plan_err(&MlaDecodeParams { heads: 0, ..good.clone() }, &c), "params.heads");
    expect(plan_err(&MlaDecodeParams { softmax_scale: f32::NAN, ..good.clone() }, &c), "params.softmax_scale");
    expect(plan_err(&MlaDecodeParams { splits: MlaSplitPolicy::NumSplits(0), ..good.clone() }, &c), "params.splits");
    expect(plan_err(&MlaDecodeParams { splits: MlaSplitPolicy::ComputeUnits(0), ..good.clone() }, &c), "params.splits");
    let cache = |f: &dyn Fn(&mut MlaPagedCache)| {
        let mut p = good.clone();
        f(&mut p.cache);
        p
    };
    expect(plan_err(&cache(&|k| k.page_size = 32), &c), "params.cache.page_size");
    expect(plan_err(&cache(&|k| k.kv_scale = 0.0), &c), "params.cache.kv_scale");
    expect(plan_err(&cache(&|k| k.dims.latent = 0), &c), "params.cache.dims.latent");

    let mut bad = c.clone();
    bad.block_table[1] = c.num_pages as i32; // second page of sequence 0 (70 tokens use 2 pages)
    expect(plan_err(&good, &bad), "batch.block_table");
    let mut bad = c.clone();
    bad.block_table[bad.max_pages] = -1; // first page of sequence 1
    expect(plan_err(&good, &bad), "batch.block_table");
    let mut bad = c.clone();
    bad.seq_lens[1] = (bad.max_pages * 64 + 1) as i32;
    expect(plan_err(&good, &bad), "batch.seq_lens");
    let mut bad = c.clone();
    bad.seq_lens[1] = 1; // shorter than q_len 2
    expect(plan_err(&good, &bad), "batch.seq_lens");
    let mut bad = c.clone();
    bad.block_table.pop();
    expect(plan_err(&good, &bad), "batch.block_table");
    // Unused block-table entries are not read: garbage there is fine.
    let mut ok = c.clone();
    ok.block_table[ok.max_pages - 1] = i32::MIN;
    MlaDecode::plan(b, &good, &batch_of(&ok)).expect("unused entries may hold anything");

    // Tensor arguments.
    let q = rng.normals(2 * 2 * 12 * dims.width(), 1.0);
    let n = c.seq_lens.len();
    let run = |edit: &dyn Fn(&mut Decode<B>), ws_cut: usize| -> Error {
        let plan = MlaDecode::plan(b, &good, &batch_of(&c)).expect("plan");
        let mut d = Decode::new(b, &c, &good, &q, DType::F32, DType::F32);
        edit(&mut d);
        let need = MlaDecode::workspace_size(b, &plan);
        assert!(need > 0, "3 splits need a workspace");
        let mut ws = b.alloc_zeroed(need - ws_cut).expect("ws");
        MlaDecode::run(b, &plan, d.args(), Some(&mut ws), b.default_stream()).expect_err("must be rejected")
    };
    let zeros = |dt, shape: &[usize]| b.zeros(dt, shape).expect("zeros");
    expect(run(&|_| {}, 1), "workspace");
    expect(run(&|d| d.q = zeros(DType::F16, &[n, 2, 12, dims.width()]), 0), "q");
    expect(run(&|d| d.q = zeros(DType::F32, &[n, 2, 12, dims.width() + 1]), 0), "q");
    expect(run(&|d| d.out = zeros(DType::F32, &[n, 2, 12, dims.width()]), 0), "out");
    expect(run(&|d| d.out = zeros(DType::I32, &[n, 2, 12, dims.latent]), 0), "out");
    expect(run(&|d| d.lse = zeros(DType::BF16, &[n, 2, 12]), 0), "lse");
    expect(run(&|d| d.table = zeros(DType::I64, &[n, c.max_pages]), 0), "block_table");
    expect(run(&|d| d.lens = zeros(DType::I32, &[n + 1]), 0), "seq_lens");
    expect(run(&|d| d.cache = zeros(DType::BF16, &[c.num_pages, 64, dims.width()]), 0), "kv_cache");
    expect(run(&|d| d.cache = zeros(DType::U8, &[c.num_pages, 64, dims.width() + 1]), 0), "kv_cache");
    expect(run(&|d| d.cache = zeros(DType::F32, &[c.num_pages, 64, dims.width()]), 0), "kv_cache");
    // A layout reaching past its buffer.
    expect(
        run(
            &|d| {
                d.cache.layout.offset = 1;
            },
            0,
        ),
        "kv_cache",
    );
}

