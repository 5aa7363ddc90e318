//! The CUDA stand-in under backend-cuda (selected here through K3_CUDA_DRIVER_LIBRARY, as
//! scripts/standin-env.sh does) and cudarc's raw driver calls: the misuses it turns into errors,
//! each with its CUresult and a message cuGetErrorString returns, and the personalities.
//!
//! The driver is loaded once per process, so the personality checks run in child processes.

use cudarc::driver::sys;
use k3_backend_cuda::{kernels, CudaRuntime};
use k3_kernels::Runtime;
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A capture in global mode forbids allocations and synchronising calls from every thread of the
/// process (the drivers' rule, which the stand-in keeps), and the test harness runs tests on
/// parallel threads: the test that captures in global mode holds this lock for writing, every
/// other test of the binary for reading, so none of them allocates during that capture.
static CAPTURE: RwLock<()> = RwLock::new(());

fn beside_captures() -> RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|e| e.into_inner())
}

fn alone() -> RwLockWriteGuard<'static, ()> {
    CAPTURE.write().unwrap_or_else(|e| e.into_inner())
}

/// Points backend-cuda at the stand-in built next to this test (unless the caller chose one).
fn runtime() -> CudaRuntime {
    if std::env::var_os("K3_CUDA_DRIVER_LIBRARY").is_none() {
        // `cargo test` leaves this package's cdylib beside the test binary in deps/; `cargo build`
        // puts it one level up.
        let exe = std::env::current_exe().expect("test binary path");
        let deps = exe.parent().map(PathBuf::from).expect("deps dir");
        let lib = [deps.clone(), deps.parent().map(PathBuf::from).unwrap_or(deps)]
            .map(|d| d.join("libk3_standin_cuda.so"))
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("libk3_standin_cuda.so not built next to {}", exe.display()));
        std::env::set_var("K3_CUDA_DRIVER_LIBRARY", lib);
    }
    // An AMD personality left by `standin-env.sh rocm` in the same shell is not this library's.
    if std::env::var("K3_STANDIN_ARCH").is_ok_and(|a| a.starts_with("gfx")) {
        std::env::remove_var("K3_STANDIN_ARCH");
    }
    let rt = CudaRuntime::new(0).expect("the CUDA stand-in opens as device 0");
    assert!(rt.device_info().name.starts_with("k3 stand-in"), "not the stand-in: {}", rt.device_info().name);
    rt
}

fn text(rc: sys::CUresult) -> String {
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: out-pointer to a local; the driver returns a static string.
    unsafe { sys::cuGetErrorString(rc, &mut s) };
    if s.is_null() {
        return format!("{rc:?}");
    }
    // SAFETY: NUL-terminated string from the driver.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// `rc` is `want`, and the error string carries the stand-in's explanation containing `needle`.
fn expect(rc: sys::CUresult, want: sys::CUresult, needle: &str) {
    assert_eq!(rc, want, "{}", text(rc));
    let t = text(rc);
    assert!(t.contains("k3 stand-in") && t.contains(needle), "{t}");
}

fn ok(what: &str, rc: sys::CUresult) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}: {}", text(rc));
}

/// Whether build.rs embedded nvcc cubins (no nvcc at build time: the kernel tests skip, unless
/// K3_REQUIRE_DEVICE_COMPILE=1 makes that a failure).
fn cubins() -> bool {
    if !kernels::IMAGES.is_empty() {
        return true;
    }
    let require = std::env::var("K3_REQUIRE_DEVICE_COMPILE").is_ok_and(|v| v == "1");
    assert!(!require, "K3_REQUIRE_DEVICE_COMPILE=1 but no cubins are embedded: {:?}", kernels::UNAVAILABLE);
    println!("skipped: no cubins embedded ({:?})", kernels::UNAVAILABLE);
    false
}

/// The embedded nvcc cubin of a csrc file for compute capability (major, minor), loaded raw.
fn module(file: &str, cc: (u32, u32)) -> Result<sys::CUmodule, sys::CUresult> {
    let img = kernels::embedded_cubin(file, cc.0, cc.1).unwrap_or_else(|| panic!("no embedded cubin of {file} for {cc:?}"));
    let mut m = std::ptr::null_mut();
    // SAFETY: a complete cubin; out-pointer to a local.
    match unsafe { sys::cuModuleLoadData(&mut m, img.as_ptr() as *const c_void) } {
        sys::CUresult::CUDA_SUCCESS => Ok(m),
        e => Err(e),
    }
}

