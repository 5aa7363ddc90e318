//! Warp-level matrix fragments: the emulator's lane/slot lookup tables are bijections onto each
//! operand and agree with the worked examples of the fragment-layout reference, and a bf16 GEMM
//! built only from MMA fragments matches an f64 reference (K-scaled bound) and, bit for bit, the
//! emulator's documented f32 summation order, at warp 32 (16x8x16) and warp 64 (16x16x16 and
//! 32x32x8).
mod common;

use common::*;
use half::bf16;
use k3_backend_simt::{mma_layout, MmaOperand, MmaShape};
use k3_kernels::{KernelArgs, LaunchConfig, Runtime};

const SHAPES: [MmaShape; 3] = [MmaShape::M16N8K16, MmaShape::M32N32K8, MmaShape::M16N16K16];

fn operand_dims(shape: MmaShape, op: MmaOperand) -> (usize, usize) {
    let (m, n, k, _) = shape.dims();
    match op {
        MmaOperand::A => (m, k),
        MmaOperand::B => (k, n),
        MmaOperand::C => (m, n),
    }
}

#[test]
fn fragment_tables_are_bijections_onto_each_operand() {
    for shape in SHAPES {
        let (_, _, _, warp) = shape.dims();
        for op in [MmaOperand::A, MmaOperand::B, MmaOperand::C] {
            let (rows, cols) = operand_dims(shape, op);
            let slots = rows * cols / warp as usize;
            let mut seen = vec![0u32; rows * cols];
            for lane in 0..warp as usize {
                for slot in 0..slots {
                    let (r, c) = mma_layout(shape, op, lane, slot).expect("slot in range");
                    assert!(r < rows && c < cols, "{shape:?} {op:?} lane {lane} slot {slot} -> ({r},{c})");
                    seen[r * cols + c] += 1;
                }
                assert!(mma_layout(shape, op, lane, slots).is_none(), "{shape:?} {op:?} has only {slots} slots");
            }
            assert!(seen.iter().all(|&n| n == 1), "{shape:?} {op:?} is not a bijection: {seen:?}");
            assert!(mma_layout(shape, op, warp as usize, 0).is_none());
        }
    }
}

#[test]
fn fragment_tables_match_the_reference_worked_examples() {
    use MmaOperand::*;
    use MmaShape::*;
    // shared/reference/matrix-fragments.md, sections 1.3 and 3.3.
    type Case = (MmaShape, MmaOperand, usize, usize, (usize, usize));
    let cases: &[Case] = &[
        (M16N8K16, C, 5, 2, (9, 2)),
        (M16N8K16, A, 5, 3, (9, 3)),
        (M16N8K16, B, 5, 2, (10, 1)),
        (M16N8K16, C, 9, 3, (10, 3)),
        (M16N8K16, A, 21, 7, (13, 11)),
        (M32N32K8, A, 37, 2, (5, 6)),
        (M32N32K8, B, 37, 3, (7, 5)),
        (M32N32K8, C, 37, 6, (14, 5)),
        (M32N32K8, C, 5, 2, (2, 5)),
        (M16N16K16, A, 37, 1, (5, 9)),
        (M16N16K16, C, 37, 2, (10, 5)),
        (M16N16K16, C, 5, 2, (2, 5)),
    ];
    for &(shape, op, lane, slot, want) in cases {
        assert_eq!(mma_layout(shape, op, lane, slot), Some(want), "{shape:?} {op:?} lane {lane} slot {slot}");
    }
}

/// The inverse maps (element -> lane, slot) of the reference, written independently of the
/// forward formulas the emulator uses.
fn reference_inverse(shape: MmaShape, op: MmaOperand, r: usize, c: usize) -> (usize, usize) {
    use MmaOperand::*;
    match (shape, op) {
        (MmaShape::M16N8K16, A) => (4 * (r % 8) + (c % 8) / 2, (c % 2) + 2 * (r / 8) + 4 * (c / 8)),
        (MmaShape::M16N8K16, B) => (4 * c + (r % 8) / 2, (r % 2) + 2 * (r / 8)),
        (MmaShape::M16N8K16, C) => (4 * (r % 8) + c / 2, (c % 2) + 2 * (r / 8)),
        (s, A) => {
            let (m, _, k, _) = s.dims();
            let kpl = m * k / 64;
            (r + m * (c / kpl), c % kpl)
        }
        (s, B) => {
            let (_, n, k, _) = s.dims();
            let kpl = n * k / 64;
            (c + n * (r / kpl), r % kpl)
        }
        (MmaShape::M32N32K8, C) => (c + 32 * ((r / 4) % 2), 4 * (r / 8) + (r % 4)),
        (MmaShape::M16N16K16, C) => (c + 16 * (r / 4), r % 4),
    }
}

