//! Copy bandwidth and launch latency of CUDA device 0, timed with device events, printed as one
//! JSON object (what scripts/gpu-check.sh records in its report).
//!
//! ```sh
//! cargo run -p k3-backend-cuda --release --example copy_bandwidth -- [MiB per copy, default 1024] [iterations, default 20]
//! ```
//!
//! - `d2d_copy_gbs`: bytes copied per second by cuMemcpyDtoDAsync (each byte is read once and
//!   written once, so the memory traffic is twice this: `d2d_traffic_gbs`);
//! - `h2d_gbs` / `d2h_gbs`: from and to pageable host memory (what `copy_h2d` / `copy_d2h`
//!   do), a lower bound of what pinned memory reaches;
//! - `launch_us`: mean time per launch of an empty kernel, 1000 back to back on one stream.
//!
//! Exits with status 2 and `{"error": ...}` when no device answers.

use k3_backend_cuda::{CudaRuntime, KernelSet};
use k3_kernels::{LaunchConfig, Runtime};
use kernel_api::Result;

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|a| a.parse().ok()).filter(|&v| v > 0).unwrap_or(default)
}

fn time_ms(rt: &CudaRuntime, mut work: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = rt.default_stream();
    let (a, b) = (rt.create_event()?, rt.create_event()?);
    work()?; // warm-up (first-touch, lazy module setup)
    rt.synchronize_stream(s)?;
    rt.record_event(&a, s)?;
    work()?;
    rt.record_event(&b, s)?;
    Ok(rt.elapsed_ms(&a, &b)? as f64)
}

fn run() -> Result<String> {
    let rt = CudaRuntime::new(0)?;
    let mib = arg(1, 1024);
    let iters = arg(2, 20);
    let bytes = mib << 20;
    let s = rt.default_stream();
    let src = rt.alloc(bytes)?;
    let mut dst = rt.alloc(bytes)?;
    let d2d_ms = time_ms(&rt, || {
        for _ in 0..iters {
            rt.copy_d2d(&src, 0, &mut dst, 0, bytes, s)?;
        }
        Ok(())
    })?;
    let host = vec![1u8; bytes.min(256 << 20)];
    let h2d_ms = time_ms(&rt, || rt.copy_h2d(&host, &mut dst, 0, s))?;
    let mut back = vec![0u8; host.len()];
    // copy_d2h waits for its copy, so the end event is recorded after it finished.
    let d2h_ms = time_ms(&rt, || rt.copy_d2h(&src, 0, &mut back, s))?;

    let launches = 1000;
    let launch_us = match rt.kernels(KernelSet::Tests).and_then(|m| rt.kernel(&m, "empty_kernel")) {
        Ok(k) => {
            let ms = time_ms(&rt, || {
                for _ in 0..launches {
                    // SAFETY: empty_kernel takes no parameters and touches no memory.
                    unsafe { rt.launch(&k, &LaunchConfig::new(1, 32, 0), &[], s)? };
                }
                Ok(())
            })?;
            format!("{:.3}", ms * 1e3 / launches as f64)
        }
        Err(e) => format!("null, \"launch_error\": {:?}", e.to_string()),
    };
    let gbs = |b: usize, n: usize, ms: f64| (b as f64 * n as f64) / (ms * 1e-3) / 1e9;
    Ok(format!(
        "{{\"device\": {:?}, \"arch\": {:?}, \"bytes_per_copy\": {bytes}, \"iterations\": {iters}, \
         \"d2d_copy_gbs\": {:.1}, \"d2d_traffic_gbs\": {:.1}, \"h2d_gbs\": {:.1}, \"d2h_gbs\": {:.1}, \"launch_us\": {launch_us}, \
         \"summary\": {:?}}}",
        rt.device_info().name,
        rt.device_info().arch,
        gbs(bytes, iters, d2d_ms),
        2.0 * gbs(bytes, iters, d2d_ms),
        gbs(host.len(), 1, h2d_ms),
        gbs(back.len(), 1, d2h_ms),
        rt.summary(),
    ))
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(json) => {
            println!("{json}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{{\"error\": {:?}}}", e.to_string());
            std::process::ExitCode::from(2)
        }
    }
}
