//! The fp8 KV-cache format that follows from a device's fp8 flavour, and the scale conversion
//! a checkpoint calibrated for the other flavour needs.
//!
//! gfx942 (MI300X) computes with e4m3fnuz, gfx950 (MI355X) and NVIDIA with OCP e4m3fn
//! (`DeviceInfo::fp8`), so `--kv-cache-dtype fp8` (`fp8-tiled`) means `fp8-e4m3fnuz`
//! (`fp8-tiled-e4m3fnuz`) on gfx942 and `fp8-e4m3fn` (`fp8-tiled-e4m3fn`) elsewhere.
//!
//! The two flavours differ by one in the exponent bias (8 vs 7): the same byte is worth half as
//! much in e4m3fnuz as in e4m3fn (fnuz max 240 = 448 / 2 + 16 extra at `0x7F`, which fn spends
//! on NaN). A flat cache's per-tensor scale calibrated for e4m3fn (`amax / 448`) therefore has
//! to be doubled for an e4m3fnuz cache ([`ocp_scale_for_fnuz`]): then every e4m3fn code keeps
//! its value, and nothing above 240 · scale saturates that e4m3fn could hold. The tile-scaled
//! format needs nothing: its power-of-two tile scales are derived from the data at write time
//! for the cache's own flavour.

use kernel_api::ops::{Fp8Flavor, KvCacheFormat};
use kernel_api::{DeviceInfo, Fp8Native, Result};

/// The fp8 flavour a KV cache on this device should use.
pub fn native_fp8_flavor(info: &DeviceInfo) -> Fp8Flavor {
    match info.fp8 {
        Fp8Native::Fnuz => Fp8Flavor::E4M3Fnuz,
        Fp8Native::Ocp | Fp8Native::Both => Fp8Flavor::E4M3Fn,
    }
}

/// `--kv-cache-dtype`: `fp8` and `fp8-tiled` name the device's own flavour; every full name
/// (`bf16`, `fp8-e4m3fnuz`, ...) is taken as given.
pub fn resolve_kv_cache_dtype(name: &str, info: &DeviceInfo) -> Result<KvCacheFormat> {
    match name {
        "fp8" => Ok(KvCacheFormat::Fp8Flat(native_fp8_flavor(info))),
        "fp8-tiled" => Ok(KvCacheFormat::Fp8Tiled(native_fp8_flavor(info))),
        other => KvCacheFormat::parse(other),
    }
}

/// A flat-fp8 dequantisation scale calibrated for OCP e4m3fn, converted for an e4m3fnuz cache
/// (× 2: the same byte is worth half as much in e4m3fnuz).
pub fn ocp_scale_for_fnuz(scale: f32) -> f32 {
    scale * 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_api::formats::{F8E4M3Fn, F8E4M3Fnuz};
    use kernel_api::BackendKind;

    fn info(fp8: Fp8Native) -> DeviceInfo {
        DeviceInfo {
            kind: BackendKind::Rocm,
            arch: "gfx".into(),
            name: String::new(),
            warp_size: 64,
            compute_units: 1,
            shared_mem_per_block: 0,
            l2_bytes: 0,
            fp8,
        }
    }

    #[test]
    fn fp8_names_follow_the_device() {
        let fnuz = info(Fp8Native::Fnuz);
        let ocp = info(Fp8Native::Ocp);
        assert_eq!(resolve_kv_cache_dtype("fp8", &fnuz).unwrap().name(), "fp8-e4m3fnuz");
        assert_eq!(resolve_kv_cache_dtype("fp8-tiled", &fnuz).unwrap().name(), "fp8-tiled-e4m3fnuz");
        assert_eq!(resolve_kv_cache_dtype("fp8", &ocp).unwrap().name(), "fp8-e4m3fn");
        assert_eq!(resolve_kv_cache_dtype("fp8-tiled", &info(Fp8Native::Both)).unwrap().name(), "fp8-tiled-e4m3fn");
        assert_eq!(resolve_kv_cache_dtype("fp8-e4m3fn", &fnuz).unwrap().name(), "fp8-e4m3fn");
        assert!(resolve_kv_cache_dtype("fp9", &fnuz).is_err());
    }

    /// The factor 2 exactly: every byte that is finite in both flavours is worth half as much
    /// in e4m3fnuz, so `fnuz(b) · 2s == fn(b) · s` for the converted scale.
    #[test]
    fn the_same_byte_is_worth_half_in_fnuz() {
        let mut checked = 0;
        for b in 0..=255u8 {
            let (ocp, fnuz) = (F8E4M3Fn::from_bits(b).to_f32(), F8E4M3Fnuz::from_bits(b).to_f32());
            if ocp.is_nan() || fnuz.is_nan() {
                // fn's NaNs (0x7F, 0xFF: 240 and -240 in fnuz) and fnuz's NaN (0x80: -0 in fn).
                assert!([0x7F, 0xFF, 0x80].contains(&b), "{b:#04x}");
                continue;
            }
            assert_eq!(fnuz, ocp / 2.0, "{b:#04x}");
            let s = 0.0123f32;
            assert_eq!(fnuz * ocp_scale_for_fnuz(s), ocp * s, "{b:#04x}");
            checked += 1;
        }
        assert_eq!(checked, 253);
        assert_eq!(F8E4M3Fnuz::MAX, 240.0);
        assert_eq!(F8E4M3Fn::MAX, 448.0);
    }
}
