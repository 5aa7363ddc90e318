//! Target architecture lists (`K3_CUDA_ARCHS`, `K3_HIP_ARCHS`) and what each needs.

use std::fmt;

/// Default of `K3_CUDA_ARCHS`: Hopper (H100/H200) and the two datacenter Blackwell parts.
pub const DEFAULT_CUDA_ARCHS: &str = "90a,100a,103a";
/// Default of `K3_HIP_ARCHS`: MI300 (CDNA3) and MI350 (CDNA4).
pub const DEFAULT_HIP_ARCHS: &str = "gfx942,gfx950";

/// An NVIDIA compute capability as nvcc spells it after `sm_`: digits and an optional
/// feature-set suffix (`a` arch-specific, `f` family), e.g. `90a`, `100a`, `120`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaArch(String);

impl CudaArch {
    /// Accepts `90a`, `sm_90a`, `compute_90a` (any case); `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("sm_").or_else(|| s.strip_prefix("compute_")).unwrap_or(&s);
        let digits = s.trim_end_matches(['a', 'f']);
        let suffix = &s[digits.len()..];
        let ok = (2..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) && suffix.len() <= 1;
        ok.then(|| CudaArch(s.to_string()))
    }

    /// `90a`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `sm_90a`, the name of the real architecture (and of the cubin target).
    pub fn sm(&self) -> String {
        format!("sm_{}", self.0)
    }

    /// `compute_90a`, the virtual architecture nvcc compiles the PTX for.
    pub fn compute(&self) -> String {
        format!("compute_{}", self.0)
    }
}

impl fmt::Display for CudaArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.0)
    }
}

/// An AMDGPU processor as clang's `--offload-arch` takes it, optionally with target features
/// (`gfx942`, `gfx942:xnack-`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HipArch(String);

impl HipArch {
    /// Accepts `gfx` followed by hex digits, then optional `:feature+`/`:feature-` parts.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let mut parts = s.split(':');
        let proc_ = parts.next()?;
        let id = proc_.strip_prefix("gfx")?;
        let proc_ok = (3..=4).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit());
        let feats_ok = parts.all(|f| {
            f.len() > 1
                && (f.ends_with('+') || f.ends_with('-'))
                && f[..f.len() - 1].bytes().all(|b| b.is_ascii_alphanumeric())
        });
        (proc_ok && feats_ok).then_some(HipArch(s))
    }

    /// The full `--offload-arch` value.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The processor without target features (`gfx942`).
    pub fn processor(&self) -> &str {
        self.0.split(':').next().unwrap_or(&self.0)
    }

    /// Oldest LLVM major version whose AMDGPU backend knows this processor (0: not tracked;
    /// the compiler decides). gfx950 is the one that matters: LLVM 19 rejects it.
    pub fn min_llvm_major(&self) -> u32 {
        match self.processor() {
            "gfx950" => 20,
            "gfx1250" | "gfx1251" => 22,
            "gfx1200" | "gfx1201" => 18,
            "gfx940" => 15,
            "gfx941" | "gfx942" => 16,
            _ => 0,
        }
    }

    /// A file-name-safe spelling (`gfx942_xnack-`).
    pub fn file_stem(&self) -> String {
        self.0.replace(':', "_")
    }
}

impl fmt::Display for HipArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits a list on commas, semicolons or whitespace (FlashKDA uses commas, AITER semicolons)
/// and parses each entry; returns the parsed archs (deduplicated, in order) and the rejected
/// entries. `none` or an empty list gives no archs.
pub fn parse_list<T: PartialEq>(spec: &str, parse: impl Fn(&str) -> Option<T>) -> (Vec<T>, Vec<String>) {
    let mut archs = Vec::new();
    let mut bad = Vec::new();
    for item in spec.split([',', ';', ' ', '\t', '\n']).map(str::trim).filter(|s| !s.is_empty()) {
        if item.eq_ignore_ascii_case("none") {
            continue;
        }
        match parse(item) {
            Some(a) if !archs.contains(&a) => archs.push(a),
            Some(_) => {}
            None => bad.push(item.to_string()),
        }
    }
    (archs, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_arch_spellings() {
        assert_eq!(CudaArch::parse("sm_90a").map(|a| a.compute()), Some("compute_90a".into()));
        assert_eq!(CudaArch::parse("100A").map(|a| a.sm()), Some("sm_100a".into()));
        assert_eq!(CudaArch::parse("compute_120").map(|a| a.sm()), Some("sm_120".into()));
        for bad in ["", "9", "sm_", "90aa", "gfx942", "1000", "90b"] {
            assert_eq!(CudaArch::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn hip_arch_spellings() {
        assert_eq!(HipArch::parse("gfx942:xnack-").map(|a| a.processor().to_string()), Some("gfx942".into()));
        assert_eq!(HipArch::parse("GFX950").map(|a| a.min_llvm_major()), Some(20));
        assert_eq!(HipArch::parse("gfx90a").map(|a| a.min_llvm_major()), Some(0));
        for bad in ["", "942", "gfx", "gfx9z2", "gfx942:", "gfx942:xnack", "sm_90a"] {
            assert_eq!(HipArch::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn lists_split_dedup_and_report_bad_entries() {
        let (a, bad) = parse_list("90a, sm_90a;100a  bogus,,103a", CudaArch::parse);
        assert_eq!(a.iter().map(|a| a.as_str()).collect::<Vec<_>>(), ["90a", "100a", "103a"]);
        assert_eq!(bad, ["bogus"]);
        let (a, bad) = parse_list("none", HipArch::parse);
        assert!(a.is_empty() && bad.is_empty());
    }
}
