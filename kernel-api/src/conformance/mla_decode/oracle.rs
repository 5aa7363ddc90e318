//! Independent oracles for the MLA decode tests: a hand-written decoder of the cache bytes,
//! paged-cache builders with shuffled page tables, and f64 attention in the absorbed and naive
//! (decompressed) forms. Nothing here calls the CPU backend.

use crate::conformance::TestRng;
use crate::ops::kv_cache::{encode_token, flat_fp8_scale, Fp8Flavor, KvCacheFormat, KvDims, KV_TILE};

/// An e4m3 byte decoded by its definition: fn has bias 7 and NaN = S.1111.111; fnuz has bias 8,
/// NaN = 0x80 and no -0.
pub fn e4m3_value(bits: u8, flavor: Fp8Flavor) -> f64 {
    let (bias, nan) = match flavor {
        Fp8Flavor::E4M3Fn => (7, bits & 0x7F == 0x7F),
        Fp8Flavor::E4M3Fnuz => (8, bits == 0x80),
    };
    if nan {
        return f64::NAN;
    }
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((bits >> 3) & 0xF) as i32;
    let m = (bits & 7) as f64 / 8.0;
    if e == 0 {
        sign * m * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m) * 2f64.powi(e - bias)
    }
}

/// A little-endian bf16 decoded by its definition (the top half of an f32).
pub fn bf16_value(lo: u8, hi: u8) -> f64 {
    f32::from_bits((u16::from_le_bytes([lo, hi]) as u32) << 16) as f64
}

/// One token's bytes decoded by the format's definition (kernel-anchors.md 4.2 / 4.7).
pub fn decode_token_bytes(fmt: KvCacheFormat, d: KvDims, b: &[u8], kv_scale: f32) -> Vec<f64> {
    match fmt {
        KvCacheFormat::Bf16 => (0..d.width()).map(|i| bf16_value(b[2 * i], b[2 * i + 1])).collect(),
        KvCacheFormat::Fp8Flat(f) => b[..d.width()].iter().map(|&x| e4m3_value(x, f) * kv_scale as f64).collect(),
        KvCacheFormat::Fp8Tiled(f) => {
            let tiles = d.latent.div_ceil(KV_TILE);
            let mut v: Vec<f64> = (0..d.latent)
                .map(|i| {
                    let s = d.latent + 4 * (i / KV_TILE);
                    e4m3_value(b[i], f) * f32::from_le_bytes([b[s], b[s + 1], b[s + 2], b[s + 3]]) as f64
                })
                .collect();
            let r = d.latent + 4 * tiles;
            v.extend((0..d.rope).map(|j| bf16_value(b[r + 2 * j], b[r + 2 * j + 1])));
            v
        }
    }
}

/// A paged cache holding a batch of sequences, pages shuffled over the pool, unused rows and
/// spare pages filled with random bytes (a kernel reading them would produce garbage or NaN).
#[derive(Clone, Debug)]
pub struct PagedCase {
    pub dims: KvDims,
    pub format: KvCacheFormat,
    pub page_size: usize,
    pub num_pages: usize,
    pub kv_scale: f32,
    pub seq_lens: Vec<i32>,
    pub max_pages: usize,
    /// `[batch, max_pages]`, -1 past each sequence's pages.
    pub block_table: Vec<i32>,
    /// `[num_pages, page_size, bytes_per_token]`.
    pub bytes: Vec<u8>,
    /// Raw (unquantised) token values per sequence, `[seq_len][width]`.
    pub raw: Vec<Vec<Vec<f32>>>,
}

