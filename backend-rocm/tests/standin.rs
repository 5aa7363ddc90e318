//! The backend's host path against the emulator-backed HIP stand-in (`standin/hip`), selected
//! with `eval "$(bash scripts/standin-env.sh rocm gfx942|gfx950)"`. Without it (no
//! `K3_HIP_LIBRARY` naming the stand-in) every test prints `skipped: ...`.
//!
//! What runs here and nowhere else: the DeviceInfo a gfx942 / gfx950 device maps to, the arch
//! name read through the hipDeviceProp_t layouts of HIP 5, 6 and 7 (child processes with
//! `K3_STANDIN_HIP_VERSION`), the hipBLASLt route with its fallback to the dialect's kernels
//! when the library has no algorithm, and the hiprtc path answering `Unavailable` when neither
//! an embedded image nor hiprtc is there.

use k3_backend_rocm::hiprtc::CodeObjectCache;
use k3_backend_rocm::{rocm_backend, GemmRoute, KernelSet, KernelSource, RocmBackend, RocmRuntime};
use k3_kernels::vendor_gemm::lt_workspace_bytes;
use k3_kernels::Runtime;
use kernel_api::ops::{Gemm, GemmParams};
use kernel_api::{DType, Error, Fp8Native};
use std::process::Command;

/// The personality the stand-in plays, when this run uses it.
fn standin_arch() -> Option<String> {
    let lib = std::env::var("K3_HIP_LIBRARY").unwrap_or_default();
    if !lib.contains("k3_standin_hip") {
        println!("skipped: K3_HIP_LIBRARY does not name the HIP stand-in (eval \"$(bash scripts/standin-env.sh rocm gfx942)\")");
        return None;
    }
    Some(std::env::var("K3_STANDIN_ARCH").ok().filter(|a| !a.is_empty()).unwrap_or_else(|| "gfx942".into()))
}

#[test]
fn device_info_follows_the_processor() {
    let Some(arch) = standin_arch() else { return };
    let rt = RocmRuntime::new(0).expect("the stand-in device");
    let i = rt.device_info();
    println!("{}", rt.summary());
    assert_eq!(i.arch, arch);
    assert_eq!(rt.target_id(), format!("{arch}:sramecc+:xnack-"));
    assert_eq!(i.warp_size, 64);
    assert!(i.l2_bytes > 0, "{i:?}");
    let (cus, lds, fp8) = match arch.as_str() {
        "gfx942" => (304, 64 << 10, Fp8Native::Fnuz),
        "gfx950" => (256, 160 << 10, Fp8Native::Ocp),
        other => panic!("unexpected personality {other}"),
    };
    assert_eq!((i.compute_units, i.shared_mem_per_block, i.fp8), (cus, lds, fp8));
    assert!(rt.kernel_availability().starts_with("embedded code objects"), "{}", rt.kernel_availability());
    assert!(rt.library().contains("k3_standin_hip"), "{}", rt.library());
    // More LDS than the processor has is refused before the launch.
    let b = rocm_backend(0).expect("backend");
    let k = b.runtime().kernels(KernelSet::Tests).expect("test kernels");
    let cfg = k3_kernels::LaunchConfig::new(1u32, 64u32, (lds + 1) as u32);
    // SAFETY: rejected by the configuration check before anything is launched.
    let e = unsafe { b.runtime().launch_by_name(&k, "block_reduce", &cfg, &[], b.runtime().default_stream()) }.unwrap_err();
    assert_eq!(e.field(), Some("cfg.shared_bytes"), "{e}");
}

/// The child side of `arch_name_is_read_on_hip_5_6_and_7`.
#[test]
#[ignore = "runs only as a child process of arch_name_is_read_on_hip_5_6_and_7"]
fn arch_name_child() {
    let rt = RocmRuntime::new(0).expect("the stand-in device");
    println!("ARCH {} VIA {} VERSION {}", rt.target_id(), rt.arch_name_source(), k3_backend_rocm::hip::version_string(rt.runtime_version()));
}

#[test]
fn arch_name_is_read_on_hip_5_6_and_7() {
    let Some(arch) = standin_arch() else { return };
    let exe = std::env::current_exe().expect("test binary");
    for (version, call) in [("5", "hipGetDeviceProperties"), ("6", "hipGetDevicePropertiesR0600"), ("7", "hipGetDevicePropertiesR0600")] {
        let out = Command::new(&exe)
            .args(["--ignored", "--exact", "arch_name_child", "--nocapture", "--test-threads=1"])
            .env("K3_STANDIN_HIP_VERSION", version)
            .output()
            .expect("spawn");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "HIP {version}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = stdout.lines().find_map(|l| l.split_once("ARCH ").map(|(_, r)| r.to_string())).expect("child line");
        println!("HIP {version}: {line}");
        assert!(line.starts_with(&format!("{arch}:sramecc+:xnack- VIA {call} VERSION {version}.")), "HIP {version}: {line}");
    }
}

