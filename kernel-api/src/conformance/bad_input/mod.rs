//! The bad-input suite for device metadata: index tensors in device memory (block tables, slot
//! mappings, sequence lengths, cu_seqlens, state indices, checkpoint offsets, expert ids, sorted
//! token ids, padded counts, embedding ids) that differ from what the plan validated on the host.
//!
//! ```ignore
//! kernel_api::bad_input_suite!(k3_backend_simt::simt_backend(32));
//! ```
//!
//! Every case plans a valid batch, hands `run` device metadata the plan never saw, and requires
//! a typed error naming the tensor ([`crate::Error::InvalidInput`] with the CPU reference's field
//! name), or, where the contract lets a backend compute with in-range device values, the result
//! of those values. The error may come from `run` (the CPU reference reads the device values
//! there) or from the synchronising call after it (GPU kernels record the first violation on
//! the device; see `k3_kernels::device_checks`). A panic, a signal, a hang or a wrong result
//! fails the test; under AddressSanitizer (the emulator's ASan build) so does any access outside
//! the tensors.
//!
//! Two kinds of tests: the cases a hostile run found (named, one per finding), and seeded
//! generators that corrupt random entries of random small batches with values drawn from every
//! class of bad value (past the bound, negative, the dtype's extremes, repeats, decreasing
//! offsets). Each generator runs [`cases`] malformed device tensors per backend and prints how
//! many it ran and how long they took.

pub mod embedding;
pub mod kda;
pub mod mla;
pub mod moe;

use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::error::{Error, Result};
use crate::tensor::HostTensor;
use std::fmt::Display;
use std::time::Instant;

