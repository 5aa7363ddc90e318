//! What to compile and for which targets, read from the environment by build scripts.

use crate::arch::{parse_list, CudaArch, HipArch, DEFAULT_CUDA_ARCHS, DEFAULT_HIP_ARCHS};
use crate::env::BuildEnv;
use std::path::PathBuf;

/// Upper bound on concurrent device compiles when nothing else says: nvcc takes ~0.5 GB
/// and a core per job, and CI has 2 cores.
pub const DEFAULT_MAX_JOBS: usize = 4;

/// One kernel build: sources, include directories, targets, flags and where outputs go.
#[derive(Clone, Debug)]
pub struct Config {
    /// Translation units (`*.cu`), each compiled on its own for every target.
    pub sources: Vec<PathBuf>,
    /// `-I` directories. Every header below them is hashed into the cache key and watched.
    pub include_dirs: Vec<PathBuf>,
    /// `-D` definitions (`NAME` or `NAME=VALUE`) for every target.
    pub defines: Vec<String>,
    pub cuda_archs: Vec<CudaArch>,
    pub hip_archs: Vec<HipArch>,
    /// Extra nvcc flags (`K3_NVCC_FLAGS`), after the built-in ones.
    pub nvcc_flags: Vec<String>,
    /// Extra clang flags for HIP (`K3_HIP_FLAGS`), after the built-in ones.
    pub hip_flags: Vec<String>,
    /// Generated helper files (the zig `lld` wrapper) go here.
    pub out_dir: PathBuf,
    /// Content-addressed outputs (`K3_KERNEL_CACHE_DIR`, default `out_dir/k3-kernel-cache`).
    pub cache_dir: PathBuf,
    /// Concurrent compiles (`K3_KERNEL_JOBS`, default min(cargo's NUM_JOBS, cores, 4)).
    pub jobs: usize,
    /// Set when nothing may be compiled (`DOCS_RS`, `K3_SKIP_DEVICE_COMPILE`): the reason.
    pub disabled: Option<String>,
}

impl Config {
    /// Defaults: the default arch lists, cache under `out_dir`, default job count, no flags.
    pub fn new(sources: Vec<PathBuf>, include_dirs: Vec<PathBuf>, out_dir: PathBuf) -> Self {
        let (cuda_archs, _) = parse_list(DEFAULT_CUDA_ARCHS, CudaArch::parse);
        let (hip_archs, _) = parse_list(DEFAULT_HIP_ARCHS, HipArch::parse);
        Config {
            sources,
            include_dirs,
            defines: Vec::new(),
            cuda_archs,
            hip_archs,
            nvcc_flags: Vec::new(),
            hip_flags: Vec::new(),
            cache_dir: out_dir.join("k3-kernel-cache"),
            out_dir,
            jobs: default_jobs(None),
            disabled: None,
        }
    }

    /// [`Config::new`] adjusted by the environment (each variable read is reported to cargo;
    /// a malformed entry is a `cargo::warning` and is left out, never a panic):
    /// `DOCS_RS`, `K3_SKIP_DEVICE_COMPILE` (disable), `K3_CUDA_ARCHS` (else `CUDA_COMPUTE_CAP`),
    /// `K3_HIP_ARCHS`, `K3_KERNEL_CACHE_DIR`, `K3_KERNEL_JOBS`, `K3_NVCC_FLAGS`, `K3_HIP_FLAGS`.
    pub fn from_env(env: &BuildEnv, sources: Vec<PathBuf>, include_dirs: Vec<PathBuf>, out_dir: PathBuf) -> Self {
        let mut cfg = Config::new(sources, include_dirs, out_dir);
        if env.var_os("DOCS_RS").is_some() {
            cfg.disabled = Some("DOCS_RS is set (docs.rs builds compile no device code)".into());
        } else if env.flag("K3_SKIP_DEVICE_COMPILE") {
            cfg.disabled = Some("K3_SKIP_DEVICE_COMPILE is set".into());
        }
        let cuda_spec = match env.var("K3_CUDA_ARCHS") {
            Some(s) => Some(("K3_CUDA_ARCHS", s)),
            None => env.var("CUDA_COMPUTE_CAP").map(|s| ("CUDA_COMPUTE_CAP", s)),
        };
        if let Some((var, spec)) = cuda_spec {
            let (archs, bad) = parse_list(&spec, CudaArch::parse);
            if !bad.is_empty() {
                env.warning(&format!("k3-build-support: {var}: ignoring {bad:?} (expected e.g. 90a,100a,103a)"));
            }
            cfg.cuda_archs = archs;
        }
        if let Some(spec) = env.var("K3_HIP_ARCHS") {
            let (archs, bad) = parse_list(&spec, HipArch::parse);
            if !bad.is_empty() {
                env.warning(&format!("k3-build-support: K3_HIP_ARCHS: ignoring {bad:?} (expected e.g. gfx942,gfx950)"));
            }
            cfg.hip_archs = archs;
        }
        if let Some(dir) = env.path("K3_KERNEL_CACHE_DIR") {
            cfg.cache_dir = dir;
        }
        let jobs_var = env.var("K3_KERNEL_JOBS");
        match jobs_var.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => cfg.jobs = n,
            Some(_) => env.warning(&format!(
                "k3-build-support: K3_KERNEL_JOBS={:?} is not a positive integer; using {}",
                jobs_var.unwrap_or_default(),
                cfg.jobs
            )),
            None => cfg.jobs = default_jobs(std::env::var("NUM_JOBS").ok().and_then(|n| n.parse().ok())),
        }
        cfg.nvcc_flags = split_flags(env.var("K3_NVCC_FLAGS"));
        cfg.hip_flags = split_flags(env.var("K3_HIP_FLAGS"));
        cfg
    }

    /// [`Config::from_env`] for a build script: `out_dir` is cargo's `OUT_DIR` (falling back to
    /// the system temporary directory if a caller runs it outside cargo).
    pub fn for_build_script(env: &BuildEnv, sources: Vec<PathBuf>, include_dirs: Vec<PathBuf>) -> Self {
        let out_dir = std::env::var_os("OUT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("k3-build-support"));
        Config::from_env(env, sources, include_dirs, out_dir)
    }

    /// The source's name relative to the include directory that holds it (`tests/gemm_mma.cu`),
    /// else its file name: used in artifact names, warnings and embedded tables.
    pub fn source_name(&self, source: &std::path::Path) -> String {
        for d in &self.include_dirs {
            if let Ok(rel) = source.strip_prefix(d) {
                return rel.to_string_lossy().replace('\\', "/");
            }
        }
        source.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| source.display().to_string())
    }
}

fn split_flags(v: Option<String>) -> Vec<String> {
    v.map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

/// min(cargo's `NUM_JOBS` if given, available cores, [`DEFAULT_MAX_JOBS`]), at least 1.
pub fn default_jobs(num_jobs: Option<usize>) -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    num_jobs.unwrap_or(cores).min(cores).clamp(1, DEFAULT_MAX_JOBS)
}
