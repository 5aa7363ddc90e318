//! Build script of k3-backend-rocm: one generated file in `$OUT_DIR`, through the
//! workspace's `k3-build-support`.
//!
//! - `hip_images.rs`: `IMAGES`, one HSA code object per (kernel `.cu`, processor of
//!   `K3_HIP_ARCHS`, default `gfx942,gfx950`), embedded with include_bytes!, and `UNAVAILABLE`,
//!   the targets that have none and why (no clang for that processor, `K3_SKIP_DEVICE_COMPILE`,
//!   a failed compile).
//!
//! A missing compiler is a cargo warning, not an error (the crate then compiles with hiprtc at
//! run time, where there is one), unless `K3_REQUIRE_DEVICE_COMPILE=1`, which makes any target
//! without images a build error. Compiles are cached by content hash (`K3_KERNEL_CACHE_DIR`,
//! default under `$OUT_DIR`). This script never panics.

use k3_build_support::{compile_hip, kernel_sources, write_image_table, BuildEnv, Config};
use std::path::PathBuf;

fn main() {
    let env = BuildEnv::build_script();
    if let Err(e) = build(&env) {
        env.warning(&format!("k3-backend-rocm: {e}"));
        eprintln!("k3-backend-rocm build failed: {e}");
        std::process::exit(1);
    }
}

fn build(env: &BuildEnv) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let csrc_raw = manifest.join("../kernels/csrc");
    let csrc = csrc_raw.canonicalize().map_err(|e| format!("kernel sources not found at {}: {e}", csrc_raw.display()))?;
    let require = env.flag("K3_REQUIRE_DEVICE_COMPILE");

    let mut cfg = Config::for_build_script(env, kernel_sources(&csrc)?, vec![csrc.clone()]);
    cfg.cuda_archs.clear();

    let hip = compile_hip(env, &cfg);
    if require {
        let missing: Vec<String> =
            hip.iter().filter_map(|o| o.result.as_ref().err().map(|skip| format!("{}: {skip}", o.target))).collect();
        if !missing.is_empty() {
            return Err(format!("K3_REQUIRE_DEVICE_COMPILE=1 but no kernel images for:\n{}", missing.join("\n")));
        }
    }
    write_image_table(&cfg.out_dir.join("hip_images.rs"), &hip, &[])
}
