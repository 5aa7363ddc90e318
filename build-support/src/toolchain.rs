//! Finding the device compilers: nvcc for NVIDIA, a clang with the AMDGPU backend for AMD.
//!
//! Discovery never panics. It returns what was found and from where ([`Nvcc::found_via`],
//! [`HipClang::found_via`]), or a [`NotFound`] listing every place that was tried and why each
//! did not qualify, so a skipped build can say exactly what to install or set.

use crate::arch::HipArch;
use crate::env::{is_executable, BuildEnv};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tool that could not be found, with one entry per place tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotFound {
    /// What was looked for (`nvcc`, `clang for gfx950`).
    pub tool: String,
    /// `where: why not`, in search order.
    pub tried: Vec<String>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not found: {}", self.tool, self.tried.join("; "))
    }
}

impl std::error::Error for NotFound {}

/// Runs `program args` and returns stdout+stderr, or why it could not run / failed.
pub(crate) fn run_capture(cmd: &mut Command) -> Result<String, String> {
    match cmd.output() {
        Ok(out) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if out.status.success() {
                Ok(text)
            } else {
                Err(format!("exited with {}: {}", out.status, first_lines(&text, 3)))
            }
        }
        Err(e) => Err(format!("cannot run: {e}")),
    }
}

pub(crate) fn first_lines(text: &str, n: usize) -> String {
    text.lines().filter(|l| !l.trim().is_empty()).take(n).collect::<Vec<_>>().join(" | ")
}

// ---------------------------------------------------------------------------------------------
// nvcc

/// An nvcc that answered `--version`, with the host compiler it will use.
#[derive(Clone, Debug)]
pub struct Nvcc {
    /// The nvcc executable.
    pub nvcc: PathBuf,
    /// The CUDA root (the directory above `bin/nvcc`).
    pub root: Option<PathBuf>,
    /// Which variable or search found it (`CUDA_HOME=/opt/cuda`, `PATH`).
    pub found_via: String,
    /// `release 13.5, V13.5.37` from `nvcc --version`.
    pub version: String,
    /// `-ccbin` from `NVCC_CCBIN`, if set.
    pub ccbin: Option<PathBuf>,
}

impl Nvcc {
    /// A tool shipped next to nvcc (`cuobjdump`, `nvdisasm`, `fatbinary`), else on `PATH`.
    pub fn sibling(&self, env: &BuildEnv, name: &str) -> Option<PathBuf> {
        let here = self.nvcc.parent().map(|d| d.join(name));
        here.filter(|p| is_executable(p)).or_else(|| env.which(name))
    }

    /// Identity that goes into the cache key.
    pub fn identity(&self) -> String {
        format!("nvcc {} {} ccbin={:?}", self.nvcc.display(), self.version, self.ccbin)
    }
}

