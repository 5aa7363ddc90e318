//! Conformance tests of [`crate::ops::MlaCacheWrite`]. Cache writes are compared bit for bit.

use super::{round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::formats::{bf16, F8E4M3Fn, F8E4M3Fnuz, Saturation};
use crate::ops::kv_cache::{decode_token, encode_token, flat_fp8_scale, Fp8Flavor, KvCacheFormat, KvDims};
use crate::ops::{MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams};
use crate::tensor::{HostTensor, Layout, TensorRef};
use crate::tolerance::{assert_close, Tolerance};


const TINY: KvDims = KvDims { latent: 64, rope: 16 };

/// How the cache and inputs are laid out in one run.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    num_pages: usize,
    page_size: usize,
    /// Extra bytes after each page (a padded page stride).
    page_pad: usize,
    /// Store the bf16 format in a bf16-typed cache tensor instead of u8.
    bf16_cache: bool,
    /// kv rows are a slice at this offset of a fused projection row this much wider.
    kv_row_extra: usize,
    kv_dt: DType,
    slot_dt: DType,
}

/// What a run produced: the whole cache buffer before and after.
struct Written {
    before: Vec<u8>,
    after: Vec<u8>,
    /// Byte offset of slot s's row.
    row_offset: Vec<usize>,
}

/// Runs the backend's cache write of `values` (`[n, width]`, already representable in
/// `g.kv_dt`) to `slots` over a cache filled with random bytes.
fn write_cache<B: Backend + MlaCacheWrite>(
    b: &B,
    rng: &mut TestRng,
    p: &MlaCacheWriteParams,
    g: Geometry,
    values: &[f32],
    slots: &[i64],
) -> Written {
    let (n, width, bpt) = (slots.len(), p.dims.width(), p.format.bytes_per_token(p.dims));
    // kv: rows of width + kv_row_extra, the token's values starting at kv_row_extra / 2.
    let row = width + g.kv_row_extra;
    let lead = g.kv_row_extra / 2;
    let mut fused = vec![1.0e4f32; n * row];
    for t in 0..n {
        fused[t * row + lead..][..width].copy_from_slice(&values[t * width..][..width]);
    }
    let kv_buf = upload_f32(b, g.kv_dt, &[n * row], &fused).unwrap();
    let kv_layout = Layout { dtype: g.kv_dt, shape: vec![n, width], strides: vec![row, 1], offset: lead };
    let slot_host = match g.slot_dt {
        DType::I32 => HostTensor::from_i32(&[n], &slots.iter().map(|&s| s as i32).collect::<Vec<_>>()).unwrap(),
        _ => HostTensor::from_i64(&[n], slots).unwrap(),
    };
    let slot_t = b.upload_tensor(&slot_host).unwrap();
    let (cache_dt, inner) = if g.bf16_cache { (DType::BF16, width) } else { (DType::U8, bpt) };
    let page_bytes = g.page_size * bpt + g.page_pad;
    let before: Vec<u8> = (0..g.num_pages * page_bytes).map(|_| rng.next_u64() as u8).collect();
    let es = cache_dt.size_bytes();
    let layout = Layout { dtype: cache_dt, shape: vec![g.num_pages, g.page_size, inner], strides: vec![page_bytes / es, bpt / es, 1], offset: 0 };
    let mut cache = DeviceTensor::<B> { buf: b.upload(&before).unwrap(), layout };
    let batch = MlaCacheWriteBatch { slot_mapping: slots.to_vec() };
    let plan = MlaCacheWrite::plan(b, p, &batch).expect("plan");
    let args = MlaCacheWriteArgs {
        kv: TensorRef::new(&kv_buf.buf, kv_layout),
        slot_mapping: slot_t.as_ref(),
        cache: cache.as_mut(),
    };
    MlaCacheWrite::run(b, &plan, args, None, b.default_stream()).expect("run");
    let mut after = vec![0u8; before.len()];
    b.download(&cache.buf, &mut after).unwrap();
    let row_offset = (0..g.num_pages * g.page_size).map(|s| (s / g.page_size) * page_bytes + (s % g.page_size) * bpt).collect();
    Written { before, after, row_offset }
}

