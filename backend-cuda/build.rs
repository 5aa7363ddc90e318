//! Build script of k3-backend-cuda: two generated files in `$OUT_DIR`, both through the
//! workspace's `k3-build-support`.
//!
//! - `kernel_sources.rs`: `SOURCES`, every file under `kernels/csrc` as `(path relative to csrc,
//!   include_str!)`, for the run-time NVRTC path (the sources travel inside the binary).
//! - `cuda_images.rs`: `IMAGES`, one nvcc cubin per (kernel `.cu`, `sm_XX` of `K3_CUDA_ARCHS`,
//!   default `90a,100a,103a`), embedded with include_bytes!, and `UNAVAILABLE`, the targets that
//!   have none and why (no nvcc, `K3_SKIP_DEVICE_COMPILE`, a failed compile).
//!
//! A missing toolkit is a cargo warning, not an error (the crate then JIT-compiles with NVRTC),
//! unless `K3_REQUIRE_DEVICE_COMPILE=1`, which makes any target without images a build error.
//! Compiles are cached by content hash (`K3_KERNEL_CACHE_DIR`, default under `$OUT_DIR`). This
//! script never panics.

use k3_build_support::{compile_cuda, kernel_sources, write_image_table, BuildEnv, Config};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let env = BuildEnv::build_script();
    if let Err(e) = build(&env) {
        env.warning(&format!("k3-backend-cuda: {e}"));
        eprintln!("k3-backend-cuda build failed: {e}");
        std::process::exit(1);
    }
}

fn build(env: &BuildEnv) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let csrc_raw = manifest.join("../kernels/csrc");
    let csrc = csrc_raw.canonicalize().map_err(|e| format!("kernel sources not found at {}: {e}", csrc_raw.display()))?;
    let require = env.flag("K3_REQUIRE_DEVICE_COMPILE");

    let mut cfg = Config::for_build_script(env, kernel_sources(&csrc)?, vec![csrc.clone()]);
    cfg.hip_archs.clear();
    write_sources_table(env, &csrc, &cfg.out_dir.join("kernel_sources.rs"))?;

    let cuda = compile_cuda(env, &cfg);
    if require {
        let missing: Vec<String> =
            cuda.iter().filter_map(|o| o.result.as_ref().err().map(|skip| format!("{}: {skip}", o.target))).collect();
        if !missing.is_empty() {
            return Err(format!("K3_REQUIRE_DEVICE_COMPILE=1 but no kernel images for:\n{}", missing.join("\n")));
        }
    }
    write_image_table(&cfg.out_dir.join("cuda_images.rs"), &cuda, &[])
}

/// `SOURCES`: every file a kernel may include, embedded for NVRTC.
fn write_sources_table(env: &BuildEnv, csrc: &Path, path: &Path) -> Result<(), String> {
    let exts: Vec<&str> = ["cu"].into_iter().chain(k3_build_support::sources::HEADER_EXTS.iter().copied()).collect();
    let files = k3_build_support::sources::find_files(csrc, &exts, &[])?;
    let mut text = String::from("/// Every file under kernels/csrc: (path relative to csrc, contents).\n");
    text.push_str("pub static SOURCES: &[(&str, &str)] = &[\n");
    for dir in k3_build_support::sources::dirs_under(csrc) {
        env.rerun_if_changed(&dir); // an added file re-runs the script
    }
    for f in &files {
        env.rerun_if_changed(f);
        let rel = f.strip_prefix(csrc).map_err(|e| e.to_string())?.to_string_lossy().replace('\\', "/");
        let abs = f.to_str().ok_or_else(|| format!("{} is not UTF-8", f.display()))?;
        let _ = writeln!(text, "    ({rel:?}, include_str!({abs:?})),");
    }
    text.push_str("];\n");
    if std::fs::read_to_string(path).ok().as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
