//! Runtime checks: what GPUs leave undefined comes back as an error naming the kernel, block,
//! thread and call site, without aborting the process; launch-configuration errors name the
//! offending field; and the runtime keeps working after any of them.
mod common;

use common::*;
use k3_backend_simt::SimtRuntime;
use k3_kernels::{KernelArgs, LaunchConfig, ModuleImage, ImageFormat, Runtime};
use kernel_api::Error;

const FAULTS: &str = include_str!("../../kernels/csrc/tests/faults.cu");

fn run_fault(rt: &SimtRuntime, kernel: &str, block: u32) -> Error {
    let out = alloc::<i32>(rt, 1024);
    let mut a = KernelArgs::new();
    a.push(out.device_ptr());
    match launch(rt, kernel, LaunchConfig::new(2, block, 0), &mut a) {
        Err(e) => e,
        Ok(()) => panic!("{kernel} at warp {}: no error", rt.warp_size()),
    }
}

fn driver_why(e: &Error) -> &str {
    match e {
        Error::Driver { why, .. } => why,
        other => panic!("expected a driver error, got {other:?}"),
    }
}

/// A correct launch still works (fibers stopped mid-kernel were rebuilt).
fn assert_still_works(rt: &SimtRuntime) {
    let block = 128u32;
    let x: Vec<f32> = (0..block as usize).map(|i| i as f32).collect();
    let (xb, out) = (upload(rt, &x), alloc::<f32>(rt, 1));
    let mut a = KernelArgs::new();
    a.push(xb.device_ptr()).push(out.device_ptr());
    launch(rt, "dynamic_shared_sum", LaunchConfig::new(1, block, block * 4), &mut a).unwrap();
    assert_eq!(download::<f32>(rt, &out)[0], (0..block).sum::<u32>() as f32);
}

#[test]
fn barrier_divergence_reports_both_call_sites() {
    let (a, b) = (marker_line(FAULTS, "BARRIER-A"), marker_line(FAULTS, "BARRIER-B"));
    for warp in WARPS {
        for seed in [0, 1] {
            let rt = rt(warp).with_seed(seed);
            let e = run_fault(&rt, "barrier_divergence", 4 * warp);
            let why = driver_why(&e);
            assert!(why.contains("barrier divergence"), "{why}");
            assert!(why.contains(&format!("tests/faults.cu:{a}")), "{why}");
            assert!(why.contains(&format!("tests/faults.cu:{b}")), "{why}");
            assert!(why.contains("kernel `barrier_divergence` block ("), "{why}");
            assert_still_works(&rt);
        }
    }
}

#[test]
fn divergent_collectives_are_reported() {
    let (a, b) = (marker_line(FAULTS, "COLLECTIVE-A"), marker_line(FAULTS, "COLLECTIVE-B"));
    for warp in WARPS {
        let rt = rt(warp);
        let why = driver_why(&run_fault(&rt, "divergent_collective", warp)).to_string();
        assert!(why.contains("divergent warp collective"), "{why}");
        assert!(why.contains(&format!("tests/faults.cu:{a}")) && why.contains(&format!("tests/faults.cu:{b}")), "{why}");
        assert_still_works(&rt);
    }
}

#[test]
fn exited_lanes_in_a_collective_mask_are_reported() {
    for warp in WARPS {
        for seed in [0, 2] {
            let rt = rt(warp).with_seed(seed);
            let why = driver_why(&run_fault(&rt, "exited_lane_in_mask", warp)).to_string();
            assert!(why.contains("exited"), "{why}");
            assert!(why.contains("lane 3") || why.contains("0x8"), "{why}");
            assert_still_works(&rt);
        }
    }
}

#[test]
fn deadlocks_are_reported_with_what_each_thread_waits_for() {
    for warp in WARPS {
        let rt = rt(warp);
        let why = driver_why(&run_fault(&rt, "deadlock", 2 * warp)).to_string();
        assert!(why.contains("deadlock"), "{why}");
        assert!(why.contains(&format!("2 of {} threads wait at a barrier", 2 * warp)), "{why}");
        assert!(why.contains(&format!("{} wait in warp collectives", 2 * warp - 2)), "{why}");
        assert_still_works(&rt);
    }
}