/// The test's own encoders for the bf16 and flat fp8 formats (straight from the format types):
/// bf16 round-half-even, and fp8 of `x · (1/kv_scale)` with the reciprocal rounded to f32,
/// round-half-even, saturating. The tiled format is checked against the shared codec here and
/// by hand in [`mla_cache_write_k3_tiled_layout`].
fn expected_token(p: &MlaCacheWriteParams, values: &[f32]) -> Vec<u8> {
    match p.format {
        KvCacheFormat::Bf16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes()).collect(),
        KvCacheFormat::Fp8Flat(f) => {
            let inv = 1.0f32 / p.kv_scale;
            values
                .iter()
                .map(|&v| match f {
                    Fp8Flavor::E4M3Fn => F8E4M3Fn::from_f32(v * inv, Saturation::Finite).to_bits(),
                    Fp8Flavor::E4M3Fnuz => F8E4M3Fnuz::from_f32(v * inv, Saturation::Finite).to_bits(),
                })
                .collect()
        }
        KvCacheFormat::Fp8Tiled(_) => {
            let mut out = vec![0u8; p.format.bytes_per_token(p.dims)];
            encode_token(p.format, p.dims, values, p.kv_scale, &mut out).unwrap();
            out
        }
    }
}

/// Latent ~ N(0, 1) (post-RMSNorm), rope ~ N(0, 6) (un-normalised), rounded through `dt`.
fn token_values(rng: &mut TestRng, d: KvDims, n: usize, dt: DType) -> Vec<f32> {
    let mut v = Vec::with_capacity(n * d.width());
    for _ in 0..n {
        v.extend(rng.normals(d.latent, 1.0));
        v.extend(rng.normals(d.rope, 6.0));
    }
    round_through(dt, &v)
}

/// Random slots: distinct valid slots for some tokens, negative padding slots for others.
fn random_slots(rng: &mut TestRng, n: usize, total_slots: usize) -> Vec<i64> {
    let perm = rng.permutation(total_slots);
    (0..n).map(|t| if rng.below(4) == 0 { -1 - rng.below(3) as i64 } else { perm[t] as i64 }).collect()
}

/// Every written row equals the independent encoding; every other byte (other slots, page
/// padding, skipped tokens) is unchanged. All formats, tiny and K3 dims, page sizes 1/4/64,
/// f32 and bf16 inputs with strided rows, i32/i64 slot mappings, u8 and bf16 cache tensors.
pub fn mla_cache_write_bit_exact<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(576);
    let geometries = [
        (TINY, Geometry { num_pages: 3, page_size: 4, page_pad: 0, bf16_cache: false, kv_row_extra: 0, kv_dt: DType::F32, slot_dt: DType::I64 }),
        (TINY, Geometry { num_pages: 9, page_size: 1, page_pad: 16, bf16_cache: false, kv_row_extra: 48, kv_dt: DType::BF16, slot_dt: DType::I32 }),
        (KvDims::K3, Geometry { num_pages: 2, page_size: 64, page_pad: 0, bf16_cache: false, kv_row_extra: 1536, kv_dt: DType::BF16, slot_dt: DType::I64 }),
        (KvDims::K3, Geometry { num_pages: 3, page_size: 4, page_pad: 8, bf16_cache: false, kv_row_extra: 0, kv_dt: DType::F32, slot_dt: DType::I32 }),
    ];
    for fmt in KvCacheFormat::ALL {
        for &(dims, g0) in &geometries {
            for bf16_cache in [false, true] {
                if bf16_cache && fmt != KvCacheFormat::Bf16 {
                    continue;
                }
                let g = Geometry { bf16_cache, ..g0 };
                let n = 7;
                let values = token_values(&mut rng, dims, n, g.kv_dt);
                let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                let max = match fmt {
                    KvCacheFormat::Fp8Flat(f) | KvCacheFormat::Fp8Tiled(f) => f.max_finite(),
                    KvCacheFormat::Bf16 => 1.0,
                };
                // 0.75·amax/max: the largest values saturate, which must be bit-exact too.
                let kv_scale = if fmt.uses_tensor_scale() { 0.75 * amax / max } else { 1.0 };
                let p = MlaCacheWriteParams { dims, num_pages: g.num_pages, page_size: g.page_size, format: fmt, kv_scale };
                let slots = random_slots(&mut rng, n, g.num_pages * g.page_size);
                let w = write_cache(b, &mut rng, &p, g, &values, &slots);
                let bpt = fmt.bytes_per_token(dims);
                let mut expected = w.before.clone();
                for (t, &s) in slots.iter().enumerate() {
                    if s >= 0 {
                        let o = w.row_offset[s as usize];
                        expected[o..o + bpt].copy_from_slice(&expected_token(&p, &values[t * dims.width()..][..dims.width()]));
                    }
                }
                if let Some(i) = (0..expected.len()).find(|&i| expected[i] != w.after[i]) {
                    panic!(
                        "{} dims {dims:?} {g:?} slots {slots:?}: cache byte {i} is {:#04x}, expected {:#04x} (before {:#04x})",
                        fmt.name(),
                        w.after[i],
                        expected[i],
                        w.before[i]
                    );
                }
            }
        }
    }
}

