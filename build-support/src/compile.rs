//! Ahead-of-time device compiles with a content-hash cache and a cap on parallel jobs.
//!
//! Each (source, target) pair is one job and one output file named by a 128-bit hash of: the
//! compiler's path and version, the target, every flag except paths, the source's name and
//! bytes, and the names and bytes of every header under the include directories. A hit costs
//! one `stat`; a miss compiles into a temporary file that is renamed into place only on
//! success, so an interrupted build never leaves a truncated image in the cache.

use crate::arch::{CudaArch, HipArch};
use crate::config::Config;
use crate::env::BuildEnv;
use crate::hash::KeyHasher;
use crate::sources::{dirs_under, headers};
use crate::toolchain::{find_hip_clang, find_nvcc, HipClang, NotFound, Nvcc};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Bumped whenever the command lines or the cache layout change meaning.
const CACHE_FORMAT: &str = "k3-build-support cache v1";

/// The kind of file an [`Artifact`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArtifactKind {
    /// An NVIDIA ELF for one `sm_XX` (load with `cuModuleLoadData`).
    Cubin,
    /// Several cubins of one source bundled by `fatbinary` (the driver picks the device's).
    Fatbin,
    /// An AMD HSA code object (ELF, code object v5) for one processor (`hipModuleLoadData`).
    CodeObject,
    /// AMDGPU assembly text (`clang -S`), for inspection only.
    Assembly,
}

impl ArtifactKind {
    fn ext(self) -> &'static str {
        match self {
            ArtifactKind::Cubin => "cubin",
            ArtifactKind::Fatbin => "fatbin",
            ArtifactKind::CodeObject => "hsaco",
            ArtifactKind::Assembly => "s",
        }
    }
}

/// One compiled output file.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// The translation unit.
    pub source: PathBuf,
    /// Its name relative to its include directory (`tests/gemm_mma.cu`).
    pub name: String,
    /// `sm_90a`, `gfx942`, or for a fatbin the comma-joined list of its cubins' targets.
    pub target: String,
    pub kind: ArtifactKind,
    /// The file (inside the cache directory).
    pub path: PathBuf,
    /// True when it came from the cache without running the compiler.
    pub cached: bool,
    /// Wall time of the compile (0 when cached).
    pub seconds: f64,
}

/// A compile that failed, with the command line and the compiler's output.
#[derive(Clone, Debug)]
pub struct Failure {
    pub name: String,
    pub target: String,
    pub command: String,
    pub output: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} for {} failed: {}\n  command: {}", self.name, self.target, self.output.trim_end(), self.command)
    }
}

/// Why a target has no images. Build scripts embed this as "unavailable" with the reason.
#[derive(Clone, Debug)]
pub enum Skip {
    /// Device compiles are switched off (`DOCS_RS`, `K3_SKIP_DEVICE_COMPILE`).
    Disabled(String),
    /// The compiler for this target was not found.
    NoToolchain(NotFound),
    /// At least one source failed (every failure listed).
    Failed(Vec<Failure>),
    /// The cache directory or a source could not be read or written.
    Io(String),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Disabled(why) => write!(f, "device compile disabled: {why}"),
            Skip::NoToolchain(nf) => write!(f, "{nf}"),
            Skip::Failed(fs) => {
                write!(f, "{} compile(s) failed", fs.len())?;
                for fail in fs {
                    write!(f, "\n{fail}")?;
                }
                Ok(())
            }
            Skip::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Which vendor a target belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    Cuda,
    Hip,
}

/// The result for one target: every source's image, or why there are none.
#[derive(Clone, Debug)]
pub struct ArchOutcome {
    pub platform: Platform,
    /// `sm_90a`, `gfx950`.
    pub target: String,
    /// Compiler used (`nvcc release 13.5, V13.5.37 via CUDA_HOME=...`), when one was found.
    pub compiler: Option<String>,
    pub result: Result<Vec<Artifact>, Skip>,
}

/// A compile job before it runs.
struct Job<'a> {
    compiler: Compiler<'a>,
    source: PathBuf,
    name: String,
    target: String,
    kind: ArtifactKind,
    /// Every argument except the output path, which goes last after `-o`.
    args: Vec<OsString>,
    final_path: PathBuf,
}

#[derive(Clone, Copy)]
enum Compiler<'a> {
    Nvcc(&'a Nvcc),
    Clang(&'a HipClang),
}

impl Compiler<'_> {
    fn command(&self) -> Command {
        match self {
            Compiler::Nvcc(n) => Command::new(&n.nvcc),
            Compiler::Clang(c) => c.command(),
        }
    }
    fn identity(&self) -> String {
        match self {
            Compiler::Nvcc(n) => n.identity(),
            Compiler::Clang(c) => c.identity(),
        }
    }
}

