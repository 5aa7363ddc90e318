//! Build script of k3-kernels: `kernel_sources.rs` in `$OUT_DIR`, `SOURCES`, every file under
//! `csrc` as `(path relative to csrc, include_str!)`, so the backends that compile at run time
//! (NVRTC, hiprtc) carry the sources inside the binary. No toolkit is needed. This script never
//! panics.

use k3_build_support::{write_sources_table, BuildEnv};
use std::path::PathBuf;

fn main() {
    let env = BuildEnv::build_script();
    if let Err(e) = build(&env) {
        env.warning(&format!("k3-kernels: {e}"));
        eprintln!("k3-kernels build failed: {e}");
        std::process::exit(1);
    }
}

fn build(env: &BuildEnv) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let csrc = manifest.join("csrc").canonicalize().map_err(|e| format!("kernel sources not found: {e}"))?;
    write_sources_table(env, &csrc, &out.join("kernel_sources.rs"))
}
