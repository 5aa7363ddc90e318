//! Build script of k3-backend-cuda. Everything it does lives in this one file, so that it can be
//! swapped for the workspace's `build-support` crate later. Two outputs in `$OUT_DIR`:
//!
//! - `kernel_sources.rs`: `SOURCES`, every file under `kernels/csrc` as `(relative path,
//!   include_str!)`, for the run-time NVRTC path (the sources travel inside the binary).
//! - `kernel_fatbins.rs`: when nvcc is found, every `.cu` under `kernels/csrc/ops` and
//!   `kernels/csrc/tests` compiled with nvcc into one fatbin per file for the archs of
//!   `K3_CUDA_ARCHS` (default `90a,100a,103a`), embedded with include_bytes!; `FATBINS` and
//!   `FATBIN_ARCHS`. Without nvcc both are empty, with a cargo warning saying why.
//!
//! nvcc is looked for in `$NVCC`, then `bin/nvcc` under `$CUDA_HOME`, `$CUDA_PATH`,
//! `$CUDA_ROOT`, `$CUDA_TOOLKIT_ROOT_DIR`, then on `PATH`. `K3_CUDA_NVCC=0` skips nvcc;
//! `DOCS_RS` skips it too. A file nvcc rejects is left out (warning) unless
//! `K3_REQUIRE_DEVICE_COMPILE=1`, which turns any missing nvcc or failed compile into a build
//! error. Fatbins are cached in `$OUT_DIR` by a hash of the file, every header, the flags and
//! the nvcc version. This script never panics.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "90a,100a,103a";
/// Subfolders of csrc whose .cu files become kernel sets (ops: the op kernels; tests: the
/// dialect's own test kernels).
const SETS: &[&str] = &["ops", "tests"];
const ENV_VARS: &[&str] = &[
    "NVCC",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
    "PATH",
    "K3_CUDA_ARCHS",
    "K3_CUDA_NVCC",
    "K3_REQUIRE_DEVICE_COMPILE",
    "NVCC_CCBIN",
    "DOCS_RS",
];

