//! The HIP runtime of this process: libamdhip64 found ([`crate::dylib`]), every function this
//! crate calls resolved, the version checked and `hipInit` run, once. Every failure is an
//! `Error::Unavailable` naming what was searched or what is missing; nothing panics.

use crate::dylib::{self, Lib};
use crate::sys::{self, hipError_t, HipFns, HipGetDevicePropertiesR0600};
use kernel_api::{Error, Result};
use std::ffi::CStr;
use std::sync::OnceLock;

/// The oldest HIP runtime this crate calls (its device-attribute numbering and graph capture
/// API are those of ROCm 5.0 and later).
pub const MIN_MAJOR: i32 = 5;

/// What to do when there is no usable runtime.
pub const INSTALL_HINT: &str = "install ROCm 6 or 7 (or Debian's libamdhip64-5 for the ROCm 5 runtime), set ROCM_PATH to its root, \
     or name the library with K3_HIP_LIBRARY=/full/path/libamdhip64.so";

/// The loaded runtime.
#[derive(Debug)]
pub struct Hip {
    pub lib: Lib,
    pub fns: HipFns,
    /// `hipGetDevicePropertiesR0600` when the runtime exports it (ROCm 6+).
    pub props_r0600: Option<HipGetDevicePropertiesR0600>,
    /// `hipRuntimeGetVersion`: major · 10⁷ + minor · 10⁵ + patch.
    pub runtime_version: i32,
    pub driver_version: i32,
}

static HIP: OnceLock<std::result::Result<Hip, String>> = OnceLock::new();

/// The process's HIP runtime, loaded and initialised once.
pub fn hip() -> Result<&'static Hip> {
    HIP.get_or_init(load).as_ref().map_err(|why| Error::Unavailable { why: why.clone() })
}

/// Whether a HIP runtime library can be opened here (no device needed).
pub fn library_present() -> bool {
    dylib::find(&dylib::HIP).is_ok()
}

/// `50221153` -> `5.2.21153`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

fn load() -> std::result::Result<Hip, String> {
    let lib = dylib::find(&dylib::HIP)
        .map_err(|nf| format!("the HIP runtime libamdhip64 was not found ({}); {INSTALL_HINT}", nf.describe()))?;
    // SAFETY: a library found as libamdhip64 (or named by K3_HIP_LIBRARY) exports the HIP C API
    // with the signatures of the HIP headers the declarations were generated from.
    let fns = unsafe { HipFns::load(&lib.lib) }.map_err(|missing| {
        format!("{} lacks {missing:?}: not a HIP runtime, or one older than ROCm {MIN_MAJOR}.0; {INSTALL_HINT}", lib.found_as)
    })?;
    let mut runtime_version = 0;
    // SAFETY: resolved symbol; valid out-pointer.
    let rc = unsafe { (fns.hipRuntimeGetVersion)(&mut runtime_version) };
    if rc != sys::hipSuccess {
        return Err(format!("hipRuntimeGetVersion failed in {}: {}", lib.found_as, error_text(&fns, rc)));
    }
    if runtime_version / 10_000_000 < MIN_MAJOR {
        return Err(format!(
            "{} is HIP {}, older than this crate supports (ROCm {MIN_MAJOR}.0 or newer); {INSTALL_HINT}",
            lib.found_as,
            version_string(runtime_version)
        ));
    }
    // SAFETY: resolved symbol; flags must be 0.
    let rc = unsafe { (fns.hipInit)(0) };
    if rc != sys::hipSuccess {
        return Err(format!(
            "the HIP runtime ({}, HIP {}) cannot be used: hipInit failed with {}",
            lib.found_as,
            version_string(runtime_version),
            error_text(&fns, rc)
        ));
    }
    let mut driver_version = 0;
    // SAFETY: resolved symbol; valid out-pointer. A failure leaves 0 ("unknown").
    let _ = unsafe { (fns.hipDriverGetVersion)(&mut driver_version) };
    // SAFETY: the ROCm 6 entry point has hipGetDeviceProperties' C signature (sys/mod.rs).
    let props_r0600 = unsafe { lib.function::<HipGetDevicePropertiesR0600>("hipGetDevicePropertiesR0600") };
    Ok(Hip { lib, fns, props_r0600, runtime_version, driver_version })
}

/// `hipErrorNoDevice: no ROCm-capable device is detected` from the runtime's own tables.
pub fn error_text(fns: &HipFns, rc: hipError_t) -> String {
    let text = |p: *const std::os::raw::c_char| {
        // SAFETY: the runtime returns a static NUL-terminated string or null.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: resolved symbols taking any error code.
    let (name, desc) = unsafe { (text((fns.hipGetErrorName)(rc)), text((fns.hipGetErrorString)(rc))) };
    match (name, desc) {
        (Some(n), Some(d)) if n != d => format!("{n}: {d}"),
        (Some(n), _) => n,
        (None, Some(d)) => format!("error {rc}: {d}"),
        (None, None) => format!("error {rc}"),
    }
}

impl Hip {
    /// `Err(Driver)` naming the call unless `rc` is hipSuccess.
    pub fn check(&self, call: &str, rc: hipError_t) -> Result<()> {
        if rc == sys::hipSuccess {
            Ok(())
        } else {
            Err(Error::Driver { call: call.to_string(), why: error_text(&self.fns, rc) })
        }
    }

    /// The runtime's major version (5, 6, 7).
    pub fn major(&self) -> i32 {
        self.runtime_version / 10_000_000
    }

    /// The number of devices, or `Unavailable` with the runtime's reason.
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: resolved symbol; valid out-pointer.
        let rc = unsafe { (self.fns.hipGetDeviceCount)(&mut n) };
        if rc != sys::hipSuccess {
            return Err(Error::Unavailable {
                why: format!("hipGetDeviceCount failed ({}): {}", self.lib.found_as, error_text(&self.fns, rc)),
            });
        }
        Ok(n.max(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_print_as_hip_does() {
        assert_eq!(version_string(50221153), "5.2.21153");
        assert_eq!(version_string(60443483), "6.4.43483");
        assert_eq!(version_string(70051831), "7.0.51831");
    }
}
