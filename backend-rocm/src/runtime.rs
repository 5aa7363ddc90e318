//! [`RocmRuntime`]: the [`Runtime`] of one HIP device, over the function table of
//! [`crate::hip`].
//!
//! - Every call first makes the runtime's device current on the calling thread (`hipSetDevice`,
//!   skipped when this thread already has it).
//! - Buffers are `hipMalloc` allocations; `free` (and drop) wait for the device first, so
//!   "released after the queued work" holds whatever stream used the buffer.
//! - The default stream is an owned non-blocking stream (not the null stream, which would
//!   serialise against every other stream); `create_stream` makes more of the same.
//! - Copies are `hipMemcpyAsync` on the given stream. HIP does not promise that an async copy
//!   from pageable host memory has read its source when the call returns, so `copy_h2d` waits
//!   for its stream (the trait lets the caller reuse the bytes at once); device-to-host waits too.
//! - Modules: `load_module` takes an HSA code object; [`RocmRuntime::kernels`] loads a whole
//!   [`KernelSet`], one HIP module per `.cu` file, from the embedded code object of the device's
//!   processor when there is one, else compiled by hiprtc for it (cached on disk);
//!   `K3_ROCM_KERNELS=embedded|jit` forces one path.
//! - Launches check the configuration against the device limits, then `hipModuleLaunchKernel`
//!   with the launchers' `kernelParams` (`extra` is always null).

use crate::blaslt::{GemmRoute, HipBlasLt};
use crate::device::{self, Probed};
use crate::hip::{self, Hip};
use crate::hiprtc::{self, CacheOutcome, CodeObjectCache};
use crate::kernels::{self, KernelSet};
use crate::sys;
use k3_kernels::runtime::check_range;
use k3_kernels::{DevicePtr, ImageFormat, LaunchConfig, ModuleImage, Runtime, VendorGemmArgs};
use kernel_api::ops::GemmParams;
use kernel_api::{DeviceInfo, Error, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One HIP device as a [`Runtime`].
pub struct RocmRuntime {
    pub(crate) hip: &'static Hip,
    pub(crate) dev: Arc<Device>,
    info: DeviceInfo,
    probed: Probed,
    stream: RocmStream,
    sets: Mutex<HashMap<KernelSet, RocmModule>>,
    pub(crate) blaslt: OnceLock<std::result::Result<HipBlasLt, String>>,
    /// A [`GemmRoute`] as u8, changeable through `&self` (benches compare both routes).
    pub(crate) gemm_route: AtomicU8,
}

impl fmt::Debug for RocmRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmRuntime({}, {}, HIP {})", self.info.name, self.probed.target_id, hip::version_string(self.hip.runtime_version))
    }
}

/// The device an object belongs to; dropping the last owner changes nothing on the device.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) hip: &'static Hip,
    pub(crate) ordinal: i32,
}

thread_local! {
    /// The device this thread last made current through [`Device::bind`].
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

impl Device {
    /// Makes this device current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        if CURRENT.with(|c| c.get()) == Some(self.ordinal) {
            return Ok(());
        }
        device::set_device(self.hip, self.ordinal)?;
        CURRENT.with(|c| c.set(Some(self.ordinal)));
        Ok(())
    }

    pub(crate) fn check(&self, call: &str, rc: sys::hipError_t) -> Result<()> {
        self.hip.check(call, rc)
    }

    /// `hipDeviceSynchronize` on this device.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: resolved symbol.
        self.check("hipDeviceSynchronize", unsafe { (self.hip.fns.hipDeviceSynchronize)() })
    }
}

/// Where a kernel file's code came from when a [`KernelSet`] was loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelOrigin {
    /// The code object embedded at build time for the device's processor.
    Embedded,
    /// hiprtc, compiled now (and stored in the cache when it could be).
    Compiled(CacheOutcome),
}

/// How [`RocmRuntime::kernels`] chooses between embedded code objects and hiprtc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The embedded code object for the device's processor when there is one, else hiprtc.
    Auto,
    /// Embedded code objects only.
    Embedded,
    /// hiprtc only.
    Jit,
}