/// (op, test name, test) of the conformance registry.
type Test = (&'static str, &'static str, fn(&RocmBackend));

fn gemm_tests() -> Vec<Test> {
    kernel_api::conformance::all_tests::<RocmBackend>().into_iter().filter(|(op, _, _)| *op == "gemm").collect()
}

/// The contract's `Gemm` under both routes: hipBLASLt (the stand-in's, through the vendor-GEMM
/// hook with the plan's shape-sized workspace) and the dialect's kernels, each through the GEMM
/// conformance tests; an M beyond the kernels' grid is supported only on the hipBLASLt route.
#[test]
fn gemm_conformance_on_both_routes() {
    if standin_arch().is_none() {
        return;
    }
    let b = rocm_backend(0).expect("backend");
    let rt = b.runtime();
    println!("{}", rt.gemm_route_summary());
    let p = GemmParams::new(64, 128, 256, DType::BF16, DType::BF16, DType::BF16);
    let huge_m = GemmParams::new(65_535 * 64 + 1, 8, 8, DType::F32, DType::F32, DType::F32);
    for route in [GemmRoute::HipBlasLt, GemmRoute::Kernels] {
        rt.set_gemm_route(route);
        let plan = Gemm::plan(&b, &p).expect("plan");
        let want_ws = if route == GemmRoute::HipBlasLt { lt_workspace_bytes(&p) } else { 0 };
        assert_eq!(Gemm::workspace_size(&b, &plan), want_ws, "{route:?}");
        assert_eq!(Gemm::supports(&b, &huge_m).is_ok(), route == GemmRoute::HipBlasLt, "{route:?}: M beyond the kernels' grid");
        for (_, name, test) in gemm_tests() {
            println!("{route:?}: {name}");
            test(&b);
        }
    }
    rt.set_gemm_route(GemmRoute::Auto);
    assert!(rt.gemm_route_summary().starts_with("hipBLASLt ("), "{}", rt.gemm_route_summary());
}

/// The child side of `gemm_falls_back_when_hipblaslt_has_no_algorithm`.
#[test]
#[ignore = "runs only as a child process of gemm_falls_back_when_hipblaslt_has_no_algorithm"]
fn gemm_fallback_child() {
    let b = rocm_backend(0).expect("backend");
    assert_eq!(b.runtime().gemm_route(), GemmRoute::HipBlasLt);
    for (_, name, test) in gemm_tests() {
        println!("fallback: {name}");
        test(&b);
    }
    println!("FALLBACK OK");
}

/// With a hipBLASLt that finds no algorithm (`K3_STANDIN_BLAS_REJECT=all`), every GEMM still
/// passes: the launcher falls back to the dialect's kernels.
#[test]
fn gemm_falls_back_when_hipblaslt_has_no_algorithm() {
    if standin_arch().is_none() {
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", "gemm_fallback_child", "--nocapture", "--test-threads=1"])
        .env("K3_STANDIN_BLAS_REJECT", "all")
        .env("K3_ROCM_GEMM", "hipblaslt")
        .output()
        .expect("spawn");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("FALLBACK OK"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// The stand-in has the kernels of both processors embedded but no hiprtc: asking for hiprtc
/// names what was searched and what to install.
#[test]
fn hiprtc_is_unavailable_beside_the_standin() {
    if standin_arch().is_none() {
        return;
    }
    let rt = RocmRuntime::new(0).expect("the stand-in device");
    match rt.load_kernel_set(KernelSet::Tests, KernelSource::Jit, &CodeObjectCache::disabled()) {
        Err(Error::Unavailable { why }) => {
            println!("{why}");
            assert!(why.contains("hiprtc not found") && why.contains("libhiprtc.so{,.7,.6,.5}"), "{why}");
            assert!(why.contains("K3_HIP_ARCHS=jit") || why.contains("K3_ROCM_KERNELS=jit"), "{why}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The embedded path is unaffected.
    let (_, origins) = rt.load_kernel_set(KernelSet::Tests, KernelSource::Embedded, &CodeObjectCache::disabled()).expect("embedded");
    assert!(origins.iter().all(|(_, o)| *o == k3_backend_rocm::KernelOrigin::Embedded));
}
