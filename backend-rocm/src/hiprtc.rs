//! Run-time compilation of the embedded kernel sources with hiprtc, to an HSA code object for
//! one processor, with an on-disk cache: the path for a device whose processor has no embedded
//! image (anything but gfx942 / gfx950 in a default build, or a build made without clang).
//!
//! - Library: with `K3_HIP_LIBRARY` set, `libhiprtc.so*` beside that library, then the library
//!   itself; otherwise `libhiprtc.so{,.7,.6,.5}` in the ROCm folders and through the loader
//!   (ROCm 6 and 7), then the HIP runtime itself (ROCm 5 has hiprtc inside libamdhip64).
//! - Headers come from [`crate::kernels::SOURCES`] through `hiprtcCreateProgram`'s header list
//!   (every csrc header under its csrc-relative name, those beside a `.cu` also under their
//!   names relative to it), so no source tree is needed.
//! - Options: `--offload-arch=<processor>`, `-O3`, `-std=c++17`, `-DK3_WARP_SIZE=<wave size>`.
//! - Cache (`k3_kernels::jit_cache`): `$K3_KERNEL_CACHE_DIR` (`off` disables it), default
//!   `$XDG_CACHE_HOME/k3-kernels` or `~/.cache/k3-kernels`; files
//!   `hip/<file>-<processor>-<key>.hsaco`, the key a 128-bit content hash of the file, every
//!   header, the options and the hiprtc version.

use crate::dylib::{self, Lib, NotFound};
use crate::kernels;
use crate::sys::{self, hiprtcProgram, hiprtcResult, HiprtcFns};
use k3_build_support::hash::KeyHasher;
pub use k3_kernels::jit_cache::{CacheOutcome, KernelCache};
use kernel_api::{Error, Result};
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// What to install when hiprtc is missing.
pub const INSTALL_HINT: &str = "install ROCm's hiprtc (libhiprtc.so, part of ROCm 6 and 7; ROCm 5 has it inside libamdhip64) \
     and set ROCM_PATH, or build with a clang that knows this processor (K3_HIP_ARCHS, K3_HIP_CLANG) so its code objects are embedded";

/// A loaded hiprtc.
#[derive(Debug)]
pub struct Hiprtc {
    lib: Lib,
    fns: HiprtcFns,
    version: (i32, i32),
    /// Compiles run one at a time: ROCm 5.2's hiprtc crashes (SIGSEGV, seen in
    /// tests/hiprtc_jit.rs) when two threads compile at once, and a compile is long enough
    /// that the lock costs nothing measurable.
    compiling: Mutex<()>,
}

static HIPRTC: OnceLock<std::result::Result<Hiprtc, String>> = OnceLock::new();

/// The process's hiprtc, found and checked once; `Unavailable` naming what was searched.
pub fn hiprtc() -> Result<&'static Hiprtc> {
    HIPRTC.get_or_init(load).as_ref().map_err(|why| Error::Unavailable { why: why.clone() })
}

fn load() -> std::result::Result<Hiprtc, String> {
    let mut searched = NotFound::default();
    let mut tried: Vec<Lib> = Vec::new();
    let mut absorb = |r: std::result::Result<Lib, NotFound>, searched: &mut NotFound| match r {
        Ok(lib) => tried.push(lib),
        Err(nf) => {
            searched.searched.extend(nf.searched);
            searched.failures.extend(nf.failures);
        }
    };
    // With K3_HIP_LIBRARY only its folder and itself: a selected runtime (or stand-in) is never
    // mixed with a system ROCm's compiler.
    let hip = dylib::find(&dylib::HIP);
    match &hip {
        Ok(h) if std::env::var_os("K3_HIP_LIBRARY").is_some_and(|v| !v.is_empty()) => {
            let dirs: Vec<PathBuf> = h.dir().into_iter().collect();
            absorb(dylib::find_in(&dylib::HIPRTC, &dirs, false), &mut searched);
        }
        _ => absorb(dylib::find(&dylib::HIPRTC), &mut searched),
    }
    match hip {
        Ok(h) => {
            searched.searched.push(format!("the HIP runtime {}", h.found_as));
            tried.push(h);
        }
        Err(nf) => searched.searched.extend(nf.searched),
    }
    for lib in tried {
        // SAFETY: a library exporting the hiprtc symbols has hiprtc's C signatures.
        if let Ok(fns) = unsafe { HiprtcFns::load(&lib.lib) } {
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // SAFETY: resolved symbol; valid out-pointers.
            let rc = unsafe { (fns.hiprtcVersion)(&mut major, &mut minor) };
            if rc != sys::HIPRTC_SUCCESS {
                return Err(format!("hiprtcVersion failed in {}: {}", lib.found_as, result_text(&fns, rc)));
            }
            return Ok(Hiprtc { lib, fns, version: (major, minor), compiling: Mutex::new(()) });
        }
    }
    Err(format!("hiprtc not found ({}); {INSTALL_HINT}", searched.describe()))
}