/// One K3 token in the 656-byte tile-scaled e4m3fn format, every byte checked against values
/// worked out by hand: fp8 codes, power-of-two f32 tile scales, bf16 rope.
pub fn mla_cache_write_k3_tiled_layout<B: Backend + MlaCacheWrite>(b: &B) {
    let d = KvDims::K3;
    let mut v = vec![0f32; d.width()];
    // Tile 0: amax 448 -> scale 2^ceil(log2(1)) = 1.
    v[0] = 448.0; // 0 1111 110 = 0x7e
    v[1] = 1.0; // 0 0111 000 = 0x38
    v[2] = -1.0; // 0xb8
    v[3] = 0.5; // 0 0110 000 = 0x30
    // Tile 1: amax 900 -> 900/448 = 2.009 -> scale 4.
    v[128] = 900.0; // 225 -> nearest e4m3 224 = 1.75·2^7 = 0 1110 110 = 0x76
    v[129] = -2.0; // -0.5 -> 0xb0
    // Tile 2: all zero -> scale 1, codes 0.
    // Tile 3: amax 0.01 -> 0.01/448 = 2.2e-5 -> scale 2^-15.
    v[384] = 0.01; // 327.68 -> 320 = 1.25·2^8 = 0 1111 010 = 0x7a
    v[385] = 0.005; // 163.84 -> 160 = 1.25·2^7 = 0 1110 010 = 0x72
    // Rope: bf16, never fp8 (100000 would saturate fp8).
    v[512] = 1000.0; // 0x447a
    v[513] = -3.5; // 0xc060
    v[514] = 100000.0; // f32 0x47c35000 -> bf16 0x47c3 (round down)
    v[575] = 1.0; // 0x3f80

    let mut want = vec![0u8; 656];
    want[..4].copy_from_slice(&[0x7e, 0x38, 0xb8, 0x30]);
    want[128..130].copy_from_slice(&[0x76, 0xb0]);
    want[384..386].copy_from_slice(&[0x7a, 0x72]);
    want[512..516].copy_from_slice(&1.0f32.to_le_bytes());
    want[516..520].copy_from_slice(&[0x00, 0x00, 0x80, 0x40]); // 4.0
    want[520..524].copy_from_slice(&1.0f32.to_le_bytes());
    want[524..528].copy_from_slice(&[0x00, 0x00, 0x00, 0x38]); // 2^-15
    want[528..534].copy_from_slice(&[0x7a, 0x44, 0x60, 0xc0, 0xc3, 0x47]);
    want[654..656].copy_from_slice(&[0x80, 0x3f]);

    let p = MlaCacheWriteParams { dims: d, num_pages: 1, page_size: 4, format: KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), kv_scale: 1.0 };
    let g = Geometry { num_pages: 1, page_size: 4, page_pad: 0, bf16_cache: false, kv_row_extra: 0, kv_dt: DType::F32, slot_dt: DType::I64 };
    let mut rng = TestRng::new(656);
    let w = write_cache(b, &mut rng, &p, g, &v, &[3]);
    let got = &w.after[3 * 656..4 * 656];
    for i in 0..656 {
        assert_eq!(got[i], want[i], "byte {i} of the 656-byte token: got {:#04x}, want {:#04x}", got[i], want[i]);
    }
    assert_eq!(&w.after[..3 * 656], &w.before[..3 * 656], "other rows of the page changed");
}

/// Decoding the written bytes gives the inputs back within the format's tolerance.
pub fn mla_cache_write_round_trip<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(42956);
    for fmt in KvCacheFormat::ALL {
        for dims in [TINY, KvDims::K3] {
            let n = 5;
            let values = token_values(&mut rng, dims, n, DType::F32);
            let kv_scale = match fmt {
                KvCacheFormat::Fp8Flat(f) => flat_fp8_scale(&values, f),
                _ => 1.0,
            };
            let p = MlaCacheWriteParams { dims, num_pages: 2, page_size: 4, format: fmt, kv_scale };
            let g = Geometry { num_pages: 2, page_size: 4, page_pad: 0, bf16_cache: false, kv_row_extra: 0, kv_dt: DType::F32, slot_dt: DType::I64 };
            let slots = [6i64, 0, 3, 7, 1];
            let w = write_cache(b, &mut rng, &p, g, &values, &slots);
            let bpt = fmt.bytes_per_token(dims);
            let mut decoded = vec![0f32; n * dims.width()];
            for (t, &s) in slots.iter().enumerate() {
                let o = w.row_offset[s as usize];
                decode_token(fmt, dims, &w.after[o..o + bpt], kv_scale, &mut decoded[t * dims.width()..][..dims.width()]).unwrap();
            }
            // One rounding per value: BF16 for bf16 storage, FP8_E4M3 (3 mantissa bits) for fp8.
            let tol = if fmt == KvCacheFormat::Bf16 { Tolerance::BF16 } else { Tolerance::FP8_E4M3 };
            assert_close(&format!("{} {dims:?} round trip", fmt.name()), &decoded, &values, tol);
        }
    }
}

