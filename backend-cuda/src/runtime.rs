//! [`CudaRuntime`]: the [`Runtime`] of one CUDA device, over the driver API through cudarc.
//!
//! - Buffers are raw `cuMemAlloc` allocations; `free` (and drop) wait for the context first, so
//!   "released after the queued work" holds whatever stream used the buffer.
//! - The default stream is an owned non-blocking stream (not the legacy NULL stream, which
//!   would serialise against every other stream); `create_stream` makes more of the same.
//! - Copies are async on the given stream: host-to-device from pageable memory returns once the
//!   driver has staged the bytes (the trait's "may be reused" rule); device-to-host waits.
//! - Modules: `load_module` takes a PTX, cubin or fatbin image; [`CudaRuntime::kernels`] loads a
//!   whole [`KernelSet`] of kernels/csrc, one CUDA module per `.cu` file, from the embedded
//!   cubin for the device's arch when there is one, else compiled by NVRTC for the device's own arch
//!   (cached on disk); `K3_CUDA_KERNELS=embedded|jit` forces one path.
//! - Launches check the configuration against the device limits and raise a kernel's dynamic
//!   shared-memory limit when a launch asks for more than the 48 KiB default.

use crate::blaslt::{BlasLtGemm, GemmRoute};
use crate::driver::{self, drv, Probed};
use crate::kernels::{self, Arch, KernelSet};
use crate::nvrtc::{self, CacheOutcome, CubinCache};
use cudarc::driver::{result, sys, CudaContext};
use k3_kernels::runtime::check_range;
use k3_kernels::{DevicePtr, ImageFormat, LaunchConfig, ModuleImage, Runtime, VendorGemmArgs};
use kernel_api::ops::GemmParams;
use kernel_api::{DeviceInfo, Error, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYNAMIC_SMEM: u32 = 48 * 1024;

/// One CUDA device as a [`Runtime`].
pub struct CudaRuntime {
    pub(crate) ctx: Arc<CudaContext>,
    info: DeviceInfo,
    cc: (u32, u32),
    driver_version: i32,
    max_threads: u32,
    elapsed_v2: bool,
    stream: CudaStream,
    sets: Mutex<HashMap<KernelSet, CudaModule>>,
    pub(crate) blaslt: OnceLock<std::result::Result<crate::blaslt::BlasLt, String>>,
    /// A [`GemmRoute`] as u8, changeable through `&self` (benches compare both routes).
    pub(crate) gemm_route: AtomicU8,
}

impl fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaRuntime({}, {}, driver {})", self.info.name, self.info.arch, driver::version_string(self.driver_version))
    }
}

/// Where a kernel file's code came from when a [`KernelSet`] was loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelOrigin {
    /// The nvcc cubin embedded at build time for the device's arch.
    Embedded,
    /// NVRTC, compiled now (and stored in the cache when it could be).
    Compiled(CacheOutcome),
}

/// How [`CudaRuntime::kernels`] chooses between embedded binaries and NVRTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// Embedded cubin for the device's arch when there is one, else NVRTC (the default).
    Auto,
    /// Embedded cubins only.
    Embedded,
    /// NVRTC only.
    Jit,
}

impl KernelSource {
    /// `K3_CUDA_KERNELS` (`auto`, `embedded`, `jit`; unset = auto).
    pub fn from_env() -> Result<Self> {
        crate::env::choice("K3_CUDA_KERNELS", &[("auto", KernelSource::Auto), ("embedded", KernelSource::Embedded), ("jit", KernelSource::Jit)])
    }
}

impl CudaRuntime {
    /// Opens device `ordinal`. `Unavailable` (never a panic) when there is no libcuda, no
    /// device, or a driver too old for the calls this crate makes; the reason says which.
    pub fn new(ordinal: usize) -> Result<Self> {
        let route = GemmRoute::from_env()?;
        let Probed { ctx, info, compute_capability, driver_version, max_threads_per_block, elapsed_v2 } =
            driver::probe(ordinal)?;
        let stream = CudaStream::new(&ctx)?;
        Ok(CudaRuntime {
            ctx,
            info,
            cc: compute_capability,
            driver_version,
            max_threads: max_threads_per_block,
            elapsed_v2,
            stream,
            sets: Mutex::new(HashMap::new()),
            blaslt: OnceLock::new(),
            gemm_route: AtomicU8::new(route as u8),
        })
    }

