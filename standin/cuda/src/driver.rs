//! The CUDA driver entry points cudarc and backend-cuda call (signatures of CUDA 13's `cuda.h`),
//! over the emulated device at warp 32. One device (ordinal 0) with one primary context, which
//! must be current on the calling thread for work to be issued, as on a real driver.

use crate::codes::{self, run, CuResult};
use k3_standin::error::{invalid, Error, Kind, Result};
use k3_standin::graph::Node;
use k3_standin::{device, CaptureMode, Device, StreamRef, Vendor};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::atomic::{AtomicI64, Ordering};

type Handle = *mut c_void;
type DevPtr = u64;

/// The primary context's handle (any non-null value no other handle uses).
const PRIMARY: u64 = 0x4b33_c7c7_0000;
/// The driver version reported: CUDA 13.0, the level of the bindings cudarc is built with.
const DRIVER_VERSION: c_int = 13000;

static RETAINED: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

fn dev() -> Result<&'static Device> {
    let d = device(Vendor::Cuda)?;
    d.require_init()?;
    Ok(d)
}

/// The device, for calls that need the primary context current on this thread.
fn ctx_dev() -> Result<&'static Device> {
    let d = dev()?;
    if CURRENT.with(Cell::get) != PRIMARY {
        return Err(Error::new(Kind::InvalidContext, "no CUDA context is current on this thread (cuCtxSetCurrent)"));
    }
    Ok(d)
}

fn put<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: a non-null out-pointer from the caller, valid for one T.
    unsafe { p.write(v) };
    Ok(())
}

fn stream(s: Handle) -> StreamRef {
    StreamRef::from_raw(s as u64)
}