#[test]
fn shared_memory_limit_is_enforced() {
    let line = marker_line(FAULTS, "BIG-SHARED");
    for warp in WARPS {
        let rt = rt(warp).with_shared_limit(32 * 1024).unwrap();
        let why = driver_why(&run_fault(&rt, "shared_limit_exceeded", 64)).to_string();
        assert!(why.contains("shared memory limit exceeded"), "{why}");
        assert!(why.contains(&format!("tests/faults.cu:{line}")) && why.contains("65536 bytes"), "{why}");
        // Raised to 64 KiB it fits.
        let rt = rt.with_shared_limit(64 * 1024).unwrap();
        let out = alloc::<f32>(&rt, 64);
        let mut a = KernelArgs::new();
        a.push(out.device_ptr());
        launch(&rt, "shared_limit_exceeded", LaunchConfig::new(1, 64, 0), &mut a).unwrap();
        assert_eq!(download::<f32>(&rt, &out), vec![1.0; 64]);
        // Dynamic shared memory counts against the same limit, checked at launch.
        let x = upload(&rt, &[0f32; 64]);
        let mut a = KernelArgs::new();
        a.push(x.device_ptr()).push(out.device_ptr());
        let e = launch(&rt, "dynamic_shared_sum", LaunchConfig::new(1, 64, 64 * 1024 + 4), &mut a).unwrap_err();
        assert_eq!(e.field(), Some("launch.shared_bytes"), "{e}");
    }
}

#[test]
fn device_side_traps_name_the_thread_and_site() {
    let line = marker_line(FAULTS, "TRAP");
    for warp in WARPS {
        let rt = rt(warp);
        let why = driver_why(&run_fault(&rt, "trap_in_thread_5", warp)).to_string();
        assert!(why.contains("index out of range"), "{why}");
        assert!(why.contains(&format!("tests/faults.cu:{line}")) && why.contains("thread (5,0,0)"), "{why}");
        assert_still_works(&rt);
    }
}

#[test]
fn bad_launches_name_the_offending_field() {
    let rt = rt(32);
    let out = alloc::<i32>(&rt, 2048);
    let run = |cfg: LaunchConfig, nargs: usize| {
        let mut a = KernelArgs::new();
        for _ in 0..nargs {
            a.push(out.device_ptr());
        }
        launch(&rt, "barrier_divergence", cfg, &mut a).unwrap_err()
    };
    assert_eq!(run(LaunchConfig::new(1, 1025, 0), 1).field(), Some("launch.block"));
    assert_eq!(run(LaunchConfig::new(1, (32, 0), 0), 1).field(), Some("launch.block"));
    assert_eq!(run(LaunchConfig::new(0, 32, 0), 1).field(), Some("launch.grid"));
    assert_eq!(run(LaunchConfig::new((1, 70000), 32, 0), 1).field(), Some("launch.grid"));
    assert_eq!(run(LaunchConfig::new(1, 32, 0), 2).field(), Some("params"));
    assert!(matches!(rt.kernel(&rt.module(), "no_such_kernel"), Err(Error::Unavailable { .. })));
    let ptx = ModuleImage { name: "x", format: ImageFormat::Ptx, bytes: b".version 8.0" };
    assert!(matches!(rt.load_module(&ptx), Err(Error::Unsupported { .. })));
    assert!(SimtRuntime::new(48).is_err());
    assert!(common::rt(32).with_shared_limit(k3_backend_simt::MAX_SHARED_LIMIT + 1).is_err());
    // A kernel looked up at warp 64 cannot be launched on a warp-32 runtime.
    let rt64 = common::rt(64);
    let k64 = rt64.kernel(&rt64.module(), "empty_kernel").unwrap();
    // SAFETY: empty_kernel takes no parameters.
    let e = unsafe { rt.launch(&k64, &LaunchConfig::new(1, 32, 0), &[], rt.default_stream()) }.unwrap_err();
    assert_eq!(e.field(), Some("kernel"));
    assert_still_works(&rt);
}

#[test]
fn every_test_kernel_is_registered_at_both_warp_sizes() {
    let ks = k3_backend_simt::kernels();
    for name in ["block_reduce", "warp_semantics", "gemm_bf16_mma", "convert_from_f32", "adjacent_diff_missing_barrier", "deadlock"] {
        for warp in WARPS {
            assert!(ks.iter().any(|k| k.name == name && k.warp_size == warp), "{name} at warp {warp}");
        }
    }
    let reduce = ks.iter().find(|k| k.name == "block_reduce").unwrap();
    assert_eq!((reduce.nparams, reduce.file.as_str()), (6, "tests/reduce.cu"));
}

/// The registry records each parameter's kind from the kernel's C++ signature:
/// `block_reduce(const float*, int, float*, float*, int*, int*)`.
#[test]
fn kernels_record_their_parameter_kinds() {
    use k3_backend_simt::ParamKind::{Pointer, Scalar};
    for warp in WARPS {
        let rt = SimtRuntime::new(warp).unwrap();
        let k = rt.kernel(&rt.module(), "block_reduce").unwrap();
        assert_eq!(k.params(), vec![Pointer, Scalar(4), Pointer, Pointer, Pointer, Pointer], "warp {warp}");
        assert_eq!(k.params().iter().map(|p| p.size()).sum::<usize>(), 5 * 8 + 4);
    }
}
