//! The `Runtime` trait: what every GPU-ish backend (CUDA, ROCm, the SIMT emulator) offers to the
//! kernel launchers in this crate. It is deliberately small and close to the CUDA driver API:
//! allocate, copy, load a module, look a kernel up by name, launch it with a grid, a block,
//! dynamic shared bytes and an array of pointers to the parameter values (cuLaunchKernel's
//! `kernelParams`), order work on streams and time it with events.
//!
//! Semantics every implementation keeps:
//! - work on one stream runs in submission order; `synchronize*` and `copy_d2h` are the only
//!   calls that wait for queued work;
//! - `copy_h2d` returns once the host bytes have been consumed, so the caller may reuse them;
//! - errors are [`kernel_api::Error`]: `InvalidInput` for a bad launch configuration or range,
//!   `Unavailable` for a missing kernel or an image this runtime cannot load, `Driver` for a
//!   failure reported by the device (for the SIMT emulator: a runtime check inside a kernel).

use kernel_api::ops::GemmParams;
use kernel_api::{DeviceInfo, Error, Result};
use std::ffi::c_void;
use std::fmt;

/// Grid or block extents (CUDA's `dim3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }
    /// `(x, 1, 1)`.
    pub const fn x(x: u32) -> Self {
        Dim3 { x, y: 1, z: 1 }
    }
    /// Number of points (u128: the product of three u32 cannot overflow it).
    pub const fn count(&self) -> u128 {
        self.x as u128 * self.y as u128 * self.z as u128
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Self {
        Dim3::x(x)
    }
}
impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Self {
        Dim3::new(x, y, 1)
    }
}
impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Self {
        Dim3::new(x, y, z)
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    pub grid: Dim3,
    pub block: Dim3,
    /// Bytes of dynamic shared memory (`k3::dynamic_shared<T>()` in the dialect).
    pub shared_bytes: u32,
}

impl LaunchConfig {
    pub fn new(grid: impl Into<Dim3>, block: impl Into<Dim3>, shared_bytes: u32) -> Self {
        LaunchConfig { grid: grid.into(), block: block.into(), shared_bytes }
    }
}

/// A device address as kernels see it (a pointer parameter's value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub const fn offset(self, bytes: u64) -> Self {
        DevicePtr(self.0.wrapping_add(bytes))
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// What a module image holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ImageFormat {
    /// PTX text (CUDA JIT).
    Ptx,
    /// A CUDA cubin for one architecture.
    Cubin,
    /// A CUDA fatbin.
    Fatbin,
    /// An AMD HSA code object.
    Hsaco,
    /// Kernels compiled into the running binary (the SIMT emulator); `bytes` is empty and
    /// `name` says which set (`simt` is every kernel of `csrc/`).
    HostLinked,
}

/// A module to load: a compiled image, or a name for kernels linked into the binary.
#[derive(Clone, Copy, Debug)]
pub struct ModuleImage<'a> {
    pub name: &'a str,
    pub format: ImageFormat,
    pub bytes: &'a [u8],
}

impl<'a> ModuleImage<'a> {
    /// The kernels compiled into the running binary.
    pub const fn host_linked(name: &'a str) -> Self {
        ModuleImage { name, format: ImageFormat::HostLinked, bytes: &[] }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A value that can be passed to a kernel by value. Implemented for the scalar types kernel
/// signatures use and for [`DevicePtr`] (any `T*` parameter).
pub trait KernelArg: Copy + sealed::Sealed {
    /// Native-endian bytes of the value as the kernel parameter holds it.
    fn write_bytes(self, out: &mut [u8; 8]) -> usize;
}

macro_rules! kernel_arg {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelArg for $t {
            fn write_bytes(self, out: &mut [u8; 8]) -> usize {
                let b = self.to_ne_bytes();
                out[..b.len()].copy_from_slice(&b);
                b.len()
            }
        }
    )*};
}
kernel_arg!(i32, u32, i64, u64, f32, f64);

impl sealed::Sealed for DevicePtr {}
impl KernelArg for DevicePtr {
    fn write_bytes(self, out: &mut [u8; 8]) -> usize {
        self.0.write_bytes(out)
    }
}

/// Owned storage for a launch's parameter values and the pointer array a runtime's `launch`
/// takes. Each value sits in its own 8-byte aligned slot.
#[derive(Clone, Debug, Default)]
pub struct KernelArgs {
    slots: Vec<u64>,
    sizes: Vec<usize>,
}