fn main() {
    for v in ENV_VARS {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let require = matches!(std::env::var("K3_REQUIRE_DEVICE_COMPILE").as_deref(), Ok("1") | Ok("true"));
    match build(require) {
        Ok(()) => {}
        Err(e) => {
            // Only reached for I/O failures in OUT_DIR or with K3_REQUIRE_DEVICE_COMPILE=1.
            println!("cargo:warning=k3-backend-cuda: {e}");
            eprintln!("k3-backend-cuda build failed: {e}");
            std::process::exit(1);
        }
    }
}

fn warn(msg: &str) {
    for line in msg.lines().take(30) {
        println!("cargo:warning=k3-backend-cuda: {line}");
    }
}

fn build(require: bool) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let csrc_raw = manifest.join("../kernels/csrc");
    let csrc = csrc_raw.canonicalize().map_err(|e| format!("kernel sources not found at {}: {e}", csrc_raw.display()))?;
    println!("cargo:rerun-if-changed={}", csrc.display());

    let mut files = Vec::new();
    walk(&csrc, &mut files)?;
    let files: Vec<(String, PathBuf)> = files
        .into_iter()
        .filter(|p| ["cu", "cuh", "h", "hpp", "inc"].iter().any(|e| p.extension().is_some_and(|x| x == *e)))
        .filter_map(|p| Some((p.strip_prefix(&csrc).ok()?.to_string_lossy().replace('\\', "/"), p)))
        .collect();
    for (_, p) in &files {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    // 1. Every source, embedded for NVRTC.
    let mut src_rs = String::from("/// Every file under kernels/csrc: (path relative to csrc, contents).\n");
    src_rs.push_str("pub static SOURCES: &[(&str, &str)] = &[\n");
    for (rel, p) in &files {
        let _ = writeln!(src_rs, "    ({rel:?}, include_str!({:?})),", p.display().to_string());
    }
    src_rs.push_str("];\n");
    write_if_changed(&out_dir.join("kernel_sources.rs"), &src_rs)?;

    // 2. Fatbins from nvcc, when there is one.
    let kernels: Vec<&(String, PathBuf)> =
        files.iter().filter(|(rel, _)| rel.ends_with(".cu") && SETS.iter().any(|s| rel.starts_with(&format!("{s}/")))).collect();
    let archs = parse_archs(&std::env::var("K3_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.into()));
    let fatbins = match find_nvcc().and_then(|nvcc| Ok((nvcc, archs.clone()?))) {
        Err(why) => {
            if require {
                return Err(format!("K3_REQUIRE_DEVICE_COMPILE=1 but {why}"));
            }
            warn(&format!("{why}; no kernel binaries embedded (kernels will be JIT-compiled with NVRTC at run time)"));
            BTreeMap::new()
        }
        Ok((nvcc, archs)) => compile_all(&nvcc, &csrc, &out_dir, &files, &kernels, &archs, require)?,
    };
    let archs = archs.unwrap_or_default();
    let mut fat_rs = String::from("/// Arch list the embedded fatbins were compiled for (`90a`, ...), empty without nvcc.\n");
    let listed: Vec<&str> = if fatbins.is_empty() { Vec::new() } else { archs.iter().map(|s| s.as_str()).collect() };
    let _ = writeln!(fat_rs, "pub static FATBIN_ARCHS: &[&str] = &{listed:?};");
    fat_rs.push_str("/// nvcc fatbins: (kernel file relative to csrc, image).\n");
    fat_rs.push_str("pub static FATBINS: &[(&str, &[u8])] = &[\n");
    for (rel, path) in &fatbins {
        let _ = writeln!(fat_rs, "    ({rel:?}, include_bytes!({:?})),", path.display().to_string());
    }
    fat_rs.push_str("];\n");
    write_if_changed(&out_dir.join("kernel_fatbins.rs"), &fat_rs)?;
    Ok(())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let rd = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            println!("cargo:rerun-if-changed={}", p.display());
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), String> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `90a, sm_100a,103a` -> ["90a", "100a", "103a"]; each entry digits plus an optional a/f.
fn parse_archs(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for raw in list.split([',', ';', ' ']).map(str::trim).filter(|s| !s.is_empty()) {
        let a = raw.trim_start_matches("sm_").trim_start_matches("compute_");
        let digits = a.trim_end_matches(['a', 'f']);
        if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) || a.len() > digits.len() + 1 {
            return Err(format!("K3_CUDA_ARCHS: `{raw}` is not an arch like 90a, 100a or 120"));
        }
        if !out.iter().any(|x| x == a) {
            out.push(a.to_string());
        }
    }
    if out.is_empty() {
        return Err("K3_CUDA_ARCHS is empty".into());
    }
    Ok(out)
}

struct Nvcc {
    path: PathBuf,
    version: String,
}

fn find_nvcc() -> Result<Nvcc, String> {
    if std::env::var_os("DOCS_RS").is_some() {
        return Err("DOCS_RS is set".into());
    }
    if matches!(std::env::var("K3_CUDA_NVCC").as_deref(), Ok("0") | Ok("off") | Ok("false")) {
        return Err("K3_CUDA_NVCC=0".into());
    }
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("NVCC") {
        candidates.push(PathBuf::from(p));
    }
    for v in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Some(root) = std::env::var_os(v) {
            candidates.push(PathBuf::from(root).join("bin/nvcc"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    for c in candidates.iter().filter(|c| c.is_file()) {
        match Command::new(c).arg("--version").output() {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let version = text.lines().rev().find(|l| l.contains("release")).unwrap_or("").trim().to_string();
                return Ok(Nvcc { path: c.clone(), version });
            }
            Ok(o) => warn(&format!("{} --version failed: {}", c.display(), String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => warn(&format!("cannot run {}: {e}", c.display())),
        }
    }
    Err("nvcc not found ($NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, $CUDA_ROOT/bin, $CUDA_TOOLKIT_ROOT_DIR/bin, PATH)".into())
}

/// FNV-1a, 64 bit: a stable content hash for the cache file names (no dependency needed).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn nvcc_args(csrc: &Path, archs: &[String], src: &Path, out: &Path) -> Vec<String> {
    let mut a = vec!["-fatbin".to_string(), "-std=c++17".into(), "-O3".into(), "-lineinfo".into()];
    a.push(format!("-I{}", csrc.display()));
    if let Ok(ccbin) = std::env::var("NVCC_CCBIN") {
        a.push(format!("-ccbin={ccbin}"));
    }
    for arch in archs {
        a.push("-gencode".into());
        a.push(format!("arch=compute_{arch},code=sm_{arch}"));
    }
    a.push(src.display().to_string());
    a.push("-o".into());
    a.push(out.display().to_string());
    a
}

fn compile_all(
    nvcc: &Nvcc,
    csrc: &Path,
    out_dir: &Path,
    files: &[(String, PathBuf)],
    kernels: &[&(String, PathBuf)],
    archs: &[String],
    require: bool,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let fat_dir = out_dir.join("fatbin");
    fs::create_dir_all(&fat_dir).map_err(|e| format!("cannot create {}: {e}", fat_dir.display()))?;
    // Any header may be included by any kernel: hash them all into every key.
    let mut headers = Vec::new();
    for (rel, p) in files.iter().filter(|(rel, _)| !rel.ends_with(".cu")) {
        headers.push(rel.as_bytes().to_vec());
        headers.push(fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?);
    }
    let jobs: Vec<(String, PathBuf, PathBuf)> = kernels
        .iter()
        .map(|(rel, src)| {
            let text = fs::read(src).unwrap_or_default();
            let flags = nvcc_args(csrc, archs, Path::new(""), Path::new("")).join(" ");
            let mut parts: Vec<&[u8]> = vec![rel.as_bytes(), &text, flags.as_bytes(), nvcc.version.as_bytes()];
            parts.extend(headers.iter().map(|h| h.as_slice()));
            let stem: String = rel.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
            (rel.clone(), src.clone(), fat_dir.join(format!("{stem}-{:016x}.fatbin", fnv(&parts))))
        })
        .collect();

    let threads = std::env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(2).clamp(1, 8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, Result<(), String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(jobs.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((rel, src, out)) = jobs.get(i) else { break };
                        done.push((i, compile_one(nvcc, csrc, archs, rel, src, out)));
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });

    let mut embedded = BTreeMap::new();
    let mut failures = Vec::new();
    for (i, r) in results {
        let (rel, _, out) = &jobs[i];
        match r {
            Ok(()) => {
                embedded.insert(rel.clone(), out.clone());
            }
            Err(e) => failures.push(format!("{rel}: {e}")),
        }
    }
    if embedded.len() + failures.len() != jobs.len() {
        failures.push("an nvcc worker thread stopped early".into());
    }
    if !failures.is_empty() {
        let msg = format!("nvcc ({}) failed for {} file(s):\n{}", nvcc.version, failures.len(), failures.join("\n"));
        if require {
            return Err(msg);
        }
        warn(&format!("{msg}\n(those files are left to the run-time NVRTC path)"));
    }
    Ok(embedded)
}

fn compile_one(nvcc: &Nvcc, csrc: &Path, archs: &[String], rel: &str, src: &Path, out: &Path) -> Result<(), String> {
    if out.is_file() {
        return Ok(()); // same content hash: compiled by an earlier run of this script
    }
    let tmp = out.with_extension("fatbin.tmp");
    let o = Command::new(&nvcc.path)
        .args(nvcc_args(csrc, archs, src, &tmp))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.path.display()))?;
    if !o.status.success() {
        let mut log = String::from_utf8_lossy(&o.stderr).into_owned();
        log.push_str(&String::from_utf8_lossy(&o.stdout));
        return Err(format!("{rel} for {archs:?}:\n{}", log.trim()));
    }
    fs::rename(&tmp, out).map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))
}
