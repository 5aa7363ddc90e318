//! The tolerance policy: how a backend's output is compared with the reference.
//!
//! Metric: FLA's relative RMSE, `rmse(out - ref) / rms(ref)`, computed in f64. A comparison also
//! passes when the largest absolute difference is below `abs_floor` (all-zero references).
//!
//! Thresholds per output dtype and why:
//!
//! | output | rel. RMSE | why |
//! |---|---|---|
//! | f32, same algorithm | 1e-5 | f32 has 24 bits; a reordered f32 sum of n terms drifts ~sqrt(n)·2^-24 ≈ 1e-6 at n ≤ 10^4, tenfold margin |
//! | f32 vs a different algorithm (chunked vs recurrent KDA, absorbed vs naive MLA) | 1e-4 | exp/inverse chains add relative error; still 50× stricter than FLA's 0.005 |
//! | bf16 | 8e-3 | one bf16 rounding of a unit-RMS value has RMS error 2^-8/√12·√2 ≈ 1.6e-3 per rounding; 4 roundings in a chain plus accumulation-order noise stay under 8e-3 (FLA uses 5e-3 to 2e-2 per op; FlashKDA's fp64 gold 5e-3) |
//! | f16 | 2e-3 | 3 more mantissa bits than bf16 |
//! | fp8 e4m3 (fn/fnuz) values | 6e-2 | 3 mantissa bits: one rounding has relative RMS 2^-4/√3 ≈ 3.6e-2 |
//! | fp8 e5m2 values | 1.2e-1 | 2 mantissa bits |
//! | LSE (f32) | 1e-5 absolute-relative | the log-sum-exp is well conditioned; compared like f32 |
//! | recurrent state (f32) | same as the output of that op | states are always compared, never only outputs |
//!
//! Format conversions, cache writes and routing selections are compared bit for bit, not with
//! tolerances.
//!
//! ## Determinism of the CPU reference
//!
//! The CPU reference gives the same bits for the same inputs whatever the thread count
//! (`RAYON_NUM_THREADS`), so a reference output can be recorded once and compared bit for bit,
//! and a difference between two runs is never thread noise. How:
//! - work is split across threads only where each thread owns whole outputs: the dense GEMM
//!   (the `gemm` crate splits the output's rows and columns; each output's K reduction runs in
//!   the same blocked order, its block sizes from the CPU's caches, not the thread count), KDA
//!   prefill per (sequence, head), the MoE GEMM per row;
//! - schedules that change a reduction order are derived from a fixed compute-unit count
//!   ([`crate::cpu::CPU_COMPUTE_UNITS`], 1), never from the thread count: the MLA decode's
//!   split-KV partition used to follow the rayon pool, and 1 thread against 2, 3, 4 or 8 changed
//!   ~18% of the tiny model's logits by up to 1.4e-6 (2,505 of 13,824 on a 12+16-token request).
//!
//! Cost: none measurable. The MLA decode reference is sequential, and one compute unit means one
//! pass per sequence instead of split partials plus a merge (measured, release, this project's
//! 2-core VM: 4 sequences of 900-3,000 tokens, 16 heads, latent 512: 176 ms with 1 unit, 174
//! and 178 ms with 2 and 8). Scope: one machine. The `gemm`
//! crate picks its kernels and block sizes by CPU features and cache sizes, so two different
//! CPUs may differ in the last bits (within [`Tolerance::F32`]). The emulator and the GPU
//! backends schedule by their own compute units (the emulator's `K3_SIMT_WORKERS`) and are
//! compared with the tolerances above, not bit for bit. Checked by
//! `model-k3/tests/determinism.rs` (one `k3 run` child per thread count, logits bit for bit)
//! and `kernel-api/tests/dense_props.rs` (GEMM at 1, 2, 3 and 8 threads).

use crate::dtype::DType;

/// A relative-RMSE threshold with an absolute floor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rel_rmse: f64,
    pub abs_floor: f64,
}

impl Tolerance {
    /// Same algorithm, f32 arithmetic.
    pub const F32: Tolerance = Tolerance { rel_rmse: 1e-5, abs_floor: 1e-6 };
    /// f32, different but mathematically equal algorithm.
    pub const F32_ALGO: Tolerance = Tolerance { rel_rmse: 1e-4, abs_floor: 1e-6 };
    pub const BF16: Tolerance = Tolerance { rel_rmse: 8e-3, abs_floor: 1e-6 };
    pub const F16: Tolerance = Tolerance { rel_rmse: 2e-3, abs_floor: 1e-6 };
    pub const FP8_E4M3: Tolerance = Tolerance { rel_rmse: 6e-2, abs_floor: 1e-6 };
    pub const FP8_E5M2: Tolerance = Tolerance { rel_rmse: 1.2e-1, abs_floor: 1e-6 };

    /// The policy for an output stored in `dtype`.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::BF16 => Self::BF16,
            DType::F16 => Self::F16,
            DType::F8E4M3Fn | DType::F8E4M3Fnuz => Self::FP8_E4M3,
            DType::F8E5M2 => Self::FP8_E5M2,
            _ => Self::F32,
        }
    }

    /// The looser of two tolerances (an f32 output computed from bf16 inputs, say).
    pub fn max(self, other: Tolerance) -> Tolerance {
        Tolerance { rel_rmse: self.rel_rmse.max(other.rel_rmse), abs_floor: self.abs_floor.max(other.abs_floor) }
    }
}

/// The outcome of one comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub rel_rmse: f64,
    pub max_abs: f64,
    /// Non-finite values in `out` where `reference` is finite (or vice versa).
    pub nonfinite_mismatches: usize,
}

/// rmse(out - ref) / rms(ref), with max-abs difference; NaN positions must agree.
pub fn compare(out: &[f32], reference: &[f32]) -> Comparison {
    let mut se = 0f64;
    let mut sr = 0f64;
    let mut max_abs = 0f64;
    let mut bad = 0usize;
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_finite() != r.is_finite() || (o.is_nan() != r.is_nan()) {
            bad += 1;
            continue;
        }
        if !r.is_finite() {
            if o != r && !(o.is_nan() && r.is_nan()) {
                bad += 1;
            }
            continue;
        }
        let d = o as f64 - r as f64;
        se += d * d;
        sr += (r as f64) * (r as f64);
        max_abs = max_abs.max(d.abs());
    }
    let rel = if sr > 0.0 { (se / sr).sqrt() } else if se > 0.0 { f64::INFINITY } else { 0.0 };
    Comparison { rel_rmse: rel, max_abs, nonfinite_mismatches: bad + out.len().abs_diff(reference.len()) }
}

/// Compares and describes a failure; `Ok` carries the measured comparison.
pub fn check_close(what: &str, out: &[f32], reference: &[f32], tol: Tolerance) -> Result<Comparison, String> {
    if out.len() != reference.len() {
        return Err(format!("{what}: {} values vs {} in the reference", out.len(), reference.len()));
    }
    let c = compare(out, reference);
    if c.nonfinite_mismatches == 0 && (c.rel_rmse <= tol.rel_rmse || c.max_abs <= tol.abs_floor) {
        Ok(c)
    } else {
        Err(format!(
            "{what}: rel RMSE {:.3e} (limit {:.1e}), max abs {:.3e}, {} non-finite mismatches",
            c.rel_rmse, tol.rel_rmse, c.max_abs, c.nonfinite_mismatches
        ))
    }
}

/// Panicking form for tests.
#[track_caller]
pub fn assert_close(what: &str, out: &[f32], reference: &[f32], tol: Tolerance) -> Comparison {
    match check_close(what, out, reference, tol) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}
