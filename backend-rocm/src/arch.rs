//! AMD GPU target names and what the plans need to know about each processor.
//!
//! A device reports its target ID (`gcnArchName`), e.g. `gfx942:sramecc+:xnack-`: the processor
//! and the target features it runs with. Code objects are compiled for the processor (the
//! features are left "any", which runs with either setting), so images are selected by the
//! processor alone.

use kernel_api::Fp8Native;

/// The processor of a target ID (`gfx942:sramecc+:xnack-` -> `gfx942`).
pub fn processor(target_id: &str) -> &str {
    target_id.split(':').next().unwrap_or(target_id).trim()
}

/// Whether `s` is a target ID: `gfx` + 3 or 4 hex digits, then `:feature+` / `:feature-` parts.
pub fn is_target_id(s: &str) -> bool {
    let mut parts = s.split(':');
    let proc_ok = parts.next().and_then(|p| p.strip_prefix("gfx")).is_some_and(|id| {
        (3..=4).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    proc_ok
        && parts.all(|f| {
            f.len() > 1
                && (f.ends_with('+') || f.ends_with('-'))
                && f[..f.len() - 1].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// The target ID inside a `hipDeviceProp_t` written into `bytes`, found without knowing the
/// struct's layout (it differs between ROCm 5, 6 and 7): every NUL-terminated string that
/// starts after a NUL byte (or at offset 0) and is a target ID. A full target ID (with
/// features, what `gcnArchName` holds) wins over a bare processor name (which a `name` field
/// might hold).
pub fn find_target_id(bytes: &[u8]) -> Option<String> {
    let mut bare: Option<String> = None;
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(3).position(|w| w == b"gfx") {
        let start = i + pos;
        i = start + 3;
        if start > 0 && bytes[start - 1] != 0 {
            continue;
        }
        let Some(len) = bytes[start..].iter().position(|&b| b == 0) else { break };
        let Ok(s) = std::str::from_utf8(&bytes[start..start + len]) else { continue };
        if !is_target_id(s) {
            continue;
        }
        if s.contains(':') {
            return Some(s.to_string());
        }
        bare.get_or_insert_with(|| s.to_string());
    }
    bare
}

/// The fp8 flavour the processor's matrix and conversion instructions use: e4m3fnuz / e5m2fnuz
/// on the MI300 family (gfx940, gfx941, gfx942), OCP e4m3fn / e5m2 on gfx950 and RDNA4
/// (gfx12); none in hardware elsewhere (the kernels decode both in software).
pub fn fp8_native(processor: &str) -> Fp8Native {
    match processor {
        "gfx940" | "gfx941" | "gfx942" => Fp8Native::Fnuz,
        p if p == "gfx950" || p.starts_with("gfx12") => Fp8Native::Ocp,
        _ => Fp8Native::Both,
    }
}

/// LDS per workgroup of the processors this project targets (CDNA3 64 KiB, CDNA4 160 KiB), used
/// only when the runtime does not report it.
pub fn known_lds_bytes(processor: &str) -> Option<usize> {
    match processor {
        "gfx90a" | "gfx940" | "gfx941" | "gfx942" => Some(64 << 10),
        "gfx950" => Some(160 << 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ids_and_processors() {
        assert_eq!(processor("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(processor("gfx950"), "gfx950");
        for ok in ["gfx942", "gfx950", "gfx90a", "gfx1201", "gfx942:sramecc+:xnack-", "gfx90a:xnack+"] {
            assert!(is_target_id(ok), "{ok}");
        }
        for bad in ["", "gfx", "gfx9", "gfx94z", "gfx94200", "gfx942:", "gfx942:xnack", "GFX942", "sm_90a", "gfx942:x+y-"] {
            assert!(!is_target_id(bad), "{bad}");
        }
        assert_eq!(fp8_native("gfx942"), Fp8Native::Fnuz);
        assert_eq!(fp8_native("gfx950"), Fp8Native::Ocp);
        assert_eq!(fp8_native("gfx1201"), Fp8Native::Ocp);
        assert_eq!(fp8_native("gfx90a"), Fp8Native::Both);
        assert_eq!(known_lds_bytes("gfx942"), Some(65536));
        assert_eq!(known_lds_bytes("gfx950"), Some(163840));
    }

    #[test]
    fn target_id_is_found_in_any_layout() {
        // A name field, then integers, then the arch name at an arbitrary offset.
        for offset in [256usize, 396, 1160, 4000] {
            let mut buf = vec![0u8; 8192];
            buf[..19].copy_from_slice(b"AMD Instinct MI300X");
            buf[300..304].copy_from_slice(&0x6766_7800u32.to_le_bytes()); // "\0xfg": no match
            let id = b"gfx942:sramecc+:xnack-";
            buf[offset..offset + id.len()].copy_from_slice(id);
            assert_eq!(find_target_id(&buf).as_deref(), Some("gfx942:sramecc+:xnack-"), "offset {offset}");
        }
        // A bare processor name is taken when there is nothing better.
        let mut buf = vec![0u8; 64];
        buf[10..16].copy_from_slice(b"gfx950");
        assert_eq!(find_target_id(&buf).as_deref(), Some("gfx950"));
        // Embedded in other text, or unterminated: not a field of its own.
        let mut buf = vec![0u8; 64];
        buf[..12].copy_from_slice(b"xgfx942:xna+");
        assert_eq!(find_target_id(&buf), None);
        assert_eq!(find_target_id(b"gfx942"), None);
        assert_eq!(find_target_id(&[]), None);
    }
}