impl KernelSource {
    /// `K3_ROCM_KERNELS` (`auto`, `embedded`, `jit`; unset = auto).
    pub fn from_env() -> Result<Self> {
        crate::env::choice("K3_ROCM_KERNELS", &[("auto", KernelSource::Auto), ("embedded", KernelSource::Embedded), ("jit", KernelSource::Jit)])
    }
}

impl RocmRuntime {
    /// Opens device `ordinal`. `Unavailable` (never a panic) when there is no HIP runtime, no
    /// device, a runtime too old or lacking a symbol this crate calls; the reason says which
    /// and what was searched.
    pub fn new(ordinal: usize) -> Result<Self> {
        let route = GemmRoute::from_env()?;
        let hip = hip::hip()?;
        let probed = device::probe(hip, ordinal)?;
        let dev = Arc::new(Device { hip, ordinal: probed.ordinal });
        CURRENT.with(|c| c.set(Some(probed.ordinal)));
        let stream = RocmStream::new(&dev)?;
        Ok(RocmRuntime {
            hip,
            dev,
            info: probed.info.clone(),
            probed,
            stream,
            sets: Mutex::new(HashMap::new()),
            blaslt: OnceLock::new(),
            gemm_route: AtomicU8::new(route as u8),
        })
    }

    /// Number of HIP devices; `Unavailable` when the runtime is missing or reports none usable.
    pub fn device_count() -> Result<usize> {
        hip::hip()?.device_count()
    }