impl KernelArgs {
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends one parameter value.
    pub fn push<T: KernelArg>(&mut self, v: T) -> &mut Self {
        let mut bytes = [0u8; 8];
        let n = v.write_bytes(&mut bytes);
        self.slots.push(u64::from_ne_bytes(bytes));
        self.sizes.push(n);
        self
    }
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
    /// Byte size of each parameter, in order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }
    /// Pointers to each value (cuLaunchKernel's `kernelParams`), valid while `self` is neither
    /// moved nor modified.
    pub fn params(&mut self) -> Vec<*mut c_void> {
        self.slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect()
    }
}

/// A row-major matrix operand of a vendor GEMM: the buffer, the byte offset of element (0, 0)
/// and the distance between rows in elements.
#[derive(Debug)]
pub struct MatrixOperand<'a, B> {
    pub buf: &'a B,
    pub offset_bytes: usize,
    pub row_stride: usize,
}

/// Buffers of one `out[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N])` handed to a vendor BLAS; shapes and
/// dtypes are those of the [`GemmParams`] it comes with, and every range has been checked against
/// its buffer by the op's plan.
#[derive(Debug)]
pub struct VendorGemmArgs<'a, B> {
    pub x: MatrixOperand<'a, B>,
    pub w: MatrixOperand<'a, B>,
    /// `[N]`, unit stride (its `row_stride` is 1).
    pub bias: Option<MatrixOperand<'a, B>>,
    /// `[M, N]`, contiguous (`row_stride` N).
    pub out: &'a mut B,
    pub out_offset_bytes: usize,
    /// At least the bytes [`Runtime::vendor_gemm_workspace`] asked for.
    pub workspace: Option<&'a mut B>,
}

/// Memory, modules, launches, streams and events of one device.
pub trait Runtime: Send + Sync {
    /// An owned device allocation.
    type Buffer: Send + Sync + fmt::Debug;
    /// An ordered queue of work.
    type Stream: Send + Sync + fmt::Debug;
    /// A point in a stream that can be waited on and timed.
    type Event: Send + Sync + fmt::Debug;
    /// A loaded module (a set of kernels).
    type Module: Send + Sync + fmt::Debug;
    /// A kernel looked up in a module.
    type Kernel: Send + Sync + fmt::Debug + Clone;

    fn device_info(&self) -> &DeviceInfo;

    /// Allocates `bytes` bytes; the contents are unspecified (poisoned in the emulator).
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer>;
    /// Releases an allocation after the work queued on it has finished.
    fn free(&self, buf: Self::Buffer) -> Result<()>;
    fn buffer_len(&self, buf: &Self::Buffer) -> usize;
    /// The address kernels use for the first byte of `buf`.
    fn device_ptr(&self, buf: &Self::Buffer) -> DevicePtr;

    /// Sets every byte of `buf` to `value`, in stream order.
    fn memset(&self, buf: &mut Self::Buffer, value: u8, stream: &Self::Stream) -> Result<()>;
    /// Copies `src` to `dst[dst_offset..]`; returns once `src` may be reused.
    fn copy_h2d(&self, src: &[u8], dst: &mut Self::Buffer, dst_offset: usize, stream: &Self::Stream) -> Result<()>;
    /// Copies `src[src_offset..][..dst.len()]` to `dst` after the stream's queued work; waits.
    fn copy_d2h(&self, src: &Self::Buffer, src_offset: usize, dst: &mut [u8], stream: &Self::Stream) -> Result<()>;
    /// Copies `bytes` bytes between device buffers, in stream order.
    fn copy_d2d(
        &self,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        bytes: usize,
        stream: &Self::Stream,
    ) -> Result<()>;

