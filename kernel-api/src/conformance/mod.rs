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
pub mod bad_input;
pub mod conv1d;
pub mod elementwise;
pub mod gemm;
pub mod kda_decode;
pub mod kda_gate;
pub mod kda_prefill;
pub mod latent_moe;
pub mod lse_merge;
pub mod mla_cache_write;
pub mod mla_decode;
pub mod mla_prefill;
pub mod moe_align;
pub mod moe_gemm;
pub mod moe_router;
pub mod norm;
pub mod registry;
pub mod rng;
pub mod tensor_ops;

pub use rng::TestRng;

use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::HostTensor;

/// Every op of the contract and the conformance tests that cover it. The coverage test checks
/// that no op is left without a test.
pub fn coverage() -> Vec<(&'static str, &'static str)> {
    macro_rules! list {
        ($($op:ident: $($seg:ident)::+),* $(,)?) => {
            vec![$((stringify!($op), last_segment(stringify!($($seg)::+)))),*]
        };
    }
    crate::__k3_for_each_test!(list)
}

fn last_segment(path: &'static str) -> &'static str {
    path.rsplit("::").next().unwrap_or(path).trim()
}

/// Every conformance test as `(op, test, fn)`, for runners outside `cargo test` (`k3 doctor`).
pub fn all_tests<B: AllOps>() -> Vec<(&'static str, &'static str, fn(&B))> {
    macro_rules! list {
        ($($op:ident: $($seg:ident)::+),* $(,)?) => {
            vec![$((stringify!($op), last_segment(stringify!($($seg)::+)), $($seg)::+::<B> as fn(&B))),*]
        };
    }
    crate::__k3_for_each_test!(list)
}

/// Entries of [`ALL_OPS`] that are compositions of ops (`kernel_api::compose`), not op traits.
pub const COMPOSITIONS: &[&str] = &["latent_moe_block"];

/// The ops the contract promises (the coverage report lists each).
pub const ALL_OPS: &[&str] = &[
    "lse_merge",
    "copy_cast",
    "add_assign",
    "mla_prefill",
    "mla_cache_write",
    "kda_gate",
    "kda_prefill",
    "mla_decode",
    "mla_prefill_absorbed",
    "causal_conv1d",
    "kda_decode",
    "moe_router",
    "moe_align",
    "moe_grouped_gemm",
    "moe_combine",
    "gemm",
    "rms_norm",
    "gated_rms_norm",
    "l2_norm",
    "attn_res_mix",
    "situ_glu",
    "sigmoid_gate",
    "embedding_gather",
    "latent_moe_block",
];

/// Prints the coverage table and fails if an op has no test.
pub fn coverage_report(backend_name: &str, pending: &[&str]) {
    let cov = coverage();
    println!("conformance coverage for backend `{backend_name}`:");
    let mut missing = Vec::new();
    for op in ALL_OPS {
        let tests: Vec<&str> = cov.iter().filter(|(o, _)| o == op).map(|(_, t)| *t).collect();
        let status = if tests.is_empty() {
            "NOT COVERED"
        } else if pending.contains(op) {
            "pending: no kernel on this backend yet (tests skipped)"
        } else {
            "covered"
        };
        println!("  {op:<24} {:>2} tests  {status}", tests.len());
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
///
/// `conformance_suite!(make, pending = [op, ..])` names ops this backend has no kernel for yet:
/// their tests print `skipped: ...` and the coverage report lists them as pending, so a missing
/// kernel is visible, never silently counted as covered.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!($make, pending = []);
    };
    ($make:expr, pending = [$($pending:ident),* $(,)?]) => {
        fn __k3_backend() -> Option<impl $crate::backend::Backend + $crate::conformance::AllOps> {
            match $make {
                Ok(b) => Some(b),
                Err(e) => {
                    println!("skipped: {e}");
                    None
                }
            }
        }

        fn __k3_pending() -> &'static [&'static str] {
            &[$(stringify!($pending)),*]
        }

        #[test]
        fn coverage_report() {
            if let Some(b) = __k3_backend() {
                $crate::conformance::coverage_report($crate::backend::Backend::name(&b), __k3_pending());
            }
        }

        $crate::__k3_for_each_test!($crate::__k3_conf_tests);
    };
}

/// The op traits a backend must implement to run the whole suite.
/// One trait per line (keeps merges of new families conflict-free).
macro_rules! all_ops {
    ($($t:path),* $(,)?) => {
        pub trait AllOps: $($t +)* {}
        impl<T: $($t +)*> AllOps for T {}
    };
}
all_ops!(
    crate::ops::LseMerge,
    crate::ops::CopyCast,
    crate::ops::AddAssign,
    crate::ops::MlaPrefill,
    crate::ops::MlaCacheWrite,
    crate::ops::KdaGate,
    crate::ops::KdaPrefill,
    crate::ops::MlaDecode,
    crate::ops::MlaPrefillAbsorbed,
    crate::ops::CausalConv1d,
    crate::ops::KdaDecode,
    crate::ops::MoeRouter,
    crate::ops::MoeAlign,
    crate::ops::MoeGroupedGemm,
    crate::ops::MoeCombine,
    crate::ops::Gemm,
    crate::ops::RmsNorm,
    crate::ops::GatedRmsNorm,
    crate::ops::L2Norm,
    crate::ops::AttnResMix,
    crate::ops::SituGlu,
    crate::ops::SigmoidGate,
    crate::ops::EmbeddingGather,
);

/// Defines one `#[test]` per registry entry, running it when the backend is available.
#[macro_export]
#[doc(hidden)]
macro_rules! __k3_conf_tests {
    ($($op:ident: $module:ident :: $name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if __k3_pending().contains(&stringify!($op)) {
                    println!("skipped: no `{}` kernel on this backend yet", stringify!($op));
                    return;
                }
                if let Some(b) = __k3_backend() {
                    $crate::conformance::$module::$name(&b);
                }
            }
        )*
    };
}
