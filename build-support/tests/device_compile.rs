//! Tier 4 of the verification plan: every kernel source under `kernels/csrc` compiles for
//! sm_90a, sm_100a, sm_103a (nvcc) and gfx942, gfx950 (clang / zig clang) through
//! k3-build-support, and the disassembly has the intended matrix instructions: HMMA in every
//! source that uses `k3::mma::mma_sync` on all three NVIDIA targets, v_mfma on both AMD
//! targets, and neither in the sources that do not (the negative control that shows the check
//! can fail). Every kernel exported outside `#if` blocks must be in every image.
//!
//! Without a toolchain the affected platform is skipped with the exact reason (which tool was
//! not found where) and the test passes; with `K3_REQUIRE_DEVICE_COMPILE=1` (CI) a missing
//! toolchain fails it. A compile error always fails it.
//! Arch lists, cache directory and job count: `tests/common`.

mod common;

use common::{config, csrc, required, CUDA_ARCHS};
use k3_build_support::disasm::{amdgpu_objdump, cuda_sass, find_llvm_objdump, mnemonics_with_prefix};
use k3_build_support::sources::{export_present, kernel_exports, Export};
use k3_build_support::{
    bundle_fatbins, compile_cuda_with, compile_hip, compile_hip_assembly, find_nvcc, kernel_sources, ArchOutcome,
    Artifact, BuildEnv, Config, HipArch, Nvcc, Skip,
};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the test knows about a source from its text.
struct SourceFacts {
    uses_mma: bool,
    exports: Vec<Export>,
}

fn facts(path: &Path) -> SourceFacts {
    let text = std::fs::read_to_string(path).expect("readable source");
    SourceFacts { uses_mma: uses_mma(path, &text, 0), exports: kernel_exports(&text) }
}

/// Whether `text` (the file at `path`) or a local header it includes (`#include "x.cuh"`,
/// resolved next to it, recursively) calls mma_sync.
fn uses_mma(path: &Path, text: &str, depth: usize) -> bool {
    if text.contains("mma_sync(") {
        return true;
    }
    if depth > 8 {
        return false;
    }
    text.lines().filter_map(|l| l.trim().strip_prefix("#include \"")).filter_map(|r| r.split('"').next()).any(|inc| {
        // Dialect headers (k3/...) define mma_sync; they are not uses of it.
        if inc.starts_with("k3/") {
            return false;
        }
        let p = path.parent().map(|d| d.join(inc)).unwrap_or_default();
        std::fs::read_to_string(&p).is_ok_and(|t| uses_mma(&p, &t, depth + 1))
    })
}

/// Kernels that must be in an image of a target of this warp size.
fn expected_kernels(f: &SourceFacts, warp64: bool) -> Vec<String> {
    f.exports.iter().filter(|e| export_present(e, warp64)).map(|e| e.name.clone()).collect()
}

/// Collected problems (a failing test lists them all) and skip notes.
#[derive(Default)]
struct Verdict {
    problems: Vec<String>,
    skipped: Vec<String>,
    /// One line per target that compiled.
    summary: Vec<String>,
}

fn summary(o: &ArchOutcome, arts: &[Artifact]) -> String {
    let compiled: Vec<&Artifact> = arts.iter().filter(|a| !a.cached).collect();
    let secs = compiled.iter().map(|a| a.seconds).fold(0.0, |s, x| s + x);
    let slowest = compiled.iter().map(|a| a.seconds).fold(0.0, f64::max);
    format!(
        "{}: {} sources, {} compiled ({secs:.2} s of compiler time, slowest {slowest:.2} s), {} cached; {}",
        o.target,
        arts.len(),
        compiled.len(),
        arts.len() - compiled.len(),
        o.compiler.as_deref().unwrap_or("?")
    )
}

