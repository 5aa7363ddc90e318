//! The dialect's semantics on the emulator at warp 32 and 64: a block reduction (barriers,
//! shuffles, ballots, atomics), warp shuffles/ballots/reductions against an independent model of
//! CUDA's rules (partial widths and masks included), thread/block indices of 3-D launches,
//! dynamic shared memory, and the bf16/fp8 conversions bit-exact against kernel_api::formats.
mod common;

use common::*;
use k3_kernels::{DevicePtr, KernelArgs, LaunchConfig};
use kernel_api::formats::{bf16, F8E4M3Fn, F8E4M3Fnuz, F8E5M2, Saturation};

fn ptr(b: &k3_backend_simt::SimtBuffer) -> DevicePtr {
    b.device_ptr()
}

#[test]
fn block_reduce_sums_counts_and_maxes_at_both_warp_sizes() {
    for warp in WARPS {
        let rt = rt(warp);
        for (n, block) in [(1000usize, 256u32), (4096, 1024), (77, 64)] {
            let mut g = Lcg(n as u64 * 31 + warp as u64);
            let x: Vec<f32> = (0..n).map(|_| g.eighths(-16, 16)).collect();
            let nblocks = n.div_ceil(block as usize);
            let xb = upload(&rt, &x);
            let sums = alloc::<f32>(&rt, nblocks);
            let total = upload(&rt, &[0.0f32]);
            let pos = upload(&rt, &[0i32]);
            let mx = upload(&rt, &[i32::MIN]);
            let mut a = KernelArgs::new();
            a.push(ptr(&xb)).push(n as i32).push(ptr(&sums)).push(ptr(&total)).push(ptr(&pos)).push(ptr(&mx));
            launch(&rt, "block_reduce", LaunchConfig::new(nblocks as u32, block, 0), &mut a).unwrap();
            // Inputs are multiples of 1/8 below 2^5 in magnitude: every partial sum is exact in
            // f32 whatever the order, so exact equality with an f64 reference is required.
            let got = download::<f32>(&rt, &sums);
            for (bi, chunk) in x.chunks(block as usize).enumerate() {
                let want: f64 = chunk.iter().map(|&v| v as f64).sum();
                assert_eq!(got[bi] as f64, want, "warp {warp} n {n} block {bi}");
            }
            let want_total: f64 = x.iter().map(|&v| v as f64).sum();
            assert_eq!(download::<f32>(&rt, &total)[0] as f64, want_total, "warp {warp} n {n}");
            let want_pos = x.iter().filter(|&&v| v > 0.0).count() as i32;
            assert_eq!(download::<i32>(&rt, &pos)[0], want_pos, "warp {warp} n {n}");
            // Padding lanes contribute int(0.0) = 0 to the max.
            let mut want_max = x.iter().map(|&v| v as i32).max().unwrap();
            if n % block as usize != 0 {
                want_max = want_max.max(0);
            }
            assert_eq!(download::<i32>(&rt, &mx)[0], want_max, "warp {warp} n {n}");
        }
    }
}

const POISON: i32 = 0xDEADBEEFu32 as i32;

/// CUDA's shuffle rules, written from the PTX ISA's shfl.sync pseudo-code (c = segmask/clamp):
/// maxLane/minLane bound the segment of `width` lanes, and an out-of-range source returns the
/// caller's own value.
fn model_source(kind: usize, lane: i64, b: i64, width: i64) -> i64 {
    let seg_start = lane - lane % width; // minLane
    let seg_end = seg_start + width - 1; // maxLane for idx / down / bfly
    let (j, ok) = match kind {
        0 => {
            let j = seg_start + b.rem_euclid(width);
            (j, j <= seg_end)
        }
        1 => {
            let j = lane - b;
            (j, j >= seg_start)
        }
        2 => {
            let j = lane + b;
            (j, j <= seg_end)
        }
        _ => {
            let j = lane ^ b;
            (j, j <= seg_end)
        }
    };
    if ok {
        j
    } else {
        lane
    }
}