fn function(m: sys::CUmodule, name: &str) -> Result<sys::CUfunction, sys::CUresult> {
    let c = CString::new(name).expect("name");
    let mut f = std::ptr::null_mut();
    // SAFETY: a live module, a C string, an out-pointer to a local.
    match unsafe { sys::cuModuleGetFunction(&mut f, m, c.as_ptr()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(f),
        e => Err(e),
    }
}

fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    // SAFETY: out-pointer to a local; the context is current (the runtime bound it).
    ok("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, bytes) });
    p
}

/// Launches block_reduce(const float*, int, float*, float*, int*, int*) with `ptrs` for its
/// five pointers.
fn launch_reduce(f: sys::CUfunction, grid: [u32; 3], block: [u32; 3], smem: u32, ptrs: [u64; 5]) -> sys::CUresult {
    let (mut x, mut n, mut s, mut t, mut p, mut m) = (ptrs[0], 256i32, ptrs[1], ptrs[2], ptrs[3], ptrs[4]);
    let mut params: Vec<*mut c_void> = vec![
        &mut x as *mut u64 as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut s as *mut u64 as *mut c_void,
        &mut t as *mut u64 as *mut c_void,
        &mut p as *mut u64 as *mut c_void,
        &mut m as *mut u64 as *mut c_void,
    ];
    // SAFETY: one pointer per parameter of block_reduce; the null stream.
    unsafe { sys::cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, std::ptr::null_mut(), params.as_mut_ptr(), std::ptr::null_mut()) }
}

fn reduce_setup(rt: &CudaRuntime) -> (sys::CUmodule, sys::CUfunction, [u64; 5]) {
    let m = module("tests/reduce.cu", rt.compute_capability()).expect("load reduce");
    let f = function(m, "block_reduce").expect("block_reduce");
    (m, f, [alloc(1024), alloc(4), alloc(4), alloc(4), alloc(4)])
}

#[test]
fn launches_beyond_the_personality_limits() {
    let _capture_lock = beside_captures();
    if !cubins() {
        return;
    }
    let rt = runtime();
    let (_, f, ptrs) = reduce_setup(&rt);
    use sys::CUresult::*;
    expect(launch_reduce(f, [1, 1, 1], [2048, 1, 1], 0, ptrs), CUDA_ERROR_INVALID_VALUE, "block");
    expect(launch_reduce(f, [1, 1, 1], [16, 1, 128], 0, ptrs), CUDA_ERROR_INVALID_VALUE, "block");
    expect(launch_reduce(f, [1, 70000, 1], [256, 1, 1], 0, ptrs), CUDA_ERROR_INVALID_VALUE, "grid");
    expect(launch_reduce(f, [0, 1, 1], [256, 1, 1], 0, ptrs), CUDA_ERROR_INVALID_VALUE, "grid");
    // Dynamic shared memory above 48 KiB needs the opt-in, and the opt-in stops at 227 KiB.
    expect(launch_reduce(f, [1, 1, 1], [256, 1, 1], 64 << 10, ptrs), CUDA_ERROR_INVALID_VALUE, "dynamic shared memory");
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: a live function.
    unsafe {
        expect(sys::cuFuncSetAttribute(f, attr, 228 << 10), CUDA_ERROR_INVALID_VALUE, "exceed");
        ok("opt in", sys::cuFuncSetAttribute(f, attr, 64 << 10));
    }
    ok("launch after opting in", launch_reduce(f, [1, 1, 1], [256, 1, 1], 64 << 10, ptrs));
    let mut extra = [std::ptr::null_mut::<c_void>(); 1];
    // SAFETY: a live function; `extra` is the misuse.
    let rc = unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), extra.as_mut_ptr()) };
    expect(rc, CUDA_ERROR_INVALID_VALUE, "extra");
}

