//! The kernel sources and code objects carried inside this crate.
//!
//! - [`SOURCES`]: every file of `kernels/csrc` (embedded by build.rs with include_str!), what the
//!   hiprtc path compiles; the source tree is never read at run time.
//! - [`IMAGES`]: one HSA code object per (`.cu` of csrc, processor of `K3_HIP_ARCHS`, default
//!   `gfx942,gfx950`) when `k3-build-support` found a clang for it at build time (clang-19 for
//!   gfx942, a clang >= 20 or `zig clang` for gfx950); [`UNAVAILABLE`]: the targets without
//!   images and why.

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));
    include!(concat!(env!("OUT_DIR"), "/hip_images.rs"));
}

use crate::arch;
pub use generated::{IMAGES, SOURCES, UNAVAILABLE};
use std::fmt;

/// A group of kernel files loaded as one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// `csrc/ops/**.cu`: the op kernels the launchers of k3-kernels call.
    Ops,
    /// `csrc/tests/**.cu`: the dialect's own test kernels.
    Tests,
}

impl KernelSet {
    pub const ALL: [KernelSet; 2] = [KernelSet::Ops, KernelSet::Tests];

    /// The folder of csrc the set's `.cu` files live in.
    pub const fn dir(self) -> &'static str {
        match self {
            KernelSet::Ops => "ops",
            KernelSet::Tests => "tests",
        }
    }

    /// The set's kernel files (paths relative to csrc), sorted.
    pub fn files(self) -> Vec<&'static str> {
        let prefix = format!("{}/", self.dir());
        SOURCES.iter().map(|(p, _)| *p).filter(|p| p.starts_with(&prefix) && p.ends_with(".cu")).collect()
    }
}

impl fmt::Display for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dir())
    }
}

/// The embedded text of a csrc file.
pub fn source(path: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// The embedded code object of a kernel file for a device whose target ID has this processor
/// (`gfx942` for `gfx942:sramecc+:xnack-`). Images built for a target with features
/// (`K3_HIP_ARCHS=gfx942:xnack-`) match the processor too; the runtime refuses one whose
/// features contradict the device's.
pub fn embedded_image(path: &str, processor: &str) -> Option<&'static [u8]> {
    IMAGES.iter().find(|(p, target, _)| *p == path && arch::processor(target) == processor).map(|(_, _, b)| *b)
}

/// The processors that have embedded images, in build order.
pub fn embedded_processors() -> Vec<&'static str> {
    let mut out: Vec<&str> = Vec::new();
    for (_, target, _) in IMAGES {
        let p = arch::processor(target);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Kernel names a source registers with `K3_EXPORT(name)` (the dialect's registration macro),
/// inside preprocessor conditionals too: the kernels a build of the file may contain, so a
/// lookup asks only the modules that can have the kernel.
pub fn declared_kernels(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("K3_EXPORT(").and_then(|rest| rest.split(')').next()).map(str::trim))
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// An ELF file for the AMDGPU machine (EM_AMDGPU = 224): what an HSA code object is.
pub fn is_amdgpu_elf(bytes: &[u8]) -> bool {
    bytes.len() > 20 && bytes[..4] == *b"\x7fELF" && u16::from_le_bytes([bytes[18], bytes[19]]) == 224
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_embedded_and_sets_list_kernel_files() {
        assert!(source("k3/compat.h").is_some_and(|s| s.contains("K3_COMPAT_H")));
        assert!(KernelSet::Tests.files().contains(&"tests/reduce.cu"));
        assert!(KernelSet::Ops.files().iter().all(|f| f.starts_with("ops/") && f.ends_with(".cu")));
        assert_eq!(declared_kernels(source("tests/reduce.cu").unwrap()), ["block_reduce"]);
        // The macro's definitions in the dialect headers are not registrations.
        assert!(declared_kernels(source("k3/detail/target_hip.h").unwrap()).is_empty());
        let conditional = "K3_EXPORT(a);\n#if K3_WARP_SIZE == 64\nK3_EXPORT(b);\n#endif\n// K3_EXPORT(c);\n";
        assert_eq!(declared_kernels(conditional), ["a", "b"]);
    }

    #[test]
    fn embedded_images_are_amdgpu_code_objects_of_every_kernel_file() {
        if IMAGES.is_empty() {
            assert!(!UNAVAILABLE.is_empty(), "no images must come with a reason");
            println!("skipped: no kernel images embedded: {UNAVAILABLE:?}");
            return;
        }
        let kernel_files: Vec<&str> = KernelSet::ALL.iter().flat_map(|s| s.files()).collect();
        for processor in embedded_processors() {
            for file in &kernel_files {
                let image = embedded_image(file, processor).unwrap_or_else(|| panic!("{file} for {processor}"));
                assert!(is_amdgpu_elf(image), "{file} for {processor} is not an AMDGPU ELF");
            }
        }
        assert!(IMAGES.iter().all(|(f, _, _)| kernel_files.contains(f)));
        // A device reporting features selects the processor's image.
        let p = embedded_processors()[0];
        assert!(embedded_image(kernel_files[0], arch::processor(&format!("{p}:sramecc+:xnack-"))).is_some());
        assert!(embedded_image(kernel_files[0], "gfx000").is_none());
    }
}