#[test]
fn warp_shuffles_ballots_and_reductions_follow_cuda_semantics() {
    for warp in WARPS {
        let rt = rt(warp);
        let w = warp as usize;
        let n = 2 * w; // two warps
        let input: Vec<i32> = (0..n as i32).map(|i| i * 7 - 40 + (i % 3)).collect();
        let inb = upload(&rt, &input);
        let out = alloc::<i32>(&rt, 15 * n);
        let widths: Vec<i32> = [1, 2, 4, 8, 16, 32, 64].into_iter().filter(|&x| x <= warp as i32).collect();
        for &width in &widths {
            for (src, delta, xmask) in [(0, 1, 1), (3, 2, 5), (-1, 7, 31), (37, 0, warp as i32 - 1), (5, 16, 16)] {
                let mut a = KernelArgs::new();
                a.push(ptr(&inb)).push(ptr(&out)).push(src).push(delta).push(xmask).push(width);
                launch(&rt, "warp_semantics", LaunchConfig::new(1, n as u32, 0), &mut a).unwrap();
                let got = download::<i32>(&rt, &out);
                let probe = |p: usize, t: usize| got[p * n + t];
                let ctx = format!("warp {warp} width {width} src {src} delta {delta} xmask {xmask}");
                for t in 0..n {
                    let lane = (t % w) as i64;
                    let base = t - t % w;
                    let val = |l: i64| input[base + l as usize];
                    let wi = width as i64;
                    assert_eq!(probe(0, t), val(model_source(0, lane, src as i64, wi)), "shfl {ctx} t {t}");
                    assert_eq!(probe(1, t), val(model_source(1, lane, delta as i64, wi)), "shfl_up {ctx} t {t}");
                    assert_eq!(probe(2, t), val(model_source(2, lane, delta as i64, wi)), "shfl_down {ctx} t {t}");
                    assert_eq!(probe(3, t), val(model_source(3, lane, xmask as i64, wi)), "shfl_xor {ctx} t {t}");
                    assert_eq!(probe(14, t), val(model_source(0, lane, src as i64, wi)), "float shfl {ctx} t {t}");
                    let warp_vals = &input[base..base + w];
                    let ballot: u64 =
                        warp_vals.iter().enumerate().filter(|(_, v)| *v & 1 != 0).map(|(l, _)| 1u64 << l).sum();
                    assert_eq!(probe(4, t) as u32 as u64 | ((probe(5, t) as u32 as u64) << 32), ballot, "ballot {ctx}");
                    let half = w / 2;
                    let (lo, hi) = if (lane as usize) < half { (0, half) } else { (half, w) };
                    let hb: u64 = (lo..hi).filter(|&l| warp_vals[l] > 0).map(|l| 1u64 << l).sum();
                    assert_eq!(probe(6, t) as u32 as u64 | ((probe(7, t) as u32 as u64) << 32), hb, "half ballot {ctx}");
                    assert_eq!(probe(8, t), warp_vals.iter().sum::<i32>(), "reduce_sum {ctx}");
                    assert_eq!(probe(9, t), *warp_vals.iter().max().unwrap(), "reduce_max {ctx}");
                    assert_eq!(probe(10, t), lane as i32, "lane_id {ctx}");
                    assert_eq!(probe(11, t), (t / w) as i32, "warp_id {ctx}");
                    assert_eq!(probe(12, t), val(lane ^ 1), "64-bit shfl_xor {ctx}");
                    assert_eq!(probe(13, t), POISON, "shuffle from a lane outside the mask {ctx}");
                }
            }
        }
    }
}