/// vLLM #42956: a flat fp8 scale from [`flat_fp8_scale`] over latent AND rope keeps large k_pe
/// values unsaturated (each within one fp8 rounding), while a scale calibrated on the latent
/// alone clamps them to the latent's range.
pub fn mla_cache_write_flat_scale_covers_rope<B: Backend + MlaCacheWrite>(b: &B) {
    let mut rng = TestRng::new(4295);
    let d = KvDims::K3;
    for f in [Fp8Flavor::E4M3Fn, Fp8Flavor::E4M3Fnuz] {
        let fmt = KvCacheFormat::Fp8Flat(f);
        let n = 3;
        let mut values = Vec::new();
        for _ in 0..n {
            values.extend(rng.normals(d.latent, 1.0)); // |latent| < ~5
            values.extend(rng.normals(d.rope, 1.0).iter().map(|x| x * 40.0)); // |k_pe| up to ~150
        }
        let latent_only: Vec<f32> = values.chunks(d.width()).flat_map(|t| t[..d.latent].to_vec()).collect();
        let g = Geometry { num_pages: 1, page_size: 4, page_pad: 0, bf16_cache: false, kv_row_extra: 0, kv_dt: DType::F32, slot_dt: DType::I64 };
        let decode_rope = |scale: f32, rng: &mut TestRng| -> (Vec<f32>, Vec<f32>) {
            let p = MlaCacheWriteParams { dims: d, num_pages: 1, page_size: 4, format: fmt, kv_scale: scale };
            let w = write_cache(b, rng, &p, g, &values, &[0, 1, 2]);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for t in 0..n {
                let mut tok = vec![0f32; d.width()];
                decode_token(fmt, d, &w.after[t * d.width()..(t + 1) * d.width()], scale, &mut tok).unwrap();
                got.extend_from_slice(&tok[d.latent..]);
                want.extend_from_slice(&values[t * d.width() + d.latent..(t + 1) * d.width()]);
            }
            (got, want)
        };
        // Half an fp8 ulp (2^-4 relative) plus the subnormal step scale·2^-10 (e4m3fn; fnuz's is
        // smaller): the bound of one unsaturated rounding.
        let within_rounding = |x: f32, y: f32, scale: f32| (x - y).abs() <= (y.abs() * 0.0625 + scale * 2f32.powi(-10)) * 1.0001;

        let full = flat_fp8_scale(&values, f);
        let (got, want) = decode_rope(full, &mut rng);
        for (x, y) in got.iter().zip(&want) {
            assert!(within_rounding(*x, *y, full), "{}: k_pe {y} came back as {x} with the full scale", fmt.name());
        }

        let latent = flat_fp8_scale(&latent_only, f);
        let (got, want) = decode_rope(latent, &mut rng);
        let ceiling = f.max_finite() * latent;
        let saturated = got.iter().zip(&want).filter(|(x, y)| !within_rounding(**x, **y, latent)).count();
        assert!(saturated > 0, "{}: a latent-only scale must saturate some k_pe values", fmt.name());
        assert!(got.iter().all(|x| x.abs() <= ceiling), "{}: decoded k_pe beyond the saturation ceiling", fmt.name());
        let want_amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(want_amax > 2.0 * ceiling, "the test needs k_pe far above the latent range");
    }
}