#[test]
fn fragment_tables_invert_the_reference_inverse_maps() {
    for shape in SHAPES {
        for op in [MmaOperand::A, MmaOperand::B, MmaOperand::C] {
            let (rows, cols) = operand_dims(shape, op);
            for r in 0..rows {
                for c in 0..cols {
                    let (lane, slot) = reference_inverse(shape, op, r, c);
                    assert_eq!(mma_layout(shape, op, lane, slot), Some((r, c)), "{shape:?} {op:?} element ({r},{c})");
                }
            }
        }
    }
}

struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<u16>,
    b: Vec<u16>,
    bias: Vec<f32>,
}

impl Gemm {
    fn new(m: usize, n: usize, k: usize, seed: u64) -> Self {
        let mut g = Lcg(seed);
        let mut r = |s: f32| bf16::from_f32((g.next_u32() as f32 / u32::MAX as f32 - 0.5) * s).to_bits();
        let a = (0..m * k).map(|_| r(4.0)).collect();
        let b = (0..k * n).map(|_| r(2.0)).collect();
        let bias = (0..n).map(|j| j as f32 * 0.25 - 3.0).collect();
        Gemm { m, n, k, a, b, bias }
    }
    fn av(&self, i: usize, kk: usize) -> f32 {
        bf16::from_bits(self.a[i * self.k + kk]).to_f32()
    }
    fn bv(&self, kk: usize, j: usize) -> f32 {
        bf16::from_bits(self.b[kk * self.n + j]).to_f32()
    }
}

fn run_gemm(warp: u32, kernel: &str, tile: (usize, usize), g: &Gemm) -> Vec<f32> {
    let rt = rt(warp);
    let (ab, bb, biasb) = (upload(&rt, &g.a), upload(&rt, &g.b), upload(&rt, &g.bias));
    let cb = alloc::<f32>(&rt, g.m * g.n);
    let tiles = (g.m / tile.0) * (g.n / tile.1);
    let warps_per_block = 4;
    let blocks = tiles.div_ceil(warps_per_block) as u32;
    let mut args = KernelArgs::new();
    args.push(ab.device_ptr()).push(bb.device_ptr()).push(biasb.device_ptr()).push(cb.device_ptr());
    args.push(g.m as i32).push(g.n as i32).push(g.k as i32);
    launch(&rt, kernel, LaunchConfig::new(blocks, warp * warps_per_block as u32, 0), &mut args).unwrap();
    let c = download::<f32>(&rt, &cb);
    rt.free(cb).unwrap();
    c
}

fn check_gemm(g: &Gemm, c: &[f32], what: &str) {
    for i in 0..g.m {
        for j in 0..g.n {
            // f64 reference; products of bf16 are exact in f32, so the only error is f32
            // rounding of the running sum: at most k * 2^-24 * sum|a*b| (+ the bias add).
            let (mut exact, mut mag) = (0f64, 0f64);
            // The emulator's documented order: each MMA adds its K products to C in
            // ascending k, and the accumulator carries across K steps: a sequential f32 sum.
            let mut seq = 0f32;
            for kk in 0..g.k {
                let p = g.av(i, kk) as f64 * g.bv(kk, j) as f64;
                exact += p;
                mag += p.abs();
                seq += g.av(i, kk) * g.bv(kk, j);
            }
            exact += g.bias[j] as f64;
            let bound = (g.k as f64 + 1.0) * 2f64.powi(-24) * (mag + g.bias[j].abs() as f64) + 1e-30;
            let got = c[i * g.n + j];
            assert!((got as f64 - exact).abs() <= bound, "{what}: C[{i}][{j}] = {got}, f64 reference {exact}, bound {bound}");
            assert_eq!(got.to_bits(), (seq + g.bias[j]).to_bits(), "{what}: C[{i}][{j}] differs from the sequential f32 sum");
        }
    }
}

#[test]
fn gemm_from_mma_fragments_at_warp_32() {
    let g = Gemm::new(64, 48, 96, 7);
    check_gemm(&g, &run_gemm(32, "gemm_bf16_mma", (16, 8), &g), "warp 32 m16n8k16");
}

#[test]
fn gemm_from_mma_fragments_at_warp_64() {
    let g = Gemm::new(64, 48, 96, 8);
    check_gemm(&g, &run_gemm(64, "gemm_bf16_mma", (16, 16), &g), "warp 64 16x16x16");
    let g = Gemm::new(64, 64, 40, 9);
    check_gemm(&g, &run_gemm(64, "gemm_bf16_mma_32x32x8", (32, 32), &g), "warp 64 32x32x8");
}