fn result_text(fns: &HiprtcFns, rc: hiprtcResult) -> String {
    // SAFETY: resolved symbol returning a static string or null.
    let p = unsafe { (fns.hiprtcGetErrorString)(rc) };
    if p.is_null() {
        format!("hiprtc error {rc}")
    } else {
        // SAFETY: non-null NUL-terminated static string.
        format!("{} ({rc})", unsafe { CStr::from_ptr(p) }.to_string_lossy())
    }
}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(what.to_string(), "contains a NUL byte"))
}

/// The options of a compile for `processor` at wave size `warp` (part of the cache key).
pub fn options(processor: &str, warp: u32) -> Vec<String> {
    vec![format!("--offload-arch={processor}"), "-O3".into(), "-std=c++17".into(), format!("-DK3_WARP_SIZE={warp}")]
}

/// Every csrc header under its csrc-relative name, and those beside `file` also under their
/// name relative to it (`#include "common.cuh"` from `ops/x.cu`).
pub fn header_list(file: &str) -> Vec<(String, &'static str)> {
    let dir = file.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
    let mut out = Vec::new();
    for (path, text) in kernels::headers() {
        out.push((path.to_string(), *text));
        if let Some(local) = path.strip_prefix(dir.as_str()).filter(|_| !dir.is_empty()) {
            out.push((local.to_string(), *text));
        }
    }
    out
}

impl Hiprtc {
    /// `(major, minor)` of the library.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where the library was loaded from.
    pub fn location(&self) -> &str {
        &self.lib.found_as
    }

    /// Compiles the embedded kernel file `file` (csrc-relative) for `processor`, without the cache.
    pub fn compile_file(&self, file: &str, processor: &str, warp: u32) -> Result<Vec<u8>> {
        let src = kernels::source(file).ok_or_else(|| Error::invalid("file", format!("no embedded kernel source `{file}`")))?;
        self.compile_source(file, src, processor, warp)
    }