    /// What the probe found (also `Runtime::device_info`).
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// The device's full target ID (`gfx942:sramecc+:xnack-`).
    pub fn target_id(&self) -> &str {
        &self.probed.target_id
    }
    /// The processor kernels are compiled for (`gfx942`).
    pub fn processor(&self) -> &str {
        &self.info.arch
    }
    /// `hipRuntimeGetVersion` (major · 10⁷ + minor · 10⁵ + patch).
    pub fn runtime_version(&self) -> i32 {
        self.hip.runtime_version
    }
    /// Where the HIP runtime was loaded from.
    pub fn library(&self) -> &str {
        &self.hip.lib.found_as
    }
    /// Which `hipGetDeviceProperties*` entry point gave the arch name.
    pub fn arch_name_source(&self) -> &'static str {
        self.probed.props_call
    }
    /// Device memory in bytes (0 when the runtime did not say).
    pub fn total_memory(&self) -> usize {
        self.probed.total_mem
    }

    /// One line for reports: device, target, limits, runtime, and where kernels come from.
    pub fn summary(&self) -> String {
        let i = &self.info;
        format!(
            "{} ({}, {} CUs, wave {}, {} KiB LDS/block, {} MiB L2, fp8 {:?}), HIP {} from {}; kernels: {}",
            i.name,
            self.probed.target_id,
            i.compute_units,
            i.warp_size,
            i.shared_mem_per_block / 1024,
            i.l2_bytes >> 20,
            i.fp8,
            hip::version_string(self.hip.runtime_version),
            self.hip.lib.found_as,
            self.kernel_availability()
        )
    }

    /// Where kernels for this device would come from: `embedded code objects (...)`,
    /// `hiprtc x.y JIT for ...`, or `none: <reason>`.
    pub fn kernel_availability(&self) -> String {
        if kernels::embedded_processors().contains(&self.processor()) {
            return format!("embedded code objects ({})", kernels::embedded_processors().join(","));
        }
        match hiprtc::hiprtc() {
            Ok(rtc) => format!("hiprtc {}.{} JIT for {} ({})", rtc.version().0, rtc.version().1, self.processor(), self.no_embedded_reason("")),
            Err(e) => format!("none: {}; {e}", self.no_embedded_reason("")),
        }
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.dev.bind()
    }

    /// The kernels of `set` (all of `kernels/csrc/<set>`), loaded once per runtime, choosing
    /// the code source by `K3_ROCM_KERNELS`.
    pub fn kernels(&self, set: KernelSet) -> Result<RocmModule> {
        let mut sets = self.sets.lock().map_err(|_| Error::Driver { call: "kernels".into(), why: "lock poisoned".into() })?;
        if let Some(m) = sets.get(&set) {
            return Ok(m.clone());
        }
        let (m, _) = self.load_kernel_set(set, KernelSource::from_env()?, &CodeObjectCache::from_env())?;
        sets.insert(set, m.clone());
        Ok(m)
    }

    /// Loads `set` afresh from the given source (not remembered): the module and where each
    /// file's code came from.
    pub fn load_kernel_set(
        &self,
        set: KernelSet,
        source: KernelSource,
        cache: &CodeObjectCache,
    ) -> Result<(RocmModule, Vec<(String, KernelOrigin)>)> {
        let processor = self.processor().to_string();
        // Parts are pushed as they load, so an error part-way unloads them.
        let mut inner = ModuleInner { name: set.dir().to_string(), parts: Vec::new(), dev: self.dev.clone() };
        let mut origins = Vec::new();
        for file in set.files() {
            let image = kernels::embedded_image(file, &processor).filter(|_| source != KernelSource::Jit);
            let mut embedded_err = None;
            if let Some(img) = image {
                match self.load_image(img, ImageFormat::Hsaco, file) {
                    Ok(m) => {
                        inner.parts.push(Part::of_file(file, m));
                        origins.push((file.to_string(), KernelOrigin::Embedded));
                        continue;
                    }
                    // e.g. target features the device does not have: hiprtc may still work.
                    Err(e) => embedded_err = Some(e),
                }
            }
            if source == KernelSource::Embedded {
                return Err(embedded_err.unwrap_or_else(|| Error::Unavailable { why: self.no_embedded_reason(file) }));
            }
            let rtc = hiprtc::hiprtc().map_err(|e| {
                let why = match e {
                    Error::Unavailable { why } => why,
                    other => other.to_string(),
                };
                let emb = embedded_err.as_ref().map(|e| format!("the embedded code object did not load ({e})")).unwrap_or_else(|| self.no_embedded_reason(file));
                Error::Unavailable { why: format!("no kernel binary for {processor} ({file}): {emb}, and {why}") }
            })?;
            let (code, outcome) = rtc.code_object(file, &processor, self.info.warp_size, cache)?;
            let m = match self.load_image(&code, ImageFormat::Hsaco, file) {
                Ok(m) => m,
                // A cached code object the runtime refuses: compile afresh once rather than fail.
                Err(_) if matches!(outcome, CacheOutcome::Hit(_)) => {
                    self.load_image(&rtc.compile_file(file, &processor, self.info.warp_size)?, ImageFormat::Hsaco, file)?
                }
                Err(e) => return Err(e),
            };
            inner.parts.push(Part::of_file(file, m));
            origins.push((file.to_string(), KernelOrigin::Compiled(outcome)));
        }
        Ok((RocmModule(Arc::new(inner)), origins))
    }

    fn no_embedded_reason(&self, file: &str) -> String {
        let processor = self.processor();
        if kernels::IMAGES.is_empty() {
            let why: Vec<String> = kernels::UNAVAILABLE.iter().map(|(t, why)| format!("{t}: {why}")).collect();
            format!("this build embedded no code objects ({}; install clang-19 / the ziglang wheel and rebuild)", why.join("; "))
        } else if !kernels::embedded_processors().contains(&processor) {
            format!("the embedded code objects were built for {:?} (K3_HIP_ARCHS), not for {processor}", kernels::embedded_processors())
        } else if kernels::embedded_image(file, processor).is_none() {
            format!("clang did not compile {file} for {processor} when this crate was built (see the build warnings)")
        } else {
            "K3_ROCM_KERNELS=jit asks for hiprtc".into()
        }
    }

    fn load_image(&self, bytes: &[u8], format: ImageFormat, name: &str) -> Result<sys::hipModule_t> {
        if format != ImageFormat::Hsaco {
            return Err(Error::unsupported("image.format", format!("{format:?}: ROCm loads HSA code objects (ImageFormat::Hsaco)")));
        }
        if !kernels::is_amdgpu_elf(bytes) {
            return Err(Error::invalid("image.bytes", format!("module `{name}` is not an AMDGPU code object ({} bytes)", bytes.len())));
        }
        self.bind()?;
        let mut m: sys::hipModule_t = std::ptr::null_mut();
        // SAFETY: `bytes` is a complete ELF image that outlives the call (the runtime copies
        // what it needs).
        let rc = unsafe { (self.hip.fns.hipModuleLoadData)(&mut m, bytes.as_ptr().cast()) };
        self.dev.check(&format!("hipModuleLoadData({name})"), rc)?;
        Ok(m)
    }

    fn check_launch(&self, cfg: &LaunchConfig) -> Result<()> {
        let (g, b) = (cfg.grid, cfg.block);
        let p = &self.probed;
        if g.count() == 0 || b.count() == 0 {
            return Err(Error::invalid("cfg", format!("empty grid {g:?} or block {b:?}")));
        }
        if b.count() > p.max_threads_per_block as u128 || b.x > p.max_block[0] || b.y > p.max_block[1] || b.z > p.max_block[2] {
            return Err(Error::invalid(
                "cfg.block",
                format!("{b:?} exceeds the device's {} threads per block (at most {:?} per axis)", p.max_threads_per_block, p.max_block),
            ));
        }
        // HIP's grid limits count work-items, but the kernels' grids are in blocks; a grid
        // axis is also a u32 of work-items on AMD hardware.
        let fits = |blocks: u32, threads: u32, max: u32| blocks <= max && blocks as u64 * threads as u64 <= u32::MAX as u64;
        if !(fits(g.x, b.x, p.max_grid[0]) && fits(g.y, b.y, p.max_grid[1]) && fits(g.z, b.z, p.max_grid[2])) {
            return Err(Error::invalid("cfg.grid", format!("{g:?} exceeds the device's grid limits {:?}", p.max_grid)));
        }
        if cfg.shared_bytes as usize > self.info.shared_mem_per_block {
            return Err(Error::invalid(
                "cfg.shared_bytes",
                format!("{} bytes exceeds the device's {} bytes of LDS per block", cfg.shared_bytes, self.info.shared_mem_per_block),
            ));
        }
        Ok(())
    }

    /// `hipMemcpyAsync` of `bytes` bytes between two addresses (device or host).
    fn memcpy(&self, call: &str, dst: u64, src: u64, bytes: usize, kind: sys::hipMemcpyKind, stream: &RocmStream) -> Result<()> {
        self.bind()?;
        // SAFETY: callers checked both ranges against their buffers, or pass a host slice of
        // exactly `bytes` that stays borrowed until the copy has run.
        let rc = unsafe { (self.hip.fns.hipMemcpyAsync)(dst as *mut c_void, src as *const c_void, bytes, kind, stream.raw()) };
        self.dev.check(call, rc)
    }
}

