//! The CPU reference backend: the executable spec of every op.
//!
//! Written for clarity first: tensors are decoded to f32 (f64 where cheap), computed with plain
//! loops, and rounded once to the output dtype (round-to-nearest-even). Work is spread over
//! threads with rayon where test time needs it. Every `run` re-validates its arguments and the
//! index values it reads, so bad input is an error here too, never a panic or a stray access.

mod attn_res;
mod conv1d;
mod elementwise;
mod gemm;
mod io;
mod kda_decode;
mod kda_gate;
mod kda_prefill;
mod lse_merge;
mod mla_cache_write;
mod mla_decode;
mod mla_prefill;
mod moe_align;
mod moe_gemm;
mod moe_router;
mod norm;
mod tensor_ops;
pub mod math;

pub use io::{read_f32, read_i64, write_f32, write_f32_rows};

use crate::backend::{Backend, BackendKind, DeviceInfo, Fp8Native};
use crate::error::{Error, Result};

/// The compute units the CPU reference reports. Fixed, not the rayon thread count: schedules
/// derived from it (the MLA decode's split-KV partition) change the order of floating-point
/// reductions, and the reference must give the same bits for any `RAYON_NUM_THREADS` (the
/// tolerance policy, `crate::tolerance`). One unit: each sequence's attention in one pass.
pub const CPU_COMPUTE_UNITS: u32 = 1;

/// Host memory used as a device buffer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostBuffer(pub Vec<u8>);

/// The CPU reference has one implicit, always-synchronous stream.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuStream;

/// The CPU reference backend.
#[derive(Debug)]
pub struct CpuBackend {
    info: DeviceInfo,
    stream: CpuStream,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            info: DeviceInfo {
                kind: BackendKind::Cpu,
                arch: "cpu".into(),
                name: "CPU reference".into(),
                warp_size: 1,
                compute_units: CPU_COMPUTE_UNITS,
                shared_mem_per_block: 0,
                l2_bytes: 0,
                fp8: Fp8Native::Both,
            },
            stream: CpuStream,
        }
    }
}

/// An empty vector with room for `bytes`: a failed allocation is an error, not an abort.
fn host_vec(bytes: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes).map_err(|e| Error::invalid("bytes", format!("cannot allocate {bytes} bytes: {e}")))?;
    Ok(v)
}

impl Backend for CpuBackend {
    type Buffer = HostBuffer;
    type Stream = CpuStream;

    fn name(&self) -> &str {
        "cpu"
    }
    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }
    fn default_stream(&self) -> &CpuStream {
        &self.stream
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<HostBuffer> {
        let mut v = host_vec(bytes)?;
        v.resize(bytes, 0);
        Ok(HostBuffer(v))
    }
    fn upload(&self, bytes: &[u8]) -> Result<HostBuffer> {
        let mut v = host_vec(bytes.len())?;
        v.extend_from_slice(bytes);
        Ok(HostBuffer(v))
    }
    fn download(&self, buf: &HostBuffer, out: &mut [u8]) -> Result<()> {
        if out.len() != buf.0.len() {
            return Err(Error::invalid("out", format!("{} bytes for a {}-byte buffer", out.len(), buf.0.len())));
        }
        out.copy_from_slice(&buf.0);
        Ok(())
    }
    fn buffer_len(&self, buf: &HostBuffer) -> usize {
        buf.0.len()
    }
    fn synchronize(&self, _stream: &CpuStream) -> Result<()> {
        Ok(())
    }
}