#[test]
fn mma_shapes_exist_only_at_their_warp_size() {
    // The 32x32x8 MFMA kernel is compiled for warp 64 only (#if K3_WARP_SIZE == 64).
    let rt32 = rt(32);
    assert!(rt32.kernel(&rt32.module(), "gemm_bf16_mma_32x32x8").is_err());
    let rt64 = rt(64);
    assert!(rt64.kernel(&rt64.module(), "gemm_bf16_mma_32x32x8").is_ok());
}

/// What `ldmatrix_fragments` (kernels/csrc/tests/ldmatrix.cu) stages: a 16 x 24 tile of u16.
const LDSM_ROWS: usize = 16;
const LDSM_COLS: usize = 24;

fn run_ldmatrix(tile: &[u16], mode: i32) -> kernel_api::Result<Vec<u32>> {
    let rt = rt(32);
    let tb = upload(&rt, tile);
    let ob = alloc::<u32>(&rt, 32 * 32);
    let mut a = KernelArgs::new();
    a.push(tb.device_ptr()).push(ob.device_ptr()).push(mode);
    launch(&rt, "ldmatrix_fragments", LaunchConfig::new(1, 32, 0), &mut a)?;
    Ok(download::<u32>(&rt, &ob))
}

/// ldmatrix as the PTX ISA documents it: lane l addresses row l % 8 of matrix l / 8; lane l
/// receives, in register i, matrix i's (row l / 4, columns 2 (l % 4), +1), or with .trans
/// (rows 2 (l % 4), +1, column l / 4), the lower-numbered element in the low half. The *_ldsm
/// fragment loads give the same slots as the per-slot loads (and load_a the m16n8k16 A layout).
#[test]
fn ldmatrix_matches_the_ptx_semantics_and_the_fragment_loads() {
    let mut g = Lcg(0x1d5a);
    let tile: Vec<u16> = (0..LDSM_ROWS * LDSM_COLS).map(|_| g.next_u32() as u16).collect();
    let out = run_ldmatrix(&tile, 0).expect("launch");
    let t = |r: usize, c: usize| tile[r * LDSM_COLS + c] as u32;
    // Element (row j, column c) of matrix i: from the row address lane 8 i + j gave.
    let m = |i: usize, j: usize, c: usize| {
        let l = 8 * i + j;
        t((5 * l + 3) % LDSM_ROWS, 8 * ((l >> 3) & 1) + c)
    };
    for l in 0..32 {
        let o = &out[l * 32..l * 32 + 32];
        let plain = |i: usize| m(i, l / 4, 2 * (l % 4)) | m(i, l / 4, 2 * (l % 4) + 1) << 16;
        let trans = |i: usize| m(i, 2 * (l % 4), l / 4) | m(i, 2 * (l % 4) + 1, l / 4) << 16;
        for i in 0..4 {
            assert_eq!(o[i], plain(i), "lane {l}: x4 register {i}");
            assert_eq!(o[4 + i], trans(i), "lane {l}: x4.trans register {i}");
        }
        for i in 0..2 {
            assert_eq!(o[8 + i], plain(i), "lane {l}: x2 register {i}");
            assert_eq!(o[10 + i], trans(i), "lane {l}: x2.trans register {i}");
        }
        assert_eq!((o[12], o[13]), (plain(0), trans(0)), "lane {l}: x1, x1.trans");
        // load_a: slot s of the m16n8k16 A fragment, A = tile columns 8..23.
        for s in 0..8 {
            let (r, c) = mma_layout(MmaShape::M16N8K16, MmaOperand::A, l, s).expect("slot");
            assert_eq!((o[14 + s / 2] >> (16 * (s % 2))) & 0xffff, t(r, 8 + c), "lane {l}: load_a slot {s}");
        }
        assert_eq!(o[18..22], o[14..18], "lane {l}: load_a_ldsm vs load_a");
        assert_eq!(o[24..26], o[22..24], "lane {l}: load_b_ldsm vs load_b");
        assert_eq!(o[28..30], o[26..28], "lane {l}: load_b_transposed_ldsm vs load_b_transposed");
    }
}

#[test]
fn ldmatrix_traps_on_a_row_off_a_16_byte_boundary() {
    let tile = vec![0u16; LDSM_ROWS * LDSM_COLS];
    let e = run_ldmatrix(&tile, 1).unwrap_err().to_string();
    assert!(e.contains("16-byte boundary"), "{e}");
}
