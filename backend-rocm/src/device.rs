//! The device probe: from the loaded runtime to a [`DeviceInfo`], every failure an
//! `Unavailable` with the reason.
//!
//! Limits come from `hipDeviceGetAttribute`, one attribute at a time (its numbering is the same
//! in ROCm 5, 6 and 7). The arch name (`gcnArchName`) is the one thing only `hipDeviceProp_t`
//! holds, and that struct's layout differs between ROCm 5 (`hipGetDeviceProperties`), 6 and 7
//! (`hipGetDevicePropertiesR0600`). So the entry point matching the runtime's major version is
//! called with a 64 KiB zeroed buffer (the structs are 792 to ~1.5 KiB), and the target ID is
//! the NUL-terminated `gfx...` string found in it ([`arch::find_target_id`]); no offset is
//! assumed.

use crate::arch;
use crate::hip::{error_text, Hip};
use crate::sys;
use kernel_api::{BackendKind, DeviceInfo, Error, Result};
use std::os::raw::c_int;

/// Bytes offered to `hipGetDeviceProperties*`: far more than any ROCm layout needs.
const PROPS_BUFFER_BYTES: usize = 64 << 10;

/// What the probe found on a device.
#[derive(Clone, Debug)]
pub struct Probed {
    pub ordinal: i32,
    pub info: DeviceInfo,
    /// The full target ID, e.g. `gfx942:sramecc+:xnack-`.
    pub target_id: String,
    pub max_threads_per_block: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
    pub total_mem: usize,
    /// Which entry point gave the arch name.
    pub props_call: &'static str,
}

/// Makes `ordinal` the calling thread's device.
pub fn set_device(hip: &Hip, ordinal: i32) -> Result<()> {
    // SAFETY: resolved symbol.
    hip.check("hipSetDevice", unsafe { (hip.fns.hipSetDevice)(ordinal) })
}

/// Opens device `ordinal` and describes it.
pub fn probe(hip: &Hip, ordinal: usize) -> Result<Probed> {
    let count = hip.device_count()?;
    if count == 0 {
        return Err(Error::Unavailable { why: format!("the HIP runtime ({}) reports no device", hip.lib.found_as) });
    }
    if ordinal >= count {
        let visible = ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
            .iter()
            .filter_map(|v| std::env::var(v).ok().map(|x| format!(", {v}={x}")))
            .collect::<String>();
        return Err(Error::Unavailable { why: format!("no HIP device {ordinal}: {count} visible{visible}") });
    }
    let dev = ordinal as c_int;
    set_device(hip, dev).map_err(|e| Error::Unavailable { why: format!("cannot open HIP device {ordinal}: {e}") })?;
    let attr = |a: sys::hipDeviceAttribute_t, what: &str| -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: resolved symbol; valid out-pointer; `dev` is below the device count.
        let rc = unsafe { (hip.fns.hipDeviceGetAttribute)(&mut v, a, dev) };
        if rc != sys::hipSuccess {
            return Err(Error::Unavailable { why: format!("cannot read {what} of HIP device {ordinal}: {}", error_text(&hip.fns, rc)) });
        }
        Ok(v.max(0) as u32)
    };
    let warp = attr(sys::hipDeviceAttributeWarpSize, "the wavefront size")?;
    let cus = attr(sys::hipDeviceAttributeMultiprocessorCount, "the CU count")?;
    let lds = attr(sys::hipDeviceAttributeMaxSharedMemoryPerBlock, "LDS per block")? as usize;
    let l2 = attr(sys::hipDeviceAttributeL2CacheSize, "the L2 size")? as usize;
    let max_threads = attr(sys::hipDeviceAttributeMaxThreadsPerBlock, "threads per block")?;
    let max_block = [
        attr(sys::hipDeviceAttributeMaxBlockDimX, "block x")?,
        attr(sys::hipDeviceAttributeMaxBlockDimY, "block y")?,
        attr(sys::hipDeviceAttributeMaxBlockDimZ, "block z")?,
    ];
    let max_grid = [
        attr(sys::hipDeviceAttributeMaxGridDimX, "grid x")?,
        attr(sys::hipDeviceAttributeMaxGridDimY, "grid y")?,
        attr(sys::hipDeviceAttributeMaxGridDimZ, "grid z")?,
    ];
    let (target_id, props_call) = target_id(hip, dev)?;
    let processor = arch::processor(&target_id).to_string();
    let mut name_buf = [0u8; 256];
    // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within them.
    let rc = unsafe { (hip.fns.hipDeviceGetName)(name_buf.as_mut_ptr().cast(), name_buf.len() as c_int, dev) };
    let name = if rc == sys::hipSuccess {
        let end = name_buf.iter().position(|&b| b == 0).unwrap_or(name_buf.len());
        String::from_utf8_lossy(&name_buf[..end]).trim().to_string()
    } else {
        String::new()
    };
    let mut total_mem = 0usize;
    // SAFETY: resolved symbol; valid out-pointer. A failure leaves 0 ("unknown").
    let _ = unsafe { (hip.fns.hipDeviceTotalMem)(&mut total_mem, dev) };
    let info = DeviceInfo {
        kind: BackendKind::Rocm,
        arch: processor.clone(),
        name: if name.is_empty() { format!("HIP device {ordinal}") } else { name },
        warp_size: warp,
        compute_units: cus,
        // The runtime's number; the processor's known LDS only when it reports none.
        shared_mem_per_block: if lds > 0 { lds } else { arch::known_lds_bytes(&processor).unwrap_or(0) },
        l2_bytes: l2,
        fp8: arch::fp8_native(&processor),
    };
    Ok(Probed { ordinal: dev, info, target_id, max_threads_per_block: max_threads, max_block, max_grid, total_mem, props_call })
}

/// The device's target ID from `hipGetDevicePropertiesR0600` (runtime major >= 6, when
/// exported) or `hipGetDeviceProperties` (ROCm 5), read from an oversized buffer.
fn target_id(hip: &Hip, dev: c_int) -> Result<(String, &'static str)> {
    // u64 words: aligned for any field of the struct.
    let mut buf = vec![0u64; PROPS_BUFFER_BYTES / 8];
    let props = buf.as_mut_ptr().cast::<sys::hipDeviceProp_t>();
    let (call, rc) = match hip.props_r0600 {
        // SAFETY: the buffer is larger than any hipDeviceProp_t layout and suitably aligned.
        Some(f) if hip.major() >= 6 => ("hipGetDevicePropertiesR0600", unsafe { f(props, dev) }),
        // SAFETY: as above.
        _ => ("hipGetDeviceProperties", unsafe { (hip.fns.hipGetDeviceProperties)(props, dev) }),
    };
    if rc != sys::hipSuccess {
        return Err(Error::Unavailable { why: format!("{call}({dev}) failed: {}", error_text(&hip.fns, rc)) });
    }
    // SAFETY: reinterpreting initialised u64 words as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), PROPS_BUFFER_BYTES) };
    let id = arch::find_target_id(bytes).ok_or_else(|| Error::Unavailable {
        why: format!("{call}({dev}) returned no gcnArchName (no NUL-terminated gfx... target ID in its output)"),
    })?;
    Ok((id, call))
}