/// A device allocation.
pub struct RocmBuffer {
    ptr: u64,
    len: usize,
    dev: Arc<Device>,
}

impl RocmBuffer {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }
}

impl Drop for RocmBuffer {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed free leaks the allocation.
        if self.dev.synchronize().is_ok() {
            // SAFETY: allocated by hipMalloc on this device and freed once.
            let _ = unsafe { (self.dev.hip.fns.hipFree)(self.ptr as *mut c_void) };
        }
    }
}

impl fmt::Debug for RocmBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmBuffer({} bytes at {:#x})", self.len, self.ptr)
    }
}

/// An ordered queue of work (an owned non-blocking HIP stream).
#[derive(Clone)]
pub struct RocmStream(Arc<StreamInner>);

struct StreamInner {
    raw: sys::hipStream_t,
    dev: Arc<Device>,
}

// SAFETY: a hipStream_t is a handle the runtime lets any thread use; it is destroyed once.
unsafe impl Send for StreamInner {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: created by hipStreamCreateWithFlags, destroyed once (last Arc).
            let _ = unsafe { (self.dev.hip.fns.hipStreamDestroy)(self.raw) };
        }
    }
}

impl RocmStream {
    fn new(dev: &Arc<Device>) -> Result<Self> {
        dev.bind()?;
        let mut raw: sys::hipStream_t = std::ptr::null_mut();
        // SAFETY: resolved symbol; valid out-pointer.
        let rc = unsafe { (dev.hip.fns.hipStreamCreateWithFlags)(&mut raw, sys::hipStreamNonBlocking) };
        dev.check("hipStreamCreateWithFlags", rc)?;
        Ok(RocmStream(Arc::new(StreamInner { raw, dev: dev.clone() })))
    }
    /// The raw handle (for libraries such as hipBLASLt).
    pub fn raw(&self) -> sys::hipStream_t {
        self.0.raw
    }
}

