//! The kernel sources and binaries carried inside this crate, and the arch arithmetic that
//! decides whether an embedded binary runs on a device.
//!
//! - [`SOURCES`], [`KernelSet`], [`source`]: k3-kernels' embedded csrc texts (`k3_kernels::csrc`),
//!   what the NVRTC path compiles; the source tree is never read at run time.
//! - [`IMAGES`]: one nvcc cubin per (`.cu` of csrc, `sm_XX` of `K3_CUDA_ARCHS`) when
//!   `k3-build-support` found nvcc at build time; [`UNAVAILABLE`]: the targets without images
//!   and why (both from build.rs).

mod generated {
    include!(concat!(env!("OUT_DIR"), "/cuda_images.rs"));
}

pub use generated::{IMAGES, UNAVAILABLE};
pub use k3_kernels::csrc::{headers, registered_kernels, source, KernelSet, SOURCES};
use std::fmt;

/// The embedded cubin of a kernel file that runs on a device of compute capability
/// `major.minor`, if build.rs produced one.
pub fn embedded_cubin(path: &str, major: u32, minor: u32) -> Option<&'static [u8]> {
    IMAGES
        .iter()
        .find(|(p, target, _)| *p == path && Arch::parse(target).is_some_and(|a| a.runs_on(major, minor)))
        .map(|(_, _, b)| *b)
}

/// The targets that have embedded images (`sm_90a`, ...), in build order.
pub fn embedded_targets() -> Vec<&'static str> {
    let mut out: Vec<&str> = Vec::new();
    for (_, target, _) in IMAGES {
        if !out.contains(target) {
            out.push(target);
        }
    }
    out
}

/// A CUDA target: `sm_90a` is `{ major: 9, minor: 0, suffix: Some('a') }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
    /// `a` (arch-specific: this exact compute capability only), `f` (family: same major, this
    /// minor or newer), or none (same major, this minor or newer).
    pub suffix: Option<char>,
}

impl Arch {
    /// Parses `90a`, `sm_90a`, `compute_100a`, `120`, `100f`.
    pub fn parse(s: &str) -> Option<Arch> {
        let t = s.trim().trim_start_matches("sm_").trim_start_matches("compute_");
        let (digits, suffix) = match t.chars().last()? {
            c @ ('a' | 'f') => (&t[..t.len() - 1], Some(c)),
            _ => (t, None),
        };
        if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let (maj, min) = digits.split_at(digits.len() - 1);
        Some(Arch { major: maj.parse().ok()?, minor: min.parse().ok()?, suffix })
    }

    /// The richest target a device of compute capability `major.minor` runs: the
    /// arch-specific `sm_XYa` from Hopper on (wgmma, tcgen05 need it), plain `sm_XY` before.
    pub fn for_device(major: u32, minor: u32) -> Arch {
        Arch { major, minor, suffix: (major >= 9).then_some('a') }
    }

    /// Whether SASS compiled for `self` runs on a device of compute capability `major.minor`.
    pub fn runs_on(&self, major: u32, minor: u32) -> bool {
        match self.suffix {
            Some('a') => self.major == major && self.minor == minor,
            _ => self.major == major && self.minor <= minor,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)?;
        if let Some(c) = self.suffix {
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// Whether the embedded cubins include SASS for a device of compute capability `major.minor`.
pub fn embedded_covers(major: u32, minor: u32) -> bool {
    embedded_targets().iter().filter_map(|a| Arch::parse(a)).any(|a| a.runs_on(major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archs_parse_print_and_match_devices() {
        let a = Arch::parse("90a").unwrap();
        assert_eq!(a.to_string(), "sm_90a");
        assert!(a.runs_on(9, 0) && !a.runs_on(10, 0));
        assert_eq!(Arch::parse("sm_103a").unwrap(), Arch { major: 10, minor: 3, suffix: Some('a') });
        assert!(!Arch::parse("100a").unwrap().runs_on(10, 3), "sm_100a SASS does not run on sm_103");
        assert!(Arch::parse("80").unwrap().runs_on(8, 6) && !Arch::parse("86").unwrap().runs_on(8, 0));
        assert!(Arch::parse("compute_120").unwrap().runs_on(12, 1));
        for bad in ["", "9", "9x", "sm_", "a", "90aa"] {
            assert_eq!(Arch::parse(bad), None, "{bad}");
        }
        assert_eq!(Arch::for_device(9, 0).to_string(), "sm_90a");
        assert_eq!(Arch::for_device(10, 3).to_string(), "sm_103a");
        assert_eq!(Arch::for_device(8, 9).to_string(), "sm_89");
    }

    #[test]
    fn embedded_images_are_cubins_of_every_kernel_file() {
        if IMAGES.is_empty() {
            assert!(!UNAVAILABLE.is_empty(), "no images must come with a reason");
            println!("skipped: no kernel images embedded: {UNAVAILABLE:?}");
            return;
        }
        let kernel_files: Vec<&str> = KernelSet::ALL.iter().flat_map(|s| s.files()).collect();
        for target in embedded_targets() {
            let arch = Arch::parse(target).unwrap_or_else(|| panic!("{target}"));
            for file in &kernel_files {
                let image = embedded_cubin(file, arch.major, arch.minor).unwrap_or_else(|| panic!("{file} for {target}"));
                // An ELF file (cubins are ELF), machine EM_CUDA = 190.
                assert_eq!(image.get(..4), Some(&b"\x7fELF"[..]), "{file}");
                assert_eq!(image.get(18..20), Some(&190u16.to_le_bytes()[..]), "{file}");
            }
        }
        assert!(IMAGES.iter().all(|(f, _, _)| kernel_files.contains(f)));
    }
}
