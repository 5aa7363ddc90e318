//! Runs the disassembly tools over compiled images and reads every kernel's resources, per
//! target: NVIDIA cubins with `cuobjdump -res-usage` and `nvdisasm -c`; AMD code objects with
//! `llvm-readelf --notes` and `llvm-objdump -d` when an `llvm-objdump` knows the processor,
//! else the `clang -S` assembly of the same compile (gfx950 with LLVM 19 tools).

use super::{amdgpu, sass, KernelResources};
use crate::arch::HipArch;
use crate::compile::{compile_cuda, compile_hip, compile_hip_assembly, ArchOutcome, Artifact};
use crate::config::Config;
use crate::disasm::{amdgpu_objdump, find_llvm_objdump};
use crate::env::{is_executable, BuildEnv};
use crate::toolchain::{find_nvcc, run_capture, Nvcc};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What one target's images say, or why there is nothing to say.
#[derive(Clone, Debug)]
pub struct TargetResources {
    /// `sm_90a`, `gfx950`.
    pub target: String,
    /// The compiler without where it was found (`nvcc release 13.5, V13.5.37`).
    pub compiler: Option<String>,
    /// The tools the figures were read with.
    pub read_with: String,
    /// Every kernel of every image, in source then kernel order.
    pub kernels: Result<Vec<KernelResources>, String>,
}

/// Every kernel of `arts`, one image at a time on `jobs` threads.
fn each_image(
    arts: &[Artifact],
    jobs: usize,
    read: impl Fn(&Artifact) -> Result<Vec<KernelResources>, String> + Sync,
) -> Result<Vec<KernelResources>, String> {
    let results = crate::par::map(arts, jobs, "k3-kernel-resources", |a| read(a));
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (r, a) in results.into_iter().zip(arts) {
        match r.unwrap_or_else(|| Err("not read".into())) {
            Ok(ks) => out.extend(ks),
            Err(e) => errors.push(format!("{} for {}: {e}", a.name, a.target)),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.join("\n"))
    }
}

/// Kernels of NVIDIA cubins (`cuobjdump` and `nvdisasm` next to nvcc or on `PATH`).
pub fn nvidia(env: &BuildEnv, nvcc: &Nvcc, arts: &[Artifact], jobs: usize) -> Result<Vec<KernelResources>, String> {
    let tool = |name: &str| {
        nvcc.sibling(env, name).ok_or_else(|| format!("{name} not found next to nvcc nor on PATH (pip install nvidia-cuda-{name})"))
    };
    let (cuobjdump, nvdisasm) = (tool("cuobjdump")?, tool("nvdisasm")?);
    each_image(arts, jobs, |a| {
        let usage = run_capture(Command::new(&cuobjdump).arg("-res-usage").arg(&a.path))?;
        let listing = run_capture(Command::new(&nvdisasm).arg("-c").arg(&a.path))?;
        sass::kernels(&a.name, &a.target, &usage, &listing)
    })
}

/// The `llvm-readelf` of the same LLVM as `objdump` (`llvm-objdump-19` -> `llvm-readelf-19`).
pub fn readelf_beside(objdump: &Path) -> Result<PathBuf, String> {
    let name = objdump.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let p = objdump.with_file_name(name.replacen("objdump", "readelf", 1));
    if name.contains("objdump") && is_executable(&p) {
        Ok(p)
    } else {
        Err(format!("no llvm-readelf beside {} (install the llvm package that has it)", objdump.display()))
    }
}

/// Kernels of AMD code objects: metadata notes and disassembly.
pub fn amd_code_objects(objdump: &Path, arts: &[Artifact], jobs: usize) -> Result<Vec<KernelResources>, String> {
    let readelf = readelf_beside(objdump)?;
    each_image(arts, jobs, |a| {
        let notes = run_capture(Command::new(&readelf).arg("--notes").arg(&a.path))?;
        let listing = amdgpu_objdump(objdump, &a.path)?;
        amdgpu::kernels(&a.name, &a.target, &notes, &listing)
    })
}

