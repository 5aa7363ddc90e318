//! [`SimtBackend`]: the generic [`GpuBackend`] over the emulator runtime, so the contract's op
//! traits launch the very kernels of `kernels/csrc/ops` on the CPU (names `simt32`, `simt64`).

use crate::runtime::SimtRuntime;
use k3_kernels::{GpuBackend, ModuleImage};
use kernel_api::{Error, Result};

/// `kernel_api::Backend` + every op trait on the SIMT emulator.
pub type SimtBackend = GpuBackend<SimtRuntime>;

/// A backend at warp 32 (`simt32`) or 64 (`simt64`); see [`SimtRuntime::new`] for the
/// environment it reads.
pub fn simt_backend(warp_size: u32) -> Result<SimtBackend> {
    simt_backend_from(SimtRuntime::new(warp_size)?)
}

/// Wraps a configured runtime (seed, shared-memory limit).
pub fn simt_backend_from(rt: SimtRuntime) -> Result<SimtBackend> {
    let name = match rt.warp_size() {
        32 => "simt32",
        64 => "simt64",
        w => return Err(Error::invalid("warp_size", format!("{w} (expected 32 or 64)"))),
    };
    GpuBackend::new(rt, &ModuleImage::host_linked("k3-kernels"), name)
}