/// Finds nvcc: `NVCC` (the executable), then `K3_CUDA_HOME`, `CUDA_HOME`, `CUDA_PATH`,
/// `CUDA_ROOT` (a CUDA root with `bin/nvcc`), then `nvcc` on `PATH`. An explicitly set variable
/// that does not lead to a working nvcc is an error, not silently skipped. Also checks what nvcc
/// needs to compile device code: a host C++ compiler (`NVCC_CCBIN` or g++ on `PATH`) and CCCL's
/// `nv/target` header (the `nvidia-cuda-cccl` wheel).
pub fn find_nvcc(env: &BuildEnv) -> Result<Nvcc, NotFound> {
    let mut tried = Vec::new();
    let fail = |tried: Vec<String>| NotFound { tool: "nvcc".into(), tried };
    let mut candidate: Option<(PathBuf, String)> = None;
    if let Some(p) = env.path("NVCC") {
        if !is_executable(&p) {
            tried.push(format!("NVCC={}: not an executable file", p.display()));
            return Err(fail(tried));
        }
        candidate = Some((p.clone(), format!("NVCC={}", p.display())));
    } else {
        tried.push("NVCC unset".into());
    }
    if candidate.is_none() {
        for var in ["K3_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
            let Some(root) = env.path(var) else {
                tried.push(format!("{var} unset"));
                continue;
            };
            let p = root.join("bin").join(exe("nvcc"));
            if !is_executable(&p) {
                tried.push(format!("{var}={}: {} does not exist", root.display(), p.display()));
                return Err(fail(tried));
            }
            candidate = Some((p, format!("{var}={}", root.display())));
            break;
        }
    }
    if candidate.is_none() {
        match env.which(&exe("nvcc")) {
            Some(p) => candidate = Some((p, "PATH".into())),
            None => {
                tried.push("no nvcc on PATH".into());
                return Err(fail(tried));
            }
        }
    }
    let Some((nvcc, found_via)) = candidate else { return Err(fail(tried)) };
    let version = match run_capture(Command::new(&nvcc).arg("--version")) {
        Ok(text) => text
            .lines()
            .find_map(|l| l.split_once("Cuda compilation tools, ").map(|(_, v)| v.trim().to_string()))
            .unwrap_or_else(|| first_lines(&text, 1)),
        Err(e) => {
            tried.push(format!("{found_via}: {} --version {e}", nvcc.display()));
            return Err(fail(tried));
        }
    };
    let root = nvcc.parent().and_then(Path::parent).map(Path::to_path_buf);
    let ccbin = env.path("NVCC_CCBIN");
    match &ccbin {
        Some(c) if !is_executable(c) && env.which(&c.to_string_lossy()).is_none() => {
            tried.push(format!("{found_via}: NVCC_CCBIN={} is not an executable", c.display()));
            return Err(fail(tried));
        }
        Some(_) => {}
        None => {
            if env.which("g++").is_none() && env.which("c++").is_none() {
                tried.push(format!(
                    "{found_via}: nvcc found but it needs a host C++ compiler: put g++ on PATH or set NVCC_CCBIN"
                ));
                return Err(fail(tried));
            }
        }
    }
    if let Some(r) = &root {
        let inc = r.join("include");
        let has_headers = inc.join("cuda_runtime.h").is_file();
        let has_cccl = inc.join("nv").join("target").is_file() || inc.join("cccl").join("nv").join("target").is_file();
        if has_headers && !has_cccl {
            tried.push(format!(
                "{found_via}: {} has no nv/target header (cuda_fp16.h needs it): install the nvidia-cuda-cccl wheel next to nvidia-cuda-nvcc",
                inc.display()
            ));
            return Err(fail(tried));
        }
    }
    Ok(Nvcc { nvcc, root, found_via, version, ccbin })
}

fn exe(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

// ---------------------------------------------------------------------------------------------
// clang for AMDGPU

/// How a clang is invoked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClangKind {
    /// A clang executable (`clang-19`, `clang`).
    Native,
    /// `zig clang` from the ziglang wheel; its AMDGPU link step runs `lld -flavor gnu`, which
    /// `lld_dir/lld` (a generated wrapper around `zig ld.lld`) answers.
    Zig { lld_dir: PathBuf },
}

/// A clang that accepts `-x hip` device compiles for a given processor.
#[derive(Clone, Debug)]
pub struct HipClang {
    /// The executable (the clang, or the zig binary).
    pub program: PathBuf,
    pub kind: ClangKind,
    /// Which variable or search found it (`K3_HIP_CLANG=...`, `PATH (clang-19)`, `K3_ZIG=...`).
    pub found_via: String,
    /// First line of `--version` (`Debian clang version 19.1.7 (3~deb12u1)`).
    pub version: String,
    /// LLVM major version (19, 22).
    pub major: u32,
    /// `PATH` to run it with (the lld wrapper first for zig).
    path_env: Option<std::ffi::OsString>,
}