    /// Number of CUDA devices; `Unavailable` when the driver is missing or reports none usable.
    pub fn device_count() -> Result<usize> {
        driver::device_count()
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.cc
    }
    /// The arch kernels are compiled for on this device (`sm_90a` on an H100/H200).
    pub fn arch(&self) -> Arch {
        Arch::for_device(self.cc.0, self.cc.1)
    }
    /// The driver's CUDA version (`12040` = 12.4).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }
    /// The cudarc context, for code that wants cudarc's own API on this device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// One line for reports: device, arch, limits, driver, and where kernels would come from.
    pub fn summary(&self) -> String {
        let i = &self.info;
        format!(
            "{} ({}, {} SMs, {} KiB shared/block, {} MiB L2), driver CUDA {}; kernels: {}",
            i.name,
            i.arch,
            i.compute_units,
            i.shared_mem_per_block / 1024,
            i.l2_bytes >> 20,
            driver::version_string(self.driver_version),
            self.kernel_availability()
        )
    }

    /// Where kernels for this device would come from: `embedded cubins (...)`, `NVRTC x.y`,
    /// or `none: <reason>`.
    pub fn kernel_availability(&self) -> String {
        if kernels::embedded_covers(self.cc.0, self.cc.1) {
            return format!("embedded cubins ({})", kernels::embedded_targets().join(","));
        }
        match nvrtc::nvrtc() {
            Ok(nv) => format!("NVRTC {}.{} JIT for {} ({})", nv.version().0, nv.version().1, self.arch(), self.no_embedded_reason("")),
            Err(e) => format!("none: {e}"),
        }
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// The kernels of `set` (all of `kernels/csrc/<set>`), loaded once per runtime, choosing
    /// the code source by `K3_CUDA_KERNELS`.
    pub fn kernels(&self, set: KernelSet) -> Result<CudaModule> {
        let mut sets = self.sets.lock().map_err(|_| Error::Driver { call: "kernels".into(), why: "lock poisoned".into() })?;
        if let Some(m) = sets.get(&set) {
            return Ok(m.clone());
        }
        let (m, _) = self.load_kernel_set(set, KernelSource::from_env()?, &CubinCache::from_env())?;
        sets.insert(set, m.clone());
        Ok(m)
    }

    /// Loads `set` afresh from the given source (not remembered): the module and where each
    /// file's code came from.
    pub fn load_kernel_set(
        &self,
        set: KernelSet,
        source: KernelSource,
        cache: &CubinCache,
    ) -> Result<(CudaModule, Vec<(String, KernelOrigin)>)> {
        let arch = self.arch();
        // Parts are pushed into the module as they load, so an error part-way unloads them.
        let mut inner = ModuleInner::new(set.dir().to_string(), Vec::new(), self.ctx.clone());
        let mut origins = Vec::new();
        for file in set.files() {
            let cubin = kernels::embedded_cubin(file, self.cc.0, self.cc.1).filter(|_| source != KernelSource::Jit);
            let mut embedded_err = None;
            if let Some(img) = cubin {
                match self.load_image(img, ImageFormat::Cubin, file) {
                    Ok(m) => {
                        inner.parts.push(Part { file: file.to_string(), module: m });
                        origins.push((file.to_string(), KernelOrigin::Embedded));
                        continue;
                    }
                    // e.g. a cubin from a newer nvcc than the driver: NVRTC may still work.
                    Err(e) => embedded_err = Some(e),
                }
            }
            if source == KernelSource::Embedded {
                return Err(embedded_err.unwrap_or_else(|| Error::Unavailable { why: self.no_embedded_reason(file) }));
            }
            let nv = nvrtc::nvrtc().map_err(|e| {
                let why = match e {
                    Error::Unavailable { why } => why,
                    other => other.to_string(),
                };
                let emb = embedded_err.as_ref().map(|e| format!("the embedded cubin did not load ({e})")).unwrap_or_else(|| self.no_embedded_reason(file));
                Error::Unavailable { why: format!("no kernel binary for {arch} ({file}): {emb}, and {why}") }
            })?;
            let (cubin, outcome) = nv.cubin(file, &arch, cache)?;
            let m = match self.load_image(&cubin, ImageFormat::Cubin, file) {
                Ok(m) => m,
                // A cached cubin the driver refuses (damaged, or from another driver setup):
                // compile afresh once rather than fail.
                Err(_) if matches!(outcome, CacheOutcome::Hit(_)) => {
                    self.load_image(&nv.compile_cubin(file, &arch)?, ImageFormat::Cubin, file)?
                }
                Err(e) => return Err(e),
            };
            inner.parts.push(Part { file: file.to_string(), module: m });
            origins.push((file.to_string(), KernelOrigin::Compiled(outcome)));
        }
        Ok((CudaModule(Arc::new(inner)), origins))
    }

    fn no_embedded_reason(&self, file: &str) -> String {
        if kernels::IMAGES.is_empty() {
            let why: Vec<String> = kernels::UNAVAILABLE.iter().map(|(t, why)| format!("{t}: {why}")).collect();
            format!("this build embedded no kernel binaries ({}; set CUDA_HOME or NVCC and rebuild)", why.join("; "))
        } else if !kernels::embedded_covers(self.cc.0, self.cc.1) {
            format!("the embedded kernels were built for {:?} (K3_CUDA_ARCHS), not for {}", kernels::embedded_targets(), self.arch())
        } else if kernels::embedded_cubin(file, self.cc.0, self.cc.1).is_none() {
            format!("nvcc did not compile {file} when this crate was built (see the build warnings)")
        } else {
            "K3_CUDA_KERNELS=jit asks for NVRTC".into()
        }
    }

    fn load_image(&self, bytes: &[u8], format: ImageFormat, name: &str) -> Result<sys::CUmodule> {
        self.bind()?;
        // PTX must be NUL-terminated text; cubins and fatbins are used as they are.
        let owned;
        let data: &[u8] = match format {
            ImageFormat::Ptx if bytes.last() != Some(&0) => {
                let mut v = bytes.to_vec();
                v.push(0);
                owned = v;
                &owned
            }
            ImageFormat::Ptx | ImageFormat::Cubin | ImageFormat::Fatbin => bytes,
            other => {
                return Err(Error::unsupported("image.format", format!("{other:?}: CUDA loads PTX, cubin or fatbin images")))
            }
        };
        if data.is_empty() {
            return Err(Error::invalid("image.bytes", format!("module `{name}` is empty")));
        }
        // SAFETY: `data` is a complete image of the declared kind and outlives the call (the
        // driver copies what it needs).
        unsafe { result::module::load_data(data.as_ptr() as *const c_void) }
            .map_err(|e| Error::Driver { call: format!("cuModuleLoadData({name}, {format:?})"), why: driver::describe(e) })
    }

    fn check_launch(&self, cfg: &LaunchConfig) -> Result<()> {
        let (g, b) = (cfg.grid, cfg.block);
        if g.count() == 0 || b.count() == 0 {
            return Err(Error::invalid("cfg", format!("empty grid {g:?} or block {b:?}")));
        }
        if b.count() > self.max_threads as u128 || b.x > 1024 || b.y > 1024 || b.z > 64 {
            return Err(Error::invalid("cfg.block", format!("{b:?} exceeds the device's {} threads per block", self.max_threads)));
        }
        if g.x > i32::MAX as u32 || g.y > 65535 || g.z > 65535 {
            return Err(Error::invalid("cfg.grid", format!("{g:?} exceeds the CUDA grid limits (2^31-1, 65535, 65535)")));
        }
        if cfg.shared_bytes as usize > self.info.shared_mem_per_block {
            return Err(Error::invalid(
                "cfg.shared_bytes",
                format!("{} bytes exceeds the device's {} bytes per block", cfg.shared_bytes, self.info.shared_mem_per_block),
            ));
        }
        Ok(())
    }
}

/// A device allocation.
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl CudaBuffer {
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

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; cudarc keeps them for the next checked call.
        self.ctx.record_err(self.ctx.synchronize());
        // SAFETY: allocated by cuMemAlloc in this context and freed once.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaBuffer({} bytes at {:#x})", self.len, self.ptr)
    }
}

