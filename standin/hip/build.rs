//! Build script of the HIP stand-in:
//! - a soname no HIP loader asks for (`libk3_standin_hip.so`), so the library is only ever used
//!   by full path;
//! - for its own tests, `kernels/csrc/tests/reduce.cu` compiled for gfx942 and gfx950 by
//!   `k3-build-support` (cached by content hash) into `$OUT_DIR/test_images.rs`. Without a HIP
//!   compiler the table is empty with the reason, and a cargo warning says so.

use k3_build_support::{compile_hip, write_image_table, BuildEnv, Config};
use std::path::PathBuf;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libk3_standin_hip.so");
    let env = BuildEnv::build_script();
    if let Err(e) = test_images(&env) {
        env.warning(&format!("k3-standin-hip: {e}"));
        eprintln!("k3-standin-hip build failed: {e}");
        std::process::exit(1);
    }
}

fn test_images(env: &BuildEnv) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let csrc = manifest.join("../../kernels/csrc").canonicalize().map_err(|e| format!("kernel sources: {e}"))?;
    let mut cfg = Config::for_build_script(env, vec![csrc.join("tests/reduce.cu")], vec![csrc.clone()]);
    cfg.cuda_archs.clear();
    let hip = compile_hip(env, &cfg);
    write_image_table(&cfg.out_dir.join("test_images.rs"), &hip, &[])
}
