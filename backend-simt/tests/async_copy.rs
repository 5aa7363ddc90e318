//! k3/async_copy.h on the emulator (kernels/csrc/tests/async_copy.cu): a two-group pipeline
//! lands every chunk (and the zero fills) where the waits say, and a missing wait is visible,
//! since the emulator defers each copy to the wait that retires its group.
mod common;

use common::*;
use k3_kernels::{KernelArgs, LaunchConfig};

const SENTINEL: u32 = 0xabab_abab;

fn run(warp: u32, threads: usize, mode: i32) -> (Vec<u32>, Vec<u32>) {
    let rt = rt(warp);
    let src: Vec<u32> = (0..2 * threads * 4).map(|i| 0x1000_0000 + i as u32).collect();
    let sb = upload(&rt, &src);
    let ob = alloc::<u32>(&rt, 2 * threads * 4);
    let mut a = KernelArgs::new();
    a.push(sb.device_ptr()).push(ob.device_ptr()).push(mode);
    launch(&rt, "async_copy_pipeline", LaunchConfig::new(1, threads as u32, 0), &mut a).unwrap();
    (src, download::<u32>(&rt, &ob))
}

/// What thread t reads from stage s: its neighbour's chunk, or zeros where the neighbour
/// zero-filled.
fn expected(src: &[u32], threads: usize, s: usize, t: usize) -> [u32; 4] {
    let from = (t + 1) % threads;
    if from % 3 == 2 {
        return [0; 4];
    }
    let i = (s * threads + from) * 4;
    [src[i], src[i + 1], src[i + 2], src[i + 3]]
}

#[test]
fn waited_groups_land_and_zero_fills_are_zero() {
    for warp in WARPS {
        for threads in [warp as usize, 256] {
            let (src, out) = run(warp, threads, 0);
            for s in 0..2 {
                for t in 0..threads {
                    let i = (s * threads + t) * 4;
                    assert_eq!(out[i..i + 4], expected(&src, threads, s, t), "warp {warp} threads {threads} stage {s} thread {t}");
                }
            }
        }
    }
}

#[test]
fn a_missing_wait_reads_stale_shared_memory() {
    for warp in WARPS {
        let threads = 128;
        let (src, out) = run(warp, threads, 1);
        // Stage 0 was read after wait<2> with two groups committed: nothing had landed.
        assert!(out[..threads * 4].iter().all(|&w| w == SENTINEL), "warp {warp}: stage 0 must still be the sentinel");
        // Stage 1 after wait<0>: everything landed.
        for t in 0..threads {
            let i = (threads + t) * 4;
            assert_eq!(out[i..i + 4], expected(&src, threads, 1, t), "warp {warp} thread {t}");
        }
    }
}