    /// Loads a module image (PTX/cubin/hsaco, or the host-linked kernels of the emulator).
    fn load_module(&self, image: &ModuleImage<'_>) -> Result<Self::Module>;
    /// Looks a kernel up by its exported name; `Unavailable` if the module has none.
    fn kernel(&self, module: &Self::Module, name: &str) -> Result<Self::Kernel>;

    /// Enqueues a launch. `params[i]` points at the value of the kernel's i-th parameter.
    ///
    /// # Safety
    /// The pointed-to values must have exactly the types of the kernel's parameters, and every
    /// device pointer among them must be valid for the accesses the kernel makes.
    unsafe fn launch(
        &self,
        kernel: &Self::Kernel,
        cfg: &LaunchConfig,
        params: &[*mut c_void],
        stream: &Self::Stream,
    ) -> Result<()>;

    /// Looks `name` up in `module` and launches it.
    ///
    /// # Safety
    /// As for [`Runtime::launch`].
    unsafe fn launch_by_name(
        &self,
        module: &Self::Module,
        name: &str,
        cfg: &LaunchConfig,
        params: &[*mut c_void],
        stream: &Self::Stream,
    ) -> Result<()> {
        let k = self.kernel(module, name)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.launch(&k, cfg, params, stream) }
    }

    /// The stream used when a caller names none.
    fn default_stream(&self) -> &Self::Stream;
    /// A number that tells this runtime's live streams apart (the CUDA stream handle, the
    /// emulator's stream id): it keys each stream's device error record
    /// ([`crate::device_checks`]). The default gives every stream the same key, so they share
    /// one record.
    fn stream_key(&self, _stream: &Self::Stream) -> u64 {
        0
    }
    fn create_stream(&self) -> Result<Self::Stream>;
    /// Waits for all work queued on `stream`.
    fn synchronize_stream(&self, stream: &Self::Stream) -> Result<()>;

    fn create_event(&self) -> Result<Self::Event>;
    /// Marks the point after the work queued so far on `stream`.
    fn record_event(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    /// Waits until the work before `event` has finished.
    fn synchronize_event(&self, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two recorded events; `InvalidInput` if either was never recorded.
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;

    /// Waits for all work on every stream of this runtime.
    fn synchronize(&self) -> Result<()>;

    /// The workspace bytes a dense GEMM with these params needs when it goes to the vendor BLAS
    /// (cuBLASLt, hipBLASLt), or `None` when this runtime leaves it to the dialect's own GEMM
    /// kernels (the default: no vendor BLAS). Both `Gemm::workspace_size` and `Gemm::run` ask,
    /// so the answer must depend on the params and on settings that do not change between a
    /// plan and its runs.
    fn vendor_gemm_workspace(&self, _params: &GemmParams) -> Option<usize> {
        None
    }

    /// Enqueues the GEMM on the vendor BLAS; called only when [`Runtime::vendor_gemm_workspace`]
    /// said `Some`. `Err(Unsupported)` (e.g. no algorithm for these strides or alignments)
    /// sends the launcher to the dialect's kernel instead; any other error is the op's error.
    fn vendor_gemm(&self, _params: &GemmParams, _args: VendorGemmArgs<'_, Self::Buffer>, _stream: &Self::Stream) -> Result<()> {
        Err(Error::Unavailable { why: "this runtime has no vendor GEMM".into() })
    }
}

/// Checks that `[offset, offset + len)` lies inside a buffer of `buf_len` bytes.
pub fn check_range(field: &str, offset: usize, len: usize, buf_len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buf_len => Ok(()),
        _ => Err(Error::invalid(field, format!("range {offset}..{offset}+{len} exceeds a {buf_len}-byte buffer"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_point_at_native_values() {
        let mut a = KernelArgs::new();
        a.push(7i32).push(DevicePtr(0x1234_5678_9abc)).push(2.5f32).push(u64::MAX);
        assert_eq!(a.sizes(), &[4, 8, 4, 8]);
        let p = a.params();
        // SAFETY: the pointers address a's slots, alive and unmodified here.
        unsafe {
            assert_eq!(*(p[0] as *const i32), 7);
            assert_eq!(*(p[1] as *const u64), 0x1234_5678_9abc);
            assert_eq!(*(p[2] as *const f32), 2.5);
            assert_eq!(*(p[3] as *const u64), u64::MAX);
        }
    }

    #[test]
    fn dim3_counts_without_overflow() {
        assert_eq!(Dim3::new(u32::MAX, u32::MAX, u32::MAX).count(), (u32::MAX as u128).pow(3));
        assert_eq!(Dim3::from((3, 4)).count(), 12);
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check_range("dst", 4, 4, 8).is_ok());
        assert!(check_range("dst", 5, 4, 8).is_err());
        assert!(check_range("dst", usize::MAX, 2, 8).is_err());
    }
}
