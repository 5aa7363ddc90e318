//! [`SimtBackend`]: `kernel_api::Backend` on the SIMT emulator, so op launchers written against
//! [`k3_kernels::Runtime`] can run behind the contract's op traits (names `simt32`, `simt64`).

use crate::runtime::{SimtBuffer, SimtRuntime, SimtStream};
use k3_kernels::Runtime;
use kernel_api::{Backend, DeviceInfo, Error, Result};

/// The emulator behind the contract: host-memory buffers, synchronous streams.
#[derive(Debug)]
pub struct SimtBackend {
    rt: SimtRuntime,
    name: &'static str,
}

impl SimtBackend {
    /// A backend at warp 32 (`simt32`) or 64 (`simt64`); see [`SimtRuntime::new`] for the
    /// environment it reads.
    pub fn new(warp_size: u32) -> Result<Self> {
        Self::from_runtime(SimtRuntime::new(warp_size)?)
    }
    /// Wraps a configured runtime (seed, shared-memory limit).
    pub fn from_runtime(rt: SimtRuntime) -> Result<Self> {
        let name = match rt.warp_size() {
            32 => "simt32",
            64 => "simt64",
            w => return Err(Error::invalid("warp_size", format!("{w}"))),
        };
        Ok(SimtBackend { rt, name })
    }
    /// The runtime kernel launchers use.
    pub fn runtime(&self) -> &SimtRuntime {
        &self.rt
    }
}

impl Backend for SimtBackend {
    type Buffer = SimtBuffer;
    type Stream = SimtStream;

    fn name(&self) -> &str {
        self.name
    }
    fn device_info(&self) -> &DeviceInfo {
        self.rt.device_info()
    }
    fn default_stream(&self) -> &SimtStream {
        self.rt.default_stream()
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<SimtBuffer> {
        SimtBuffer::new(bytes, 0)
    }
    fn upload(&self, bytes: &[u8]) -> Result<SimtBuffer> {
        let mut b = SimtBuffer::new(bytes.len(), 0)?;
        b.write(0, bytes)?;
        Ok(b)
    }
    fn download(&self, buf: &SimtBuffer, out: &mut [u8]) -> Result<()> {
        if out.len() != buf.len() {
            return Err(Error::invalid("out", format!("{} bytes for a {}-byte buffer", out.len(), buf.len())));
        }
        buf.read(0, out)
    }
    fn buffer_len(&self, buf: &SimtBuffer) -> usize {
        buf.len()
    }
    fn synchronize(&self, stream: &SimtStream) -> Result<()> {
        self.rt.synchronize_stream(stream)
    }
}
