//! The backend contract: memory, streams and device description. Op families are separate
//! traits (see [`crate::ops`]) that a backend implements when it has them; callers choose a
//! backend by its capability answers, not by `cfg`.

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::{HostTensor, Layout, TensorMut, TensorRef};
use std::fmt;

/// Which family of machine a backend drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// The CPU reference (the spec).
    Cpu,
    /// The SIMT emulator running the GPU kernel sources on the CPU.
    Simt,
    Cuda,
    Rocm,
}

/// The fp8 flavour a device computes with natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Native {
    /// OCP e4m3fn / e5m2: NVIDIA sm_89+, AMD gfx950.
    Ocp,
    /// e4m3fnuz: AMD gfx942.
    Fnuz,
    /// Decodes both in software (CPU, emulator).
    Both,
}

/// What a backend runs on. Plans choose grid sizes and variants from this.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub kind: BackendKind,
    /// `cpu`, `sm_90a`, `gfx942`, ...
    pub arch: String,
    pub name: String,
    /// Threads per warp / wavefront (1 for the CPU reference).
    pub warp_size: u32,
    /// SMs, CUs or CPU threads.
    pub compute_units: u32,
    pub shared_mem_per_block: usize,
    pub l2_bytes: usize,
    pub fp8: Fp8Native,
}

/// Memory, streams and synchronisation of one device. `run` methods of op traits only enqueue
/// work on a stream; `download` and `synchronize` are the only calls that wait.
pub trait Backend: Send + Sync {
    /// An owned device allocation (bytes).
    type Buffer: Send + Sync + fmt::Debug;
    /// An ordered queue of work.
    type Stream: Send + Sync + fmt::Debug;

    /// Short name used by `K3_BACKEND` and reports (`cpu`, `simt32`, `cuda`, ...).
    fn name(&self) -> &str;
    fn device_info(&self) -> &DeviceInfo;
    fn default_stream(&self) -> &Self::Stream;
    /// A zero-filled allocation of `bytes` bytes.
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buffer>;
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer>;
    /// Copies the whole buffer to `out` (same length) after all queued work has finished. Like
    /// `synchronize`, returns a bad-device-metadata error a kernel of any stream recorded (see
    /// [`crate::ops`], device metadata).
    fn download(&self, buf: &Self::Buffer, out: &mut [u8]) -> Result<()>;
    fn buffer_len(&self, buf: &Self::Buffer) -> usize;
    /// Waits for the work queued on `stream`. On GPU backends this is where a kernel's report of
    /// bad device metadata (an index out of its bounds) becomes an [`crate::Error::InvalidInput`]
    /// naming the tensor, once (see [`crate::ops`], device metadata).
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
}

/// A buffer that remembers its tensor layout: what tests and the model runner hold.
#[derive(Debug)]
pub struct DeviceTensor<B: Backend + ?Sized> {
    pub buf: B::Buffer,
    pub layout: Layout,
}

impl<B: Backend + ?Sized> DeviceTensor<B> {
    pub fn as_ref(&self) -> TensorRef<'_, B> {
        TensorRef { buf: &self.buf, layout: self.layout.clone() }
    }
    pub fn as_mut(&mut self) -> TensorMut<'_, B> {
        TensorMut { buf: &mut self.buf, layout: self.layout.clone() }
    }
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }
}

/// Host <-> device helpers available on every backend.
pub trait BackendExt: Backend {
    fn upload_tensor(&self, t: &HostTensor) -> Result<DeviceTensor<Self>> {
        Ok(DeviceTensor { buf: self.upload(&t.bytes)?, layout: t.layout() })
    }
    fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor<Self>> {
        let layout = Layout::contiguous(dtype, shape);
        let n = layout.span_bytes().ok_or_else(|| crate::Error::invalid("shape", "size overflows usize"))?;
        Ok(DeviceTensor { buf: self.alloc_zeroed(n)?, layout })
    }
    /// A workspace for a plan that asked for `bytes` (`None` when it asked for none), zeroed.
    fn workspace(&self, bytes: usize) -> Result<Option<Self::Buffer>> {
        if bytes == 0 {
            Ok(None)
        } else {
            self.alloc_zeroed(bytes).map(Some)
        }
    }
    /// Downloads a contiguous device tensor.
    fn download_tensor(&self, t: &DeviceTensor<Self>) -> Result<HostTensor> {
        let mut bytes = vec![0u8; self.buffer_len(&t.buf)];
        self.download(&t.buf, &mut bytes)?;
        let start = t.layout.offset * t.layout.dtype.size_bytes();
        let end = t.layout.span_bytes().unwrap_or(start);
        HostTensor::from_bytes(t.layout.dtype, &t.layout.shape, bytes[start..end].to_vec())
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}
