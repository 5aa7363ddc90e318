//! The resource report's reading of real images: the dialect's test kernels compiled for all five
//! targets and read back with the real tools (`cuobjdump`, `nvdisasm`, `llvm-readelf`,
//! `llvm-objdump`, or the `clang -S` assembly for gfx950). Checks figures the sources determine:
//! `vec_copy16` moves everything in 16-byte loads, `vec_scale2` has a 16-byte body and a 4-byte
//! tail, the MMA GEMM has matrix instructions of the vendor's class, every exported kernel is
//! read, and every kernel fits at least one 128-thread block per SM / CU.
//!
//! A target whose compiler is missing is skipped with the reason, unless
//! `K3_REQUIRE_DEVICE_COMPILE=1` (CI), where that fails the test.

mod common;

use common::{config, csrc, required};
use k3_build_support::resources::collect::read_targets;
use k3_build_support::resources::occupancy::{limits, occupancy};
use k3_build_support::resources::{KernelResources, Vendor};
use k3_build_support::sources::{export_present, kernel_exports};
use k3_build_support::{find_hip_clang, find_nvcc, kernel_sources, BuildEnv};

fn kernel<'a>(ks: &'a [KernelResources], name: &str) -> &'a KernelResources {
    ks.iter().find(|k| k.kernel == name).unwrap_or_else(|| panic!("{name} not read"))
}

#[test]
fn test_kernels_read_back_from_every_target() {
    let csrc = csrc();
    let wanted = ["tests/vector_loads.cu", "tests/gemm_mma.cu"];
    let sources: Vec<_> = kernel_sources(&csrc)
        .expect("sources listed")
        .into_iter()
        .filter(|s| wanted.iter().any(|w| s.ends_with(w)))
        .collect();
    assert_eq!(sources.len(), wanted.len(), "{sources:?}");
    let env = BuildEnv::process_quiet();
    let cfg = config(sources.clone(), &csrc);
    let have_nvcc = find_nvcc(&env).is_ok();
    let wrapper = cfg.out_dir.join("k3-zig-lld");
    let mut problems = Vec::new();
    let mut skipped = Vec::new();
    for t in read_targets(&env, &cfg) {
        let l = limits(&t.target).expect("a report target");
        let has_compiler = match l.vendor {
            Vendor::Nvidia => have_nvcc,
            Vendor::Amd => cfg.hip_archs.iter().any(|a| a.as_str() == t.target && find_hip_clang(&env, a, &wrapper).is_ok()),
        };
        let ks = match t.kernels {
            Ok(ks) => ks,
            Err(e) if !has_compiler => {
                skipped.push(format!("{}: {e}", t.target));
                continue;
            }
            Err(e) => {
                problems.push(format!("{}: {e}", t.target));
                continue;
            }
        };
        eprintln!("kernel_resources: {} read with {} ({})", t.target, t.read_with, t.compiler.as_deref().unwrap_or("?"));
        for src in &sources {
            let text = std::fs::read_to_string(src).expect("readable");
            for e in kernel_exports(&text).iter().filter(|e| export_present(e, l.warp_size == 64)) {
                if !ks.iter().any(|k| k.kernel == e.name) {
                    problems.push(format!("{}: exported kernel {} not read", t.target, e.name));
                }
            }
        }
        let copy = kernel(&ks, "vec_copy16");
        if copy.metric("wide_load_share") != Some(1.0) {
            problems.push(format!("{}: vec_copy16 loads {:?}", t.target, copy.code.global_loads));
        }
        let scale = kernel(&ks, "vec_scale2");
        let share = scale.metric("wide_load_share").unwrap_or(0.0);
        if !(share > 0.0 && share < 1.0 && scale.code.global_loads.contains_key(&16)) {
            problems.push(format!("{}: vec_scale2 loads {:?} (share {share})", t.target, scale.code.global_loads));
        }
        let gemm = kernel(&ks, "gemm_bf16_mma");
        let class = if l.vendor == Vendor::Nvidia { "mma.sync" } else { "mfma" };
        if gemm.code.matrix.get(class).copied().unwrap_or(0) == 0 {
            problems.push(format!("{}: gemm_bf16_mma has no {class} instruction: {:?}", t.target, gemm.code.matrix));
        }
        for k in &ks {
            let o = occupancy(l, k, 128, 0);
            if k.regs == 0 || o.blocks == 0 || (l.vendor == Vendor::Amd && k.sgprs.unwrap_or(0) == 0) {
                problems.push(format!("{} {}: regs {} sgprs {:?}, {} blocks of 128", t.target, k.kernel, k.regs, k.sgprs, o.blocks));
            }
        }
    }
    for s in &skipped {
        eprintln!("kernel_resources: SKIPPED {s}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    if required() {
        assert!(skipped.is_empty(), "K3_REQUIRE_DEVICE_COMPILE=1 but:\n{}", skipped.join("\n"));
    }
}