#[test]
fn thread_and_block_indices_of_3d_launches() {
    for warp in WARPS {
        let rt = rt(warp);
        let (block, grid) = ((8u32, 4u32, 3u32), (3u32, 2u32, 2u32));
        let threads = (block.0 * block.1 * block.2) as usize;
        let blocks = (grid.0 * grid.1 * grid.2) as usize;
        let out = alloc::<u32>(&rt, threads * blocks * 8);
        let dims = alloc::<u32>(&rt, 6);
        let mut a = KernelArgs::new();
        a.push(ptr(&out)).push(ptr(&dims));
        launch(&rt, "index_probe", LaunchConfig::new(grid, block, 0), &mut a).unwrap();
        assert_eq!(download::<u32>(&rt, &dims), vec![8, 4, 3, 3, 2, 2]);
        let got = download::<u32>(&rt, &out);
        for bz in 0..grid.2 {
            for by in 0..grid.1 {
                for bx in 0..grid.0 {
                    let bl = ((bz * grid.1 + by) * grid.0 + bx) as usize;
                    for tz in 0..block.2 {
                        for ty in 0..block.1 {
                            for tx in 0..block.0 {
                                let tl = ((tz * block.1 + ty) * block.0 + tx) as usize;
                                let o = &got[(bl * threads + tl) * 8..][..8];
                                let want = [tx, ty, tz, bx, by, bz, tl as u32 % warp, tl as u32 / warp];
                                assert_eq!(o, &want, "warp {warp} block {bl} thread {tl}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dynamic_shared_memory_holds_the_launch_bytes() {
    for warp in WARPS {
        let rt = rt(warp);
        let (blocks, block) = (5usize, 128usize);
        let x: Vec<f32> = (0..blocks * block).map(|i| (i % 17) as f32 - 8.0).collect();
        let xb = upload(&rt, &x);
        let out = alloc::<f32>(&rt, blocks);
        let mut a = KernelArgs::new();
        a.push(ptr(&xb)).push(ptr(&out));
        launch(&rt, "dynamic_shared_sum", LaunchConfig::new(blocks as u32, block as u32, (block * 4) as u32), &mut a).unwrap();
        let want: Vec<f32> = x.chunks(block).map(|c| c.iter().sum()).collect();
        assert_eq!(download::<f32>(&rt, &out), want, "warp {warp}");
    }
}

/// f32 inputs that probe every rounding boundary of the formats: all fp8 values and the
/// midpoints between neighbours (plus and minus one ulp), bf16 boundaries, specials, extremes,
/// subnormals, and pseudo-random bit patterns.
fn conversion_inputs() -> Vec<f32> {
    let mut v: Vec<f32> = Vec::new();
    for code in 0u8..=255 {
        for x in [F8E4M3Fn(code).to_f32(), F8E4M3Fnuz(code).to_f32(), F8E5M2(code).to_f32()] {
            v.push(x);
            v.push(f32::from_bits(x.to_bits().wrapping_add(1)));
            v.push(f32::from_bits(x.to_bits().wrapping_sub(1)));
        }
    }
    for flavour in 0..3 {
        let vals: Vec<f32> = (0u8..=127)
            .map(|c| match flavour {
                0 => F8E4M3Fn(c).to_f32(),
                1 => F8E4M3Fnuz(c).to_f32(),
                _ => F8E5M2(c).to_f32(),
            })
            .filter(|x| x.is_finite())
            .collect();
        for pair in vals.windows(2) {
            let mid = ((pair[0] as f64 + pair[1] as f64) / 2.0) as f32;
            for m in [mid, -mid] {
                v.push(m);
                v.push(f32::from_bits(m.to_bits() + 1));
                v.push(f32::from_bits(m.to_bits() - 1));
            }
        }
    }
    for bits in [0u32, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 0x7fbf_ffff, 1, 0x8000_0001,
        0x007f_ffff, 0x0080_0000, 0x7f7f_ffff, 0xff7f_ffff, 0x3f80_8000, 0x3f81_8000, 0x3f80_8001, 0x3f80_7fff, 0x4780_0000]
    {
        v.push(f32::from_bits(bits));
    }
    for x in [448.0f32, 464.0, 465.0, 480.0, 240.0, 248.0, 57344.0, 61440.0, 1e30, -1e30, 2f32.powi(-9), 2f32.powi(-10), 2f32.powi(-11)] {
        v.push(x);
        v.push(-x);
    }
    let mut g = Lcg(12345);
    for _ in 0..20000 {
        v.push(f32::from_bits(g.next_u32()));
    }
    for _ in 0..20000 {
        // Magnitudes around the fp8 ranges.
        let e = (g.next_u32() % 40) as i32 - 22;
        v.push((g.next_u32() as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(e));
    }
    v
}

#[test]
fn conversions_are_bit_exact_against_kernel_api_formats() {
    let x = conversion_inputs();
    let n = x.len();
    for warp in WARPS {
        let rt = rt(warp);
        let xb = upload(&rt, &x);
        let (bfo, e4, e4z, e5) = (alloc::<u16>(&rt, n), alloc::<u8>(&rt, n), alloc::<u8>(&rt, n), alloc::<u8>(&rt, n));
        let mut a = KernelArgs::new();
        a.push(ptr(&xb)).push(n as i32).push(ptr(&bfo)).push(ptr(&e4)).push(ptr(&e4z)).push(ptr(&e5));
        launch(&rt, "convert_from_f32", LaunchConfig::new(16, 256, 0), &mut a).unwrap();
        let (gb, g4, g4z, g5) =
            (download::<u16>(&rt, &bfo), download::<u8>(&rt, &e4), download::<u8>(&rt, &e4z), download::<u8>(&rt, &e5));
        for i in 0..n {
            let v = x[i];
            assert_eq!(gb[i], bf16::from_f32(v).to_bits(), "bf16 of {v:e} ({:#010x})", v.to_bits());
            assert_eq!(g4[i], F8E4M3Fn::from_f32(v, Saturation::Finite).to_bits(), "e4m3fn of {v:e} ({:#010x})", v.to_bits());
            assert_eq!(g4z[i], F8E4M3Fnuz::from_f32(v, Saturation::Finite).to_bits(), "e4m3fnuz of {v:e} ({:#010x})", v.to_bits());
            assert_eq!(g5[i], F8E5M2::from_f32(v, Saturation::Finite).to_bits(), "e5m2 of {v:e} ({:#010x})", v.to_bits());
        }

        // Decoding: all 65536 bf16 patterns, and all 256 fp8 codes in each flavour.
        let m = 65536usize;
        let bits: Vec<u16> = (0..m as u32).map(|b| b as u16).collect();
        let codes: Vec<u8> = (0..m).map(|i| i as u8).collect();
        let (bb, cb) = (upload(&rt, &bits), upload(&rt, &codes));
        let outs: Vec<_> = (0..4).map(|_| alloc::<f32>(&rt, m)).collect();
        let mut a = KernelArgs::new();
        a.push(ptr(&bb)).push(ptr(&cb)).push(m as i32);
        for o in &outs {
            a.push(ptr(o));
        }
        launch(&rt, "convert_to_f32", LaunchConfig::new(32, 256, 0), &mut a).unwrap();
        let got: Vec<Vec<f32>> = outs.iter().map(|o| download::<f32>(&rt, o)).collect();
        for i in 0..m {
            assert_eq!(got[0][i].to_bits(), bf16::from_bits(bits[i]).to_f32().to_bits(), "bf16 {:#06x}", bits[i]);
            let c = codes[i];
            assert_eq!(got[1][i].to_bits(), F8E4M3Fn(c).to_f32().to_bits(), "e4m3fn {c:#04x}");
            assert_eq!(got[2][i].to_bits(), F8E4M3Fnuz(c).to_f32().to_bits(), "e4m3fnuz {c:#04x}");
            assert_eq!(got[3][i].to_bits(), F8E5M2(c).to_f32().to_bits(), "e5m2 {c:#04x}");
        }
    }
}

/// The packed conversions of k3/convert_hw.h as the emulator runs them (the reference their
/// hardware forms are held to): bit-exact with kernel_api::formats for every non-NaN input,
/// a NaN for a NaN (the bits of a NaN are the target's; see the header).
#[test]
fn packed_hardware_conversions_are_bit_exact_on_non_nan_inputs() {
    use kernel_api::formats::f16;
    let same = |got: u16, want: u16, nan: bool, what: &str| {
        if nan {
            assert!(bf16::from_bits(got).is_nan(), "{what}: {got:#06x} is not a NaN");
        } else {
            assert_eq!(got, want, "{what}");
        }
    };
    for warp in WARPS {
        let rt = rt(warp);
        // bf16x2 packing: every conversion input as the low element, paired with its negation
        // (the high element), both rounded independently.
        let x = conversion_inputs();
        let pairs: Vec<f32> = x.iter().flat_map(|&v| [v, -v]).collect();
        let n = x.len();
        let (xb, ob) = (upload(&rt, &pairs), alloc::<u32>(&rt, n));
        let mut a = KernelArgs::new();
        a.push(ptr(&xb)).push(n as i32).push(ptr(&ob));
        launch(&rt, "convert_hw_pack_bf16x2", LaunchConfig::new(16, 256, 0), &mut a).unwrap();
        let got = download::<u32>(&rt, &ob);
        for i in 0..n {
            let (lo, hi) = (pairs[2 * i], pairs[2 * i + 1]);
            let what = format!("warp {warp} pack_bf16x2_rn({lo:e}, {hi:e})");
            same(got[i] as u16, bf16::from_f32(lo).to_bits(), lo.is_nan(), &what);
            same((got[i] >> 16) as u16, bf16::from_f32(hi).to_bits(), hi.is_nan(), &what);
        }

        // fp8 pairs: all 65536 in each flavour.
        let m = 65536usize;
        let (fb, bb, hb) = (alloc::<f32>(&rt, 3 * 2 * m), alloc::<u32>(&rt, 3 * m), alloc::<u32>(&rt, 3 * m));
        let mut a = KernelArgs::new();
        a.push(ptr(&fb)).push(ptr(&bb)).push(ptr(&hb));
        launch(&rt, "convert_hw_fp8_pairs", LaunchConfig::new(32, 256, 0), &mut a).unwrap();
        let (gf, gb, gh) = (download::<f32>(&rt, &fb), download::<u32>(&rt, &bb), download::<u32>(&rt, &hb));
        let decode = |f: usize, c: u8| match f {
            0 => F8E4M3Fn(c).to_f32(),
            1 => F8E4M3Fnuz(c).to_f32(),
            _ => F8E5M2(c).to_f32(),
        };
        for f in 0..3 {
            for c in 0..m {
                for (half, code) in [(0usize, c as u8), (1, (c >> 8) as u8)] {
                    let want = decode(f, code);
                    let what = format!("warp {warp} flavour {f} pair {c:#06x} element {half}");
                    let g = gf[(f * m + c) * 2 + half];
                    if want.is_nan() {
                        assert!(g.is_nan(), "{what}: f32 {g} is not a NaN");
                    } else {
                        assert_eq!(g.to_bits(), want.to_bits(), "{what}: f32");
                    }
                    same((gb[f * m + c] >> (16 * half)) as u16, bf16::from_f32(want).to_bits(), want.is_nan(), &format!("{what}: bf16"));
                    let h = (gh[f * m + c] >> (16 * half)) as u16;
                    if want.is_nan() {
                        assert!(f16::from_bits(h).is_nan(), "{what}: f16 {h:#06x} is not a NaN");
                    } else {
                        assert_eq!(h, f16::from_f32(want).to_bits(), "{what}: f16");
                        assert_eq!(f16::from_bits(h).to_f32().to_bits(), want.to_bits(), "{what}: f16 is exact");
                    }
                }
            }
        }

        // fp4 pairs: all 256 bytes (cvt.rn.f16x2.e2m1x2's input space; low nibble = element 0).
        let eb = alloc::<f32>(&rt, 2 * 256);
        let mut a = KernelArgs::new();
        a.push(ptr(&eb));
        launch(&rt, "convert_hw_e2m1_pairs", LaunchConfig::new(1, 128, 0), &mut a).unwrap();
        let ge = download::<f32>(&rt, &eb);
        for c in 0..256usize {
            let (lo, hi) = kernel_api::formats::F4E2M1x2(c as u8).to_f32x2();
            assert_eq!(ge[2 * c].to_bits(), lo.to_bits(), "warp {warp} e2m1 pair {c:#04x} element 0");
            assert_eq!(ge[2 * c + 1].to_bits(), hi.to_bits(), "warp {warp} e2m1 pair {c:#04x} element 1");
        }
    }
}

/// k3::byte_perm (k3/convert_hw.h) as PTX's prmt defines its default mode: result byte i is byte
/// (sel >> 4i) & 7 of the pool {lo, hi}. Every one of the 4096 selectors with nibbles 0..7 (and
/// garbage above bit 15, which prmt ignores) on varied pools; a nibble past 7 traps.
#[test]
fn byte_perm_follows_the_prmt_default_mode() {
    let prmt = |lo: u32, hi: u32, sel: u32| -> u32 {
        let pool = (u64::from(hi) << 32) | u64::from(lo);
        (0..4).map(|i| (((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) as u32) << (8 * i)).sum()
    };
    let mut args = Vec::new();
    let mut x = 0x9e37_79b9u32;
    for sel in 0..4096u32 {
        let nibbles = (sel & 7) | ((sel >> 3 & 7) << 4) | ((sel >> 6 & 7) << 8) | ((sel >> 9 & 7) << 12);
        x = x.wrapping_mul(0x0101_0101).wrapping_add(0x7f4a_7c15);
        args.extend([x, x.rotate_left(13) ^ 0xa5a5_5a5a, nibbles | (x & 0xffff_0000)]);
    }
    let n = args.len() / 3;
    for warp in WARPS {
        let rt = rt(warp);
        let (ib, ob) = (upload(&rt, &args), alloc::<u32>(&rt, n));
        let mut a = KernelArgs::new();
        a.push(ptr(&ib)).push(n as i32).push(ptr(&ob));
        launch(&rt, "convert_hw_byte_perm", LaunchConfig::new(4, 256, 0), &mut a).unwrap();
        let got = download::<u32>(&rt, &ob);
        for i in 0..n {
            let (lo, hi, sel) = (args[3 * i], args[3 * i + 1], args[3 * i + 2]);
            assert_eq!(got[i], prmt(lo, hi, sel), "warp {warp} byte_perm({lo:#010x}, {hi:#010x}, {sel:#06x})");
        }
        let bad = [1u32, 2, 0x0000_8000];
        let (ib, ob) = (upload(&rt, &bad), alloc::<u32>(&rt, 1));
        let mut a = KernelArgs::new();
        a.push(ptr(&ib)).push(1i32).push(ptr(&ob));
        let e = launch(&rt, "convert_hw_byte_perm", LaunchConfig::new(1, 32, 0), &mut a).unwrap_err().to_string();
        assert!(e.contains("selector nibble past 7"), "warp {warp}: {e}");
    }
}

/// The MoE GEMM's in-register MXFP4 decode (csrc/ops/moe_mxfp4.cuh) in both forms: the e2m1
/// magnitudes' f32 bytes by table lookups (k3::byte_perm), and k3::e2m1_x2_to_f32 (the form
/// sm_100a/103a take with their hardware convert), each times the E8M0 scale with the bf16 pair
/// as high halves, against kernel_api::formats::Mxfp4Block::dequantize rounded to bf16, for every
/// code byte under every scale byte: bit for bit (a NaN for the NaN scale 255).
#[test]
fn moe_mxfp4_register_decode_is_bit_exact() {
    use kernel_api::formats::{F4E2M1x2, Mxfp4Block, E8M0};
    for warp in WARPS {
        let rt = rt(warp);
        let (ob, cb) = (alloc::<u32>(&rt, 256 * 16 * 16), alloc::<u32>(&rt, 256 * 16 * 16));
        let mut a = KernelArgs::new();
        a.push(ptr(&ob)).push(ptr(&cb));
        launch(&rt, "moe_mxfp4_decode_all", LaunchConfig::new(8, 128, 0), &mut a).unwrap();
        let (table, cvt) = (download::<u32>(&rt, &ob), download::<u32>(&rt, &cb));
        for s in 0..256usize {
            for c in 0..16usize {
                let codes: [F4E2M1x2; 16] = std::array::from_fn(|j| F4E2M1x2((16 * c + j) as u8));
                let want = Mxfp4Block { codes, scale: E8M0(s as u8) }.dequantize();
                for (el, &v) in want.iter().enumerate() {
                    for (path, got) in [("table", &table), ("cvt", &cvt)] {
                        let word = got[(s * 16 + c) * 16 + el / 2];
                        let g = (word >> (16 * (el % 2))) as u16;
                        let what = format!("warp {warp} {path} scale {s} byte {} element {}", 16 * c + el / 2, el % 2);
                        if v.is_nan() {
                            assert!(bf16::from_bits(g).is_nan(), "{what}: {g:#06x} is not a NaN");
                        } else {
                            assert_eq!(g, bf16::from_f32(v).to_bits(), "{what}: {v:e}");
                        }
                    }
                }
            }
        }
    }
}
