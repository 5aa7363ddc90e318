//! The HIP runtime entry points of `/work`'s shared contract (helpers' `hip-api.md`), with the
//! signatures of HIP's `hip_runtime_api.h`, over the emulated device at warp 64.

use crate::codes::{self, HipError, SUCCESS};
use crate::props;
use k3_standin::error::{self, invalid, Error, Kind, Result};
use k3_standin::{device, CaptureMode, Device, StreamRef, Vendor};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

type Handle = *mut c_void;

/// Runs one exported call: errors are logged, mapped to hipError_t and kept as the last error.
pub(crate) fn run(call: &str, f: impl FnOnce() -> Result<()>) -> HipError {
    let c = match error::guard("hip", call, codes::name_of, f) {
        Ok(()) => SUCCESS,
        Err(e) => codes::code(e.kind),
    };
    codes::set_last(c);
    c
}

pub(crate) fn dev() -> Result<&'static Device> {
    device(Vendor::Hip)
}

/// Writes `v` through an out-pointer the caller passed.
pub(crate) fn put<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: a non-null out-pointer from the caller, valid for one T (the API's contract).
    unsafe { p.write(v) };
    Ok(())
}

pub(crate) fn stream(s: Handle) -> StreamRef {
    StreamRef::from_raw(s as u64)
}