/// An ordered queue of work (an owned non-blocking CUDA stream).
#[derive(Clone)]
pub struct CudaStream(Arc<cudarc::driver::CudaStream>);

impl CudaStream {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.new_stream().map(CudaStream).map_err(drv("cuStreamCreate"))
    }
    /// The raw handle (for libraries such as cuBLASLt).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.0.cu_stream()
    }
    /// cudarc's stream, for code that wants cudarc's own API.
    pub fn cudarc(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.0
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaStream({:p})", self.0.cu_stream())
    }
}

/// A timing event.
pub struct CudaEvent {
    ev: cudarc::driver::CudaEvent,
    recorded: AtomicBool,
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEvent({:p}, recorded: {})", self.ev.cu_event(), self.recorded.load(Ordering::Relaxed))
    }
}

struct Part {
    file: String,
    module: sys::CUmodule,
}

struct ModuleInner {
    name: String,
    parts: Vec<Part>,
    ctx: Arc<CudaContext>,
    /// Dynamic shared-memory limit raised on each function (by address), so that every lookup
    /// of a kernel sees the one value the driver holds and limits only ever grow.
    smem_limits: Mutex<HashMap<usize, u32>>,
}

impl ModuleInner {
    fn new(name: String, parts: Vec<Part>, ctx: Arc<CudaContext>) -> Self {
        ModuleInner { name, parts, ctx, smem_limits: Mutex::new(HashMap::new()) }
    }
}