impl fmt::Debug for RocmStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmStream({:p})", self.0.raw)
    }
}

/// A timing event.
pub struct RocmEvent {
    raw: sys::hipEvent_t,
    dev: Arc<Device>,
    recorded: AtomicBool,
}

// SAFETY: a hipEvent_t is a handle any thread may use; destroyed once in drop.
unsafe impl Send for RocmEvent {}
// SAFETY: as above; `recorded` is atomic.
unsafe impl Sync for RocmEvent {}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: created by hipEventCreateWithFlags, destroyed once.
            let _ = unsafe { (self.dev.hip.fns.hipEventDestroy)(self.raw) };
        }
    }
}

impl fmt::Debug for RocmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmEvent({:p}, recorded: {})", self.raw, self.recorded.load(Ordering::Relaxed))
    }
}

struct Part {
    file: String,
    module: sys::hipModule_t,
    /// The kernels its source registers (`kernels::registered_kernels`, conditional ones included); `None` for an image
    /// loaded by `load_module`, whose contents are unknown.
    declared: Option<Vec<String>>,
}

impl Part {
    fn of_file(file: &str, module: sys::hipModule_t) -> Self {
        Part { file: file.to_string(), module, declared: Some(kernels::source(file).map(|s| kernels::registered_kernels(s, false)).unwrap_or_default()) }
    }

    /// Whether the module may hold kernel `name`.
    fn may_have(&self, name: &str) -> bool {
        self.declared.as_ref().is_none_or(|d| d.iter().any(|k| k == name))
    }
}

struct ModuleInner {
    name: String,
    parts: Vec<Part>,
    dev: Arc<Device>,
}

// SAFETY: hipModule_t handles are usable from any thread with the device current; every use
// binds it first. They are never mutated after load.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        for p in &self.parts {
            // SAFETY: loaded by hipModuleLoadData, unloaded once; kernels hold an Arc to this
            // module, so none outlives it.
            let _ = unsafe { (self.dev.hip.fns.hipModuleUnload)(p.module) };
        }
    }
}

/// Loaded kernels: one HIP module per source file (or a single image from `load_module`).
#[derive(Clone)]
pub struct RocmModule(Arc<ModuleInner>);

impl RocmModule {
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// The source files (or image name) of each HIP module inside.
    pub fn files(&self) -> Vec<&str> {
        self.0.parts.iter().map(|p| p.file.as_str()).collect()
    }
}

impl fmt::Debug for RocmModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmModule({}, {} file(s))", self.0.name, self.0.parts.len())
    }
}

/// A kernel looked up in a module; keeps the module loaded.
#[derive(Clone)]
pub struct RocmKernel {
    func: sys::hipFunction_t,
    name: Arc<str>,
    _module: Arc<ModuleInner>,
}

// SAFETY: a hipFunction_t is a handle into a module kept alive by `_module`; HIP allows
// launching it from any thread with the device current.
unsafe impl Send for RocmKernel {}
// SAFETY: as above; nothing in it is mutated.
unsafe impl Sync for RocmKernel {}

impl RocmKernel {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for RocmKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmKernel({})", self.name)
    }
}