impl HipClang {
    /// A `Command` for the compiler driver, ready for clang arguments.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        if self.kind != ClangKind::Native {
            cmd.arg("clang");
        }
        if let Some(p) = &self.path_env {
            cmd.env("PATH", p);
        }
        cmd
    }

    /// Identity that goes into the cache key.
    pub fn identity(&self) -> String {
        format!("clang {} {} {}", self.program.display(), self.kind_name(), self.version)
    }

    /// `clang` or `zig clang`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ClangKind::Native => "clang",
            ClangKind::Zig { .. } => "zig clang",
        }
    }
}

/// Finds a clang whose AMDGPU backend knows `arch`, in this order:
/// 1. for gfx950 only: `K3_HIP_CLANG_GFX950` (explicit; an error if unusable);
/// 2. `K3_HIP_CLANG` (explicit; an error if unusable, except that a too-old one is passed over
///    for processors newer than it, e.g. clang-19 for gfx950);
/// 3. on `PATH`: `clang-19`, `clang`, `clang-22`, `clang-21`, `clang-20` (the first new enough);
/// 4. `zig clang` of the ziglang wheel (clang 22): `K3_ZIG` (the zig executable or a directory
///    holding `zig` or `ziglang/zig`), else `zig` on `PATH`. Its `lld` wrapper is generated
///    into `wrapper_dir`.
pub fn find_hip_clang(env: &BuildEnv, arch: &HipArch, wrapper_dir: &Path) -> Result<HipClang, NotFound> {
    let need = arch.min_llvm_major();
    let tool = format!(
        "clang with AMDGPU support for {arch}{}",
        if need > 0 { format!(" (LLVM >= {need})") } else { String::new() }
    );
    let mut tried = Vec::new();
    let fail = |tried: Vec<String>| NotFound { tool: tool.clone(), tried };

    let mut explicit_vars = Vec::new();
    if arch.processor() == "gfx950" {
        explicit_vars.push("K3_HIP_CLANG_GFX950");
    }
    explicit_vars.push("K3_HIP_CLANG");
    for var in explicit_vars {
        let Some(p) = env.path(var) else {
            tried.push(format!("{var} unset"));
            continue;
        };
        let via = format!("{var}={}", p.display());
        let resolved = if is_executable(&p) { Some(p.clone()) } else { env.which(&p.to_string_lossy()) };
        let Some(exe_path) = resolved else {
            tried.push(format!("{via}: not an executable"));
            return Err(fail(tried));
        };
        match probe_clang(&exe_path, ClangKind::Native, None) {
            Ok((version, major)) if major >= need => {
                return Ok(HipClang {
                    program: exe_path,
                    kind: ClangKind::Native,
                    found_via: via,
                    version,
                    major,
                    path_env: None,
                })
            }
            Ok((_, major)) if var == "K3_HIP_CLANG" => tried.push(format!("{via}: LLVM {major} is too old for {arch}")),
            Ok((_, major)) => {
                tried.push(format!("{via}: LLVM {major} is too old for {arch}"));
                return Err(fail(tried));
            }
            Err(e) => {
                tried.push(format!("{via}: {e}"));
                return Err(fail(tried));
            }
        }
    }

    let mut path_hits = 0;
    for name in ["clang-19", "clang", "clang-22", "clang-21", "clang-20"] {
        let Some(p) = env.which(name) else { continue };
        path_hits += 1;
        match probe_clang(&p, ClangKind::Native, None) {
            Ok((version, major)) if major >= need => {
                return Ok(HipClang {
                    program: p,
                    kind: ClangKind::Native,
                    found_via: format!("PATH ({name})"),
                    version,
                    major,
                    path_env: None,
                })
            }
            Ok((_, major)) => tried.push(format!("{} (PATH): LLVM {major} is too old for {arch}", p.display())),
            Err(e) => tried.push(format!("{} (PATH): {e}", p.display())),
        }
    }
    if path_hits == 0 {
        tried.push("no clang-19/clang/clang-20..22 on PATH".into());
    }

    let zig = match env.path("K3_ZIG") {
        Some(p) => {
            let exe_path =
                [p.clone(), p.join("zig"), p.join("ziglang").join("zig")].into_iter().find(|c| is_executable(c));
            match exe_path {
                Some(z) => Some((z, format!("K3_ZIG={}", p.display()))),
                None => {
                    tried.push(format!(
                        "K3_ZIG={}: no zig executable there (nor zig or ziglang/zig below it)",
                        p.display()
                    ));
                    return Err(fail(tried));
                }
            }
        }
        None => {
            tried.push("K3_ZIG unset".into());
            match env.which("zig") {
                Some(z) => Some((z, "PATH (zig)".to_string())),
                None => {
                    tried.push("no zig on PATH (pip install ziglang, then K3_ZIG=<site>/ziglang/zig)".into());
                    None
                }
            }
        }
    };
    if let Some((zig, via)) = zig {
        match zig_lld_wrapper(&zig, wrapper_dir) {
            Ok(lld_dir) => {
                let mut dirs = vec![lld_dir.clone()];
                dirs.extend(env.path_dirs());
                let path_env = std::env::join_paths(dirs).ok();
                let kind = ClangKind::Zig { lld_dir };
                match probe_clang(&zig, kind.clone(), path_env.as_ref()) {
                    Ok((version, major)) if major >= need => {
                        return Ok(HipClang { program: zig, kind, found_via: via, version, major, path_env })
                    }
                    Ok((_, major)) => tried.push(format!("{via}: zig clang is LLVM {major}, too old for {arch}")),
                    Err(e) => tried.push(format!("{via}: zig clang {e}")),
                }
            }
            Err(e) => tried.push(format!("{via}: {e}")),
        }
    }
    Err(fail(tried))
}

