//! Measures the emulator on this machine: launch overhead, a block reduction and GEMMs built
//! from MMA fragments. `cargo run --release -p k3-backend-simt --example timings`
//! (honours K3_SIMT_WORKERS and K3_SIMT_SEED; best of 5 runs for each figure).

use k3_backend_simt::{SimtBuffer, SimtRuntime};
use k3_kernels::{KernelArgs, LaunchConfig, Runtime};
use std::time::Instant;

fn upload<T: bytemuck::Pod>(rt: &SimtRuntime, v: &[T]) -> SimtBuffer {
    let bytes: &[u8] = bytemuck::cast_slice(v);
    let mut b = rt.alloc(bytes.len()).expect("alloc");
    rt.copy_h2d(bytes, &mut b, 0, rt.default_stream()).expect("copy");
    b
}

/// Best-of-5 seconds of `reps` launches.
fn time(rt: &SimtRuntime, name: &str, cfg: LaunchConfig, args: &mut KernelArgs, reps: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: each call below passes the argument types of the named kernel and
            // buffers sized for the launch.
            unsafe { rt.launch_args(name, &cfg, args) }.expect("launch");
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

fn main() -> Result<(), kernel_api::Error> {
    for warp in [32u32, 64] {
        let rt = SimtRuntime::new(warp)?;
        println!(
            "warp {warp}: {} workers, {} switch, asan {}, seed {}",
            k3_backend_simt::worker_count(),
            k3_backend_simt::context_backend(),
            k3_backend_simt::asan_enabled(),
            rt.seed()
        );
        let mut none = KernelArgs::new();
        let t = time(&rt, "empty_kernel", LaunchConfig::new(1, warp, 0), &mut none, 200);
        println!("  empty launch, 1 block x {warp} threads:      {:8.1} us", t * 1e6);
        let t = time(&rt, "empty_kernel", LaunchConfig::new(64, 256, 0), &mut none, 20);
        println!("  empty launch, 64 blocks x 256 threads:  {:8.1} us", t * 1e6);

        let n: usize = 256 * 256;
        let x: Vec<f32> = (0..n).map(|i| (i % 64) as f32 / 8.0 - 4.0).collect();
        let (xb, sums) = (upload(&rt, &x), rt.alloc(256 * 4)?);
        let (total, pos, mx) = (upload(&rt, &[0f32]), upload(&rt, &[0i32]), upload(&rt, &[0i32]));
        let mut a = KernelArgs::new();
        a.push(xb.device_ptr()).push(n as i32).push(sums.device_ptr()).push(total.device_ptr());
        a.push(pos.device_ptr()).push(mx.device_ptr());
        let t = time(&rt, "block_reduce", LaunchConfig::new(256, 256, 0), &mut a, 3);
        println!("  block_reduce, 256 blocks x 256 threads: {:8.2} ms", t * 1e3);

        let mut shapes = vec![("gemm_bf16_mma", if warp == 32 { (16, 8) } else { (16, 16) })];
        if warp == 64 {
            shapes.push(("gemm_bf16_mma_32x32x8", (32, 32)));
        }
        for (kernel, tile) in shapes {
            for (m, nn, k) in [(64usize, 48usize, 96usize), (256, 256, 256)] {
                if m % tile.0 != 0 || nn % tile.1 != 0 {
                    continue;
                }
                let a_bits: Vec<u16> = (0..m * k).map(|i| half::bf16::from_f32((i % 7) as f32 - 3.0).to_bits()).collect();
                let b_bits: Vec<u16> = (0..k * nn).map(|i| half::bf16::from_f32((i % 5) as f32 * 0.5).to_bits()).collect();
                let (ab, bb, bias, cb) = (upload(&rt, &a_bits), upload(&rt, &b_bits), upload(&rt, &vec![0f32; nn]), rt.alloc(m * nn * 4)?);
                let mut a = KernelArgs::new();
                a.push(ab.device_ptr()).push(bb.device_ptr()).push(bias.device_ptr()).push(cb.device_ptr());
                a.push(m as i32).push(nn as i32).push(k as i32);
                let tiles = (m / tile.0) * (nn / tile.1);
                let cfg = LaunchConfig::new(tiles.div_ceil(4) as u32, 4 * warp, 0);
                let t = time(&rt, kernel, cfg, &mut a, 3);
                println!("  {kernel} {m}x{nn}x{k}: {:8.2} ms", t * 1e3);
            }
        }
    }
    Ok(())
}
