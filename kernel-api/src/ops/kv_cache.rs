//! MLA KV-cache formats: how one token's 576 values (512 normalised latent + 64 shared k_pe in
//! K3; `latent + rope` in general) are stored.
//!
//! | format | bytes/token (K3) | layout |
//! |---|---|---|
//! | `Bf16` | 1152 | `latent + rope` bf16 values |
//! | `Fp8Flat(f)` | 576 | every value as fp8 of flavour `f`, divided by one per-tensor scale |
//! | `Fp8Tiled(f)` | 656 | `latent` fp8 values in tiles of 128, then one f32 power-of-two scale per tile, then `rope` bf16 values |
//!
//! The flat per-tensor scale must cover the un-normalised rope dims as well as the latent
//! (calibrating on the latent alone saturates k_pe; vLLM #42956): use [`flat_fp8_scale`].
//! Tile scales are 2^ceil(log2(amax / fp8_max)) (FlashMLA), 1.0 for an all-zero tile.
//! fp8 encoding is round-half-even with saturation to the flavour's max finite value.

use crate::error::{ensure, Error, Result};
use crate::formats::{bf16, F8E4M3Fn, F8E4M3Fnuz, Saturation, ScaleRounding, E8M0};

/// Latent tile width of the tile-scaled format.
pub const KV_TILE: usize = 128;

/// fp8 flavour of an fp8 cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Flavor {
    /// OCP e4m3fn (NVIDIA, gfx950), max 448.
    E4M3Fn,
    /// e4m3fnuz (gfx942), max 240.
    E4M3Fnuz,
}

impl Fp8Flavor {
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Flavor::E4M3Fn => F8E4M3Fn::MAX,
            Fp8Flavor::E4M3Fnuz => F8E4M3Fnuz::MAX,
        }
    }
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Fp8Flavor::E4M3Fn => F8E4M3Fn::from_f32(x, Saturation::Finite).to_bits(),
            Fp8Flavor::E4M3Fnuz => F8E4M3Fnuz::from_f32(x, Saturation::Finite).to_bits(),
        }
    }
    pub fn decode(self, b: u8) -> f32 {
        match self {
            Fp8Flavor::E4M3Fn => F8E4M3Fn::from_bits(b).to_f32(),
            Fp8Flavor::E4M3Fnuz => F8E4M3Fnuz::from_bits(b).to_f32(),
        }
    }
}

/// Storage format of the paged MLA latent cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvCacheFormat {
    Bf16,
    Fp8Flat(Fp8Flavor),
    Fp8Tiled(Fp8Flavor),
}

/// Per-token dims of the latent cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvDims {
    /// Normalised latent width (K3: 512).
    pub latent: usize,
    /// Shared, un-normalised key dims (K3: 64).
    pub rope: usize,
}

impl KvDims {
    pub const K3: KvDims = KvDims { latent: 512, rope: 64 };
    pub fn width(self) -> usize {
        self.latent + self.rope
    }
}

impl KvCacheFormat {
    /// All formats, for tests and reports.
    pub const ALL: [KvCacheFormat; 5] = [
        KvCacheFormat::Bf16,
        KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn),
        KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fnuz),
        KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn),
        KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fnuz),
    ];

    /// Bytes one token occupies.
    pub fn bytes_per_token(self, d: KvDims) -> usize {
        match self {
            KvCacheFormat::Bf16 => 2 * d.width(),
            KvCacheFormat::Fp8Flat(_) => d.width(),
            KvCacheFormat::Fp8Tiled(_) => d.latent + 4 * d.latent.div_ceil(KV_TILE) + 2 * d.rope,
        }
    }

    /// Whether the format uses the per-tensor scale parameter.
    pub fn uses_tensor_scale(self) -> bool {
        matches!(self, KvCacheFormat::Fp8Flat(_))
    }

    /// The `--kv-cache-dtype` spelling.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheFormat::Bf16 => "bf16",
            KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn) => "fp8-e4m3fn",
            KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fnuz) => "fp8-e4m3fnuz",
            KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn) => "fp8-tiled-e4m3fn",
            KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fnuz) => "fp8-tiled-e4m3fnuz",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| Error::invalid("kv_cache_dtype", format!("unknown `{s}` (expected one of {})", Self::ALL.map(|f| f.name()).join(", "))))
    }
}

