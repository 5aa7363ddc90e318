//! What the device-compile tests share: the kernel tree, the compile configuration and the
//! `K3_REQUIRE_DEVICE_COMPILE` switch.
#![allow(dead_code)] // each test binary uses part of it

use k3_build_support::arch::parse_list;
use k3_build_support::{Config, CudaArch, HipArch};
use std::path::{Path, PathBuf};

/// The arch lists are fixed here (not read from K3_CUDA_ARCHS / K3_HIP_ARCHS).
pub const CUDA_ARCHS: &str = "90a,100a,103a";
pub const HIP_ARCHS: &str = "gfx942,gfx950";

pub fn csrc() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/csrc").canonicalize().expect("kernels/csrc exists")
}

/// `K3_REQUIRE_DEVICE_COMPILE=1`: a missing toolchain fails instead of skipping.
pub fn required() -> bool {
    matches!(std::env::var("K3_REQUIRE_DEVICE_COMPILE").as_deref(), Ok("1") | Ok("true") | Ok("yes"))
}

/// Every target, at most 2 compiles at a time, outputs in `K3_KERNEL_CACHE_DIR` when set (the
/// cache the build scripts and the resource report use: same inputs, same files), else under
/// the target directory.
pub fn config(sources: Vec<PathBuf>, csrc: &Path) -> Config {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device_compile");
    let mut cfg = Config::new(sources, vec![csrc.to_path_buf()], out.clone());
    cfg.cache_dir = match std::env::var_os("K3_KERNEL_CACHE_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => out.join("cache"),
    };
    cfg.jobs = 2;
    cfg.cuda_archs = parse_list(CUDA_ARCHS, CudaArch::parse).0;
    cfg.hip_archs = parse_list(HIP_ARCHS, HipArch::parse).0;
    cfg
}