impl PagedCase {
    /// Latent values ~ N(0, 1), rope values ~ N(0, rope_std) (un-normalised, larger).
    pub fn new(rng: &mut TestRng, format: KvCacheFormat, dims: KvDims, page_size: usize, seq_lens: &[i32], rope_std: f32) -> Self {
        let raw: Vec<Vec<Vec<f32>>> = seq_lens
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| {
                        let mut t = rng.normals(dims.latent, 1.0);
                        t.extend(rng.normals(dims.rope, rope_std));
                        t
                    })
                    .collect()
            })
            .collect();
        Self::from_raw(rng, format, dims, page_size, raw)
    }

    /// Builds the cache from given raw token values (same values, another format or page size).
    pub fn from_raw(rng: &mut TestRng, format: KvCacheFormat, dims: KvDims, page_size: usize, raw: Vec<Vec<Vec<f32>>>) -> Self {
        let all: Vec<f32> = raw.iter().flatten().flatten().copied().collect();
        let kv_scale = match format {
            KvCacheFormat::Fp8Flat(f) => flat_fp8_scale(&all, f),
            _ => 1.0,
        };
        let pages_of: Vec<usize> = raw.iter().map(|s| s.len().div_ceil(page_size)).collect();
        let max_pages = pages_of.iter().copied().max().unwrap_or(0) + 1; // one spare column
        let num_pages = pages_of.iter().sum::<usize>() + 2; // two spare pages
        let perm = rng.permutation(num_pages);
        let bpt = format.bytes_per_token(dims);
        let mut bytes: Vec<u8> = (0..num_pages * page_size * bpt).map(|_| rng.next_u64() as u8).collect();
        let mut block_table = vec![-1i32; raw.len() * max_pages];
        let mut next = 0;
        for (b, seq) in raw.iter().enumerate() {
            for j in 0..pages_of[b] {
                block_table[b * max_pages + j] = perm[next] as i32;
                next += 1;
            }
            for (s, tok) in seq.iter().enumerate() {
                let page = block_table[b * max_pages + s / page_size] as usize;
                let at = (page * page_size + s % page_size) * bpt;
                encode_token(format, dims, tok, kv_scale, &mut bytes[at..at + bpt]).expect("encode_token");
            }
        }
        PagedCase {
            dims,
            format,
            page_size,
            num_pages,
            kv_scale,
            seq_lens: raw.iter().map(|s| s.len() as i32).collect(),
            max_pages,
            block_table,
            bytes,
            raw,
        }
    }

    /// The cached keys of sequence b as the oracle decodes them: `[seq_len][width]`.
    pub fn decoded(&self, b: usize) -> Vec<Vec<f64>> {
        let bpt = self.format.bytes_per_token(self.dims);
        (0..self.seq_lens[b] as usize)
            .map(|s| {
                let page = self.block_table[b * self.max_pages + s / self.page_size] as usize;
                let at = (page * self.page_size + s % self.page_size) * bpt;
                decode_token_bytes(self.format, self.dims, &self.bytes[at..at + bpt], self.kv_scale)
            })
            .collect()
    }
}

/// Absorbed attention of one query row `[q̂ | q_pe]` over `keys` (`[c | k_pe]` rows):
/// (ĉ, lse) in f64; no keys gives (0, -inf).
pub fn absorbed_attention(q: &[f64], keys: &[Vec<f64>], latent: usize, scale: f64) -> (Vec<f64>, f64) {
    let values: Vec<&[f64]> = keys.iter().map(|k| &k[..latent]).collect();
    softmax_attention(q, &keys.iter().map(|k| k.as_slice()).collect::<Vec<_>>(), &values, latent, scale)
}

/// Plain softmax attention of one query over key/value rows in f64: (output, natural-log LSE).
pub fn softmax_attention(q: &[f64], keys: &[&[f64]], values: &[&[f64]], dv: usize, scale: f64) -> (Vec<f64>, f64) {
    if keys.is_empty() {
        return (vec![0.0; dv], f64::NEG_INFINITY);
    }
    let s: Vec<f64> = keys.iter().map(|k| q.iter().zip(k.iter()).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut o = vec![0f64; dv];
    for (wi, v) in w.iter().zip(values) {
        for (oi, vi) in o.iter_mut().zip(v.iter()) {
            *oi += wi / z * vi;
        }
    }
    (o, m + z.ln())
}

/// Oracle output of a decode batch: `out` `[batch, q_len, heads, latent]` and `lse`
/// `[batch, q_len, heads]` from the oracle-decoded cache, causal tail mask.
pub fn decode_oracle(case: &PagedCase, q: &[f32], q_len: usize, heads: usize, scale: f64) -> (Vec<f32>, Vec<f32>) {
    let (latent, w) = (case.dims.latent, case.dims.width());
    let mut out = Vec::new();
    let mut lse = Vec::new();
    for b in 0..case.seq_lens.len() {
        let keys = case.decoded(b);
        let seq_len = case.seq_lens[b] as usize;
        for i in 0..q_len {
            let visible = &keys[..seq_len - q_len + i + 1];
            for h in 0..heads {
                let row = ((b * q_len + i) * heads + h) * w;
                let qv: Vec<f64> = q[row..row + w].iter().map(|&x| x as f64).collect();
                let (o, l) = absorbed_attention(&qv, visible, latent, scale);
                out.extend(o.iter().map(|&x| x as f32));
                lse.push(l as f32);
            }
        }
    }
    (out, lse)
}
