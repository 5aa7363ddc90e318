//! `k3-kernel-report`: the per-kernel resource report of every `K3_EXPORT`ed kernel of
//! `kernels/csrc/ops` on all five targets (sm_90a, sm_100a, sm_103a, gfx942, gfx950), read from
//! the compiled images, with the occupancy of every launch the ops make at K3 shapes.
//!
//! ```text
//! k3-kernel-report            print the Markdown table
//! k3-kernel-report --write    write benches/kernel-resources.md and .json
//! k3-kernel-report --check    fail when the committed files differ from a fresh report (CI)
//!                  [--gates FILE]   gate file (default benches/kernel-gates.txt), checked in every mode
//! ```
//!
//! Compiles go through k3-build-support and its content-hash cache: `K3_KERNEL_CACHE_DIR` when
//! set (CI sets it, so the build scripts' and the device-compile test's images are reused), else
//! the device-compile test's cache under the target directory. Needs the device toolchains
//! (nvcc with cuobjdump and nvdisasm, clang-19 with llvm-objdump-19 and llvm-readelf-19, zig);
//! a missing one is an error naming what was not found.

mod cases;
mod render;

use k3_build_support::resources::collect::read_targets;
use k3_build_support::resources::gate;
use k3_build_support::resources::occupancy::TARGETS;
use k3_build_support::sources::{export_present, kernel_exports};
use k3_build_support::{kernel_sources, BuildEnv, Config, CudaArch, HipArch};
use render::{TargetReport, COMMAND};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Print,
    Write,
    Check,
}

const USAGE: &str = "usage: k3-kernel-report [--write | --check] [--gates FILE]";

fn main() {
    if let Err(e) = run() {
        eprintln!("k3-kernel-report: {e}");
        std::process::exit(1);
    }
}

fn parse_args() -> Result<(Mode, PathBuf), String> {
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut mode, mut gates) = (Mode::Print, bench_dir.join("kernel-gates.txt"));
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--write" => mode = Mode::Write,
            "--check" => mode = Mode::Check,
            "--gates" => gates = PathBuf::from(it.next().ok_or(format!("--gates needs a file\n{USAGE}"))?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok((mode, gates))
}

/// The target directory this binary was built into (`<target>/debug/k3-kernel-report`).
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir)
}

fn config(env: &BuildEnv, sources: Vec<PathBuf>, csrc: &Path) -> Config {
    let target = target_dir();
    let mut cfg = Config::from_env(env, sources, vec![csrc.to_path_buf()], target.join("k3-kernel-report"));
    if env.var_os("K3_KERNEL_CACHE_DIR").is_none() {
        cfg.cache_dir = target.join("tmp/device_compile/cache");
    }
    cfg.cuda_archs = TARGETS.iter().filter_map(|t| CudaArch::parse(t.target)).collect();
    cfg.hip_archs = TARGETS.iter().filter_map(|t| HipArch::parse(t.target)).collect();
    cfg
}

fn run() -> Result<(), String> {
    let (mode, gates_file) = parse_args()?;
    let start = Instant::now();
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csrc = Path::new(k3_kernels::CSRC_DIR).canonicalize().map_err(|e| format!("{}: {e}", k3_kernels::CSRC_DIR))?;
    let sources: Vec<PathBuf> = kernel_sources(&csrc)?.into_iter().filter(|s| s.starts_with(csrc.join("ops"))).collect();
    let env = BuildEnv::process_quiet();
    let cfg = config(&env, sources.clone(), &csrc);
    let mut read = read_targets(&env, &cfg);

    let mut problems = Vec::new();
    let mut reports = Vec::new();
    for limits in &TARGETS {
        let Some(i) = read.iter().position(|r| r.target == limits.target) else {
            problems.push(format!("{}: not compiled", limits.target));
            continue;
        };
        let r = read.remove(i);
        let kernels = match &r.kernels {
            Ok(k) => k.clone(),
            Err(e) => {
                problems.push(format!("{}: {e}", limits.target));
                continue;
            }
        };
        for src in &sources {
            let text = std::fs::read_to_string(src).map_err(|e| format!("{}: {e}", src.display()))?;
            for e in kernel_exports(&text).iter().filter(|e| export_present(e, limits.warp_size == 64)) {
                if !kernels.iter().any(|k| k.kernel == e.name) {
                    problems.push(format!("{}: {} exports {} but the image has no such kernel", limits.target, cfg.source_name(src), e.name));
                }
            }
        }
        let cases = cases::all(limits).map_err(|e| format!("recording the K3 launches: {e}"))?;
        for c in &cases {
            for l in &c.launches {
                if !kernels.iter().any(|k| k.kernel == l.kernel) {
                    problems.push(format!("{}: {} {} launches {}, which no image has", limits.target, c.op, c.shape, l.kernel));
                }
            }
        }
        reports.push(TargetReport { limits, read: r, kernels, cases });
    }
    if !problems.is_empty() {
        return Err(format!("cannot report:\n{}", problems.join("\n")));
    }

    let md = render::markdown(&reports);
    let json = render::json(&reports);
    let (md_path, json_path) = (bench_dir.join("kernel-resources.md"), bench_dir.join("kernel-resources.json"));
    match mode {
        Mode::Print => print!("{md}"),
        Mode::Write => {
            for (p, text) in [(&md_path, &md), (&json_path, &json)] {
                std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
            }
            eprintln!("k3-kernel-report: wrote {} and {}", md_path.display(), json_path.display());
        }
        Mode::Check => {
            let mut stale = Vec::new();
            for (p, text) in [(&md_path, &md), (&json_path, &json)] {
                let old = std::fs::read_to_string(p).unwrap_or_default();
                if old != *text {
                    let line = old.lines().zip(text.lines()).position(|(a, b)| a != b).unwrap_or(old.lines().count().min(text.lines().count()));
                    stale.push(format!("{} differs from a fresh report from line {}", p.display(), line + 1));
                }
            }
            if !stale.is_empty() {
                return Err(format!(
                    "the committed kernel resource report is stale:\n{}\nrefresh it with `{COMMAND}` and commit benches/kernel-resources.md and .json",
                    stale.join("\n")
                ));
            }
        }
    }

    let gates_text = std::fs::read_to_string(&gates_file).map_err(|e| format!("{}: {e}", gates_file.display()))?;
    let gates = gate::parse(&gates_text).map_err(|e| format!("{}:\n{e}", gates_file.display()))?;
    let all: Vec<_> = reports.iter().flat_map(|r| r.kernels.iter().cloned()).collect();
    let failures = gate::check(&gates, &all);
    let launches: usize = reports.iter().map(|r| r.cases.iter().map(|c| c.launches.len()).sum::<usize>()).sum();
    eprintln!(
        "k3-kernel-report: {} kernel images on {} targets, {launches} launches, {} gates, {:.1} s",
        all.len(),
        reports.len(),
        gates.len(),
        start.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        return Err(format!("{} gate(s) of {} failed:\n{}", failures.len(), gates_file.display(), failures.join("\n")));
    }
    Ok(())
}
