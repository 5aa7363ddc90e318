//! Run-time compilation of the embedded kernel sources with NVRTC, to a cubin for one arch
//! (`nvrtcGetCUBIN`: SASS, so no driver-side PTX JIT and no PTX-version mismatch), with an
//! on-disk cache.
//!
//! - Headers come from [`crate::kernels::SOURCES`] through `nvrtcCreateProgram`'s header list
//!   (every csrc header under its csrc-relative name, and the headers beside a `.cu` also under
//!   their names relative to it), so no source tree is needed. The toolkit's `include/` is
//!   passed with `-I` when the NVRTC library was found inside a toolkit root that has one.
//! - Cache: `$K3_KERNEL_CACHE_DIR` (`off` disables it), default `$XDG_CACHE_HOME/k3-kernels` or
//!   `~/.cache/k3-kernels`; files `cuda/<file>-<arch>-<key>.cubin`, the key a 128-bit FNV-1a
//!   hash of the file, every header, the options and the NVRTC version (the cache itself is
//!   `k3_kernels::jit_cache`, shared with the ROCm backend's hiprtc).

use crate::dylib::{toolkit_roots, Lib, NotFound};
use crate::kernels::{self, Arch};
pub use k3_kernels::jit_cache::{CacheOutcome, KernelCache};
use cudarc::nvrtc::sys;
use kernel_api::{Error, Result};
use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// NVRTC entry points this module calls (checked before cudarc would resolve them).
const SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcDestroyProgram",
];

/// What to install when NVRTC is missing.
pub const INSTALL_HINT: &str =
    "install NVRTC (`pip install nvidia-cuda-nvrtc` and set CUDA_HOME to its site-packages/nvidia/cu13 folder, \
     or a CUDA toolkit with CUDA_HOME set), or add the folder holding libnvrtc.so.* to LD_LIBRARY_PATH";

/// A loaded NVRTC library.
#[derive(Debug)]
pub struct Nvrtc {
    lib: Lib,
    version: (i32, i32),
    include_dir: Option<PathBuf>,
}

static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();

/// The process's NVRTC, found and checked once; `Unavailable` naming what to install.
pub fn nvrtc() -> Result<&'static Nvrtc> {
    NVRTC.get_or_init(load).as_ref().map_err(|why| Error::Unavailable { why: why.clone() })
}

fn load() -> std::result::Result<Nvrtc, String> {
    let lib = Lib::find("nvrtc", true)
        .map_err(|NotFound { searched }| format!("NVRTC not found (searched {}); {INSTALL_HINT}", NotFound { searched }.describe()))?;
    let missing = lib.missing(SYMBOLS);
    if !missing.is_empty() {
        return Err(format!("{} lacks {missing:?} (NVRTC 11.1 or newer is needed); {INSTALL_HINT}", lib.found_as));
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the symbol exists (checked above) and the out-pointers are valid.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed in {}: {rc:?}", lib.found_as));
    }
    // The toolkit's headers, for kernels that include cuda_*.h: beside lib/ in a toolkit root
    // (a real toolkit, or the pip wheels' nvidia/cu13 folder).
    let include_dir = lib
        .dir()
        .and_then(|d| d.parent().map(|r| r.join("include")))
        .into_iter()
        .chain(toolkit_roots().into_iter().map(|r| r.join("include")))
        .find(|inc| inc.join("cuda_bf16.h").is_file() || inc.join("nvrtc.h").is_file());
    Ok(Nvrtc { lib, version: (major, minor), include_dir })
}