/// Malformed device tensors each generator feeds a backend: `default`, or `K3_BAD_INPUT_CASES`
/// (a soak run sets it higher; an AddressSanitizer run may set it lower).
pub fn cases(default: usize) -> usize {
    std::env::var("K3_BAD_INPUT_CASES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Enqueues an op (`run`) and makes the synchronising call after it; the first error of the two.
/// Synchronising after a failed `run` too leaves no violation pending for the next case.
pub fn run_synced<B: Backend>(b: &B, run: impl FnOnce() -> Result<()>) -> Result<()> {
    let r = run();
    let s = b.synchronize(b.default_stream());
    r.and(s)
}

/// Panics unless `r` is an [`Error::InvalidInput`] naming `field`.
#[track_caller]
pub fn assert_rejected(r: Result<()>, field: &str, case: impl Display) {
    match r {
        Err(Error::InvalidInput { field: f, .. }) if f == field => {}
        Err(e) => panic!("{case}: expected an invalid-input error naming `{field}`, got: {e}"),
        Ok(()) => panic!("{case}: expected an invalid-input error naming `{field}`, the op succeeded"),
    }
}

/// Whether `r` is a rejection naming `field` (true) or a success (false); anything else panics.
#[track_caller]
pub fn rejected_or_ok(r: Result<()>, field: &str, case: impl Display) -> bool {
    match r {
        Err(Error::InvalidInput { field: f, .. }) if f == field => true,
        Ok(()) => false,
        Err(e) => panic!("{case}: expected success or an invalid-input error naming `{field}`, got: {e}"),
    }
}

/// Counts a generator's cases and prints the total and the time at the end.
pub struct Tally {
    what: &'static str,
    backend: String,
    start: Instant,
    pub cases: usize,
}

impl Tally {
    pub fn new<B: Backend>(b: &B, what: &'static str) -> Self {
        Tally { what, backend: b.name().to_string(), start: Instant::now(), cases: 0 }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            println!(
                "bad-input {} on {}: {} malformed device tensors, each rejected with a typed error, {:.2} s",
                self.what,
                self.backend,
                self.cases,
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

/// `[0, l0, l0 + l1, ...]`: the offsets of sequences of these lengths.
pub fn offsets(lens: &[usize]) -> Vec<i64> {
    std::iter::once(0)
        .chain(lens.iter().scan(0i64, |a, &l| {
            *a += l as i64;
            Some(*a)
        }))
        .collect()
}

/// Uploads i32 values.
pub fn upload_i32<B: Backend>(b: &B, shape: &[usize], v: &[i32]) -> DeviceTensor<B> {
    b.upload_tensor(&HostTensor::from_i32(shape, v).expect("i32 tensor")).expect("upload")
}

/// Uploads i64 values.
pub fn upload_i64<B: Backend>(b: &B, shape: &[usize], v: &[i64]) -> DeviceTensor<B> {
    b.upload_tensor(&HostTensor::from_i64(shape, v).expect("i64 tensor")).expect("upload")
}

/// Uploads index values as i32 (when `wide` is false; values are truncated to i32 first) or i64.
pub fn upload_index<B: Backend>(b: &B, shape: &[usize], v: &[i64], wide: bool) -> DeviceTensor<B> {
    if wide {
        upload_i64(b, shape, v)
    } else {
        upload_i32(b, shape, &v.iter().map(|&x| x as i32).collect::<Vec<_>>())
    }
}

/// A value outside `[lo, hi)` from every class a hostile input uses: just past either end, far
/// past, and the extremes of the index dtype (i32 unless `wide`). `lo = i64::MIN` asks for
/// values at or past `hi` only.
pub fn outside(rng: &mut super::TestRng, lo: i64, hi: i64, wide: bool) -> i64 {
    let (min, max) = if wide { (i64::MIN, i64::MAX) } else { (i32::MIN as i64, i32::MAX as i64) };
    loop {
        let v = match rng.below(8) {
            0 => hi,
            1 => lo.saturating_sub(1),
            2 => hi.saturating_add(1 + rng.below(1000) as i64),
            3 => lo.saturating_sub(1 + rng.below(1000) as i64),
            4 => max,
            5 => min,
            6 => hi.saturating_add(100_000),
            _ => -(rng.below(1 << 20) as i64) - 1,
        };
        if (v < lo || v >= hi) && v >= min && v <= max {
            return v;
        }
    }
}

/// Instantiates the bad-input suite for a backend constructor expression returning
/// `Result<B, kernel_api::Error>` (skipped with the reason when it is an error), like
/// [`crate::conformance_suite!`].
#[macro_export]
macro_rules! bad_input_suite {
    ($make:expr) => {
        fn __k3_bad_input_backend() -> Option<impl $crate::backend::Backend + $crate::conformance::AllOps> {
            match $make {
                Ok(b) => Some(b),
                Err(e) => {
                    println!("skipped: {e}");
                    None
                }
            }
        }
        $crate::__k3_for_each_bad_input!($crate::__k3_bad_input_tests);
    };
}

/// Defines one `#[test]` per bad-input registry entry.
#[macro_export]
#[doc(hidden)]
macro_rules! __k3_bad_input_tests {
    ($($op:ident: $module:ident :: $name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some(b) = __k3_bad_input_backend() {
                    $crate::conformance::bad_input::$module::$name(&b);
                }
            }
        )*
    };
}

/// The bad-input tests: one line per test, `op: module::test`.
#[macro_export]
#[doc(hidden)]
macro_rules! __k3_for_each_bad_input {
    ($($m:tt)*) => {
        $($m)*! {
            embedding_gather: embedding::embedding_device_ids_out_of_range,
            embedding_gather: embedding::embedding_generated_bad_ids,
            mla_cache_write: mla::mla_cache_write_device_slot_out_of_range,
            mla_cache_write: mla::mla_cache_write_duplicate_device_slot,
            mla_cache_write: mla::mla_cache_write_generated_bad_slots,
            mla_decode: mla::mla_decode_device_seq_lens_beyond_plan,
            mla_decode: mla::mla_decode_device_block_table_out_of_range,
            mla_decode: mla::mla_decode_device_block_table_in_a_later_pass,
            mla_decode: mla::mla_decode_generated_bad_metadata,
            mla_decode: mla::mla_decode_prepared_schedule_overwritten,
            mla_prefill_absorbed: mla::mla_prefill_absorbed_generated_bad_metadata,
            mla_prefill: mla::mla_prefill_device_cu_seqlens_out_of_range,
            mla_prefill: mla::mla_prefill_generated_bad_cu_seqlens,
            kda_prefill: kda::kda_prefill_device_metadata_out_of_range,
            kda_prefill: kda::kda_prefill_generated_bad_metadata,
            kda_decode: kda::kda_decode_device_state_indices,
            kda_decode: kda::kda_decode_generated_bad_state_indices,
            causal_conv1d: kda::conv1d_device_metadata_out_of_range,
            causal_conv1d: kda::conv1d_generated_bad_metadata,
            moe_align: moe::moe_align_device_topk_ids_out_of_range,
            moe_align: moe::moe_align_generated_bad_ids,
            moe_grouped_gemm: moe::moe_gemm_device_align_outputs_out_of_range,
            moe_grouped_gemm: moe::moe_gemm_generated_bad_align_outputs,
        }
    };
}

/// Every bad-input test as `(op, test)` (for reports).
pub fn tests() -> Vec<(&'static str, &'static str)> {
    macro_rules! list {
        ($($op:ident: $module:ident :: $name:ident),* $(,)?) => {
            vec![$((stringify!($op), stringify!($name))),*]
        };
    }
    crate::__k3_for_each_bad_input!(list)
}

#[cfg(test)]
mod tests {
    /// Every op whose kernels read index data from device memory has bad-input tests.
    #[test]
    fn every_op_with_device_metadata_is_covered() {
        let covered: Vec<&str> = super::tests().into_iter().map(|(op, _)| op).collect();
        for op in [
            "embedding_gather",
            "mla_cache_write",
            "mla_decode",
            "mla_prefill_absorbed",
            "mla_prefill",
            "kda_prefill",
            "kda_decode",
            "causal_conv1d",
            "moe_align",
            "moe_grouped_gemm",
        ] {
            assert!(covered.contains(&op), "{op} has no bad-input test");
            assert!(crate::conformance::ALL_OPS.contains(&op), "{op} is not an op of the contract");
        }
    }
}