    /// Compiles `src` as if it were the csrc file `file` (its quoted includes resolve against
    /// the embedded headers).
    pub fn compile_source(&self, file: &str, src: &str, processor: &str, warp: u32) -> Result<Vec<u8>> {
        let headers = header_list(file);
        let names: Vec<CString> = headers.iter().map(|(n, _)| cstring("header name", n)).collect::<Result<_>>()?;
        let texts: Vec<CString> = headers.iter().map(|(n, t)| cstring(n, t)).collect::<Result<_>>()?;
        let mut name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        let mut text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
        let opts: Vec<CString> = options(processor, warp).iter().map(|o| cstring("option", o)).collect::<Result<_>>()?;
        let mut opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let (csrc, cname) = (cstring(file, src)?, cstring("file", file)?);
        let call = |what: &str| format!("{what}({file}, {processor})");
        let fail = |what: &str, rc| Error::Driver { call: call(what), why: result_text(&self.fns, rc) };
        // A poisoned lock only means another compile panicked; hiprtc itself is unaffected.
        let _one_at_a_time = self.compiling.lock().unwrap_or_else(|p| p.into_inner());

        let mut prog: hiprtcProgram = std::ptr::null_mut();
        // SAFETY: the pointer arrays hold `len` valid NUL-terminated strings that outlive the
        // program (destroyed below before they drop).
        let rc = unsafe {
            (self.fns.hiprtcCreateProgram)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                name_ptrs.len() as c_int,
                text_ptrs.as_mut_ptr(),
                name_ptrs.as_mut_ptr(),
            )
        };
        if rc != sys::HIPRTC_SUCCESS {
            return Err(fail("hiprtcCreateProgram", rc));
        }
        let out = (|| {
            // SAFETY: a live program; valid option strings.
            let rc = unsafe { (self.fns.hiprtcCompileProgram)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_mut_ptr()) };
            if rc != sys::HIPRTC_SUCCESS {
                return Err(Error::Driver { call: call("hiprtcCompileProgram"), why: format!("{}\n{}", result_text(&self.fns, rc), self.log(prog)) });
            }
            let mut size = 0usize;
            // SAFETY: a live program; valid out-pointer.
            let rc = unsafe { (self.fns.hiprtcGetCodeSize)(prog, &mut size) };
            if rc != sys::HIPRTC_SUCCESS {
                return Err(fail("hiprtcGetCodeSize", rc));
            }
            if size == 0 {
                return Err(Error::Driver { call: call("hiprtcGetCode"), why: "no code object produced".into() });
            }
            let mut code = vec![0u8; size];
            // SAFETY: the buffer holds the `size` bytes hiprtcGetCodeSize reported.
            let rc = unsafe { (self.fns.hiprtcGetCode)(prog, code.as_mut_ptr().cast()) };
            if rc != sys::HIPRTC_SUCCESS {
                return Err(fail("hiprtcGetCode", rc));
            }
            Ok(code)
        })();
        // SAFETY: created above, destroyed once.
        unsafe { (self.fns.hiprtcDestroyProgram)(&mut prog) };
        out
    }

    fn log(&self, prog: hiprtcProgram) -> String {
        let mut size = 0usize;
        // SAFETY: a live program; valid out-pointer.
        if unsafe { (self.fns.hiprtcGetProgramLogSize)(prog, &mut size) } != sys::HIPRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: the buffer holds `size` bytes.
        if unsafe { (self.fns.hiprtcGetProgramLog)(prog, log.as_mut_ptr().cast()) } != sys::HIPRTC_SUCCESS {
            return String::new();
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).trim().to_string()
    }

    /// Compiles through the cache: a hit returns the stored code object.
    pub fn code_object(&self, file: &str, processor: &str, warp: u32, cache: &CodeObjectCache) -> Result<(Vec<u8>, CacheOutcome)> {
        let path = cache.path("hip", file, processor, &cache_key(file, processor, warp, self.version), "hsaco");
        cache.get_or_compile(path, kernels::is_amdgpu_elf, || self.compile_file(file, processor, warp))
    }
}

/// The content key of one compile: file, every header, the options and the hiprtc version.
pub fn cache_key(file: &str, processor: &str, warp: u32, version: (i32, i32)) -> String {
    let mut h = KeyHasher::default();
    h.str("k3-backend-rocm hiprtc code object v1").str(file).str(kernels::source(file).unwrap_or(""));
    for (p, text) in kernels::headers() {
        h.str(p).str(text);
    }
    for o in options(processor, warp) {
        h.str(&o);
    }
    h.str(&format!("{}.{}", version.0, version.1));
    h.hex()
}

/// Where compiled code objects are kept (`k3_kernels::jit_cache`: `$K3_KERNEL_CACHE_DIR/hip/`).
pub type CodeObjectCache = KernelCache;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_headers_and_cache_keys() {
        assert_eq!(options("gfx90a", 64), ["--offload-arch=gfx90a", "-O3", "-std=c++17", "-DK3_WARP_SIZE=64"]);
        let h = header_list("ops/dense_gemm.cu");
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"k3/compat.h"), "{names:?}");
        // A header beside the file is reachable under its local name too.
        assert!(names.contains(&"ops/mla_common.cuh") && names.contains(&"mla_common.cuh"), "{names:?}");
        assert!(!names.iter().any(|n| n.ends_with(".cu")));
        let k = cache_key("ops/dense_gemm.cu", "gfx90a", 64, (6, 4));
        assert_eq!(k.len(), 32);
        assert_ne!(k, cache_key("ops/dense_gemm.cu", "gfx1100", 32, (6, 4)));
        assert_ne!(k, cache_key("ops/dense_gemm.cu", "gfx90a", 64, (7, 0)));
    }
}
