//! Seeded schedules: seed 0 (ascending order, 0xFF shared fill) hides a missing barrier; seeds
//! 1..3 (shuffled resume order, random shared fill) expose it with a different result per seed,
//! while correct kernels give bit-identical results at every seed.
mod common;

use common::*;
use k3_backend_simt::SimtRuntime;
use k3_kernels::{KernelArgs, LaunchConfig};

fn adjacent_diff(rt: &SimtRuntime, kernel: &str, x: &[f32], block: u32) -> Vec<f32> {
    let xb = upload(rt, x);
    let y = alloc::<f32>(rt, x.len());
    let mut a = KernelArgs::new();
    a.push(xb.device_ptr()).push(y.device_ptr());
    launch(rt, kernel, LaunchConfig::new(x.len() as u32 / block, block, 0), &mut a).unwrap();
    download::<f32>(rt, &y)
}

fn reference(x: &[f32], block: usize) -> Vec<f32> {
    (0..x.len()).map(|i| x[i] - if i % block == 0 { 0.0 } else { x[i - 1] }).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn seeds_expose_a_missing_barrier_that_seed_0_hides() {
    for warp in WARPS {
        let block = 256u32;
        let x: Vec<f32> = (0..8 * block as usize).map(|i| ((i * 37) % 101) as f32).collect();
        let want = reference(&x, block as usize);
        let rt0 = SimtRuntime::new(warp).unwrap().with_seed(0);
        assert_eq!(bits(&adjacent_diff(&rt0, "adjacent_diff_missing_barrier", &x, block)), bits(&want), "warp {warp}: seed 0");
        let mut seen: Vec<Vec<u32>> = Vec::new();
        for seed in 1..=3 {
            let rt = SimtRuntime::new(warp).unwrap().with_seed(seed);
            let got = bits(&adjacent_diff(&rt, "adjacent_diff_missing_barrier", &x, block));
            let wrong = got.iter().zip(bits(&want)).filter(|(g, w)| **g != *w).count();
            assert!(wrong > x.len() / 10, "warp {warp} seed {seed}: only {wrong} wrong elements");
            assert!(!seen.contains(&got), "warp {warp} seed {seed}: same result as an earlier seed");
            // Reproducible per seed.
            assert_eq!(got, bits(&adjacent_diff(&rt, "adjacent_diff_missing_barrier", &x, block)), "warp {warp} seed {seed}");
            seen.push(got);
        }
    }
}

#[test]
fn correct_kernels_are_bit_identical_across_seeds() {
    for warp in WARPS {
        let block = 128u32;
        let x: Vec<f32> = (0..4 * block as usize).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut base: Option<(Vec<u32>, Vec<u32>, Vec<i32>)> = None;
        for seed in 0..=3 {
            let rt = SimtRuntime::new(warp).unwrap().with_seed(seed);
            let diff = bits(&adjacent_diff(&rt, "adjacent_diff_synced", &x, block));
            assert_eq!(diff, bits(&reference(&x, block as usize)), "warp {warp} seed {seed}");
            // A reduction with barriers, shuffles, ballots and atomics.
            let n = 3000usize;
            let mut g = Lcg(99);
            let xs: Vec<f32> = (0..n).map(|_| g.eighths(-4, 4)).collect();
            let nb = n.div_ceil(256);
            let (xb, sums, total, pos, mx) =
                (upload(&rt, &xs), alloc::<f32>(&rt, nb), upload(&rt, &[0f32]), upload(&rt, &[0i32]), upload(&rt, &[i32::MIN]));
            let mut a = KernelArgs::new();
            a.push(xb.device_ptr()).push(n as i32).push(sums.device_ptr()).push(total.device_ptr());
            a.push(pos.device_ptr()).push(mx.device_ptr());
            launch(&rt, "block_reduce", LaunchConfig::new(nb as u32, 256, 0), &mut a).unwrap();
            let mut ints = download::<i32>(&rt, &pos);
            ints.extend(download::<i32>(&rt, &mx));
            let mut sumbits = bits(&download::<f32>(&rt, &sums));
            sumbits.extend(bits(&download::<f32>(&rt, &total)));
            // A GEMM from MMA fragments.
            let (m, nn, k) = (32usize, 32usize, 32usize);
            let a_bits: Vec<u16> = (0..m * k).map(|i| half::bf16::from_f32((i % 13) as f32 - 6.0).to_bits()).collect();
            let b_bits: Vec<u16> = (0..k * nn).map(|i| half::bf16::from_f32(((i * 7) % 11) as f32 * 0.125).to_bits()).collect();
            let bias = vec![0.5f32; nn];
            let (ab, bb, biasb, cb) = (upload(&rt, &a_bits), upload(&rt, &b_bits), upload(&rt, &bias), alloc::<f32>(&rt, m * nn));
            let mut a = KernelArgs::new();
            a.push(ab.device_ptr()).push(bb.device_ptr()).push(biasb.device_ptr()).push(cb.device_ptr());
            a.push(m as i32).push(nn as i32).push(k as i32);
            launch(&rt, "gemm_bf16_mma", LaunchConfig::new(2, 4 * warp, 0), &mut a).unwrap();
            sumbits.extend(bits(&download::<f32>(&rt, &cb)));
            match &base {
                None => base = Some((diff, sumbits, ints)),
                Some(b) => assert_eq!((&b.0, &b.1, &b.2), (&diff, &sumbits, &ints), "warp {warp} seed {seed} differs from seed 0"),
            }
        }
    }
}

#[test]
fn uninitialized_shared_memory_reads_poison_or_seeded_bytes() {
    for warp in WARPS {
        let read = |seed: u64| {
            let rt = SimtRuntime::new(warp).unwrap().with_seed(seed);
            let out = alloc::<u32>(&rt, 2 * 256);
            let mut a = KernelArgs::new();
            a.push(out.device_ptr());
            launch(&rt, "read_uninitialized_shared", LaunchConfig::new(2, 256, 0), &mut a).unwrap();
            download::<u32>(&rt, &out)
        };
        assert!(read(0).iter().all(|&v| v == 0xFFFF_FFFF), "warp {warp}: seed 0 fills shared memory with 0xFF");
        let (r1, r2) = (read(1), read(2));
        assert_ne!(r1, r2, "warp {warp}: different seeds, different fill");
        assert_eq!(r1, read(1), "warp {warp}: the fill is reproducible per seed");
        assert!(r1.iter().filter(|&&v| v == 0xFFFF_FFFF).count() < 4, "warp {warp}: seeded fill is random");
    }
}
