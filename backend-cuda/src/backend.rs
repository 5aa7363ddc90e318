//! [`CudaBackend`]: the generic [`GpuBackend`] over [`CudaRuntime`]: the contract's op traits
//! launch the kernels of `kernels/csrc/ops` on an NVIDIA GPU (name `cuda`).

use crate::kernels::KernelSet;
use crate::runtime::CudaRuntime;
use k3_kernels::GpuBackend;
use kernel_api::Result;

/// `kernel_api::Backend` + every op trait on a CUDA device.
pub type CudaBackend = GpuBackend<CudaRuntime>;

/// Probes device `ordinal` and loads the op kernels (embedded cubin for the device's arch, else
/// NVRTC). No driver or device: `Error::Unavailable` with the reason.
pub fn cuda_backend(ordinal: usize) -> Result<CudaBackend> {
    let rt = CudaRuntime::new(ordinal)?;
    let ops = rt.kernels(KernelSet::Ops)?;
    GpuBackend::from_module(rt, ops, "cuda")
}