// SAFETY: CUmodule handles are usable from any thread once the owning context is current;
// every use binds the context first.
unsafe impl Send for ModuleInner {}
// SAFETY: as above; the handles are never mutated after load.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        for p in &self.parts {
            // SAFETY: loaded by cuModuleLoadData in this context; unloaded once. Kernels hold
            // an Arc to this module, so none outlives it.
            self.ctx.record_err(unsafe { result::module::unload(p.module) });
        }
    }
}

/// Loaded kernels: one CUDA module per source file (or a single image from `load_module`).
#[derive(Clone)]
pub struct CudaModule(Arc<ModuleInner>);

impl CudaModule {
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// The source files (or image name) of each CUDA module inside.
    pub fn files(&self) -> Vec<&str> {
        self.0.parts.iter().map(|p| p.file.as_str()).collect()
    }
}

impl fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaModule({}, {} file(s))", self.0.name, self.0.parts.len())
    }
}

/// A kernel looked up in a module; keeps the module loaded.
#[derive(Clone)]
pub struct CudaKernel {
    func: sys::CUfunction,
    name: Arc<str>,
    module: Arc<ModuleInner>,
}

// SAFETY: a CUfunction is a handle into a module kept alive by `_module`; the driver allows
// launching it from any thread with the context current.
unsafe impl Send for CudaKernel {}
// SAFETY: as above; the only mutable state is the module's locked limit table.
unsafe impl Sync for CudaKernel {}

impl CudaKernel {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaKernel({})", self.name)
    }
}

