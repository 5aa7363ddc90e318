//! Shared helpers of the k3-kernels benches: deterministic inputs uploaded to a backend, and the
//! speed-of-light columns of the device bench report ([`sol`]), side-by-side runs against a peer
//! on identical inputs ([`peer`]).

pub mod calls;
pub mod peer;
pub mod sol;

use kernel_api::conformance::{upload_f32, TestRng};
use kernel_api::{Backend, DType, DeviceTensor, Result};

/// A tensor of N(0, std²) values (seeded), stored as `dtype` on `backend`.
pub fn random_tensor<B: Backend>(backend: &B, dtype: DType, shape: &[usize], std: f32, seed: u64) -> Result<DeviceTensor<B>> {
    let n = shape.iter().product();
    upload_f32(backend, dtype, shape, &TestRng::new(seed).normals(n, std))
}

/// GFLOP/s of `flops` floating-point operations done in `seconds`.
pub fn gflops(flops: u64, seconds: f64) -> f64 {
    flops as f64 / seconds / 1e9
}