impl Runtime for RocmRuntime {
    type Buffer = RocmBuffer;
    type Stream = RocmStream;
    type Event = RocmEvent;
    type Module = RocmModule;
    type Kernel = RocmKernel;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<RocmBuffer> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // hipMalloc(0) gives a null pointer; an empty buffer still gets a valid address.
        // SAFETY: resolved symbol; valid out-pointer.
        let rc = unsafe { (self.hip.fns.hipMalloc)(&mut p, bytes.max(1)) };
        self.dev.check(&format!("hipMalloc({bytes})"), rc)?;
        Ok(RocmBuffer { ptr: p as u64, len: bytes, dev: self.dev.clone() })
    }

    fn free(&self, buf: RocmBuffer) -> Result<()> {
        self.dev.synchronize()?;
        let ptr = buf.ptr;
        std::mem::forget(buf);
        // SAFETY: allocated by hipMalloc on this device; `buf` was forgotten so drop will not
        // free it again.
        self.dev.check("hipFree", unsafe { (self.hip.fns.hipFree)(ptr as *mut c_void) })
    }

    fn buffer_len(&self, buf: &RocmBuffer) -> usize {
        buf.len
    }

    fn device_ptr(&self, buf: &RocmBuffer) -> DevicePtr {
        buf.device_ptr()
    }

    fn memset(&self, buf: &mut RocmBuffer, value: u8, stream: &RocmStream) -> Result<()> {
        if buf.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range is the whole allocation.
        let rc = unsafe { (self.hip.fns.hipMemsetAsync)(buf.ptr as *mut c_void, value as i32, buf.len, stream.raw()) };
        self.dev.check("hipMemsetAsync", rc)
    }

    fn copy_h2d(&self, src: &[u8], dst: &mut RocmBuffer, dst_offset: usize, stream: &RocmStream) -> Result<()> {
        check_range("dst_offset", dst_offset, src.len(), dst.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.memcpy("hipMemcpyAsync(HtoD)", dst.ptr + dst_offset as u64, src.as_ptr() as u64, src.len(), sys::hipMemcpyHostToDevice, stream)?;
        // The source may be reused once this returns (see the module docs).
        self.synchronize_stream(stream)
    }

    fn copy_d2h(&self, src: &RocmBuffer, src_offset: usize, dst: &mut [u8], stream: &RocmStream) -> Result<()> {
        check_range("src_offset", src_offset, dst.len(), src.len)?;
        if dst.is_empty() {
            return self.synchronize_stream(stream);
        }
        // `dst` stays borrowed until the stream is synchronised below.
        self.memcpy("hipMemcpyAsync(DtoH)", dst.as_mut_ptr() as u64, src.ptr + src_offset as u64, dst.len(), sys::hipMemcpyDeviceToHost, stream)?;
        self.synchronize_stream(stream)
    }

    fn copy_d2d(
        &self,
        src: &RocmBuffer,
        src_offset: usize,
        dst: &mut RocmBuffer,
        dst_offset: usize,
        bytes: usize,
        stream: &RocmStream,
    ) -> Result<()> {
        check_range("src_offset", src_offset, bytes, src.len)?;
        check_range("dst_offset", dst_offset, bytes, dst.len)?;
        if bytes == 0 {
            return Ok(());
        }
        self.memcpy("hipMemcpyAsync(DtoD)", dst.ptr + dst_offset as u64, src.ptr + src_offset as u64, bytes, sys::hipMemcpyDeviceToDevice, stream)
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<RocmModule> {
        let m = self.load_image(image.bytes, image.format, image.name)?;
        let part = Part { file: image.name.to_string(), module: m, declared: None };
        Ok(RocmModule(Arc::new(ModuleInner { name: image.name.to_string(), parts: vec![part], dev: self.dev.clone() })))
    }

    fn kernel(&self, module: &RocmModule, name: &str) -> Result<RocmKernel> {
        let cname = CString::new(name).map_err(|_| Error::invalid("name", "kernel name contains a NUL byte"))?;
        self.bind()?;
        let mut found = Vec::new();
        for p in module.0.parts.iter().filter(|p| p.may_have(name)) {
            let mut f: sys::hipFunction_t = std::ptr::null_mut();
            // SAFETY: a module loaded on this device; a valid C string; valid out-pointer.
            let rc = unsafe { (self.hip.fns.hipModuleGetFunction)(&mut f, p.module, cname.as_ptr()) };
            match rc {
                sys::hipSuccess => found.push((p.file.as_str(), f)),
                // Not in this part (ROCm answers hipErrorNotFound; some versions
                // hipErrorInvalidDeviceFunction or hipErrorInvalidSymbol).
                sys::hipErrorNotFound | sys::hipErrorInvalidDeviceFunction | sys::hipErrorInvalidSymbol => {}
                other => self.dev.check(&format!("hipModuleGetFunction({name})"), other)?,
            }
        }
        match found.as_slice() {
            [(_, f)] => Ok(RocmKernel { func: *f, name: Arc::from(name), _module: module.0.clone() }),
            [] => Err(Error::Unavailable {
                why: format!("no kernel `{name}` in module `{}` ({} file(s))", module.0.name, module.0.parts.len()),
            }),
            many => Err(Error::Unavailable {
                why: format!(
                    "kernel `{name}` is defined in more than one file of `{}`: {:?}",
                    module.0.name,
                    many.iter().map(|(f, _)| *f).collect::<Vec<_>>()
                ),
            }),
        }
    }

    unsafe fn launch(&self, kernel: &RocmKernel, cfg: &LaunchConfig, params: &[*mut c_void], stream: &RocmStream) -> Result<()> {
        self.check_launch(cfg)?;
        self.bind()?;
        let mut params: Vec<*mut c_void> = params.to_vec();
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: the caller guarantees the parameter values match the kernel's signature and
        // every device pointer among them is valid; the configuration was checked above;
        // `extra` is null (the kernelParams form).
        let rc = unsafe {
            (self.hip.fns.hipModuleLaunchKernel)(
                kernel.func,
                g.x,
                g.y,
                g.z,
                b.x,
                b.y,
                b.z,
                cfg.shared_bytes,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.dev.check(&format!("hipModuleLaunchKernel({})", kernel.name), rc)
    }

    fn default_stream(&self) -> &RocmStream {
        &self.stream
    }

    fn stream_key(&self, stream: &RocmStream) -> u64 {
        stream.raw() as u64
    }

    fn create_stream(&self) -> Result<RocmStream> {
        RocmStream::new(&self.dev)
    }

    fn synchronize_stream(&self, stream: &RocmStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream of this device.
        self.dev.check("hipStreamSynchronize", unsafe { (self.hip.fns.hipStreamSynchronize)(stream.raw()) })
    }

    fn create_event(&self) -> Result<RocmEvent> {
        self.bind()?;
        let mut raw: sys::hipEvent_t = std::ptr::null_mut();
        // SAFETY: resolved symbol; valid out-pointer.
        let rc = unsafe { (self.hip.fns.hipEventCreateWithFlags)(&mut raw, sys::hipEventDefault) };
        self.dev.check("hipEventCreateWithFlags", rc)?;
        Ok(RocmEvent { raw, dev: self.dev.clone(), recorded: AtomicBool::new(false) })
    }

    fn record_event(&self, event: &RocmEvent, stream: &RocmStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event and stream of this device.
        self.dev.check("hipEventRecord", unsafe { (self.hip.fns.hipEventRecord)(event.raw, stream.raw()) })?;
        event.recorded.store(true, Ordering::Release);
        Ok(())
    }

    fn synchronize_event(&self, event: &RocmEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event.
        self.dev.check("hipEventSynchronize", unsafe { (self.hip.fns.hipEventSynchronize)(event.raw) })
    }

    fn elapsed_ms(&self, start: &RocmEvent, end: &RocmEvent) -> Result<f32> {
        for (e, field) in [(start, "start"), (end, "end")] {
            if !e.recorded.load(Ordering::Acquire) {
                return Err(Error::invalid(field, "event was never recorded"));
            }
        }
        self.synchronize_event(start)?;
        self.synchronize_event(end)?;
        let mut ms = 0f32;
        // SAFETY: two live, recorded and completed events.
        self.dev.check("hipEventElapsedTime", unsafe { (self.hip.fns.hipEventElapsedTime)(&mut ms, start.raw, end.raw) })?;
        Ok(ms)
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
    }

    fn vendor_gemm_workspace(&self, params: &GemmParams) -> Option<usize> {
        self.blaslt_workspace(params)
    }

    fn vendor_gemm(&self, params: &GemmParams, args: VendorGemmArgs<'_, RocmBuffer>, stream: &RocmStream) -> Result<()> {
        self.gemm_hipblaslt(params, args, stream)
    }
}