/// Malformed params, slot mappings and tensors give `InvalidInput` naming the field.
pub fn mla_cache_write_rejects_bad_input<B: Backend + MlaCacheWrite>(b: &B) {
    let fp8 = KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn);
    let p = MlaCacheWriteParams { dims: TINY, num_pages: 2, page_size: 4, format: fp8, kv_scale: 0.5 };
    let good = MlaCacheWriteBatch { slot_mapping: vec![5, -1, 0, 7] };
    let field = |params: &MlaCacheWriteParams, slots: &[i64]| {
        MlaCacheWrite::plan(b, params, &MlaCacheWriteBatch { slot_mapping: slots.to_vec() })
            .expect_err("must be rejected")
            .field()
            .map(str::to_owned)
    };
    assert_eq!(field(&p, &[5, 8, 0]).as_deref(), Some("slot_mapping"), "slot == num_pages * page_size");
    assert_eq!(field(&p, &[5, i64::MAX]).as_deref(), Some("slot_mapping"), "huge slot");
    assert_eq!(field(&p, &[5, -1, 3, -1, 5]).as_deref(), Some("slot_mapping"), "duplicate slot");
    for s in [0.0, f32::NAN, -1.0, f32::INFINITY] {
        assert_eq!(field(&MlaCacheWriteParams { kv_scale: s, ..p.clone() }, &[0]).as_deref(), Some("params.kv_scale"), "scale {s}");
    }
    assert_eq!(field(&MlaCacheWriteParams { page_size: 0, ..p.clone() }, &[]).as_deref(), Some("params.page_size"));
    assert_eq!(field(&MlaCacheWriteParams { num_pages: 0, ..p.clone() }, &[]).as_deref(), Some("params.num_pages"));
    let no_latent = MlaCacheWriteParams { dims: KvDims { latent: 0, rope: 16 }, ..p.clone() };
    assert_eq!(field(&no_latent, &[]).as_deref(), Some("params.dims.latent"));
    // Repeated padding slots are fine.
    assert!(MlaCacheWrite::plan(b, &p, &MlaCacheWriteBatch { slot_mapping: vec![-1, -1, 2] }).is_ok());

    let plan = MlaCacheWrite::plan(b, &p, &good).unwrap();
    let z = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let run_with = |kv: &DeviceTensor<B>, slots: &DeviceTensor<B>, cache: &mut DeviceTensor<B>| -> Result<()> {
        let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
        MlaCacheWrite::run(b, &plan, args, None, b.default_stream())
    };
    let err = |r: Result<()>| r.expect_err("must be rejected").field().map(str::to_owned);
    let kv = z(DType::F32, &[4, 80]);
    let slots = b.upload_tensor(&HostTensor::from_i64(&[4], &good.slot_mapping).unwrap()).unwrap();
    let mut cache = z(DType::U8, &[2, 4, 80]);
    assert!(run_with(&kv, &slots, &mut cache).is_ok(), "the good arguments must run");
    assert_eq!(err(run_with(&z(DType::F16, &[4, 80]), &slots, &mut cache)).as_deref(), Some("kv"));
    assert_eq!(err(run_with(&z(DType::F32, &[4, 64]), &slots, &mut cache)).as_deref(), Some("kv"));
    assert_eq!(err(run_with(&z(DType::F32, &[3, 80]), &slots, &mut cache)).as_deref(), Some("kv"));
    let mut kv_strided = z(DType::F32, &[4, 160]);
    kv_strided.layout = Layout { dtype: DType::F32, shape: vec![4, 80], strides: vec![160, 2], offset: 0 };
    assert_eq!(err(run_with(&kv_strided, &slots, &mut cache)).as_deref(), Some("kv"));
    let slots_f32 = upload_f32(b, DType::F32, &[4], &[5.0, -1.0, 0.0, 7.0]).unwrap();
    assert_eq!(err(run_with(&kv, &slots_f32, &mut cache)).as_deref(), Some("slot_mapping"));
    let slots_short = b.upload_tensor(&HostTensor::from_i64(&[3], &[5, -1, 0]).unwrap()).unwrap();
    assert_eq!(err(run_with(&kv, &slots_short, &mut cache)).as_deref(), Some("slot_mapping"));
    assert_eq!(err(run_with(&kv, &slots, &mut z(DType::BF16, &[2, 4, 80]))).as_deref(), Some("cache"), "bf16 cache, fp8 format");
    assert_eq!(err(run_with(&kv, &slots, &mut z(DType::U8, &[2, 4, 160]))).as_deref(), Some("cache"), "bf16 bytes per token");
    assert_eq!(err(run_with(&kv, &slots, &mut z(DType::U8, &[1, 4, 80]))).as_deref(), Some("cache"), "too few pages");
    let mut cache_oob = z(DType::U8, &[2, 4, 80]);
    cache_oob.layout.strides = vec![400, 80, 1];
    assert_eq!(err(run_with(&kv, &slots, &mut cache_oob)).as_deref(), Some("cache"), "layout past the buffer");
}