/// A kernel using more registers than a 1024-thread block may: found among the test kernels by
/// its register count (cuFuncGetAttribute reads it from the cubin).
#[test]
fn too_many_threads_for_the_registers() {
    let _capture_lock = beside_captures();
    if !cubins() {
        return;
    }
    let rt = runtime();
    let mut heaviest: Option<(i32, sys::CUfunction, String)> = None;
    for (file, names) in [("tests/gemm_mma.cu", &["gemm_bf16_mma"][..]), ("tests/reduce.cu", &["block_reduce"][..])] {
        let m = module(file, rt.compute_capability()).expect("load");
        for n in names {
            let f = function(m, n).expect("function");
            let mut regs = 0;
            // SAFETY: a live function; out-pointer to a local.
            ok("regs", unsafe { sys::cuFuncGetAttribute(&mut regs, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS, f) });
            assert!(regs > 0, "{n}: register count from the cubin");
            if heaviest.as_ref().is_none_or(|h| regs > h.0) {
                heaviest = Some((regs, f, n.to_string()));
            }
        }
    }
    let (regs, f, name) = heaviest.expect("kernels");
    let mut max = 0;
    // SAFETY: as above.
    ok("max threads", unsafe { sys::cuFuncGetAttribute(&mut max, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f) });
    let per_warp = (regs * 32 + 255) / 256 * 256;
    assert_eq!(max, (65536 / per_warp * 32).min(1024), "{name}: {regs} registers");
    if max < 1024 {
        // SAFETY: the configuration fails before any parameter is read.
        let rc = unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 1024, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()) };
        expect(rc, sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "registers");
    } else {
        println!("note: {name} uses {regs} registers: every test kernel fits 1024 threads, the resource check is covered by the max-threads attribute only");
    }
}

#[test]
fn kernel_missing_from_the_image_and_images_for_another_gpu() {
    let _capture_lock = beside_captures();
    if !cubins() {
        return;
    }
    let rt = runtime();
    let (m, _, _) = reduce_setup(&rt);
    expect(function(m, "no_such_kernel").unwrap_err(), sys::CUresult::CUDA_ERROR_NOT_FOUND, "no kernel `no_such_kernel`");
    // The sm_100a cubin on this sm_90a device, and the other way round on Blackwell.
    let other = if rt.compute_capability().0 == 9 { (10, 0) } else { (9, 0) };
    if kernels::embedded_cubin("tests/reduce.cu", other.0, other.1).is_some() {
        expect(module("tests/reduce.cu", other).unwrap_err(), sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, "does not run on");
    }
    // SAFETY: a live module; using it after the unload is the misuse.
    unsafe { ok("unload", sys::cuModuleUnload(m)) };
    expect(function(m, "block_reduce").unwrap_err(), sys::CUresult::CUDA_ERROR_INVALID_HANDLE, "after cuModuleUnload");
}

#[test]
fn pointer_parameters_outside_allocations_and_into_freed_ones() {
    let _capture_lock = beside_captures();
    if !cubins() {
        return;
    }
    let rt = runtime();
    let (_, f, ptrs) = reduce_setup(&rt);
    let bad = [ptrs[0], 0x1000, ptrs[2], ptrs[3], ptrs[4]];
    expect(launch_reduce(f, [1, 1, 1], [256, 1, 1], 0, bad), sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "parameter 2");
    let freed = alloc(64);
    // SAFETY: a live allocation, freed once.
    ok("free", unsafe { sys::cuMemFree_v2(freed) });
    let stale = [ptrs[0], ptrs[1], freed, ptrs[3], ptrs[4]];
    expect(launch_reduce(f, [1, 1, 1], [256, 1, 1], 0, stale), sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "freed allocation");
    ok("a valid launch still works", launch_reduce(f, [1, 1, 1], [256, 1, 1], 0, ptrs));
}

