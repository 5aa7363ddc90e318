//! The device probe: from "is there a libcuda at all" to a context and a [`DeviceInfo`], every
//! failure an `Unavailable` with the reason, never a panic.
//!
//! Order: find libcuda (cudarc would panic without it) -> `cuInit` (the driver's own message for
//! "no device" or "driver too old for this kernel module") -> every driver symbol this crate
//! calls (an old driver lacks some; cudarc would panic at the first call) -> device count and
//! ordinal -> primary context -> attributes.

use crate::dylib::Lib;
use crate::kernels::Arch;
use cudarc::driver::{result, sys, CudaContext, DriverError};
use kernel_api::{BackendKind, DeviceInfo, Error, Fp8Native, Result};
use std::sync::{Arc, OnceLock};

/// Driver entry points this crate (and the cudarc calls it makes) use, beyond cuInit.
const REQUIRED: &[&str] = &[
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

static DRIVER: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();

/// libcuda, opened once: the full path in `K3_CUDA_DRIVER_LIBRARY` when it is set (the driver
/// stand-in is selected this way), else as cudarc will open it (same names, same order).
pub fn driver_lib() -> Result<&'static Lib> {
    DRIVER
        .get_or_init(|| {
            if let Some(explicit) = Lib::from_env("K3_CUDA_DRIVER_LIBRARY", "cuda") {
                return explicit;
            }
            Lib::find("cuda", false).map_err(|nf| {
                format!(
                    "the CUDA driver library libcuda is not installed (searched {} with the dynamic loader); \
                     install the NVIDIA driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH",
                    nf.describe()
                )
            })
        })
        .as_ref()
        .map_err(|why| Error::Unavailable { why: why.clone() })
}

/// `CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected`, asking the driver for the text
/// only when it exports the functions (cudarc's own Display would panic otherwise).
pub fn describe(e: DriverError) -> String {
    let code = format!("{:?}", e.0);
    let has = |s: &str| driver_lib().is_ok_and(|l| l.has(s));
    if has("cuGetErrorString") {
        if let Ok(text) = e.error_string() {
            return format!("{code}: {}", text.to_string_lossy());
        }
    }
    code
}

/// Maps a driver error to [`Error::Driver`] naming the call.
pub fn drv(call: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Driver { call: call.to_string(), why: describe(e) }
}

/// `12040` -> `12.4`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// What the probe found on a device.
#[derive(Debug)]
pub struct Probed {
    pub ctx: Arc<CudaContext>,
    pub info: DeviceInfo,
    pub compute_capability: (u32, u32),
    pub driver_version: i32,
    pub max_threads_per_block: u32,
    /// `cuEventElapsedTime_v2` exists (drivers from CUDA 12.8); older ones have only v1.
    pub elapsed_v2: bool,
}

/// The number of CUDA devices, or `Unavailable` saying why there are none to count.
pub fn device_count() -> Result<usize> {
    init()?;
    result::device::get_count().map(|n| n.max(0) as usize).map_err(|e| Error::Unavailable {
        why: format!("cuDeviceGetCount failed: {}", describe(e)),
    })
}

/// libcuda present, cuInit succeeded, every symbol this crate calls exported.
fn init() -> Result<&'static Lib> {
    let lib = driver_lib()?;
    if !lib.has("cuInit") {
        return Err(Error::Unavailable { why: format!("{} does not export cuInit: not a CUDA driver library", lib.found_as) });
    }
    result::init().map_err(|e| Error::Unavailable {
        why: format!("the CUDA driver ({}) cannot be used: cuInit failed with {}", lib.found_as, describe(e)),
    })?;
    let missing = lib.missing(REQUIRED);
    if !missing.is_empty() {
        let version = if lib.has("cuDriverGetVersion") {
            let mut v = 0;
            // SAFETY: the symbol exists; valid out-pointer.
            match unsafe { sys::cuDriverGetVersion(&mut v) }.result() {
                Ok(()) => format!("CUDA {}", version_string(v)),
                Err(_) => "unknown version".into(),
            }
        } else {
            "unknown version".into()
        };
        return Err(Error::Unavailable {
            why: format!(
                "the installed CUDA driver ({}, {version}) lacks {missing:?}: update the NVIDIA driver (CUDA 12.0 or newer)",
                lib.found_as
            ),
        });
    }
    Ok(lib)
}

/// Opens device `ordinal` and describes it.
pub fn probe(ordinal: usize) -> Result<Probed> {
    // cudarc panics on a missing library or symbol; every such path is checked first, and a
    // panic that still escapes (a driver exporting a symbol cudarc loads that we did not list)
    // is turned into Unavailable too, unless the binary aborts on panic.
    match std::panic::catch_unwind(|| probe_unguarded(ordinal)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Unavailable { why: format!("the CUDA driver could not be used: {msg}") })
        }
    }
}

fn probe_unguarded(ordinal: usize) -> Result<Probed> {
    let lib = init()?;
    let count = result::device::get_count()
        .map_err(|e| Error::Unavailable { why: format!("cuDeviceGetCount failed: {}", describe(e)) })?;
    if count <= 0 {
        return Err(Error::Unavailable { why: "the CUDA driver reports no device (cuDeviceGetCount = 0)".into() });
    }
    if ordinal >= count as usize {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").map(|v| format!(", CUDA_VISIBLE_DEVICES={v}")).unwrap_or_default();
        return Err(Error::Unavailable { why: format!("no CUDA device {ordinal}: {count} visible{visible}") });
    }
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| Error::Unavailable { why: format!("cannot open CUDA device {ordinal}: {}", describe(e)) })?;
    // Buffers here are raw allocations ordered by the caller's streams: cudarc's per-slice
    // event tracking would add hidden event records to every launch.
    // SAFETY: no cudarc CudaSlice is ever created on this context.
    unsafe { ctx.disable_event_tracking() };
    let attr = |a: sys::CUdevice_attribute, what: &str| -> Result<i32> {
        ctx.attribute(a).map_err(|e| Error::Unavailable { why: format!("cannot read {what} of device {ordinal}: {}", describe(e)) })
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability")?.max(0) as u32;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability")?.max(0) as u32;
    let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count")?.max(0) as u32;
    let smem_optin = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "shared memory per block")?.max(0) as usize;
    let l2 = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 size")?.max(0) as usize;
    let warp = attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, "warp size")?.max(0) as u32;
    let max_threads = attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "threads per block")?.max(0) as u32;
    let name = result::device::get_name(ctx.cu_device()).unwrap_or_else(|_| format!("CUDA device {ordinal}"));
    let mut driver_version = 0;
    // SAFETY: symbol checked by init; valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(drv("cuDriverGetVersion"))?;
    let info = DeviceInfo {
        kind: BackendKind::Cuda,
        arch: Arch::for_device(major, minor).to_string(),
        name,
        warp_size: warp,
        compute_units: sms,
        shared_mem_per_block: smem_optin,
        l2_bytes: l2,
        // NVIDIA's fp8 is the OCP pair (e4m3fn, e5m2), in hardware from sm_89.
        fp8: Fp8Native::Ocp,
    };
    Ok(Probed {
        ctx,
        info,
        compute_capability: (major, minor),
        driver_version,
        max_threads_per_block: max_threads,
        elapsed_v2: lib.has("cuEventElapsedTime_v2"),
    })
}
