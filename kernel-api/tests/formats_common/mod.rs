//! Shared pieces of the format tests (`formats.rs`, `formats_props.rs`): each element format
//! paired with its `microfloat` oracle, the expected encodings (the oracle plus the documented
//! differences of our spec), and the input sets that cover every rounding case.
#![allow(dead_code)]

use kernel_api::conformance::TestRng;
use kernel_api::formats::{F8E4M3Fn, F8E4M3Fnuz, Saturation, F4E2M1, F8E5M2};

/// One element format: our codec and the oracle's, as plain functions over codes.
#[derive(Clone, Copy)]
pub struct Flavour {
    pub name: &'static str,
    /// Number of codes (256 for fp8, 16 for E2M1).
    pub codes: u32,
    pub ours_dec: fn(u8) -> f32,
    pub ours_enc: fn(f32, Saturation) -> u8,
    pub ours_max: f32,
    pub oracle_dec: fn(u8) -> f32,
    pub oracle_enc: fn(f32) -> u8,
}

pub const E4M3FN: Flavour = Flavour {
    name: "f8e4m3fn",
    codes: 256,
    ours_dec: |b| F8E4M3Fn::from_bits(b).to_f32(),
    ours_enc: |x, s| F8E4M3Fn::from_f32(x, s).to_bits(),
    ours_max: F8E4M3Fn::MAX,
    oracle_dec: |b| microfloat::f8e4m3fn::from_bits(b).to_f32(),
    oracle_enc: |x| microfloat::f8e4m3fn::from_f32(x).to_bits(),
};
pub const E4M3FNUZ: Flavour = Flavour {
    name: "f8e4m3fnuz",
    codes: 256,
    ours_dec: |b| F8E4M3Fnuz::from_bits(b).to_f32(),
    ours_enc: |x, s| F8E4M3Fnuz::from_f32(x, s).to_bits(),
    ours_max: F8E4M3Fnuz::MAX,
    oracle_dec: |b| microfloat::f8e4m3fnuz::from_bits(b).to_f32(),
    oracle_enc: |x| microfloat::f8e4m3fnuz::from_f32(x).to_bits(),
};
pub const E5M2: Flavour = Flavour {
    name: "f8e5m2",
    codes: 256,
    ours_dec: |b| F8E5M2::from_bits(b).to_f32(),
    ours_enc: |x, s| F8E5M2::from_f32(x, s).to_bits(),
    ours_max: F8E5M2::MAX,
    oracle_dec: |b| microfloat::f8e5m2::from_bits(b).to_f32(),
    oracle_enc: |x| microfloat::f8e5m2::from_f32(x).to_bits(),
};
pub const E2M1: Flavour = Flavour {
    name: "f4e2m1",
    codes: 16,
    ours_dec: |b| F4E2M1::from_bits(b).to_f32(),
    ours_enc: |x, s| F4E2M1::from_f32(x, s).to_bits(),
    ours_max: F4E2M1::MAX,
    oracle_dec: |b| microfloat::f4e2m1fn::from_bits(b).to_f32(),
    oracle_enc: |x| microfloat::f4e2m1fn::from_f32(x).to_bits(),
};

pub const ALL: [Flavour; 4] = [E4M3FN, E4M3FNUZ, E5M2, E2M1];
pub const FP8: [Flavour; 3] = [E4M3FN, E4M3FNUZ, E5M2];

/// Same value bit for bit, any NaN equal to any NaN.
pub fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// The code of the largest finite magnitude with the given sign, found from the oracle's decode.
pub fn max_code(f: &Flavour, negative: bool) -> u8 {
    let mut best: Option<(u8, f32)> = None;
    for c in 0..f.codes {
        let v = (f.oracle_dec)(c as u8);
        if v.is_finite() && v.is_sign_negative() == negative {
            let m = v.abs();
            if best.is_none_or(|(_, bm)| m > bm) {
                best = Some((c as u8, m));
            }
        }
    }
    best.expect("every format has a finite value of each sign").0
}

/// The distinct finite values of a format, ascending (f64 so midpoints are exact).
pub fn finite_grid(f: &Flavour) -> Vec<f64> {
    let mut v: Vec<f64> =
        (0..f.codes).map(|c| (f.oracle_dec)(c as u8)).filter(|x| x.is_finite()).map(|x| x as f64).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.dedup();
    v
}

