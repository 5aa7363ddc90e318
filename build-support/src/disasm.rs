//! Disassembly of compiled images, for the "the intended matrix instructions are there" check.

use crate::arch::HipArch;
use crate::env::{is_executable, BuildEnv};
use crate::toolchain::{first_lines, run_capture, Nvcc};
use std::path::{Path, PathBuf};
use std::process::Command;

/// SASS of a cubin or fatbin: `cuobjdump -sass` (next to nvcc or on `PATH`), else `nvdisasm`
/// (cubins only).
pub fn cuda_sass(env: &BuildEnv, nvcc: &Nvcc, image: &Path) -> Result<String, String> {
    if let Some(tool) = nvcc.sibling(env, "cuobjdump") {
        return run_capture(Command::new(&tool).arg("-sass").arg(image))
            .map_err(|e| format!("{}: {e}", tool.display()));
    }
    if let Some(tool) = nvcc.sibling(env, "nvdisasm") {
        return run_capture(Command::new(&tool).arg(image)).map_err(|e| format!("{}: {e}", tool.display()));
    }
    Err("neither cuobjdump nor nvdisasm found next to nvcc or on PATH (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)".into())
}

/// An `llvm-objdump` whose AMDGPU disassembler knows `arch`: `K3_LLVM_OBJDUMP`, else
/// `llvm-objdump-22` .. `llvm-objdump-19` and `llvm-objdump` on `PATH`. Returns the tool and its
/// LLVM major version, or every candidate and why it did not qualify.
pub fn find_llvm_objdump(env: &BuildEnv, arch: &HipArch) -> Result<(PathBuf, u32), String> {
    let need = arch.min_llvm_major();
    let mut tried = Vec::new();
    let mut candidates = Vec::new();
    match env.path("K3_LLVM_OBJDUMP") {
        Some(p) => candidates.push((p.clone(), format!("K3_LLVM_OBJDUMP={}", p.display()))),
        None => tried.push("K3_LLVM_OBJDUMP unset".to_string()),
    }
    for name in ["llvm-objdump-22", "llvm-objdump-21", "llvm-objdump-20", "llvm-objdump-19", "llvm-objdump"] {
        if let Some(p) = env.which(name) {
            candidates.push((p, format!("PATH ({name})")));
        }
    }
    for (p, via) in candidates {
        if !is_executable(&p) {
            tried.push(format!("{via}: not an executable"));
            continue;
        }
        match run_capture(Command::new(&p).arg("--version")) {
            Ok(text) => {
                let major = text
                    .lines()
                    .find_map(|l| l.split("LLVM version ").nth(1))
                    .and_then(|v| v.split('.').next())
                    .and_then(|m| m.trim().parse::<u32>().ok());
                match major {
                    Some(m) if m >= need.max(15) => return Ok((p, m)),
                    Some(m) => tried.push(format!("{via}: LLVM {m} cannot disassemble {arch}")),
                    None => tried.push(format!("{via}: unrecognised --version: {}", first_lines(&text, 1))),
                }
            }
            Err(e) => tried.push(format!("{via}: {e}")),
        }
    }
    Err(format!("no llvm-objdump for {arch}: {}", tried.join("; ")))
}

/// Disassembly of an AMDGPU code object with `llvm-objdump -d`.
pub fn amdgpu_objdump(objdump: &Path, code_object: &Path) -> Result<String, String> {
    run_capture(Command::new(objdump).arg("-d").arg(code_object)).map_err(|e| format!("{}: {e}", objdump.display()))
}

/// Mnemonics (first word of each instruction line) found in a disassembly or assembly text
/// that start with `prefix`, e.g. `HMMA.16816.F32.BF16` for "HMMA" or
/// `v_mfma_f32_16x16x16_bf16` for "v_mfma".
pub fn mnemonics_with_prefix(text: &str, prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for line in text.lines() {
        // SASS: `/*0860*/  HMMA.16816.F32.BF16 R12, ...`; AMD: `\tv_mfma_f32_... v[0:3], ...`.
        let body = match line.find("*/") {
            Some(i) if line.trim_start().starts_with("/*") => &line[i + 2..],
            _ => line,
        };
        for word in body.split(|c: char| c.is_whitespace() || c == ';' || c == ',') {
            let word = word.trim_start_matches('@');
            if word.starts_with(prefix) && !found.iter().any(|f| f == word) {
                found.push(word.to_string());
            }
        }
    }
    found
}
