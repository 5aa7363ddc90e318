//! The device probe without a GPU: a HIP library that is missing, and stub libamdhip64
//! libraries (built here with the system C compiler from the crate's own symbol table) standing
//! for a runtime with no device, one too old, one lacking symbols this crate calls, and one
//! whose device count is zero. Each case must give `Error::Unavailable` with a reason naming
//! what was searched or what is missing, never a panic.
//!
//! Each case runs in a child process (this test binary again, on the ignored `probe_child`
//! test) with `K3_HIP_LIBRARY` set, because a process loads the HIP runtime once.

use k3_backend_rocm::sys::HipFns;
use k3_backend_rocm::RocmRuntime;
use kernel_api::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

fn unavailable_reason(r: kernel_api::Result<RocmRuntime>) -> String {
    match r {
        Err(Error::Unavailable { why }) => why,
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(rt) => panic!("expected Unavailable, got a runtime: {rt:?}"),
    }
}

/// A C stub exporting every `HipFns` symbol (each returning hipErrorNotSupported) except those
/// `mode` leaves out or defines itself; `hipRuntimeGetVersion` always answers (6.4, or 4.5 for
/// `old`).
fn stub_source(mode: &str) -> String {
    let own: &[&str] = match mode {
        "no-device" => &["hipInit", "hipGetErrorName", "hipGetErrorString"],
        "zero-devices" => &["hipInit", "hipGetDeviceCount"],
        _ => &[],
    };
    let left_out: &[&str] = if mode == "missing" { &["hipModuleLaunchKernel", "hipGraphInstantiate"] } else { &[] };
    let mut c = String::from("typedef unsigned hipError_t;\n");
    for name in HipFns::NAMES {
        if !own.contains(name) && !left_out.contains(name) && *name != "hipRuntimeGetVersion" {
            // x86-64 and aarch64 C: extra integer/pointer arguments are ignored by a callee
            // that declares none.
            c.push_str(&format!("hipError_t {name}(void) {{ return 801; }}\n"));
        }
    }
    let version = if mode == "old" { 40_522_000 } else { 60_443_483 };
    c.push_str(&format!("hipError_t hipRuntimeGetVersion(int* v) {{ *v = {version}; return 0; }}\n"));
    match mode {
        "no-device" => c.push_str(
            "hipError_t hipInit(unsigned f) { (void)f; return 100; }\n\
             const char* hipGetErrorName(hipError_t e) { return e == 100 ? \"hipErrorNoDevice\" : \"hipErrorUnknown\"; }\n\
             const char* hipGetErrorString(hipError_t e) { return e == 100 ? \"no ROCm-capable device is detected\" : \"unknown error\"; }\n",
        ),
        "zero-devices" => c.push_str(
            "hipError_t hipInit(unsigned f) { (void)f; return 0; }\n\
             hipError_t hipGetDeviceCount(int* n) { *n = 0; return 0; }\n",
        ),
        _ => {}
    }
    c
}

fn scratch_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let d = std::env::temp_dir().join(format!("k3-rocm-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn build_stub(dir: &Path, mode: &str) -> Result<PathBuf, String> {
    let src = dir.join("stub.c");
    std::fs::write(&src, stub_source(mode)).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib = dir.join("libamdhip64.so");
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&lib)
        .output()
        .map_err(|e| format!("cannot run `{cc}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{cc}` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(lib)
}

/// Runs `probe_child` with `K3_HIP_LIBRARY=library`; returns the child's reason line.
fn run_child(library: &Path) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args(["--ignored", "--exact", "probe_child", "--nocapture", "--test-threads=1"])
        .env("K3_HIP_LIBRARY", library)
        .output()
        .expect("spawn the child test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed ({}):\n{stdout}\n{}", library.display(), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 passed"), "the child test did not run:\n{stdout}");
    let reason = stdout.lines().find_map(|l| l.split_once("REASON: ").map(|(_, r)| r.to_string()));
    reason.unwrap_or_else(|| panic!("the child printed no reason:\n{stdout}"))
}

fn stub_reason(mode: &str) -> String {
    let dir = scratch_dir(mode);
    let lib = build_stub(&dir, mode).unwrap_or_else(|e| panic!("could not build the stub libamdhip64 with the C compiler: {e}"));
    let why = run_child(&lib);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{mode}: {why}");
    why
}

#[test]
fn a_named_library_that_does_not_exist_is_unavailable_naming_it() {
    let why = run_child(Path::new("/nonexistent/k3/libamdhip64.so"));
    println!("{why}");
    assert!(why.contains("K3_HIP_LIBRARY=/nonexistent/k3/libamdhip64.so"), "{why}");
    assert!(why.contains("install ROCm"), "{why}");
}

#[test]
fn no_device_is_unavailable_with_the_runtimes_message() {
    let why = stub_reason("no-device");
    assert!(why.contains("hipInit failed with hipErrorNoDevice: no ROCm-capable device is detected"), "{why}");
    assert!(why.contains("HIP 6.4.43483"), "{why}");
}

#[test]
fn a_runtime_older_than_rocm_5_is_unavailable_naming_its_version() {
    let why = stub_reason("old");
    assert!(why.contains("HIP 4.5.22000") && why.contains("older than"), "{why}");
}

#[test]
fn missing_symbols_are_named() {
    let why = stub_reason("missing");
    assert!(why.contains("lacks") && why.contains("hipModuleLaunchKernel") && why.contains("hipGraphInstantiate"), "{why}");
}

#[test]
fn zero_devices_is_unavailable() {
    let why = stub_reason("zero-devices");
    assert!(why.contains("reports no device"), "{why}");
}

/// Without `K3_HIP_LIBRARY`: whatever this machine has (nothing, or a runtime with no device,
/// such as Debian's libamdhip64-5 on a CI runner), the answer is `Unavailable`, and when no
/// library is found at all it names every folder and soname searched.
#[test]
fn the_default_search_answers_unavailable_here() {
    if std::env::var_os("K3_HIP_LIBRARY").is_some() {
        println!("skipped: K3_HIP_LIBRARY selects a runtime for this run");
        return;
    }
    let why = unavailable_reason(RocmRuntime::new(0));
    println!("{why}");
    if k3_backend_rocm::runtime_present() {
        assert!(why.contains("hipInit failed") || why.contains("no device") || why.contains("hipGetDeviceCount"), "{why}");
    } else {
        assert!(why.contains("/opt/rocm/lib/libamdhip64.so{,.7,.6,.5}"), "{why}");
        assert!(why.contains("the dynamic loader (libamdhip64.so, libamdhip64.so.7, libamdhip64.so.6, libamdhip64.so.5)"), "{why}");
    }
    // A second probe answers the same (the lookup is remembered, not retried into a panic).
    assert_eq!(unavailable_reason(RocmRuntime::new(3)), why);
}

/// The child side: run with `K3_HIP_LIBRARY` at a stub or a missing file (see `run_child`).
#[test]
#[ignore = "runs only as the child process of the probe tests"]
fn probe_child() {
    let why = unavailable_reason(RocmRuntime::new(0));
    assert_eq!(unavailable_reason(RocmRuntime::new(0)), why);
    match RocmRuntime::device_count() {
        Ok(0) | Err(Error::Unavailable { .. }) => {}
        other => panic!("device_count: {other:?}"),
    }
    println!("REASON: {why}");
}