impl Runtime for CudaRuntime {
    type Buffer = CudaBuffer;
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = CudaModule;
    type Kernel = CudaKernel;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        self.bind()?;
        // cuMemAlloc rejects 0 bytes; an empty buffer still gets a valid address.
        // SAFETY: the context is current.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }
            .map_err(|e| Error::Driver { call: format!("cuMemAlloc({bytes})"), why: driver::describe(e) })?;
        Ok(CudaBuffer { ptr, len: bytes, ctx: self.ctx.clone() })
    }

    fn free(&self, buf: CudaBuffer) -> Result<()> {
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))?;
        let ptr = buf.ptr;
        std::mem::forget(buf);
        // SAFETY: allocated by cuMemAlloc in this context; `buf` was forgotten so drop will not
        // free it again.
        unsafe { result::free_sync(ptr) }.map_err(drv("cuMemFree"))
    }

    fn buffer_len(&self, buf: &CudaBuffer) -> usize {
        buf.len
    }

    fn device_ptr(&self, buf: &CudaBuffer) -> DevicePtr {
        buf.device_ptr()
    }

    fn memset(&self, buf: &mut CudaBuffer, value: u8, stream: &CudaStream) -> Result<()> {
        if buf.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range is the whole allocation.
        unsafe { result::memset_d8_async(buf.ptr, value, buf.len, stream.cu_stream()) }.map_err(drv("cuMemsetD8Async"))
    }

    fn copy_h2d(&self, src: &[u8], dst: &mut CudaBuffer, dst_offset: usize, stream: &CudaStream) -> Result<()> {
        check_range("dst_offset", dst_offset, src.len(), dst.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: range checked. From pageable memory the driver stages `src` before returning,
        // so the caller may reuse it afterwards.
        unsafe { result::memcpy_htod_async(dst.ptr + dst_offset as u64, src, stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))
    }

    fn copy_d2h(&self, src: &CudaBuffer, src_offset: usize, dst: &mut [u8], stream: &CudaStream) -> Result<()> {
        check_range("src_offset", src_offset, dst.len(), src.len)?;
        if dst.is_empty() {
            return self.synchronize_stream(stream);
        }
        self.bind()?;
        // SAFETY: range checked; `dst` stays borrowed until the stream is synchronised below.
        unsafe { result::memcpy_dtoh_async(dst, src.ptr + src_offset as u64, stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.synchronize_stream(stream)
    }

    fn copy_d2d(
        &self,
        src: &CudaBuffer,
        src_offset: usize,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        check_range("src_offset", src_offset, bytes, src.len)?;
        check_range("dst_offset", dst_offset, bytes, dst.len)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges checked.
        unsafe {
            result::memcpy_dtod_async(dst.ptr + dst_offset as u64, src.ptr + src_offset as u64, bytes, stream.cu_stream())
        }
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<CudaModule> {
        let m = self.load_image(image.bytes, image.format, image.name)?;
        let part = Part { file: image.name.to_string(), module: m };
        Ok(CudaModule(Arc::new(ModuleInner::new(image.name.to_string(), vec![part], self.ctx.clone()))))
    }

    fn kernel(&self, module: &CudaModule, name: &str) -> Result<CudaKernel> {
        let cname = CString::new(name).map_err(|_| Error::invalid("name", "kernel name contains a NUL byte"))?;
        self.bind()?;
        let mut found = Vec::new();
        let mut not_found = None;
        for p in &module.0.parts {
            // SAFETY: a module loaded in this context; a valid C string.
            match unsafe { result::module::get_function(p.module, cname.clone()) } {
                Ok(f) => found.push((p.file.as_str(), f)),
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => not_found = Some(driver::describe(e)),
                Err(e) => return Err(Error::Driver { call: format!("cuModuleGetFunction({name})"), why: driver::describe(e) }),
            }
        }
        // The driver's own words when the module is a single image (several say "not here" each).
        let detail = not_found.filter(|_| module.0.parts.len() == 1).map(|d| format!(": {d}")).unwrap_or_default();
        match found.as_slice() {
            [(_, f)] => Ok(CudaKernel {
                func: *f,
                name: Arc::from(name),
                module: module.0.clone(),
            }),
            [] => Err(Error::Unavailable {
                why: format!("no kernel `{name}` in module `{}` ({} file(s)){detail}", module.0.name, module.0.parts.len()),
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

    unsafe fn launch(&self, kernel: &CudaKernel, cfg: &LaunchConfig, params: &[*mut c_void], stream: &CudaStream) -> Result<()> {
        self.check_launch(cfg)?;
        self.bind()?;
        if cfg.shared_bytes > DEFAULT_DYNAMIC_SMEM {
            let mut limits = kernel.module.smem_limits.lock().map_err(|_| Error::Driver { call: "launch".into(), why: "lock poisoned".into() })?;
            let current = limits.entry(kernel.func as usize).or_insert(DEFAULT_DYNAMIC_SMEM);
            if cfg.shared_bytes > *current {
                // SAFETY: a function of a loaded module; the value is within the opt-in maximum
                // (checked above).
                unsafe {
                    result::function::set_function_attribute(
                        kernel.func,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        cfg.shared_bytes as i32,
                    )
                }
                .map_err(|e| Error::Driver { call: format!("cuFuncSetAttribute({})", kernel.name), why: driver::describe(e) })?;
                *current = cfg.shared_bytes;
            }
        }
        let mut params: Vec<*mut c_void> = params.to_vec();
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: the caller guarantees the parameter values match the kernel's signature and
        // every device pointer among them is valid; the configuration was checked above.
        unsafe { result::launch_kernel(kernel.func, (g.x, g.y, g.z), (b.x, b.y, b.z), cfg.shared_bytes, stream.cu_stream(), &mut params) }
            .map_err(|e| Error::Driver { call: format!("cuLaunchKernel({})", kernel.name), why: driver::describe(e) })
    }

    fn default_stream(&self) -> &CudaStream {
        &self.stream
    }

    fn stream_key(&self, stream: &CudaStream) -> u64 {
        stream.cu_stream() as u64
    }

    fn create_stream(&self) -> Result<CudaStream> {
        CudaStream::new(&self.ctx)
    }

    fn synchronize_stream(&self, stream: &CudaStream) -> Result<()> {
        stream.0.synchronize().map_err(drv("cuStreamSynchronize"))
    }

    fn create_event(&self) -> Result<CudaEvent> {
        let ev = self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("cuEventCreate"))?;
        Ok(CudaEvent { ev, recorded: AtomicBool::new(false) })
    }

    fn record_event(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        event.ev.record(&stream.0).map_err(drv("cuEventRecord"))?;
        event.recorded.store(true, Ordering::Release);
        Ok(())
    }

    fn synchronize_event(&self, event: &CudaEvent) -> Result<()> {
        event.ev.synchronize().map_err(drv("cuEventSynchronize"))
    }

    fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        for (e, field) in [(start, "start"), (end, "end")] {
            if !e.recorded.load(Ordering::Acquire) {
                return Err(Error::invalid(field, "event was never recorded"));
            }
        }
        self.synchronize_event(start)?;
        self.synchronize_event(end)?;
        let mut ms = 0f32;
        // SAFETY: two live, recorded and completed events of this context. v2 where the driver
        // has it (12.8+), else the original entry point.
        let rc = unsafe {
            if self.elapsed_v2 {
                sys::cuEventElapsedTime_v2(&mut ms, start.ev.cu_event(), end.ev.cu_event())
            } else {
                // The CUDA 13 bindings only declare _v2; older drivers export the original.
                type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
                let f: ElapsedFn = driver::driver_lib()?.function::<ElapsedFn>("cuEventElapsedTime").ok_or_else(|| {
                    Error::Unavailable { why: "the CUDA driver exports neither cuEventElapsedTime_v2 nor cuEventElapsedTime".into() }
                })?;
                f(&mut ms, start.ev.cu_event(), end.ev.cu_event())
            }
        };
        rc.result().map_err(drv("cuEventElapsedTime"))?;
        Ok(ms)
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    fn vendor_gemm_workspace(&self, params: &GemmParams) -> Option<usize> {
        self.blaslt_workspace(&BlasLtGemm::from_params(params))
    }

    fn vendor_gemm(&self, params: &GemmParams, args: VendorGemmArgs<'_, CudaBuffer>, stream: &CudaStream) -> Result<()> {
        self.gemm_blaslt_vendor(params, args, stream)
    }
}
