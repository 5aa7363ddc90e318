//! [`SimtRuntime`]: the [`Runtime`] of the SIMT emulator.
//!
//! Device memory is host memory (256-byte aligned allocations), a device pointer is the host
//! address, and a launch runs the kernel to completion before it returns, so streams are
//! ordering tokens and events record the host clock when they are recorded.

use crate::ffi;
use k3_kernels::runtime::check_range;
use k3_kernels::{DevicePtr, ImageFormat, LaunchConfig, ModuleImage, Runtime};
use kernel_api::{BackendKind, DeviceInfo, Error, Fp8Native, Result};
use std::alloc::Layout;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Alignment of every allocation (what cudaMalloc guarantees, and more than any vector load).
const BUFFER_ALIGN: usize = 256;
/// Byte that fresh `alloc` memory holds: NaN as f32/bf16, -1 as an integer.
const POISON_BYTE: u8 = 0xFF;

/// Host memory standing in for a device allocation.
pub struct SimtBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation; Rust code only touches it through &self/&mut self
// copies, kernels through the raw address while a launch (which the caller serialises) runs.
unsafe impl Send for SimtBuffer {}
// SAFETY: as above; shared references never create overlapping Rust references to the bytes.
unsafe impl Sync for SimtBuffer {}

impl SimtBuffer {
    pub(crate) fn new(len: usize, fill: u8) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), BUFFER_ALIGN)
            .map_err(|e| Error::invalid("bytes", format!("{len} bytes cannot be allocated: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::invalid("bytes", format!("out of memory allocating {len} bytes")))?;
        // SAFETY: freshly allocated, layout.size() >= len bytes.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), fill, layout.size()) };
        Ok(SimtBuffer { ptr, len, layout })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address kernels see.
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr.as_ptr() as u64)
    }
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range("src_offset", offset, out.len(), self.len)?;
        // SAFETY: range checked; no launch runs concurrently with a call holding &self here
        // because launches are synchronous and serialised by the runtime.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        check_range("dst_offset", offset, src.len(), self.len)?;
        // SAFETY: range checked; &mut self is exclusive.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }
    pub(crate) fn fill(&mut self, value: u8) {
        // SAFETY: the allocation holds at least len bytes; &mut self is exclusive.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), value, self.len) };
    }
}

impl Drop for SimtBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl fmt::Debug for SimtBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimtBuffer({} bytes at {:p})", self.len, self.ptr)
    }
}

/// A stream: launches and copies run synchronously, so it only names an order.
#[derive(Debug)]
pub struct SimtStream {
    id: u64,
}

impl SimtStream {
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// An event: the host time at which it was recorded (all earlier work has finished by then).
#[derive(Debug, Default)]
pub struct SimtEvent {
    at: Mutex<Option<Instant>>,
}

/// The kernels linked into this binary.
#[derive(Clone, Debug)]
pub struct SimtModule {
    name: String,
}

/// A registered kernel (a pointer into the C++ registry, valid for the whole process).
#[derive(Clone, Copy)]
struct KernelHandle(*const c_void);
// SAFETY: the registry entry it points to is immutable after static initialisation.
unsafe impl Send for KernelHandle {}
// SAFETY: as above.
unsafe impl Sync for KernelHandle {}

#[derive(Clone)]
pub struct SimtKernel {
    handle: KernelHandle,
    name: Arc<str>,
    warp_size: u32,
}

impl SimtKernel {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn warp_size(&self) -> u32 {
        self.warp_size
    }

    /// The kernel's parameters, in order, as its C++ signature declares them (recorded at
    /// registration by `K3_EXPORT`).
    pub fn params(&self) -> Vec<ParamKind> {
        let (mut descs, mut n): (*const u8, c_int) = (std::ptr::null(), 0);
        // SAFETY: the handle came from simt_get_function; out-pointers to locals.
        if unsafe { ffi::simt_kernel_params(self.handle.0, &mut descs, &mut n) } != ffi::SIMT_OK || descs.is_null() {
            return Vec::new();
        }
        // SAFETY: the registry holds `n` descriptors for the process's lifetime.
        let descs = unsafe { std::slice::from_raw_parts(descs, n.max(0) as usize) };
        descs.iter().map(|&d| ParamKind::from_desc(d)).collect()
    }
}

/// One kernel parameter as the kernel's C++ signature declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A pointer (a device address).
    Pointer,
    /// A scalar of this many bytes.
    Scalar(u8),
}