/// A per-tensor scale for a flat fp8 cache that maps the largest magnitude over *all* cached
/// dims (latent and rope) to the flavour's max finite value; 1.0 for all-zero input.
pub fn flat_fp8_scale(values: &[f32], flavor: Fp8Flavor) -> f32 {
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = amax / flavor.max_finite();
    // A subnormal amax can underflow the ratio to 0: any positive scale then encodes zeros.
    if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

fn check_scale(fmt: KvCacheFormat, scale: f32) -> Result<()> {
    ensure(!fmt.uses_tensor_scale() || (scale.is_finite() && scale > 0.0), "kv_scale", || {
        format!("must be finite and positive, got {scale}")
    })
}

/// Encodes one token (`d.width()` values) into `out` (`bytes_per_token` bytes).
pub fn encode_token(fmt: KvCacheFormat, d: KvDims, values: &[f32], kv_scale: f32, out: &mut [u8]) -> Result<()> {
    ensure(values.len() == d.width(), "values", || format!("{} values for a {}-wide token", values.len(), d.width()))?;
    ensure(out.len() == fmt.bytes_per_token(d), "out", || format!("{} bytes for a {}-byte token", out.len(), fmt.bytes_per_token(d)))?;
    check_scale(fmt, kv_scale)?;
    match fmt {
        KvCacheFormat::Bf16 => {
            for (i, &v) in values.iter().enumerate() {
                out[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        KvCacheFormat::Fp8Flat(f) => {
            let inv = 1.0 / kv_scale;
            for (o, &v) in out.iter_mut().zip(values) {
                *o = f.encode(v * inv);
            }
        }
        KvCacheFormat::Fp8Tiled(f) => {
            let tiles = d.latent.div_ceil(KV_TILE);
            for t in 0..tiles {
                let r = t * KV_TILE..((t + 1) * KV_TILE).min(d.latent);
                let amax = values[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                let ratio = amax / f.max_finite();
                // Zero, underflowed (subnormal amax) or non-finite tiles keep scale 1.
                let scale = if ratio > 0.0 && ratio.is_finite() {
                    E8M0::from_f32(ratio, ScaleRounding::Up).to_f32()
                } else {
                    1.0
                };
                for i in r {
                    out[i] = f.encode(values[i] / scale);
                }
                let so = d.latent + 4 * t;
                out[so..so + 4].copy_from_slice(&scale.to_le_bytes());
            }
            let ro = d.latent + 4 * tiles;
            for j in 0..d.rope {
                let v = bf16::from_f32(values[d.latent + j]).to_bits().to_le_bytes();
                out[ro + 2 * j..ro + 2 * j + 2].copy_from_slice(&v);
            }
        }
    }
    Ok(())
}

/// Decodes one token's bytes into `out` (`d.width()` f32 values).
pub fn decode_token(fmt: KvCacheFormat, d: KvDims, bytes: &[u8], kv_scale: f32, out: &mut [f32]) -> Result<()> {
    ensure(out.len() == d.width(), "out", || format!("{} values for a {}-wide token", out.len(), d.width()))?;
    ensure(bytes.len() == fmt.bytes_per_token(d), "bytes", || format!("{} bytes for a {}-byte token", bytes.len(), fmt.bytes_per_token(d)))?;
    check_scale(fmt, kv_scale)?;
    match fmt {
        KvCacheFormat::Bf16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32();
            }
        }
        KvCacheFormat::Fp8Flat(f) => {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = f.decode(b) * kv_scale;
            }
        }
        KvCacheFormat::Fp8Tiled(f) => {
            let tiles = d.latent.div_ceil(KV_TILE);
            for t in 0..tiles {
                let so = d.latent + 4 * t;
                let scale = f32::from_le_bytes([bytes[so], bytes[so + 1], bytes[so + 2], bytes[so + 3]]);
                for i in t * KV_TILE..((t + 1) * KV_TILE).min(d.latent) {
                    out[i] = f.decode(bytes[i]) * scale;
                }
            }
            let ro = d.latent + 4 * tiles;
            for j in 0..d.rope {
                out[d.latent + j] = bf16::from_bits(u16::from_le_bytes([bytes[ro + 2 * j], bytes[ro + 2 * j + 1]])).to_f32();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_token_sizes() {
        assert_eq!(KvCacheFormat::Bf16.bytes_per_token(KvDims::K3), 1152);
        assert_eq!(KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn).bytes_per_token(KvDims::K3), 576);
        assert_eq!(KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fnuz).bytes_per_token(KvDims::K3), 656);
    }

    #[test]
    fn subnormal_amax_keeps_a_usable_scale() {
        let d = KvDims { latent: 4, rope: 2 };
        let v = [1e-44f32, 0.0, -1e-45, 0.0, 0.5, 0.25];
        let f = Fp8Flavor::E4M3Fn;
        assert_eq!(flat_fp8_scale(&v[..4], f), 1.0);
        let fmt = KvCacheFormat::Fp8Tiled(f);
        let mut bytes = vec![0u8; fmt.bytes_per_token(d)];
        encode_token(fmt, d, &v, 1.0, &mut bytes).unwrap();
        let mut out = [0f32; 6];
        decode_token(fmt, d, &bytes, 1.0, &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
        assert_eq!(&out[4..], &[0.5, 0.25]);
    }

    #[test]
    fn names_round_trip() {
        for f in KvCacheFormat::ALL {
            assert_eq!(KvCacheFormat::parse(f.name()).unwrap(), f);
        }
        assert_eq!(KvCacheFormat::parse("fp9").unwrap_err().field(), Some("kv_cache_dtype"));
    }
}