fn check_device(id: c_int) -> Result<()> {
    dev()?;
    if id != 0 {
        return Err(Error::new(Kind::InvalidDevice, format!("device {id}: the stand-in has one device (0)")));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn hipInit(flags: c_uint) -> HipError {
    run("hipInit", || {
        if flags != 0 {
            return Err(invalid("hipInit flags must be 0"));
        }
        dev()?.init();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn hipDriverGetVersion(v: *mut c_int) -> HipError {
    run("hipDriverGetVersion", || put(v, codes::runtime_version(), "driverVersion"))
}

#[no_mangle]
pub extern "C" fn hipRuntimeGetVersion(v: *mut c_int) -> HipError {
    run("hipRuntimeGetVersion", || put(v, codes::runtime_version(), "runtimeVersion"))
}

#[no_mangle]
pub extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    run("hipGetDeviceCount", || {
        let n = i32::from(dev().is_ok());
        put(count, n, "count")?;
        dev().map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn hipSetDevice(id: c_int) -> HipError {
    run("hipSetDevice", || check_device(id))
}

#[no_mangle]
pub extern "C" fn hipGetDevice(id: *mut c_int) -> HipError {
    run("hipGetDevice", || {
        dev()?;
        put(id, 0, "deviceId")
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceGetAttribute(value: *mut c_int, attr: c_int, id: c_int) -> HipError {
    run("hipDeviceGetAttribute", || {
        check_device(id)?;
        let v = props::attribute(&dev()?.personality, attr)?;
        put(value, v, "pi")
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceGetName(name: *mut c_char, len: c_int, id: c_int) -> HipError {
    run("hipDeviceGetName", || {
        check_device(id)?;
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
pub extern "C" fn hipDeviceTotalMem(bytes: *mut usize, id: c_int) -> HipError {
    run("hipDeviceTotalMem", || {
        check_device(id)?;
        put(bytes, dev()?.personality.total_mem as usize, "bytes")
    })
}

#[no_mangle]
pub extern "C" fn hipGetDeviceProperties(prop: *mut c_void, id: c_int) -> HipError {
    run("hipGetDeviceProperties", || {
        check_device(id)?;
        props::write(&dev()?.personality, props::Layout::R0000, prop)
    })
}

#[no_mangle]
pub extern "C" fn hipGetDevicePropertiesR0600(prop: *mut c_void, id: c_int) -> HipError {
    run("hipGetDevicePropertiesR0600", || {
        check_device(id)?;
        if codes::hip_version() < 6 {
            return Err(Error::new(Kind::NotSupported, "the imitated HIP 5 has no hipGetDevicePropertiesR0600 (K3_STANDIN_HIP_VERSION=5)"));
        }
        props::write(&dev()?.personality, props::Layout::R0600, prop)
    })
}

#[no_mangle]
pub extern "C" fn hipGetErrorName(e: HipError) -> *const c_char {
    codes::name_ptr(e)
}

#[no_mangle]
pub extern "C" fn hipGetErrorString(e: HipError) -> *const c_char {
    codes::string_ptr(e)
}

#[no_mangle]
pub extern "C" fn hipGetLastError() -> HipError {
    codes::take_last()
}

#[no_mangle]
pub extern "C" fn hipPeekAtLastError() -> HipError {
    codes::peek_last()
}

// ---- memory ----

#[no_mangle]
pub extern "C" fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> HipError {
    run("hipMalloc", || {
        if size == 0 {
            return put(ptr, std::ptr::null_mut(), "ptr");
        }
        if ptr.is_null() {
            return Err(invalid("ptr is null"));
        }
        let p = dev()?.alloc(size)?;
        put(ptr, p as *mut c_void, "ptr")
    })
}

#[no_mangle]
pub extern "C" fn hipFree(ptr: *mut c_void) -> HipError {
    run("hipFree", || if ptr.is_null() { Ok(()) } else { dev()?.free(ptr as u64) })
}

#[no_mangle]
pub extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> HipError {
    run("hipMemGetInfo", || {
        let (f, t) = dev()?.mem_info();
        put(free, f as usize, "free")?;
        put(total, t as usize, "total")
    })
}

#[no_mangle]
pub extern "C" fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, s: Handle) -> HipError {
    run("hipMemcpyAsync", || {
        let d = dev()?;
        let (dst, src) = (dst as u64, src as u64);
        // hipMemcpyDefault (4): the direction follows from which side is device memory.
        let kind = if kind == 4 {
            match (d.is_device_ptr(src), d.is_device_ptr(dst)) {
                (false, true) => 1,
                (true, false) => 2,
                (true, true) => 3,
                (false, false) => 0,
            }
        } else {
            kind
        };
        match kind {
            1 => d.copy_host(stream(s), dst, src, size, true),
            2 => d.copy_host(stream(s), dst, src, size, false),
            3 => d.enqueue(stream(s), k3_standin::graph::Node::Copy { dst, src, len: size }),
            0 => Err(Error::new(Kind::InvalidValue, "host-to-host copies are not part of the stand-in's HIP subset")),
            other => Err(Error::new(Kind::InvalidValue, format!("hipMemcpyKind {other}"))),
        }
    })
}

#[no_mangle]
pub extern "C" fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, s: Handle) -> HipError {
    run("hipMemsetAsync", || dev()?.enqueue(stream(s), k3_standin::graph::Node::Memset { dst: dst as u64, value: value as u8, len: size }))
}

// ---- modules and launches ----

#[no_mangle]
pub extern "C" fn hipModuleLoadData(module: *mut Handle, image: *const c_void) -> HipError {
    run("hipModuleLoadData", || {
        if module.is_null() {
            return Err(invalid("module is null"));
        }
        // SAFETY: the caller passes a complete code object (the API's contract).
        let m = unsafe { dev()?.load_module(image as *const u8) }?;
        put(module, m as Handle, "module")
    })
}

#[no_mangle]
pub extern "C" fn hipModuleUnload(module: Handle) -> HipError {
    run("hipModuleUnload", || dev()?.unload_module(module as u64))
}

#[no_mangle]
pub extern "C" fn hipModuleGetFunction(function: *mut Handle, module: Handle, name: *const c_char) -> HipError {
    run("hipModuleGetFunction", || {
        if name.is_null() || function.is_null() {
            return Err(invalid("function or kname is null"));
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }.to_str().map_err(|_| invalid("kernel name is not UTF-8"))?;
        let f = dev()?.get_function(module as u64, name)?;
        put(function, f as Handle, "function")
    })
}

#[no_mangle]
pub extern "C" fn hipModuleLaunchKernel(
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
) -> HipError {
    run("hipModuleLaunchKernel", || {
        if !extra.is_null() {
            return Err(invalid("`extra` launch arguments are not supported by the stand-in: pass kernelParams"));
        }
        let d = dev()?;
        // SAFETY: kernelParams holds one pointer per kernel parameter (the API's contract).
        let node = unsafe { d.make_launch(f as u64, [gx, gy, gz], [bx, by, bz], shared, params) }?;
        d.enqueue(stream(s), node)
    })
}

#[no_mangle]
pub extern "C" fn hipFuncGetAttribute(value: *mut c_int, attr: c_int, f: Handle) -> HipError {
    run("hipFuncGetAttribute", || {
        let func = dev()?.function(f as u64)?;
        let v = match attr {
            0 => func.max_threads as i64,
            1 => func.static_smem as i64,
            2 | 3 => 0,
            4 => func.regs.unwrap_or(0) as i64,
            5 | 6 => {
                let (maj, min) = dev()?.personality.cc;
                (maj * 10 + min) as i64
            }
            8 => func.max_dynamic_smem as i64,
            other => return Err(invalid(format!("function attribute {other} is not emulated"))),
        };
        put(value, v as c_int, "value")
    })
}

// ---- streams and events ----

#[no_mangle]
pub extern "C" fn hipStreamCreateWithFlags(s: *mut Handle, flags: c_uint) -> HipError {
    run("hipStreamCreateWithFlags", || {
        if flags > 1 {
            return Err(invalid(format!("stream flags {flags:#x}")));
        }
        let h = dev()?.create_stream();
        put(s, h as Handle, "stream")
    })
}

#[no_mangle]
pub extern "C" fn hipStreamDestroy(s: Handle) -> HipError {
    run("hipStreamDestroy", || {
        if s.is_null() {
            return Err(Error::new(Kind::InvalidHandle, "the null stream cannot be destroyed"));
        }
        dev()?.destroy_stream(s as u64)
    })
}

#[no_mangle]
pub extern "C" fn hipStreamSynchronize(s: Handle) -> HipError {
    run("hipStreamSynchronize", || dev()?.synchronize_stream(stream(s)))
}

#[no_mangle]
pub extern "C" fn hipStreamWaitEvent(s: Handle, e: Handle, flags: c_uint) -> HipError {
    run("hipStreamWaitEvent", || {
        if flags != 0 {
            return Err(invalid("hipStreamWaitEvent flags must be 0"));
        }
        dev()?.wait_event(stream(s), e as u64)
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceSynchronize() -> HipError {
    run("hipDeviceSynchronize", || dev()?.synchronize())
}

#[no_mangle]
pub extern "C" fn hipEventCreate(e: *mut Handle) -> HipError {
    hipEventCreateWithFlags(e, 0)
}

#[no_mangle]
pub extern "C" fn hipEventCreateWithFlags(e: *mut Handle, flags: c_uint) -> HipError {
    run("hipEventCreateWithFlags", || {
        if flags & !0x7 != 0 {
            return Err(invalid(format!("event flags {flags:#x}")));
        }
        let h = dev()?.create_event(flags & 2 == 0);
        put(e, h as Handle, "event")
    })
}

#[no_mangle]
pub extern "C" fn hipEventDestroy(e: Handle) -> HipError {
    run("hipEventDestroy", || dev()?.destroy_event(e as u64))
}

#[no_mangle]
pub extern "C" fn hipEventRecord(e: Handle, s: Handle) -> HipError {
    run("hipEventRecord", || dev()?.record_event(e as u64, stream(s)))
}

#[no_mangle]
pub extern "C" fn hipEventSynchronize(e: Handle) -> HipError {
    run("hipEventSynchronize", || dev()?.synchronize_event(e as u64))
}

#[no_mangle]
pub extern "C" fn hipEventQuery(e: Handle) -> HipError {
    run("hipEventQuery", || dev()?.query_event(e as u64))
}

#[no_mangle]
pub extern "C" fn hipEventElapsedTime(ms: *mut f32, start: Handle, stop: Handle) -> HipError {
    run("hipEventElapsedTime", || {
        let v = dev()?.elapsed_ms(start as u64, stop as u64)?;
        put(ms, v, "ms")
    })
}

// ---- graphs ----

#[no_mangle]
pub extern "C" fn hipStreamBeginCapture(s: Handle, mode: c_int) -> HipError {
    run("hipStreamBeginCapture", || dev()?.begin_capture(stream(s), CaptureMode::from_raw(mode as u32)?))
}

#[no_mangle]
pub extern "C" fn hipStreamEndCapture(s: Handle, graph: *mut Handle) -> HipError {
    run("hipStreamEndCapture", || {
        if graph.is_null() {
            return Err(invalid("pGraph is null"));
        }
        let r = dev()?.end_capture(stream(s));
        put(graph, r.as_ref().map(|g| *g as Handle).unwrap_or(std::ptr::null_mut()), "pGraph")?;
        r.map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn hipStreamIsCapturing(s: Handle, status: *mut c_int) -> HipError {
    run("hipStreamIsCapturing", || {
        let v = match dev()?.capture_status(stream(s))? {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        put(status, v, "pCaptureStatus")
    })
}

#[no_mangle]
pub extern "C" fn hipGraphInstantiate(exec: *mut Handle, graph: Handle, _err_node: *mut Handle, log: *mut c_char, log_len: usize) -> HipError {
    run("hipGraphInstantiate", || {
        if !log.is_null() && log_len > 0 {
            // SAFETY: the caller's log buffer holds log_len >= 1 bytes.
            unsafe { *log = 0 };
        }
        let h = dev()?.instantiate(graph as u64)?;
        put(exec, h as Handle, "pGraphExec")
    })
}

#[no_mangle]
pub extern "C" fn hipGraphLaunch(exec: Handle, s: Handle) -> HipError {
    run("hipGraphLaunch", || dev()?.launch_graph(exec as u64, stream(s)))
}

#[no_mangle]
pub extern "C" fn hipGraphExecDestroy(exec: Handle) -> HipError {
    run("hipGraphExecDestroy", || dev()?.destroy_exec(exec as u64))
}

#[no_mangle]
pub extern "C" fn hipGraphDestroy(graph: Handle) -> HipError {
    run("hipGraphDestroy", || dev()?.destroy_graph(graph as u64))
}