impl ParamKind {
    /// From the registry's byte: bit 7 = pointer, low 7 bits = size (`ParamDesc` in
    /// `k3/simt_abi.h`).
    fn from_desc(d: u8) -> Self {
        if d & 0x80 != 0 {
            ParamKind::Pointer
        } else {
            ParamKind::Scalar(d & 0x7f)
        }
    }

    /// Bytes the parameter's value occupies.
    pub fn size(self) -> usize {
        match self {
            ParamKind::Pointer => std::mem::size_of::<*const u8>(),
            ParamKind::Scalar(n) => n as usize,
        }
    }
}

impl fmt::Debug for SimtKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimtKernel({} @ warp {})", self.name, self.warp_size)
    }
}

/// One kernel compiled into the binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    pub warp_size: u32,
    pub nparams: usize,
    /// Source file relative to `kernels/csrc`.
    pub file: String,
}

/// MMA shapes the emulator implements (numbers as in `k3/mma_layout.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaShape {
    /// NVIDIA mma.sync m16n8k16, warp 32.
    M16N8K16 = 0,
    /// AMD MFMA 32x32x8 bf16, warp 64.
    M32N32K8 = 1,
    /// AMD MFMA 16x16x16 bf16, warp 64.
    M16N16K16 = 2,
}

impl MmaShape {
    /// (M, N, K, warp size).
    pub const fn dims(self) -> (usize, usize, usize, u32) {
        match self {
            MmaShape::M16N8K16 => (16, 8, 16, 32),
            MmaShape::M32N32K8 => (32, 32, 8, 64),
            MmaShape::M16N16K16 => (16, 16, 16, 64),
        }
    }
}

/// Operands of an MMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaOperand {
    A = 0,
    B = 1,
    /// C and D share one layout.
    C = 2,
}

fn env_u64(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| Error::invalid(name, format!("`{v}` is not a non-negative integer"))),
        _ => Ok(None),
    }
}

/// Bytes, optionally with a K or M suffix (`65536`, `64K`, `1M`).
fn parse_bytes(name: &str, v: &str) -> Result<usize> {
    let t = v.trim();
    let (digits, mul) = match t.chars().last() {
        Some('k') | Some('K') => (&t[..t.len() - 1], 1024),
        Some('m') | Some('M') => (&t[..t.len() - 1], 1024 * 1024),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| Error::invalid(name, format!("`{v}` is not a byte count (e.g. 65536, 64K)")))
}

/// Largest shared-memory limit the C++ runtime accepts.
pub const MAX_SHARED_LIMIT: usize = 16 << 20;

/// The runtime's worker count: what the C++ pool reads from `K3_SIMT_WORKERS` (1..=64,
/// default 2) when the first launch creates it.
fn workers_from_env() -> Result<u32> {
    match env_u64("K3_SIMT_WORKERS")? {
        None => Ok(2),
        Some(n) if (1..=64).contains(&n) => Ok(n as u32),
        Some(n) => Err(Error::invalid("K3_SIMT_WORKERS", format!("{n} is outside 1..=64"))),
    }
}

/// The SIMT emulator as a [`Runtime`], at warp size 32 or 64.
#[derive(Debug)]
pub struct SimtRuntime {
    warp_size: u32,
    seed: u64,
    shared_limit: usize,
    info: DeviceInfo,
    stream: SimtStream,
    next_stream: AtomicU64,
}