/// The inputs shared by every job of one call: header digest and the include/define flags.
struct Inputs {
    headers_digest: String,
}

/// Hashes every header once and emits `rerun-if-changed` for sources, headers and directories.
fn prepare(env: &BuildEnv, cfg: &Config) -> Result<Inputs, String> {
    let hdrs = headers(&cfg.include_dirs)?;
    let mut h = KeyHasher::default();
    for p in &hdrs {
        let bytes = std::fs::read(p).map_err(|e| format!("cannot read header {}: {e}", p.display()))?;
        h.str(&cfg.source_name(p)).field(&bytes);
    }
    for d in &cfg.include_dirs {
        for dir in dirs_under(d) {
            env.rerun_if_changed(&dir);
        }
    }
    for p in hdrs.iter().chain(&cfg.sources) {
        env.rerun_if_changed(p);
    }
    Ok(Inputs { headers_digest: h.hex() })
}

fn define_and_include_args(cfg: &Config, args: &mut Vec<OsString>) {
    for d in &cfg.defines {
        args.push(format!("-D{d}").into());
    }
    for i in &cfg.include_dirs {
        let mut a = OsString::from("-I");
        a.push(i.as_os_str());
        args.push(a);
    }
}

/// File stem for a source: its name with separators flattened (`tests_gemm_mma`).
fn stem(name: &str) -> String {
    let base = name.strip_suffix(".cu").unwrap_or(name);
    base.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// Builds one job; `flags` are the target flags that go into the key (no paths).
fn make_job<'a>(
    cfg: &Config,
    inputs: &Inputs,
    compiler: Compiler<'a>,
    source: &Path,
    target: &str,
    kind: ArtifactKind,
    flags: &[String],
    extra: &[String],
) -> Result<Job<'a>, String> {
    let name = cfg.source_name(source);
    let bytes = std::fs::read(source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
    let mut key = KeyHasher::default();
    key.str(CACHE_FORMAT).str(&compiler.identity()).str(target).str(kind.ext());
    for f in flags.iter().chain(extra).chain(&cfg.defines) {
        key.str(f);
    }
    key.str(&name).field(&bytes).str(&inputs.headers_digest);
    let file_target = target.replace(':', "_");
    let final_path = cfg.cache_dir.join(&file_target).join(format!("{}-{}.{}", stem(&name), key.hex(), kind.ext()));
    let mut args: Vec<OsString> = flags.iter().map(OsString::from).collect();
    define_and_include_args(cfg, &mut args);
    args.extend(extra.iter().map(OsString::from));
    args.push(source.as_os_str().to_owned());
    Ok(Job { compiler, source: source.to_path_buf(), name, target: target.to_string(), kind, args, final_path })
}

fn nvcc_flags(arch: &CudaArch) -> Vec<String> {
    vec![
        "-cubin".into(),
        "-std=c++17".into(),
        "-O3".into(),
        // Source lines for profilers (Nsight Compute); no effect on the generated code.
        "-lineinfo".into(),
        "-gencode".into(),
        format!("arch={},code={}", arch.compute(), arch.sm()),
    ]
}

/// clang flags for a device-only HIP compile against the dialect's shim (no HIP headers, no
/// ROCm device libraries): the minimal recipe of shared/reference/toolchains.md.
fn hip_flags(arch: &HipArch, assembly: bool) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "-x".into(),
        "hip".into(),
        "-std=c++17".into(),
        format!("--offload-arch={arch}"),
        "--cuda-device-only".into(),
        "--no-gpu-bundle-output".into(),
        "-nogpulib".into(),
        "-nogpuinc".into(),
        "-O3".into(),
        // clang 22 defaults to v6; v5 is what clang 19 and ROCm 6 loaders expect.
        "-mcode-object-version=5".into(),
    ];
    if assembly {
        f.push("-S".into());
    }
    f
}