/// `encode(x, NonFinite)` as our spec defines it: the oracle (microfloat = ml_dtypes), except
/// where the spec deliberately differs:
/// - E2M1 has no NaN. microfloat (like ml_dtypes) turns NaN into -0 (code 0x8); we give +0
///   (code 0x0): a NaN carries no sign worth keeping and +0 is the canonical zero.
/// - E4M3fn at exactly |x| = 464, the tie between MAX = 448 (mantissa 110, even) and the first
///   step beyond it (480, the NaN code's position): IEEE round-half-even with unbounded exponent
///   gives 448, and ml_dtypes' own conversion rounds the mantissa first and so also returns 448;
///   microfloat 0.1.3 counts everything >= 464 as overflow and returns NaN. We follow IEEE.
pub fn expected_nonfinite(f: &Flavour, x: f32) -> u8 {
    if f.name == E2M1.name && x.is_nan() {
        return 0x0;
    }
    if f.name == E4M3FN.name && x.abs() == 464.0 {
        return max_code(f, x < 0.0);
    }
    (f.oracle_enc)(x)
}

/// `encode(x, Finite)` by its definition: the NonFinite result, except that a non-NaN input
/// whose NonFinite code is Inf or NaN (overflow, or ±Inf) becomes ±MAX.
pub fn expected_finite(f: &Flavour, x: f32) -> u8 {
    let nf = expected_nonfinite(f, x);
    let v = (f.oracle_dec)(nf);
    if !x.is_nan() && !v.is_finite() {
        max_code(f, x.is_sign_negative())
    } else {
        nf
    }
}

fn push_with_neighbours(out: &mut Vec<f32>, x: f32) {
    out.push(x);
    out.push(x.next_up());
    out.push(x.next_down());
}

/// Every input class the spec names, both signs: all representable values, every midpoint
/// between adjacent values and the f32 values either side of it, the overflow region, zeros,
/// infinities, NaNs, f32 subnormals, and `n_random` random bit patterns plus `n_random` random
/// magnitudes log-uniform in [2^-30, 2^20).
pub fn encode_inputs(f: &Flavour, rng: &mut TestRng, n_random: usize) -> Vec<f32> {
    let mut v = Vec::new();
    let grid = finite_grid(f);
    for &g in &grid {
        push_with_neighbours(&mut v, g as f32);
    }
    for w in grid.windows(2) {
        // The midpoint of two fp8 values has at most mbits + 2 significant bits: exact in f32.
        push_with_neighbours(&mut v, ((w[0] + w[1]) / 2.0) as f32);
    }
    // Overflow region: quarter steps of the top ulp beyond MAX, the top tie, powers of two.
    let max = *grid.last().unwrap();
    let top_ulp = max - grid[grid.len() - 2];
    for k in 1..=24 {
        push_with_neighbours(&mut v, (max + k as f64 * top_ulp / 4.0) as f32);
    }
    for e in -149..=127 {
        v.push(2f32.powi(e));
    }
    v.extend([max as f32 * 2.0, 1e10, f32::MAX]);
    // Zeros, infinities, NaNs (quiet, signalling, max payload).
    v.extend([0.0, f32::INFINITY, f32::NAN]);
    v.extend([0x7F80_0001u32, 0x7FC0_0001, 0x7FFF_FFFF, 0x7FA0_0000].map(f32::from_bits));
    // f32 subnormals.
    v.extend([1u32, 2, 3, 0x40_0000, 0x7F_FFFF].map(f32::from_bits));
    for _ in 0..64 {
        v.push(f32::from_bits(1 + (rng.next_u64() as u32 % 0x7F_FFFF)));
    }
    // Everything so far with both signs.
    let n = v.len();
    for i in 0..n {
        v.push(-v[i]);
    }
    for _ in 0..n_random {
        v.push(f32::from_bits(rng.next_u64() as u32));
    }
    for _ in 0..n_random {
        v.push(random_magnitude(rng, -30.0, 20.0));
    }
    v
}

/// ±2^u with u uniform in [lo, hi).
pub fn random_magnitude(rng: &mut TestRng, lo: f64, hi: f64) -> f32 {
    let m = (lo + (hi - lo) * rng.uniform()).exp2() as f32;
    if rng.next_u64() & 1 == 1 {
        -m
    } else {
        m
    }
}