/// Kernels of AMD `clang -S` assembly files (metadata block and listing in one text).
pub fn amd_assembly(arts: &[Artifact], jobs: usize) -> Result<Vec<KernelResources>, String> {
    each_image(arts, jobs, |a| {
        let text = std::fs::read_to_string(&a.path).map_err(|e| format!("{}: {e}", a.path.display()))?;
        amdgpu::kernels(&a.name, &a.target, &text, &text)
    })
}

/// `clang (Debian clang version 19.1.7) via PATH (clang-19)` -> the part before ` via `.
fn without_location(compiler: &Option<String>) -> Option<String> {
    compiler.as_ref().map(|c| c.split(" via ").next().unwrap_or(c).to_string())
}

fn failed(o: &ArchOutcome, read_with: &str) -> Option<TargetResources> {
    let skip = o.result.as_ref().err()?;
    Some(TargetResources {
        target: o.target.clone(),
        compiler: without_location(&o.compiler),
        read_with: read_with.into(),
        kernels: Err(skip.to_string()),
    })
}

/// Compiles `cfg.sources` for every target of `cfg` (through the content-hash cache: a target
/// compiled before costs nothing) and reads every kernel's resources.
pub fn read_targets(env: &BuildEnv, cfg: &Config) -> Vec<TargetResources> {
    let mut out = Vec::new();
    if !cfg.cuda_archs.is_empty() {
        const NV: &str = "cuobjdump -res-usage, nvdisasm -c";
        let nvcc = find_nvcc(env);
        for o in compile_cuda(env, cfg) {
            if let Some(f) = failed(&o, NV) {
                out.push(f);
                continue;
            }
            let (Ok(arts), Ok(nvcc)) = (&o.result, &nvcc) else { continue };
            let kernels = nvidia(env, nvcc, arts, cfg.jobs);
            out.push(TargetResources {
                target: o.target.clone(),
                compiler: Some(format!("nvcc {}", nvcc.version)),
                read_with: NV.into(),
                kernels,
            });
        }
    }
    for o in compile_hip(env, cfg) {
        if let Some(f) = failed(&o, "") {
            out.push(f);
            continue;
        }
        let Ok(arts) = &o.result else { continue };
        let compiler = without_location(&o.compiler);
        let Some(arch) = HipArch::parse(&o.target) else { continue };
        let (read_with, kernels) = match find_llvm_objdump(env, &arch) {
            Ok((objdump, major)) => {
                (format!("llvm-readelf --notes, llvm-objdump -d (LLVM {major})"), amd_code_objects(&objdump, arts, cfg.jobs))
            }
            Err(_) => {
                let mut one = cfg.clone();
                one.hip_archs = vec![arch];
                let asm = compile_hip_assembly(env, &one);
                let kernels = match asm.first().map(|a| &a.result) {
                    Some(Ok(asm_arts)) => amd_assembly(asm_arts, cfg.jobs),
                    Some(Err(skip)) => Err(format!("assembly: {skip}")),
                    None => Err("no assembly outcome".into()),
                };
                ("`clang -S` assembly of the same compile (no llvm-objdump knows this processor)".to_string(), kernels)
            }
        };
        out.push(TargetResources { target: o.target.clone(), compiler, read_with, kernels });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiler_descriptions_drop_paths() {
        let c = Some("clang (Debian clang version 19.1.7 (3~deb12u1)) via PATH (clang-19)".to_string());
        assert_eq!(without_location(&c).as_deref(), Some("clang (Debian clang version 19.1.7 (3~deb12u1))"));
        assert_eq!(without_location(&None), None);
    }

    #[test]
    fn readelf_is_found_beside_objdump_only() {
        let dir = std::env::temp_dir().join(format!("k3-readelf-beside-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let objdump = dir.join("llvm-objdump-19");
        assert!(readelf_beside(&objdump).is_err(), "nothing there yet");
        let readelf = dir.join("llvm-readelf-19");
        std::fs::write(&readelf, "#!/bin/sh\n").expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&readelf, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        assert_eq!(readelf_beside(&objdump), Ok(readelf));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
