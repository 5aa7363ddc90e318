//! AddressSanitizer catches out-of-bounds writes made by kernels: into a K3_SHARED array (the
//! arena's poisoned redzone) and past the end of a global buffer (heap redzone). Each bad launch
//! runs in a child process (ASan stops the process that hits it), and the parent checks the
//! report names the bug class and the kernel line.
//!
//! Runs only in a `K3_SIMT_ASAN=1` build; otherwise it checks the in-bounds launch and prints
//! why the rest is skipped.
mod common;

use common::*;
use k3_kernels::{KernelArgs, LaunchConfig};
use std::process::Command;

const FAULTS: &str = include_str!("../../kernels/csrc/tests/faults.cu");
const CHILD_ENV: &str = "K3_SIMT_ASAN_CHILD";

/// The launch a child performs: `shared` writes s[64] of a 64-float shared array, `global`
/// writes 64 floats into a 32-float buffer.
fn bad_launch(mode: &str) {
    let rt = rt(32);
    match mode {
        "shared" => {
            let out = alloc::<f32>(&rt, 64);
            let mut a = KernelArgs::new();
            a.push(out.device_ptr()).push(1i32);
            let _ = launch(&rt, "shared_oob_write", LaunchConfig::new(1, 64, 0), &mut a);
        }
        _ => {
            let out = alloc::<f32>(&rt, 32);
            let mut a = KernelArgs::new();
            a.push(out.device_ptr());
            let _ = launch(&rt, "global_oob_write", LaunchConfig::new(1, 64, 0), &mut a);
        }
    }
}

fn check_caught(test_name: &str, mode: &str, bug_class: &str, marker: &str) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(mode) {
        bad_launch(mode);
        panic!("AddressSanitizer did not stop the out-of-bounds write ({mode})");
    }
    // In bounds, the same kernels run cleanly in every build.
    let rt = rt(32);
    let out = alloc::<f32>(&rt, 64);
    let mut a = KernelArgs::new();
    a.push(out.device_ptr()).push(0i32);
    launch(&rt, "shared_oob_write", LaunchConfig::new(1, 64, 0), &mut a).unwrap();
    assert_eq!(download::<f32>(&rt, &out), vec![1.0; 64]);
    if !k3_backend_simt::asan_enabled() {
        println!(
            "skipped: the out-of-bounds part of {test_name} needs an AddressSanitizer build \
             (K3_SIMT_ASAN=1 CARGO_TARGET_DIR=target/asan cargo test -p k3-backend-simt --test asan)"
        );
        return;
    }
    let exe = std::env::current_exe().expect("test executable");
    let child = Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .output()
        .expect("spawn the child test");
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(!child.status.success(), "the child should have been stopped by ASan:\n{stderr}");
    assert!(stderr.contains(&format!("ERROR: AddressSanitizer: {bug_class}")), "{stderr}");
    let line = marker_line(FAULTS, marker);
    assert!(stderr.contains(&format!("faults.cu:{line}")), "the report should point at faults.cu:{line}:\n{stderr}");
}

#[test]
fn shared_memory_overflow_is_caught_by_asan() {
    check_caught("shared_memory_overflow_is_caught_by_asan", "shared", "use-after-poison", "SHARED-OOB");
}

#[test]
fn global_buffer_overflow_is_caught_by_asan() {
    check_caught("global_buffer_overflow_is_caught_by_asan", "global", "heap-buffer-overflow", "GLOBAL-OOB");
}