impl SimtRuntime {
    /// A runtime running the kernels compiled at `warp_size` (32 or 64). Reads `K3_SIMT_SEED`
    /// (0, the default, is the deterministic ascending order) and `K3_SIMT_SHARED_LIMIT`
    /// (default 48 KiB at warp 32, 64 KiB at warp 64).
    pub fn new(warp_size: u32) -> Result<Self> {
        if warp_size != 32 && warp_size != 64 {
            return Err(Error::invalid("warp_size", format!("{warp_size}: the emulator runs warps of 32 or 64")));
        }
        let seed = env_u64("K3_SIMT_SEED")?.unwrap_or(0);
        let default_limit = if warp_size == 32 { 48 * 1024 } else { 64 * 1024 };
        let shared_limit = match std::env::var("K3_SIMT_SHARED_LIMIT") {
            Ok(v) if !v.trim().is_empty() => parse_bytes("K3_SIMT_SHARED_LIMIT", &v)?,
            _ => default_limit,
        };
        let workers = workers_from_env()?;
        let rt = SimtRuntime {
            warp_size,
            seed,
            shared_limit: 0,
            info: DeviceInfo {
                kind: BackendKind::Simt,
                arch: format!("simt{warp_size}"),
                name: format!("SIMT emulator (warp {warp_size}, {} context switch)", context_backend()),
                warp_size,
                compute_units: workers,
                shared_mem_per_block: 0,
                l2_bytes: 0,
                fp8: Fp8Native::Both,
            },
            stream: SimtStream { id: 0 },
            next_stream: AtomicU64::new(1),
        };
        rt.with_shared_limit(shared_limit)
    }

    /// The same runtime with another schedule seed (0 = deterministic ascending order; any
    /// other value shuffles the resume order after every barrier and warp collective and fills
    /// shared memory with seeded random bytes).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The same runtime with another shared-memory limit per block (static + dynamic bytes).
    pub fn with_shared_limit(mut self, bytes: usize) -> Result<Self> {
        if bytes > MAX_SHARED_LIMIT {
            return Err(Error::invalid("shared_limit", format!("{bytes} bytes is above the emulator's {MAX_SHARED_LIMIT}")));
        }
        self.shared_limit = bytes;
        self.info.shared_mem_per_block = bytes;
        Ok(self)
    }

    pub fn warp_size(&self) -> u32 {
        self.warp_size
    }
    pub fn seed(&self) -> u64 {
        self.seed
    }
    pub fn shared_limit(&self) -> usize {
        self.shared_limit
    }

    /// The module holding every kernel of `kernels/csrc` (they are linked into the binary).
    pub fn module(&self) -> SimtModule {
        SimtModule { name: "simt".into() }
    }

    /// Launches by name with typed arguments.
    ///
    /// # Safety
    /// As for [`Runtime::launch`]: `args` must match the kernel's parameter types and every
    /// device pointer must be valid for the kernel's accesses.
    pub unsafe fn launch_args(&self, name: &str, cfg: &LaunchConfig, args: &mut k3_kernels::KernelArgs) -> Result<()> {
        let k = self.kernel(&self.module(), name)?;
        let params = args.params();
        // SAFETY: forwarded from the caller.
        unsafe { self.launch(&k, cfg, &params, &self.stream) }
    }
}

/// Every kernel compiled into this binary, at both warp sizes.
pub fn kernels() -> Vec<KernelInfo> {
    // SAFETY: plain queries of the immutable registry; strings are static C strings.
    unsafe {
        (0..ffi::simt_kernel_count())
            .filter_map(|i| {
                let (mut name, mut file): (*const c_char, *const c_char) = (std::ptr::null(), std::ptr::null());
                let (mut warp, mut np): (c_int, c_int) = (0, 0);
                if ffi::simt_kernel_info(i, &mut name, &mut warp, &mut np, &mut file) != ffi::SIMT_OK {
                    return None;
                }
                Some(KernelInfo {
                    name: CStr::from_ptr(name).to_string_lossy().into_owned(),
                    warp_size: warp as u32,
                    nparams: np as usize,
                    file: CStr::from_ptr(file).to_string_lossy().into_owned(),
                })
            })
            .collect()
    }
}

/// Whether the runtime and kernels were built with AddressSanitizer (`K3_SIMT_ASAN=1`).
pub fn asan_enabled() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { ffi::simt_asan_enabled() != 0 }
}

