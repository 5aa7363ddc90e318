//! The committed kernel resource report (`benches/kernel-resources.md` and `.json`) matches what
//! the binaries say now, and the gates of `benches/kernel-gates.txt` hold.
//!
//! Ignored by default: it needs every device toolchain (nvcc with cuobjdump and nvdisasm,
//! clang-19 with llvm-objdump-19 and llvm-readelf-19, zig) and about 25 s of disassembly. CI runs
//! it right after `cargo test --workspace`, from the same build (`.ci/run`):
//! `cargo test --workspace --test kernel_report -- --ignored`. When it fails because the report
//! is stale, the message names the command that refreshes it.

use std::process::Command;

#[test]
#[ignore = "needs the device toolchains; CI runs it with --ignored (see .ci/run)"]
fn committed_report_matches_the_binaries_and_gates_hold() {
    let out = Command::new(env!("CARGO_BIN_EXE_k3-kernel-report")).arg("--check").output().expect("k3-kernel-report runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    assert!(out.status.success(), "k3-kernel-report --check failed:\n{stderr}");
}