/// Runs (or takes from the cache) one job.
fn run_job(env: &BuildEnv, job: &Job<'_>) -> Result<Artifact, Failure> {
    let artifact = |cached, seconds| Artifact {
        source: job.source.clone(),
        name: job.name.clone(),
        target: job.target.clone(),
        kind: job.kind,
        path: job.final_path.clone(),
        cached,
        seconds,
    };
    if job.final_path.is_file() {
        return Ok(artifact(true, 0.0));
    }
    let fail = |command: String, output: String| Failure {
        name: job.name.clone(),
        target: job.target.clone(),
        command,
        output,
    };
    let dir = job.final_path.parent().unwrap_or(Path::new("."));
    if let Err(e) = std::fs::create_dir_all(dir) {
        return Err(fail(String::new(), format!("cannot create cache directory {}: {e}", dir.display())));
    }
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let tmp = job.final_path.with_extension(format!(
        "tmp{}-{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        job.kind.ext()
    ));
    let mut cmd = job.compiler.command();
    cmd.args(&job.args).arg("-o").arg(&tmp);
    let shown = format!("{cmd:?}");
    let start = Instant::now();
    let out = cmd.output();
    let seconds = start.elapsed().as_secs_f64();
    let out = match out {
        Ok(o) => o,
        Err(e) => return Err(fail(shown, format!("cannot run the compiler: {e}"))),
    };
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let text = cap_lines(&text, 40);
    if !out.status.success() || !tmp.is_file() {
        let _ = std::fs::remove_file(&tmp);
        let why = if out.status.success() {
            "the compiler wrote no output file".to_string()
        } else {
            format!("{}", out.status)
        };
        return Err(fail(shown, format!("{why}\n{text}")));
    }
    if let Err(e) = std::fs::rename(&tmp, &job.final_path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(shown, format!("cannot move the output into the cache: {e}")));
    }
    if !text.trim().is_empty() {
        env.warning(&format!(
            "k3-build-support: {} for {}: compiler output:\n{}",
            job.name,
            job.target,
            cap_lines(&text, 10)
        ));
    }
    env.note(&format!("{} for {} compiled in {seconds:.2} s", job.name, job.target));
    Ok(artifact(false, seconds))
}

fn cap_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= n {
        return text.trim_end().to_string();
    }
    format!("{}\n... ({} more lines)", lines[..n].join("\n"), lines.len() - n)
}