impl Nvrtc {
    /// `(major, minor)` of the library.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }
    /// The SM versions this NVRTC compiles for (`[75, 80, ..., 90, 100, 103, ...]`), when the
    /// library can list them (NVRTC 11.2+).
    pub fn supported_archs(&self) -> Option<Vec<u32>> {
        if !self.lib.has("nvrtcGetNumSupportedArchs") || !self.lib.has("nvrtcGetSupportedArchs") {
            return None;
        }
        let mut n: c_int = 0;
        // SAFETY: symbols checked; valid out-pointer.
        if unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) } != sys::nvrtcResult::NVRTC_SUCCESS || n <= 0 {
            return None;
        }
        let mut v = vec![0 as c_int; n as usize];
        // SAFETY: the buffer holds the n entries the library reported.
        if unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) } != sys::nvrtcResult::NVRTC_SUCCESS {
            return None;
        }
        Some(v.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect())
    }

    /// Whether this NVRTC can target `arch` (true when it cannot say).
    pub fn supports(&self, arch: &Arch) -> bool {
        self.supported_archs().is_none_or(|l| l.contains(&(arch.major * 10 + arch.minor)))
    }

    /// Where the library was loaded from.
    pub fn location(&self) -> &str {
        &self.lib.found_as
    }

    /// The options a compile for `arch` uses (part of the cache key).
    pub fn options(&self, arch: &Arch) -> Vec<String> {
        let mut o = vec![format!("--gpu-architecture={arch}"), "-std=c++17".into(), "-lineinfo".into()];
        if let Some(inc) = &self.include_dir {
            o.push(format!("-I{}", inc.display()));
        }
        o
    }

    /// Compiles the embedded kernel file `file` (csrc-relative, e.g. `tests/reduce.cu`) to a
    /// cubin for `arch`, without the cache.
    pub fn compile_cubin(&self, file: &str, arch: &Arch) -> Result<Vec<u8>> {
        let src = kernels::source(file).ok_or_else(|| Error::invalid("file", format!("no embedded kernel source `{file}`")))?;
        self.compile_source(file, src, arch)
    }

    /// Compiles `src` as if it were the csrc file `file` (its quoted includes resolve against
    /// the embedded headers): the path for kernels written outside kernels/csrc.
    pub fn compile_source(&self, file: &str, src: &str, arch: &Arch) -> Result<Vec<u8>> {
        let dir = file.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
        // Every header under its csrc-relative name; those beside the file also under the name
        // relative to it (`#include "common.cuh"` from ops/x.cu).
        let mut names = Vec::new();
        let mut texts = Vec::new();
        for (path, text) in kernels::headers() {
            let mut add = |name: &str| -> Result<()> {
                names.push(cstring("header name", name)?);
                texts.push(cstring(path, text)?);
                Ok(())
            };
            add(path)?;
            if let Some(local) = path.strip_prefix(dir.as_str()).filter(|_| !dir.is_empty()) {
                add(local)?;
            }
        }
        let csrc = cstring(file, src)?;
        let cname = cstring("file", file)?;
        let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        let text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
        let opts: Vec<CString> = self.options(arch).iter().map(|o| cstring("option", o)).collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let call = |what: &str| format!("{what}({file}, {arch})");
        let fail = |what: &str, rc: sys::nvrtcResult| Error::Driver { call: call(what), why: format!("{rc:?}") };

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer array holds `len` valid NUL-terminated strings that outlive the
        // program (destroyed below before they drop); the symbols were checked at load.
        let rc = unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                name_ptrs.len() as c_int,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        if rc != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("nvrtcCreateProgram", rc));
        }
        let out = (|| {
            // SAFETY: prog is a live program; options are valid C strings.
            let rc = unsafe { sys::nvrtcCompileProgram(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(Error::Driver { call: call("nvrtcCompileProgram"), why: format!("{rc:?}\n{}", program_log(prog)) });
            }
            let mut size = 0usize;
            // SAFETY: live program, valid out-pointer.
            let rc = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBINSize", rc));
            }
            if size == 0 {
                return Err(Error::Driver {
                    call: call("nvrtcGetCUBIN"),
                    why: "no cubin produced (a compute_* target gives PTX only)".into(),
                });
            }
            let mut cubin = vec![0u8; size];
            // SAFETY: the buffer holds `size` bytes, what nvrtcGetCUBINSize reported.
            let rc = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBIN", rc));
            }
            Ok(cubin)
        })();
        // SAFETY: prog was created above and is destroyed once.
        unsafe { sys::nvrtcDestroyProgram(&mut prog) };
        out
    }

    /// Compiles through the cache: a hit returns the stored cubin.
    pub fn cubin(&self, file: &str, arch: &Arch, cache: &CubinCache) -> Result<(Vec<u8>, CacheOutcome)> {
        let path = cache.path("cuda", file, &arch.to_string(), &format!("{:032x}", self.cache_key(file, arch)), "cubin");
        cache.get_or_compile(path, is_cuda_elf, || self.compile_cubin(file, arch))
    }

    /// The content key of one compile: file, every header, options and NVRTC version.
    pub fn cache_key(&self, file: &str, arch: &Arch) -> u128 {
        let mut h = Fnv128::new();
        h.add(b"k3-backend-cuda nvrtc cubin v1");
        h.add(file.as_bytes());
        h.add(kernels::source(file).unwrap_or("").as_bytes());
        for (p, text) in kernels::headers() {
            h.add(p.as_bytes());
            h.add(text.as_bytes());
        }
        for o in self.options(arch) {
            h.add(o.as_bytes());
        }
        h.add(format!("{}.{}", self.version.0, self.version.1).as_bytes());
        h.finish()
    }
}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(what.to_string(), "contains a NUL byte"))
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: live program, valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut log = vec![0u8; size];
    // SAFETY: the buffer holds `size` bytes.
    if unsafe { sys::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).trim().to_string()
}

/// An ELF file for the CUDA machine (EM_CUDA = 190): what a cubin is.
pub fn is_cuda_elf(bytes: &[u8]) -> bool {
    bytes.len() > 20 && bytes[..4] == *b"\x7fELF" && u16::from_le_bytes([bytes[18], bytes[19]]) == 190
}

/// Where compiled cubins are kept (`k3_kernels::jit_cache`: `$K3_KERNEL_CACHE_DIR/cuda/`).
pub type CubinCache = KernelCache;

/// FNV-1a, 128 bit: a stable content hash (std's hashers are not stable across releases).
struct Fnv128(u128);

impl Fnv128 {
    fn new() -> Self {
        Fnv128(0x6c62_272e_07bb_0142_62b8_2175_6295_c58d)
    }
    /// Adds one field; a separator byte keeps ("ab","c") and ("a","bc") apart.
    fn add(&mut self, bytes: &[u8]) {
        const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
        for &b in bytes.iter().chain(std::iter::once(&0xffu8)) {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }
    fn finish(&self) -> u128 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_separates_fields_and_is_stable() {
        let h = |parts: &[&str]| {
            let mut f = Fnv128::new();
            parts.iter().for_each(|p| f.add(p.as_bytes()));
            f.finish()
        };
        assert_ne!(h(&["ab", "c"]), h(&["a", "bc"]));
        assert_eq!(h(&["x"]), h(&["x"]));
        // Pinned: the cache key must not change between builds of the same sources.
        assert_eq!(h(&[]), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
    }

    #[test]
    fn elf_check() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[18] = 190;
        assert!(is_cuda_elf(&elf));
        elf[18] = 62; // x86-64
        assert!(!is_cuda_elf(&elf));
    }
}