/// `--version` (first line and LLVM major) and a check that the AMDGPU backend is built in.
fn probe_clang(
    program: &Path,
    kind: ClangKind,
    path_env: Option<&std::ffi::OsString>,
) -> Result<(String, u32), String> {
    let base = || {
        let mut c = Command::new(program);
        if kind != ClangKind::Native {
            c.arg("clang");
        }
        if let Some(p) = path_env {
            c.env("PATH", p);
        }
        c
    };
    let text = run_capture(base().arg("--version"))?;
    let first = first_lines(&text, 1);
    let major = first
        .split("clang version ")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse::<u32>().ok())
        .ok_or_else(|| format!("unrecognised --version output: {first}"))?;
    let targets = run_capture(base().arg("--print-targets"))?;
    if !targets.lines().any(|l| l.trim_start().starts_with("amdgcn")) {
        return Err(format!("LLVM {major} without the AMDGPU backend (--print-targets lists no amdgcn)"));
    }
    Ok((first, major))
}

/// Writes `dir/lld`, a shell script that drops `-flavor gnu` and runs `zig ld.lld`.
fn zig_lld_wrapper(zig: &Path, dir: &Path) -> Result<PathBuf, String> {
    let zig_str = zig.to_str().ok_or_else(|| format!("zig path {} is not UTF-8", zig.display()))?;
    let quoted = format!("'{}'", zig_str.replace('\'', r"'\''"));
    let script = format!(
        "#!/bin/sh\n# generated by k3-build-support: zig clang links AMDGPU code objects with `lld -flavor gnu`\n\
         [ \"$1\" = \"-flavor\" ] && shift 2\nexec {quoted} ld.lld \"$@\"\n"
    );
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("lld");
    // Rewrite only when different: keeps the mtime stable and avoids racing a running compile.
    if std::fs::read_to_string(&path).ok().as_deref() != Some(script.as_str()) {
        let tmp = dir.join(format!("lld.tmp{}", std::process::id()));
        std::fs::write(&tmp, &script).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("cannot chmod {}: {e}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(dir.to_path_buf())
}