/// The per-source checks shared by both vendors. `disasm` gives the text for an artifact.
fn check_images(
    v: &mut Verdict,
    target: &str,
    arts: &[Artifact],
    sources: &[PathBuf],
    matrix_prefix: &str,
    warp64: bool,
    kernel_marker: impl Fn(&str) -> String,
    mut disasm: impl FnMut(&Artifact) -> Result<String, String>,
) {
    for src in sources {
        let Some(art) = arts.iter().find(|a| &a.source == src) else {
            v.problems.push(format!("{target}: no image for {}", src.display()));
            continue;
        };
        let f = facts(src);
        let text = match disasm(art) {
            Ok(t) => t,
            Err(e) => {
                v.problems.push(format!("{target} {}: disassembly failed: {e}", art.name));
                continue;
            }
        };
        let found = mnemonics_with_prefix(&text, matrix_prefix);
        if f.uses_mma && found.is_empty() {
            v.problems.push(format!("{target} {}: uses mma_sync but has no {matrix_prefix}* instruction", art.name));
        }
        if !f.uses_mma && !found.is_empty() {
            v.problems.push(format!("{target} {}: has {found:?} without using mma_sync", art.name));
        }
        for k in expected_kernels(&f, warp64) {
            if !text.contains(&kernel_marker(&k)) {
                v.problems.push(format!("{target} {}: kernel {k} missing from the image", art.name));
            }
        }
        if !found.is_empty() {
            println!("    {target} {}: {}", art.name, found.join(" "));
        }
    }
}

fn is_elf(p: &Path) -> bool {
    std::fs::read(p).is_ok_and(|b| b.len() > 64 && b.starts_with(b"\x7fELF"))
}

/// One fatbin per source holding exactly the cubins of every target.
fn check_fatbins(v: &mut Verdict, env: &BuildEnv, cfg: &Config, nvcc: &Nvcc, outcomes: &[ArchOutcome]) {
    let fatbins = match bundle_fatbins(env, cfg, nvcc, outcomes) {
        Ok(f) => f,
        Err(skip) => {
            v.problems.push(format!("fatbin: {skip}"));
            return;
        }
    };
    if fatbins.len() != cfg.sources.len() {
        v.problems.push(format!("fatbin: {} bundles for {} sources", fatbins.len(), cfg.sources.len()));
    }
    let Some(cuobjdump) = nvcc.sibling(env, "cuobjdump") else { return };
    for f in &fatbins {
        let listing = std::process::Command::new(&cuobjdump).arg("-lelf").arg(&f.path).output();
        let text = listing.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        for o in outcomes {
            if !text.contains(&format!(".{}.cubin", o.target)) {
                v.problems.push(format!("fatbin {}: no {} image in `cuobjdump -lelf`: {text}", f.name, o.target));
            }
        }
    }
}

fn check_cuda(v: &mut Verdict, env: &BuildEnv, cfg: &Config) {
    let nvcc = match find_nvcc(env) {
        Ok(n) => n,
        Err(nf) => {
            v.skipped.push(format!("CUDA ({CUDA_ARCHS}): {nf}"));
            return;
        }
    };
    let start = Instant::now();
    let outcomes = compile_cuda_with(env, cfg, &nvcc);
    println!("  CUDA: {:.1} s wall for {} targets", start.elapsed().as_secs_f64(), outcomes.len());
    if outcomes.iter().all(|o| o.result.is_ok()) {
        check_fatbins(v, env, cfg, &nvcc, &outcomes);
    }
    for o in &outcomes {
        let arts = match &o.result {
            Ok(a) => a,
            Err(skip) => {
                v.problems.push(format!("{}: {skip}", o.target));
                continue;
            }
        };
        v.summary.push(summary(o, arts));
        for a in arts.iter().filter(|a| !is_elf(&a.path)) {
            v.problems.push(format!("{} {}: {} is not an ELF cubin", o.target, a.name, a.path.display()));
        }
        check_images(
            v,
            &o.target,
            arts,
            &cfg.sources,
            "HMMA",
            false,
            |k| format!("Function : {k}\n"),
            |a| {
                let sass = cuda_sass(env, &nvcc, &a.path)?;
                // cuobjdump names the architecture of each image; make sure it is this target's.
                let want = format!("code for {}\n", o.target);
                if !sass.contains(&want) {
                    return Err(format!("cuobjdump does not report {want}"));
                }
                Ok(sass)
            },
        );
    }
}