/// `x86_64-asm` or `ucontext`.
pub fn context_backend() -> &'static str {
    // SAFETY: returns a static C string.
    unsafe { CStr::from_ptr(ffi::simt_context_backend()).to_str().unwrap_or("?") }
}

/// Number of worker threads (starts the pool if it is not running yet).
pub fn worker_count() -> usize {
    // SAFETY: no arguments.
    unsafe { ffi::simt_worker_count() as usize }
}

/// (row, col) of `lane`'s `slot` in `operand`, read from the emulator's own lookup tables.
pub fn mma_layout(shape: MmaShape, operand: MmaOperand, lane: usize, slot: usize) -> Option<(usize, usize)> {
    let (lane, slot) = (c_int::try_from(lane).ok()?, c_int::try_from(slot).ok()?);
    let (mut r, mut c): (c_int, c_int) = (0, 0);
    // SAFETY: out-pointers to locals.
    let rc = unsafe { ffi::simt_mma_layout(shape as c_int, operand as c_int, lane, slot, &mut r, &mut c) };
    (rc == ffi::SIMT_OK).then_some((r as usize, c as usize))
}

impl Runtime for SimtRuntime {
    type Buffer = SimtBuffer;
    type Stream = SimtStream;
    type Event = SimtEvent;
    type Module = SimtModule;
    type Kernel = SimtKernel;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, bytes: usize) -> Result<SimtBuffer> {
        SimtBuffer::new(bytes, POISON_BYTE)
    }
    fn free(&self, buf: SimtBuffer) -> Result<()> {
        drop(buf);
        Ok(())
    }
    fn buffer_len(&self, buf: &SimtBuffer) -> usize {
        buf.len()
    }
    fn device_ptr(&self, buf: &SimtBuffer) -> DevicePtr {
        buf.device_ptr()
    }
    fn memset(&self, buf: &mut SimtBuffer, value: u8, _stream: &SimtStream) -> Result<()> {
        buf.fill(value);
        Ok(())
    }
    fn copy_h2d(&self, src: &[u8], dst: &mut SimtBuffer, dst_offset: usize, _stream: &SimtStream) -> Result<()> {
        dst.write(dst_offset, src)
    }
    fn copy_d2h(&self, src: &SimtBuffer, src_offset: usize, dst: &mut [u8], _stream: &SimtStream) -> Result<()> {
        src.read(src_offset, dst)
    }
    fn copy_d2d(
        &self,
        src: &SimtBuffer,
        src_offset: usize,
        dst: &mut SimtBuffer,
        dst_offset: usize,
        bytes: usize,
        _stream: &SimtStream,
    ) -> Result<()> {
        check_range("src_offset", src_offset, bytes, src.len())?;
        check_range("dst_offset", dst_offset, bytes, dst.len())?;
        // SAFETY: both ranges checked; src and dst are distinct buffers (&mut dst is exclusive).
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.as_ptr().add(src_offset), dst.ptr.as_ptr().add(dst_offset), bytes) };
        Ok(())
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<SimtModule> {
        match image.format {
            ImageFormat::HostLinked => Ok(SimtModule { name: image.name.to_string() }),
            other => Err(Error::unsupported(
                "image.format",
                format!("{other:?}: the SIMT emulator runs the host-linked kernels of kernels/csrc only"),
            )),
        }
    }

    fn kernel(&self, module: &SimtModule, name: &str) -> Result<SimtKernel> {
        let cname = CString::new(name).map_err(|_| Error::invalid("name", "kernel name contains a NUL byte"))?;
        let mut out: *const c_void = std::ptr::null();
        // SAFETY: valid C string and out-pointer.
        let rc = unsafe { ffi::simt_get_function(cname.as_ptr(), self.warp_size as c_int, &mut out) };
        match rc {
            ffi::SIMT_OK => Ok(SimtKernel { handle: KernelHandle(out), name: Arc::from(name), warp_size: self.warp_size }),
            ffi::SIMT_DUPLICATE => Err(Error::Unavailable {
                why: format!("kernel `{name}` is defined more than once in kernels/csrc at warp {}", self.warp_size),
            }),
            ffi::SIMT_NOT_FOUND => Err(Error::Unavailable {
                why: format!(
                    "no kernel `{name}` at warp {} in module `{}` (is it marked K3_EXPORT?)",
                    self.warp_size, module.name
                ),
            }),
            other => Err(Error::Driver { call: "simt_get_function".into(), why: format!("status {other}") }),
        }
    }

    unsafe fn launch(&self, kernel: &SimtKernel, cfg: &LaunchConfig, params: &[*mut c_void], _stream: &SimtStream) -> Result<()> {
        if kernel.warp_size != self.warp_size {
            return Err(Error::invalid(
                "kernel",
                format!("`{}` was looked up at warp {}, this runtime runs warp {}", kernel.name, kernel.warp_size, self.warp_size),
            ));
        }
        let grid = [cfg.grid.x, cfg.grid.y, cfg.grid.z];
        let block = [cfg.block.x, cfg.block.y, cfg.block.z];
        let mut err = vec![0u8; 4096];
        // SAFETY: the handle came from simt_get_function; params are the caller's promise;
        // err is a writable buffer of the given length.
        let rc = unsafe {
            ffi::simt_launch_kernel(
                kernel.handle.0,
                grid.as_ptr(),
                block.as_ptr(),
                cfg.shared_bytes,
                params.as_ptr(),
                params.len(),
                self.seed,
                self.shared_limit as u64,
                err.as_mut_ptr() as *mut c_char,
                err.len(),
            )
        };
        let msg = || {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            String::from_utf8_lossy(&err[..end]).into_owned()
        };
        match rc {
            ffi::SIMT_OK => Ok(()),
            ffi::SIMT_INVALID => {
                let m = msg();
                let (field, why) = m.split_once('\n').unwrap_or(("launch", m.as_str()));
                Err(Error::invalid(field, format!("kernel `{}`: {why}", kernel.name)))
            }
            ffi::SIMT_KERNEL_ERROR => Err(Error::Driver { call: format!("simt_launch_kernel({})", kernel.name), why: msg() }),
            other => Err(Error::Driver { call: format!("simt_launch_kernel({})", kernel.name), why: format!("status {other}: {}", msg()) }),
        }
    }

    fn default_stream(&self) -> &SimtStream {
        &self.stream
    }
    fn stream_key(&self, stream: &SimtStream) -> u64 {
        stream.id
    }
    fn create_stream(&self) -> Result<SimtStream> {
        Ok(SimtStream { id: self.next_stream.fetch_add(1, Ordering::Relaxed) })
    }
    fn synchronize_stream(&self, _stream: &SimtStream) -> Result<()> {
        Ok(())
    }
    fn create_event(&self) -> Result<SimtEvent> {
        Ok(SimtEvent::default())
    }
    fn record_event(&self, event: &SimtEvent, _stream: &SimtStream) -> Result<()> {
        *event.at.lock().map_err(|_| Error::Driver { call: "record_event".into(), why: "event lock poisoned".into() })? =
            Some(Instant::now());
        Ok(())
    }
    fn synchronize_event(&self, _event: &SimtEvent) -> Result<()> {
        Ok(())
    }
    fn elapsed_ms(&self, start: &SimtEvent, end: &SimtEvent) -> Result<f32> {
        let get = |e: &SimtEvent, field: &str| -> Result<Instant> {
            e.at.lock()
                .ok()
                .and_then(|g| *g)
                .ok_or_else(|| Error::invalid(field, "event was never recorded"))
        };
        let (s, e) = (get(start, "start")?, get(end, "end")?);
        Ok(e.saturating_duration_since(s).as_secs_f32() * 1e3)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_suffixes() {
        assert_eq!(parse_bytes("x", "65536").ok(), Some(65536));
        assert_eq!(parse_bytes("x", "64K").ok(), Some(65536));
        assert_eq!(parse_bytes("x", "1m").ok(), Some(1 << 20));
        assert!(parse_bytes("x", "lots").is_err());
        assert!(parse_bytes("x", "K").is_err());
    }
}
