//! The conformance suite: one macro instantiates every op's tests for a backend.
//!
//! ```ignore
//! kernel_api::conformance_suite!(kernel_api::cpu::CpuBackend::new_for_tests());
//! ```
//!
//! The argument is an expression of type `Result<B, kernel_api::Error>`; when it is an error
//! (no driver, no device) every test prints `skipped: <reason>` and passes, so GPU suites skip
//! on machines without a GPU.
//!
//! Each test runs the backend's op and compares it with an independent oracle written in the
//! test (naive f64 definitions, worked values from the spec), and on non-CPU backends also with
//! the CPU reference. Tolerances come from [`crate::tolerance`].

pub mod attn_res;
pub mod elementwise;
pub mod gemm;
pub mod lse_merge;
pub mod norm;
pub mod rng;

pub use rng::TestRng;

use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::HostTensor;

/// Every op of the contract and the conformance tests that cover it. The coverage test checks
/// that no op is left without a test.
pub fn coverage() -> Vec<(&'static str, &'static [&'static str])> {
    let mut v: Vec<(&'static str, &'static [&'static str])> = Vec::new();
    v.extend_from_slice(lse_merge::COVERAGE);
    v.extend_from_slice(gemm::COVERAGE);
    v.extend_from_slice(norm::COVERAGE);
    v.extend_from_slice(attn_res::COVERAGE);
    v.extend_from_slice(elementwise::COVERAGE);
    v
}

/// The ops the contract promises (the coverage report lists each).
pub const ALL_OPS: &[&str] = &[
    "lse_merge",
    "gemm",
    "rms_norm",
    "gated_rms_norm",
    "l2_norm",
    "attn_res_mix",
    "situ_glu",
    "sigmoid_gate",
    "embedding_gather",
];

/// Prints the coverage table and fails if an op has no test.
pub fn coverage_report(backend_name: &str) {
    let cov = coverage();
    println!("conformance coverage for backend `{backend_name}`:");
    let mut missing = Vec::new();
    for op in ALL_OPS {
        let tests: Vec<&str> = cov.iter().filter(|(o, _)| o == op).flat_map(|(_, t)| t.iter().copied()).collect();
        println!("  {op:<24} {:>2} tests  {}", tests.len(), if tests.is_empty() { "NOT COVERED" } else { "covered" });
        if tests.is_empty() {
            missing.push(*op);
        }
    }
    assert!(missing.is_empty(), "ops without conformance tests: {missing:?}");
}

/// Uploads f32 values encoded as `dtype`.
pub fn upload_f32<B: Backend>(b: &B, dtype: DType, shape: &[usize], v: &[f32]) -> Result<DeviceTensor<B>> {
    b.upload_tensor(&HostTensor::from_f32(dtype, shape, v)?)
}

/// Downloads a tensor decoded to f32.
pub fn download_f32<B: Backend>(b: &B, t: &DeviceTensor<B>) -> Result<Vec<f32>> {
    Ok(b.download_tensor(t)?.to_f32())
}

/// Rounds values through `dtype` (what a test oracle sees after an input is stored).
pub fn round_through(dtype: DType, v: &[f32]) -> Vec<f32> {
    match HostTensor::from_f32(dtype, &[v.len()], v) {
        Ok(t) => t.to_f32(),
        Err(_) => v.to_vec(),
    }
}

/// Instantiates the whole suite for a backend constructor expression returning
/// `Result<B, kernel_api::Error>`.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        #[allow(unused_imports)]
        use $crate::conformance as __k3_conf;

        fn __k3_backend() -> Option<impl $crate::backend::Backend + $crate::conformance::AllOps> {
            match $make {
                Ok(b) => Some(b),
                Err(e) => {
                    println!("skipped: {e}");
                    None
                }
            }
        }

        #[test]
        fn coverage_report() {
            if let Some(b) = __k3_backend() {
                $crate::conformance::coverage_report($crate::backend::Backend::name(&b));
            }
        }

        $crate::conformance_lse_merge!();
        $crate::conformance_gemm!();
        $crate::conformance_norm!();
        $crate::conformance_attn_res!();
        $crate::conformance_elementwise!();
    };
}

/// The op traits a backend must implement to run the whole suite.
pub trait AllOps:
    crate::ops::LseMerge
    + crate::ops::Gemm
    + crate::ops::RmsNorm
    + crate::ops::GatedRmsNorm
    + crate::ops::L2Norm
    + crate::ops::AttnResMix
    + crate::ops::SituGlu
    + crate::ops::SigmoidGate
    + crate::ops::EmbeddingGather
{
}
impl<T> AllOps for T where
    T: crate::ops::LseMerge
        + crate::ops::Gemm
        + crate::ops::RmsNorm
        + crate::ops::GatedRmsNorm
        + crate::ops::L2Norm
        + crate::ops::AttnResMix
        + crate::ops::SituGlu
        + crate::ops::SigmoidGate
        + crate::ops::EmbeddingGather
{
}

/// Defines one `#[test]` that runs `$path(&backend)` when the backend is available.
#[macro_export]
#[doc(hidden)]
macro_rules! __k3_conf_test {
    ($name:ident, $path:path) => {
        #[test]
        fn $name() {
            if let Some(b) = __k3_backend() {
                $path(&b);
            }
        }
    };
}