fn check_hip(v: &mut Verdict, env: &BuildEnv, cfg: &Config) {
    let start = Instant::now();
    let outcomes = compile_hip(env, cfg);
    let any_compiled = outcomes.iter().any(|o| o.result.is_ok());
    // Assembly only for targets that no installed llvm-objdump can read (gfx950 with LLVM 19).
    let mut asm_cfg = cfg.clone();
    asm_cfg.hip_archs.retain(|a| find_llvm_objdump(env, a).is_err());
    let asm =
        if any_compiled && !asm_cfg.hip_archs.is_empty() { compile_hip_assembly(env, &asm_cfg) } else { Vec::new() };
    println!("  HIP: {:.1} s wall for {} targets", start.elapsed().as_secs_f64(), outcomes.len());
    for o in &outcomes {
        let arts = match &o.result {
            Ok(a) => a,
            Err(Skip::NoToolchain(nf)) => {
                v.skipped.push(format!("HIP {}: {nf}", o.target));
                continue;
            }
            Err(skip) => {
                v.problems.push(format!("{}: {skip}", o.target));
                continue;
            }
        };
        v.summary.push(summary(o, arts));
        for a in arts.iter().filter(|a| !is_elf(&a.path)) {
            v.problems.push(format!("{} {}: {} is not an ELF code object", o.target, a.name, a.path.display()));
        }
        let Some(arch) = HipArch::parse(&o.target) else { continue };
        match find_llvm_objdump(env, &arch) {
            Ok((objdump, major)) => {
                println!("    {}: disassembled with {} (LLVM {major})", o.target, objdump.display());
                check_images(
                    v,
                    &o.target,
                    arts,
                    &cfg.sources,
                    "v_mfma",
                    true,
                    |k| format!("<{k}>:"),
                    |a| amdgpu_objdump(&objdump, &a.path),
                );
            }
            Err(why) => {
                println!("    {}: checking `clang -S` output ({why})", o.target);
                let Some(asm_o) = asm.iter().find(|a| a.target == o.target) else {
                    v.problems.push(format!("{}: no assembly outcome", o.target));
                    continue;
                };
                match &asm_o.result {
                    Ok(asm_arts) => check_images(
                        v,
                        &o.target,
                        asm_arts,
                        &cfg.sources,
                        "v_mfma",
                        true,
                        |k| format!("\n{k}:"),
                        |a| std::fs::read_to_string(&a.path).map_err(|e| e.to_string()),
                    ),
                    Err(skip) => v.problems.push(format!("{} assembly: {skip}", o.target)),
                }
            }
        }
    }
}

#[test]
fn every_kernel_compiles_for_every_arch_with_matrix_instructions() {
    let csrc = csrc();
    let sources = kernel_sources(&csrc).expect("kernel sources listed");
    assert!(sources.len() >= 6, "expected the dialect's test kernels under {}", csrc.display());
    assert!(sources.iter().any(|s| facts(s).uses_mma), "no source uses mma_sync: the matrix check would be vacuous");
    let env = BuildEnv::process_quiet();
    let cfg = config(sources, &csrc);
    println!("device_compile: {} sources under {}", cfg.sources.len(), csrc.display());
    let mut v = Verdict::default();
    check_cuda(&mut v, &env, &cfg);
    check_hip(&mut v, &env, &cfg);
    // Written past the test harness's capture so that CI logs show them on success too.
    let mut err = std::io::stderr().lock();
    for line in &v.summary {
        let _ = writeln!(err, "device_compile: {line}");
    }
    for s in &v.skipped {
        let _ = writeln!(err, "device_compile: SKIPPED {s}");
    }
    assert!(v.problems.is_empty(), "device compile problems:\n{}", v.problems.join("\n"));
    if required() {
        assert!(
            v.skipped.is_empty(),
            "K3_REQUIRE_DEVICE_COMPILE=1 but toolchains are missing:\n{}",
            v.skipped.join("\n")
        );
    }
}
