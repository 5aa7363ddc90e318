//! [`RocmBackend`]: the generic [`GpuBackend`] over [`RocmRuntime`]: the contract's op traits
//! launch the kernels of `kernels/csrc/ops` on an AMD GPU (name `rocm`).

use crate::kernels::KernelSet;
use crate::runtime::RocmRuntime;
use k3_kernels::GpuBackend;
use kernel_api::Result;

/// `kernel_api::Backend` + every op trait on a HIP device.
pub type RocmBackend = GpuBackend<RocmRuntime>;

/// Probes device `ordinal` and loads the op kernels (the embedded code object of the device's
/// processor, else hiprtc). No runtime or device: `Error::Unavailable` with the reason.
pub fn rocm_backend(ordinal: usize) -> Result<RocmBackend> {
    let rt = RocmRuntime::new(ordinal)?;
    let ops = rt.kernels(KernelSet::Ops)?;
    GpuBackend::from_module(rt, ops, "rocm")
}