fn check_ordinal(d: c_int) -> Result<()> {
    if d != 0 {
        return Err(Error::new(Kind::InvalidDevice, format!("device {d}: the stand-in has one device (0)")));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    run("cuInit", || {
        if flags != 0 {
            return Err(invalid("cuInit flags must be 0"));
        }
        device(Vendor::Cuda)?.init();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    run("cuDriverGetVersion", || put(v, DRIVER_VERSION, "driverVersion"))
}

#[no_mangle]
pub extern "C" fn cuGetErrorName(e: CuResult, s: *mut *const c_char) -> CuResult {
    match codes::name(e) {
        Some(p) if !s.is_null() => {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { s.write(p) };
            codes::SUCCESS
        }
        _ => codes::INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuGetErrorString(e: CuResult, s: *mut *const c_char) -> CuResult {
    match codes::string(e) {
        Some(p) if !s.is_null() => {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { s.write(p) };
            codes::SUCCESS
        }
        _ => codes::INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CuResult {
    run("cuDeviceGetCount", || {
        dev()?;
        put(n, 1, "count")
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> CuResult {
    run("cuDeviceGet", || {
        dev()?;
        check_ordinal(ordinal)?;
        put(d, 0, "device")
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> CuResult {
    run("cuDeviceGetName", || {
        check_ordinal(d)?;
        let text = dev()?.personality.device_name();
        if name.is_null() || len <= 0 {
            return Err(invalid("name buffer is null or empty"));
        }
        let n = text.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name as *mut u8, n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) -> CuResult {
    run("cuDeviceTotalMem", || {
        check_ordinal(d)?;
        put(bytes, dev()?.personality.total_mem as usize, "bytes")
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> CuResult {
    run("cuDeviceGetAttribute", || {
        check_ordinal(d)?;
        let p = &dev()?.personality;
        let value = match attr {
            1 => p.max_threads_per_block as i64,
            2 | 3 => 1024,
            4 => 64,
            5 => i32::MAX as i64,
            6 | 7 => 65535,
            8 => p.smem_per_block as i64,
            9 => 65536,
            10 => p.warp_size() as i64,
            11 => i32::MAX as i64,
            12 => p.regs_per_block as i64,
            13 => p.clock_khz as i64,
            14 => 512,
            15 | 19 | 31 | 32 | 41 | 83 | 95 => 1,
            16 => p.multiprocessors as i64,
            17 | 18 | 20 | 33 | 34 | 35 | 50 | 84 | 115 => 0,
            36 => p.mem_clock_khz as i64,
            37 => p.mem_bus_bits as i64,
            38 => p.l2_bytes as i64,
            39 => p.max_threads_per_multiprocessor as i64,
            40 => 2,
            75 => p.cc.0 as i64,
            76 => p.cc.1 as i64,
            81 => p.smem_per_multiprocessor as i64,
            82 => p.regs_per_multiprocessor as i64,
            97 => p.smem_per_block_optin as i64,
            106 => p.max_blocks_per_multiprocessor as i64,
            111 => (p.smem_per_multiprocessor - p.smem_per_block_optin) as i64,
            other => return Err(invalid(format!("device attribute {other} is not emulated by the stand-in"))),
        };
        put(v, value as c_int, "pi")
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, d: c_int) -> CuResult {
    run("cuDevicePrimaryCtxRetain", || {
        dev()?;
        check_ordinal(d)?;
        put(ctx, PRIMARY as Handle, "pctx")?;
        RETAINED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> CuResult {
    run("cuDevicePrimaryCtxRelease", || {
        dev()?;
        check_ordinal(d)?;
        if RETAINED.fetch_sub(1, Ordering::Relaxed) <= 0 {
            RETAINED.fetch_add(1, Ordering::Relaxed);
            return Err(Error::new(Kind::InvalidContext, "the primary context was released more often than retained"));
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CuResult {
    run("cuCtxGetCurrent", || {
        dev()?;
        put(ctx, CURRENT.with(Cell::get) as Handle, "pctx")
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CuResult {
    run("cuCtxSetCurrent", || {
        dev()?;
        let c = ctx as u64;
        if c != 0 && c != PRIMARY {
            return Err(Error::new(Kind::InvalidContext, format!("{c:#x} is not a context of this device")));
        }
        CURRENT.with(|cur| cur.set(c));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice(d: *mut c_int) -> CuResult {
    run("cuCtxGetDevice", || {
        ctx_dev()?;
        put(d, 0, "device")
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    run("cuCtxSynchronize", || ctx_dev()?.synchronize())
}

// ---- memory ----

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(p: *mut DevPtr, bytes: usize) -> CuResult {
    run("cuMemAlloc", || {
        if bytes == 0 {
            return Err(invalid("cuMemAlloc of 0 bytes"));
        }
        if p.is_null() {
            return Err(invalid("dptr is null"));
        }
        let a = ctx_dev()?.alloc(bytes)?;
        put(p, a, "dptr")
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: DevPtr) -> CuResult {
    run("cuMemFree", || if p == 0 { Ok(()) } else { ctx_dev()?.free(p) })
}

#[no_mangle]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    run("cuMemGetInfo", || {
        let (f, t) = ctx_dev()?.mem_info();
        put(free, f as usize, "free")?;
        put(total, t as usize, "total")
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: DevPtr, value: u8, n: usize, s: Handle) -> CuResult {
    run("cuMemsetD8Async", || ctx_dev()?.enqueue(stream(s), Node::Memset { dst, value, len: n }))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(dst: DevPtr, src: *const c_void, n: usize, s: Handle) -> CuResult {
    run("cuMemcpyHtoDAsync", || ctx_dev()?.copy_host(stream(s), dst, src as u64, n, true))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: DevPtr, n: usize, s: Handle) -> CuResult {
    run("cuMemcpyDtoHAsync", || ctx_dev()?.copy_host(stream(s), dst as u64, src, n, false))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: DevPtr, src: DevPtr, n: usize, s: Handle) -> CuResult {
    run("cuMemcpyDtoDAsync", || ctx_dev()?.enqueue(stream(s), Node::Copy { dst, src, len: n }))
}

// ---- modules and launches ----

#[no_mangle]
pub extern "C" fn cuModuleLoadData(m: *mut Handle, image: *const c_void) -> CuResult {
    run("cuModuleLoadData", || {
        if m.is_null() {
            return Err(invalid("module is null"));
        }
        // SAFETY: the caller passes a complete image (the API's contract).
        let h = unsafe { ctx_dev()?.load_module(image as *const u8) }?;
        put(m, h as Handle, "module")
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: Handle) -> CuResult {
    run("cuModuleUnload", || dev()?.unload_module(m as u64))
}

#[no_mangle]
pub extern "C" fn cuModuleGetFunction(f: *mut Handle, m: Handle, name: *const c_char) -> CuResult {
    run("cuModuleGetFunction", || {
        if name.is_null() || f.is_null() {
            return Err(invalid("hfunc or name is null"));
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }.to_str().map_err(|_| invalid("kernel name is not UTF-8"))?;
        let h = ctx_dev()?.get_function(m as u64, name)?;
        put(f, h as Handle, "hfunc")
    })
}

#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attr: c_int, value: c_int) -> CuResult {
    run("cuFuncSetAttribute", || match attr {
        8 => ctx_dev()?.set_max_dynamic_smem(f as u64, value as i64),
        // The shared-memory carveout is a hint with no effect on the emulator.
        9 if (-1..=100).contains(&value) => ctx_dev()?.function(f as u64).map(|_| ()),
        other => Err(invalid(format!("function attribute {other} cannot be set on the stand-in"))),
    })
}

#[no_mangle]
pub extern "C" fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: Handle) -> CuResult {
    run("cuFuncGetAttribute", || {
        let d = ctx_dev()?;
        let func = d.function(f as u64)?;
        let (maj, min) = d.personality.cc;
        let value = match attr {
            0 => func.max_threads as i64,
            1 => func.static_smem as i64,
            2 | 3 => 0,
            4 => func.regs.unwrap_or(0) as i64,
            5 | 6 => (maj * 10 + min) as i64,
            8 => func.max_dynamic_smem as i64,
            other => return Err(invalid(format!("function attribute {other} is not emulated"))),
        };
        put(v, value as c_int, "pi")
    })
}

#[no_mangle]
pub extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    run("cuLaunchKernel", || {
        if !extra.is_null() {
            return Err(invalid("`extra` launch arguments are not supported by the stand-in: pass kernelParams"));
        }
        let d = ctx_dev()?;
        // SAFETY: kernelParams holds one pointer per kernel parameter (the API's contract).
        let node = unsafe { d.make_launch(f as u64, [gx, gy, gz], [bx, by, bz], shared, params) }?;
        d.enqueue(stream(s), node)
    })
}

// ---- streams and events ----

#[no_mangle]
pub extern "C" fn cuStreamCreate(s: *mut Handle, flags: c_uint) -> CuResult {
    run("cuStreamCreate", || {
        if flags > 1 {
            return Err(invalid(format!("stream flags {flags:#x}")));
        }
        let h = ctx_dev()?.create_stream();
        put(s, h as Handle, "phStream")
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: Handle) -> CuResult {
    run("cuStreamDestroy", || {
        if (s as u64) <= 2 {
            return Err(Error::new(Kind::InvalidHandle, "a default stream cannot be destroyed"));
        }
        dev()?.destroy_stream(s as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: Handle) -> CuResult {
    run("cuStreamSynchronize", || ctx_dev()?.synchronize_stream(stream(s)))
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(s: Handle) -> CuResult {
    run("cuStreamQuery", || ctx_dev()?.query_stream(stream(s)))
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: Handle, e: Handle, flags: c_uint) -> CuResult {
    run("cuStreamWaitEvent", || {
        if flags > 1 {
            return Err(invalid(format!("wait flags {flags:#x}")));
        }
        ctx_dev()?.wait_event(stream(s), e as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuEventCreate(e: *mut Handle, flags: c_uint) -> CuResult {
    run("cuEventCreate", || {
        if flags & !0x7 != 0 {
            return Err(invalid(format!("event flags {flags:#x}")));
        }
        let h = ctx_dev()?.create_event(flags & 2 == 0);
        put(e, h as Handle, "phEvent")
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: Handle) -> CuResult {
    run("cuEventDestroy", || dev()?.destroy_event(e as u64))
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: Handle, s: Handle) -> CuResult {
    run("cuEventRecord", || ctx_dev()?.record_event(e as u64, stream(s)))
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: Handle) -> CuResult {
    run("cuEventSynchronize", || ctx_dev()?.synchronize_event(e as u64))
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: Handle) -> CuResult {
    run("cuEventQuery", || ctx_dev()?.query_event(e as u64))
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: Handle, end: Handle) -> CuResult {
    run("cuEventElapsedTime", || {
        let v = ctx_dev()?.elapsed_ms(start as u64, end as u64)?;
        put(ms, v, "pMilliseconds")
    })
}

/// The pre-12.8 name of the same call.
#[no_mangle]
pub extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CuResult {
    cuEventElapsedTime_v2(ms, start, end)
}

// ---- graphs ----

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(s: Handle, mode: c_int) -> CuResult {
    run("cuStreamBeginCapture", || ctx_dev()?.begin_capture(stream(s), CaptureMode::from_raw(mode as u32)?))
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture(s: Handle, g: *mut Handle) -> CuResult {
    run("cuStreamEndCapture", || {
        if g.is_null() {
            return Err(invalid("phGraph is null"));
        }
        let r = ctx_dev()?.end_capture(stream(s));
        put(g, r.as_ref().map(|h| *h as Handle).unwrap_or(std::ptr::null_mut()), "phGraph")?;
        r.map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn cuStreamIsCapturing(s: Handle, status: *mut c_int) -> CuResult {
    run("cuStreamIsCapturing", || {
        let v = match ctx_dev()?.capture_status(stream(s))? {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        put(status, v, "captureStatus")
    })
}

#[no_mangle]
pub extern "C" fn cuGraphInstantiateWithFlags(exec: *mut Handle, g: Handle, flags: c_ulonglong) -> CuResult {
    run("cuGraphInstantiateWithFlags", || {
        if flags != 0 {
            return Err(invalid(format!("instantiate flags {flags:#x} are not emulated")));
        }
        let h = ctx_dev()?.instantiate(g as u64)?;
        put(exec, h as Handle, "phGraphExec")
    })
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: Handle, s: Handle) -> CuResult {
    run("cuGraphLaunch", || ctx_dev()?.launch_graph(exec as u64, stream(s)))
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: Handle) -> CuResult {
    run("cuGraphExecDestroy", || dev()?.destroy_exec(exec as u64))
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: Handle) -> CuResult {
    run("cuGraphDestroy", || dev()?.destroy_graph(g as u64))
}