/// Runs the jobs on at most `jobs` threads (the calling thread is one of them); results in
/// job order.
fn run_all(env: &BuildEnv, jobs: &[Job<'_>], max_jobs: usize) -> Vec<Result<Artifact, Failure>> {
    crate::par::map(jobs, max_jobs, "k3-device-compile", |job| run_job(env, job))
        .into_iter()
        .zip(jobs)
        .map(|(r, job)| {
            r.unwrap_or_else(|| {
                Err(Failure {
                    name: job.name.clone(),
                    target: job.target.clone(),
                    command: String::new(),
                    output: "the compile job did not run".into(),
                })
            })
        })
        .collect()
}

/// Groups job results per target, in the order of `targets`.
fn group(
    platform: Platform,
    targets: &[(String, Option<String>)],
    jobs: &[Job<'_>],
    results: Vec<Result<Artifact, Failure>>,
) -> Vec<ArchOutcome> {
    let mut per: Vec<(Vec<Artifact>, Vec<Failure>)> = targets.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for (job, r) in jobs.iter().zip(results) {
        let Some(idx) = targets.iter().position(|(t, _)| *t == job.target) else { continue };
        match r {
            Ok(a) => per[idx].0.push(a),
            Err(f) => per[idx].1.push(f),
        }
    }
    targets
        .iter()
        .zip(per)
        .map(|((target, compiler), (arts, fails))| ArchOutcome {
            platform,
            target: target.clone(),
            compiler: compiler.clone(),
            result: if fails.is_empty() { Ok(arts) } else { Err(Skip::Failed(fails)) },
        })
        .collect()
}

fn skipped(platform: Platform, target: String, compiler: Option<String>, skip: Skip) -> ArchOutcome {
    ArchOutcome { platform, target, compiler, result: Err(skip) }
}

/// Warns (one `cargo::warning` block per target) about every target without images.
fn warn_skips(env: &BuildEnv, outcomes: &[ArchOutcome]) {
    for o in outcomes {
        if let Err(skip) = &o.result {
            let what = match o.platform {
                Platform::Cuda => "CUDA",
                Platform::Hip => "HIP",
            };
            env.warning(&format!("k3-build-support: {what} kernels for {} unavailable: {skip}", o.target));
        }
    }
}

/// Compiles every source for every `cfg.cuda_archs` entry into cubins with nvcc found by
/// [`find_nvcc`]. Never panics: a missing nvcc, a disabled build or a failed compile gives the
/// affected targets an `Err(Skip)` and a `cargo::warning`.
pub fn compile_cuda(env: &BuildEnv, cfg: &Config) -> Vec<ArchOutcome> {
    let targets: Vec<String> = cfg.cuda_archs.iter().map(CudaArch::sm).collect();
    if let Some(why) = &cfg.disabled {
        return targets.into_iter().map(|t| skipped(Platform::Cuda, t, None, Skip::Disabled(why.clone()))).collect();
    }
    if targets.is_empty() {
        return Vec::new();
    }
    let outcomes = match find_nvcc(env) {
        Ok(nvcc) => compile_cuda_with(env, cfg, &nvcc),
        Err(nf) => {
            targets.into_iter().map(|t| skipped(Platform::Cuda, t, None, Skip::NoToolchain(nf.clone()))).collect()
        }
    };
    warn_skips(env, &outcomes);
    outcomes
}

/// [`compile_cuda`] with a given nvcc (no discovery, no warnings).
pub fn compile_cuda_with(env: &BuildEnv, cfg: &Config, nvcc: &Nvcc) -> Vec<ArchOutcome> {
    let compiler_desc = Some(format!("nvcc {} via {}", nvcc.version, nvcc.found_via));
    let targets: Vec<(String, Option<String>)> =
        cfg.cuda_archs.iter().map(|a| (a.sm(), compiler_desc.clone())).collect();
    let inputs = match prepare(env, cfg) {
        Ok(i) => i,
        Err(e) => {
            return targets.into_iter().map(|(t, c)| skipped(Platform::Cuda, t, c, Skip::Io(e.clone()))).collect()
        }
    };
    let mut extra = cfg.nvcc_flags.clone();
    if let Some(cc) = &nvcc.ccbin {
        extra.splice(0..0, ["-ccbin".to_string(), cc.to_string_lossy().into_owned()]);
    }
    let mut jobs = Vec::new();
    let mut io_errors: Vec<(String, String)> = Vec::new();
    for arch in &cfg.cuda_archs {
        for src in &cfg.sources {
            match make_job(
                cfg,
                &inputs,
                Compiler::Nvcc(nvcc),
                src,
                &arch.sm(),
                ArtifactKind::Cubin,
                &nvcc_flags(arch),
                &extra,
            ) {
                Ok(j) => jobs.push(j),
                Err(e) => io_errors.push((arch.sm(), e)),
            }
        }
    }
    let results = run_all(env, &jobs, cfg.jobs);
    with_io_errors(group(Platform::Cuda, &targets, &jobs, results), io_errors)
}

fn with_io_errors(mut outcomes: Vec<ArchOutcome>, io_errors: Vec<(String, String)>) -> Vec<ArchOutcome> {
    for (target, e) in io_errors {
        if let Some(o) = outcomes.iter_mut().find(|o| o.target == target) {
            o.result = Err(Skip::Io(e));
        }
    }
    outcomes
}

/// Compiles every source for every `cfg.hip_archs` entry into HSA code objects, each with the
/// clang that [`find_hip_clang`] picks for that processor (clang-19 for gfx942, a clang >= 20
/// or `zig clang` for gfx950). Never panics; targets without a compiler or with a failed
/// compile get an `Err(Skip)` and a `cargo::warning`, the others still build.
pub fn compile_hip(env: &BuildEnv, cfg: &Config) -> Vec<ArchOutcome> {
    compile_hip_kind(env, cfg, ArtifactKind::CodeObject)
}

/// Like [`compile_hip`] but produces AMDGPU assembly (`clang -S`) instead of code objects:
/// for inspecting processors that no installed `llvm-objdump` can disassemble (gfx950 with
/// LLVM 19). Cached like code objects.
pub fn compile_hip_assembly(env: &BuildEnv, cfg: &Config) -> Vec<ArchOutcome> {
    compile_hip_kind(env, cfg, ArtifactKind::Assembly)
}

fn compile_hip_kind(env: &BuildEnv, cfg: &Config, kind: ArtifactKind) -> Vec<ArchOutcome> {
    if let Some(why) = &cfg.disabled {
        return cfg
            .hip_archs
            .iter()
            .map(|a| skipped(Platform::Hip, a.to_string(), None, Skip::Disabled(why.clone())))
            .collect();
    }
    if cfg.hip_archs.is_empty() {
        return Vec::new();
    }
    let wrapper_dir = cfg.out_dir.join("k3-zig-lld");
    let found: Vec<(HipArch, Result<HipClang, NotFound>)> =
        cfg.hip_archs.iter().map(|a| (a.clone(), find_hip_clang(env, a, &wrapper_dir))).collect();
    let targets: Vec<(String, Option<String>)> = found
        .iter()
        .map(|(a, c)| {
            (a.to_string(), c.as_ref().ok().map(|c| format!("{} ({}) via {}", c.kind_name(), c.version, c.found_via)))
        })
        .collect();
    let inputs = match prepare(env, cfg) {
        Ok(i) => i,
        Err(e) => {
            let out: Vec<ArchOutcome> =
                targets.into_iter().map(|(t, c)| skipped(Platform::Hip, t, c, Skip::Io(e.clone()))).collect();
            warn_skips(env, &out);
            return out;
        }
    };
    let mut jobs = Vec::new();
    let mut io_errors = Vec::new();
    for (arch, clang) in &found {
        let Ok(clang) = clang else { continue };
        for src in &cfg.sources {
            let flags = hip_flags(arch, kind == ArtifactKind::Assembly);
            match make_job(cfg, &inputs, Compiler::Clang(clang), src, arch.as_str(), kind, &flags, &cfg.hip_flags) {
                Ok(j) => jobs.push(j),
                Err(e) => io_errors.push((arch.to_string(), e)),
            }
        }
    }
    let results = run_all(env, &jobs, cfg.jobs);
    let mut outcomes = with_io_errors(group(Platform::Hip, &targets, &jobs, results), io_errors);
    for (o, (_, clang)) in outcomes.iter_mut().zip(&found) {
        if let Err(nf) = clang {
            o.result = Err(Skip::NoToolchain(nf.clone()));
        }
    }
    warn_skips(env, &outcomes);
    outcomes
}

/// Bundles, per source, the cubins of every successful CUDA target into one fatbin with
/// `fatbinary` (next to nvcc). Sources are taken from the first successful target; a source
/// missing from any successful target is an error for that source.
pub fn bundle_fatbins(env: &BuildEnv, cfg: &Config, nvcc: &Nvcc, cuda: &[ArchOutcome]) -> Result<Vec<Artifact>, Skip> {
    let ok: Vec<&Vec<Artifact>> = cuda.iter().filter_map(|o| o.result.as_ref().ok()).collect();
    let Some(first) = ok.first() else {
        return Err(Skip::Io("no CUDA target compiled, nothing to bundle".into()));
    };
    let Some(fatbinary) = nvcc.sibling(env, "fatbinary") else {
        return Err(Skip::NoToolchain(NotFound {
            tool: "fatbinary".into(),
            tried: vec![format!("not next to {} nor on PATH", nvcc.nvcc.display())],
        }));
    };
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for art in first.iter() {
        let mut parts = Vec::new();
        for arts in &ok {
            match arts.iter().find(|a| a.name == art.name && a.kind == ArtifactKind::Cubin) {
                Some(a) => parts.push(a),
                None => failures.push(Failure {
                    name: art.name.clone(),
                    target: "fatbin".into(),
                    command: String::new(),
                    output: "missing from one of the compiled targets".into(),
                }),
            }
        }
        let mut key = KeyHasher::default();
        key.str(CACHE_FORMAT).str("fatbin");
        for p in &parts {
            key.str(&p.path.to_string_lossy());
        }
        let target = parts.iter().map(|p| p.target.as_str()).collect::<Vec<_>>().join(",");
        let path = cfg.cache_dir.join("fatbin").join(format!("{}-{}.fatbin", stem(&art.name), key.hex()));
        let artifact = |cached, seconds| Artifact {
            source: art.source.clone(),
            name: art.name.clone(),
            target: target.clone(),
            kind: ArtifactKind::Fatbin,
            path: path.clone(),
            cached,
            seconds,
        };
        if path.is_file() {
            out.push(artifact(true, 0.0));
            continue;
        }
        let mut cmd = Command::new(&fatbinary);
        let tmp = path.with_extension(format!("tmp{}.fatbin", std::process::id()));
        let mut create = OsString::from("--create=");
        create.push(tmp.as_os_str());
        cmd.arg(create);
        for p in &parts {
            let mut image =
                OsString::from(format!("--image3=kind=elf,sm={},file=", p.target.trim_start_matches("sm_")));
            image.push(p.path.as_os_str());
            cmd.arg(image);
        }
        let shown = format!("{cmd:?}");
        let start = Instant::now();
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match cmd.output() {
            Ok(o) if o.status.success() && tmp.is_file() && std::fs::rename(&tmp, &path).is_ok() => {
                out.push(artifact(false, start.elapsed().as_secs_f64()))
            }
            Ok(o) => {
                let _ = std::fs::remove_file(&tmp);
                failures.push(Failure {
                    name: art.name.clone(),
                    target: target.clone(),
                    command: shown,
                    output: format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr)),
                })
            }
            Err(e) => failures.push(Failure {
                name: art.name.clone(),
                target: target.clone(),
                command: shown,
                output: format!("cannot run fatbinary: {e}"),
            }),
        }
    }
    if failures.is_empty() {
        Ok(out)
    } else {
        Err(Skip::Failed(failures))
    }
}
