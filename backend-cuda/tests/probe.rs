//! The device probe without a GPU: a missing libcuda, and stub libcuda libraries (built here
//! with the system C compiler) standing for a machine with no device, a driver too old for the
//! kernel module, and a driver too old for the symbols this crate calls. Each case must give
//! `Error::Unavailable` with a reason, never a panic.
//!
//! The stub cases run in a child process (this test binary again, on the ignored
//! `stub_child` test) with `LD_LIBRARY_PATH` pointing at the stub, because a process loads
//! libcuda once.

use k3_backend_cuda::CudaRuntime;
use kernel_api::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

fn unavailable_reason(r: kernel_api::Result<CudaRuntime>) -> String {
    match r {
        Err(Error::Unavailable { why }) => why,
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(rt) => panic!("expected Unavailable, got a runtime: {rt:?}"),
    }
}

#[test]
fn missing_libcuda_is_unavailable_with_the_names_searched() {
    if k3_backend_cuda::driver_present() {
        println!("skipped: a libcuda is installed here, so the no-driver path cannot be observed in-process");
        return;
    }
    let why = unavailable_reason(CudaRuntime::new(0));
    println!("{why}");
    assert!(why.contains("libcuda") && why.contains("libcuda.so.1"), "{why}");
    assert!(why.contains("install the NVIDIA driver"), "{why}");
    // A second probe answers the same (the lookup is remembered, not retried into a panic).
    assert_eq!(unavailable_reason(CudaRuntime::new(3)), why);
    assert!(matches!(CudaRuntime::device_count(), Err(Error::Unavailable { .. })));
}

/// Stub libcuda sources; STUB_MODE selects the behaviour.
const STUB_C: &str = r#"
typedef int CUresult;
#if STUB_MODE == 1   /* a driver with no device */
#define INIT_RESULT 100
#elif STUB_MODE == 2 /* a user-space driver newer than the kernel module */
#define INIT_RESULT 803
#else                /* a driver that initialises but predates the symbols this crate uses */
#define INIT_RESULT 0
CUresult cuDriverGetVersion(int* v) { *v = 11020; return 0; }
#endif
CUresult cuInit(unsigned flags) { (void)flags; return INIT_RESULT; }
CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : e == 803 ? "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
CUresult cuGetErrorString(CUresult e, const char** s) {
  *s = e == 100 ? "no CUDA-capable device is detected"
     : e == 803 ? "system has unsupported display driver / cuda driver combination"
                : "unknown error";
  return 0;
}
"#;

fn scratch_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let d = std::env::temp_dir().join(format!("k3-cuda-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Builds the stub as libcuda.so and libcuda.so.1 in `dir` (both names: the loader tries
/// libcuda.so first, which a real driver elsewhere on the machine might answer).
fn build_stub(dir: &Path, mode: u32) -> Result<(), String> {
    build_stub_named(dir, mode, "libcuda.so.1")?;
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so")).map_err(|e| e.to_string())?;
    Ok(())
}

/// Builds the stub with `soname` as `dir/<soname>`.
fn build_stub_named(dir: &Path, mode: u32, soname: &str) -> Result<(), String> {
    let src = dir.join("stub.c");
    std::fs::write(&src, STUB_C).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib = dir.join(soname);
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", &format!("-Wl,-soname,{soname}"), &format!("-DSTUB_MODE={mode}")])
        .arg(&src)
        .arg("-o")
        .arg(&lib)
        .output()
        .map_err(|e| format!("cannot run `{cc}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{cc}` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Runs `stub_child` against stub `mode`; returns the child's reason line.
fn run_child(mode: u32) -> String {
    let dir = scratch_dir(&format!("stub{mode}"));
    if let Err(e) = build_stub(&dir, mode) {
        let _ = std::fs::remove_dir_all(&dir);
        panic!("could not build the stub libcuda with the C compiler: {e}");
    }
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    child_reason(mode, &dir, &[("LD_LIBRARY_PATH", ld)])
}

/// Runs `stub_child` with the stub `mode` named `soname` selected by K3_CUDA_DRIVER_LIBRARY
/// (its folder is on no search path).
fn run_child_explicit(mode: u32, soname: &str) -> String {
    let dir = scratch_dir(&format!("explicit{mode}"));
    if let Err(e) = build_stub_named(&dir, mode, soname) {
        let _ = std::fs::remove_dir_all(&dir);
        panic!("could not build the stub libcuda with the C compiler: {e}");
    }
    let path = dir.join(soname).display().to_string();
    child_reason(mode, &dir, &[("K3_CUDA_DRIVER_LIBRARY", path)])
}

fn child_reason(mode: u32, dir: &Path, env: &[(&str, String)]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args(["--ignored", "--exact", "stub_child", "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("K3_STUB_MODE", mode.to_string())
        .output()
        .expect("spawn the child test");
    let _ = std::fs::remove_dir_all(dir);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed (mode {mode}):\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the child test did not run:\n{stdout}");
    // libtest prints "test stub_child ... " without a newline before the test's own output.
    let reason = stdout.lines().find_map(|l| l.split_once("REASON: ").map(|(_, r)| r.to_string()));
    reason.unwrap_or_else(|| panic!("the child printed no reason:\n{stdout}"))
}

#[test]
fn no_device_is_unavailable_with_the_drivers_message() {
    let why = run_child(1);
    println!("{why}");
    assert!(why.contains("CUDA_ERROR_NO_DEVICE") && why.contains("no CUDA-capable device is detected"), "{why}");
}

#[test]
fn driver_kernel_mismatch_is_unavailable_with_the_drivers_message() {
    let why = run_child(2);
    println!("{why}");
    assert!(why.contains("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"), "{why}");
}

#[test]
fn driver_without_needed_symbols_is_unavailable_naming_them() {
    let why = run_child(3);
    println!("{why}");
    assert!(why.contains("lacks") && why.contains("cuMemAlloc_v2") && why.contains("CUDA 11.2"), "{why}");
}

/// K3_CUDA_DRIVER_LIBRARY selects a library by path; cudarc then finds it by its soname.
#[test]
fn explicit_driver_library_is_used_when_cudarc_resolves_to_it() {
    let why = run_child_explicit(1, "libcuda.so");
    assert!(why.contains("CUDA_ERROR_NO_DEVICE") && why.contains("explicit1"), "{why}");
    // A soname cudarc never asks for: cudarc would load another library (or none), so it is refused.
    let why = run_child_explicit(1, "libk3stub.so");
    assert!(why.contains("K3_CUDA_DRIVER_LIBRARY=") && why.contains("soname"), "{why}");
}

/// The child side: run with LD_LIBRARY_PATH at a stub libcuda (see `run_child`).
#[test]
#[ignore = "runs only as the child process of the stub tests"]
fn stub_child() {
    let mode: u32 = std::env::var("K3_STUB_MODE").expect("K3_STUB_MODE").parse().expect("mode");
    let explicit = std::env::var_os("K3_CUDA_DRIVER_LIBRARY").is_some();
    assert!(explicit || k3_backend_cuda::driver_present(), "the stub libcuda was not found on LD_LIBRARY_PATH");
    let why = unavailable_reason(CudaRuntime::new(0));
    // The same answer from device_count, and again from a second probe (no state left behind).
    match CudaRuntime::device_count() {
        Err(Error::Unavailable { why: w }) => assert!(!w.is_empty()),
        other => panic!("device_count on stub {mode}: {other:?}"),
    }
    assert_eq!(unavailable_reason(CudaRuntime::new(0)), why);
    println!("REASON: {why}");
}
