//! The kernel sources and code objects carried inside this crate.
//!
//! - [`SOURCES`], [`KernelSet`], [`source`]: k3-kernels' embedded csrc texts (`k3_kernels::csrc`),
//!   what the hiprtc path compiles; the source tree is never read at run time.
//! - [`IMAGES`]: one HSA code object per (`.cu` of csrc, processor of `K3_HIP_ARCHS`, default
//!   `gfx942,gfx950`) when `k3-build-support` found a clang for it at build time (clang-19 for
//!   gfx942, a clang >= 20 or `zig clang` for gfx950); [`UNAVAILABLE`]: the targets without
//!   images and why.

mod generated {
    include!(concat!(env!("OUT_DIR"), "/hip_images.rs"));
}

use crate::arch;
pub use generated::{IMAGES, UNAVAILABLE};
pub use k3_kernels::csrc::{headers, registered_kernels, source, KernelSet, SOURCES};

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

/// An ELF file for the AMDGPU machine (EM_AMDGPU = 224): what an HSA code object is.
pub fn is_amdgpu_elf(bytes: &[u8]) -> bool {
    bytes.len() > 20 && bytes[..4] == *b"\x7fELF" && u16::from_le_bytes([bytes[18], bytes[19]]) == 224
}

#[cfg(test)]
mod tests {
    use super::*;

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