#[test]
fn freed_memory_and_double_free() {
    let _capture_lock = beside_captures();
    let _rt = runtime();
    let (p, q) = (alloc(64), alloc(64));
    let mut host = [0u8; 64];
    use sys::CUresult::*;
    // SAFETY: p and q are live until the free; every call after it is the misuse under test.
    unsafe {
        ok("free", sys::cuMemFree_v2(p));
        expect(sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr() as *mut c_void, p, 64, std::ptr::null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS, "use after free");
        expect(sys::cuMemcpyHtoDAsync_v2(p, host.as_ptr() as *const c_void, 64, std::ptr::null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS, "use after free");
        expect(sys::cuMemcpyDtoDAsync_v2(q, p, 64, std::ptr::null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS, "use after free");
        expect(sys::cuMemsetD8Async(p, 0, 64, std::ptr::null_mut()), CUDA_ERROR_ILLEGAL_ADDRESS, "use after free");
        expect(sys::cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "double free");
        expect(sys::cuMemFree_v2(q + 8), CUDA_ERROR_INVALID_VALUE, "not the start of an allocation");
        expect(sys::cuMemcpyHtoDAsync_v2(q, host.as_ptr() as *const c_void, 65, std::ptr::null_mut()), CUDA_ERROR_INVALID_VALUE, "past the end");
    }
}

#[test]
fn streams_events_and_graphs_after_destroy() {
    let _capture_lock = alone();
    let _rt = runtime();
    let p = alloc(16);
    use sys::CUresult::*;
    // SAFETY: handles live until their destroy calls; every call after is the misuse.
    unsafe {
        let mut s = std::ptr::null_mut();
        ok("stream", sys::cuStreamCreate(&mut s, 1));
        ok("destroy", sys::cuStreamDestroy_v2(s));
        expect(sys::cuMemsetD8Async(p, 0, 16, s), CUDA_ERROR_INVALID_HANDLE, "after cuStreamDestroy");
        expect(sys::cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE, "after cuStreamDestroy");
        expect(sys::cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE, "after cuStreamDestroy");
        let mut e = std::ptr::null_mut();
        ok("event", sys::cuEventCreate(&mut e, 0));
        ok("destroy", sys::cuEventDestroy_v2(e));
        expect(sys::cuEventRecord(e, std::ptr::null_mut()), CUDA_ERROR_INVALID_HANDLE, "after cuEventDestroy");
        let mut ms = 0f32;
        expect(sys::cuEventElapsedTime_v2(&mut ms, e, e), CUDA_ERROR_INVALID_HANDLE, "after cuEventDestroy");
        // Stream capture: an allocation during a global capture is refused and invalidates it.
        ok("stream", sys::cuStreamCreate(&mut s, 1));
        ok("begin", sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL));
        let mut q = 0;
        expect(sys::cuMemAlloc_v2(&mut q, 16), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "capturing");
        let mut g = std::ptr::null_mut();
        expect(sys::cuStreamEndCapture(s, &mut g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "invalidated");
        assert!(g.is_null());
        expect(sys::cuGraphLaunch(0x4b33_0000_0010usize as sys::CUgraphExec, s), CUDA_ERROR_INVALID_HANDLE, "executable graph");
    }
}

/// Work from a thread without the context current is refused, as on a real driver.
#[test]
fn work_needs_a_current_context() {
    let _capture_lock = beside_captures();
    let _rt = runtime();
    std::thread::spawn(|| {
        let mut p = 0;
        // SAFETY: out-pointer to a local; no context is current on this new thread.
        let rc = unsafe { sys::cuMemAlloc_v2(&mut p, 16) };
        expect(rc, sys::CUresult::CUDA_ERROR_INVALID_CONTEXT, "no CUDA context is current");
    })
    .join()
    .expect("thread");
}

#[test]
fn blackwell_personalities() {
    let _capture_lock = beside_captures();
    for (arch, sms, cc) in [("sm_100a", "148", "10.0"), ("sm_103a", "160", "10.3")] {
        let exe = std::env::current_exe().expect("exe");
        let out = std::process::Command::new(exe)
            .args(["child_personality", "--exact", "--ignored", "--nocapture"])
            .env("K3_STANDIN_ARCH", arch)
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{arch}: {text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(&format!("{arch} {sms} SMs {cc}")), "{arch}: {text}");
    }
}

#[test]
#[ignore = "run by blackwell_personalities under each K3_STANDIN_ARCH"]
fn child_personality() {
    let _capture_lock = beside_captures();
    let rt = runtime();
    let i = rt.device_info();
    let (maj, min) = rt.compute_capability();
    println!("{} {} SMs {maj}.{min}", i.arch, i.compute_units);
    assert_eq!(i.shared_mem_per_block, 227 * 1024);
    assert!(i.name.contains(&i.arch), "{}", i.name);
    if cubins() {
        // The embedded cubin for this arch loads and runs.
        let (_, f, ptrs) = reduce_setup(&rt);
        ok("launch", launch_reduce(f, [1, 1, 1], [256, 1, 1], 0, ptrs));
    }
}
