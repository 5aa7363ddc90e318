//! [`GpuBackend`]: `kernel_api::Backend` and every op trait, over any [`Runtime`]. This is where
//! "what to launch, with which grid and arguments" is written once; CUDA, ROCm and the SIMT
//! emulator only supply the runtime (memory, modules, launches).

use crate::device_checks::{CheckRecords, DeviceChecks};
use crate::runtime::{DevicePtr, KernelArg, KernelArgs, LaunchConfig, ModuleImage, Runtime};
use kernel_api::{Backend, DType, DeviceInfo, Error, Layout, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The contract's backend over a kernel runtime.
pub struct GpuBackend<R: Runtime> {
    rt: R,
    module: R::Module,
    name: String,
    kernels: Mutex<HashMap<String, R::Kernel>>,
    /// The per-stream device error records.
    checks: CheckRecords<R::Buffer>,
    /// Whether launches pass their stream's record ([`DeviceChecks::On`]) or a null pointer.
    checks_on: AtomicBool,
    /// The MLA `*_mma` kernels' KV pipeline stages, fixed by `set_mla_kv_stages` (0: chosen from
    /// the device's shared memory).
    pub(crate) mla_kv_stages: AtomicUsize,
    /// Whether the router's logits past one token tile stay off the matrix units, set by
    /// `set_router_matrix_units` (false: the default, a bf16 weight takes the MMA kernel).
    pub(crate) router_cores_only: AtomicBool,
}

impl<R: Runtime> std::fmt::Debug for GpuBackend<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend").field("name", &self.name).field("device", self.rt.device_info()).finish()
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// Loads the op kernels from `image` (a fatbin, code object or the emulator's host-linked
    /// module) and names the backend (`cuda`, `rocm`, `simt32`, ...). Device checks follow
    /// `K3_DEVICE_CHECKS` (on unless it says `off`).
    pub fn new(rt: R, image: &ModuleImage<'_>, name: impl Into<String>) -> Result<Self> {
        let module = rt.load_module(image)?;
        Self::from_module(rt, module, name)
    }

    /// Wraps a module the runtime has already loaded (e.g. one CUDA module per kernel file,
    /// JIT-compiled or from an embedded fatbin). Allocates the backend's device error records
    /// (4 KiB); device checks start as `K3_DEVICE_CHECKS` says (on unless it says `off`).
    pub fn from_module(rt: R, module: R::Module, name: impl Into<String>) -> Result<Self> {
        let mode = DeviceChecks::from_env()?;
        let checks = CheckRecords::new(&rt)?;
        let b = GpuBackend {
            rt,
            module,
            name: name.into(),
            kernels: Mutex::new(HashMap::new()),
            checks,
            checks_on: AtomicBool::new(true),
            mla_kv_stages: AtomicUsize::new(0),
            router_cores_only: AtomicBool::new(false),
        };
        b.set_device_checks(mode);
        Ok(b)
    }

    /// Switches the kernels' index checks on or off for later launches (see
    /// [`crate::device_checks`]); violations already recorded are still reported.
    pub fn set_device_checks(&self, mode: DeviceChecks) {
        self.checks_on.store(mode == DeviceChecks::On, Ordering::Relaxed);
    }

    pub fn device_checks(&self) -> DeviceChecks {
        if self.checks_on.load(Ordering::Relaxed) {
            DeviceChecks::On
        } else {
            DeviceChecks::Off
        }
    }

    /// Pushes the device error record of `stream` (a null pointer with checks off): the last
    /// argument of every kernel that reads index data from device memory (`k3::ErrorRecord*`,
    /// `csrc/k3/checks.h`).
    pub fn push_checks(&self, args: &mut KernelArgs, stream: &R::Stream) -> Result<()> {
        let ptr = match self.device_checks() {
            DeviceChecks::On => self.checks.record_for(self.rt.stream_key(stream))?,
            DeviceChecks::Off => DevicePtr(0),
        };
        args.push(ptr);
        Ok(())
    }

    pub fn runtime(&self) -> &R {
        &self.rt
    }

    /// Device address of element 0 of `layout` inside `buf`.
    pub fn ptr(&self, buf: &R::Buffer, layout: &Layout) -> DevicePtr {
        self.rt.device_ptr(buf).offset((layout.offset * layout.dtype.size_bytes()) as u64)
    }

    /// Pushes an optional tensor argument (`TensorRef::parts` / `TensorMut::parts`): its device
    /// pointer and its first `strides` strides, or a null pointer and zero strides when it is
    /// absent (kernels test the pointer).
    pub fn push_opt(&self, args: &mut KernelArgs, t: Option<(&R::Buffer, &Layout)>, strides: usize) {
        self.push_opt_parts(args, t, false, strides);
    }

    /// [`GpuBackend::push_opt`] with the dtype code after the pointer (0 when absent).
    pub fn push_opt_typed(&self, args: &mut KernelArgs, t: Option<(&R::Buffer, &Layout)>, strides: usize) {
        self.push_opt_parts(args, t, true, strides);
    }

    fn push_opt_parts(&self, args: &mut KernelArgs, t: Option<(&R::Buffer, &Layout)>, typed: bool, strides: usize) {
        args.push(t.map_or(DevicePtr(0), |(buf, l)| self.ptr(buf, l)));
        if typed {
            args.push(t.map_or(0, |(_, l)| dtype_code(l.dtype)));
        }
        for i in 0..strides {
            args.push(t.and_then(|(_, l)| l.strides.get(i)).map_or(0, |&s| s as i64));
        }
    }

    /// Launches kernel `name` (looked up once, then cached).
    pub fn launch(&self, name: &str, cfg: LaunchConfig, args: &mut KernelArgs, stream: &R::Stream) -> Result<()> {
        let kernel = {
            let mut cache = self.kernels.lock().map_err(|_| Error::Driver { call: "kernel cache".into(), why: "poisoned".into() })?;
            match cache.get(name) {
                Some(k) => k.clone(),
                None => {
                    let k = self.rt.kernel(&self.module, name)?;
                    cache.insert(name.to_string(), k.clone());
                    k
                }
            }
        };
        let params = args.params();
        // SAFETY: launchers pass, in order, exactly the parameters the kernel declares (one
        // KernelArgs push per kernel parameter), and every pointer comes from a layout that the
        // op's plan checked against its buffer.
        unsafe { self.rt.launch(&kernel, &cfg, &params, stream) }
    }
}

/// The dtype code kernels receive (`k3/tensor.h` `DtypeCode`).
pub fn dtype_code(d: DType) -> i32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F8E4M3Fn => 3,
        DType::F8E4M3Fnuz => 4,
        DType::F8E5M2 => 5,
        DType::E8M0 => 6,
        DType::U8 | DType::F4E2M1x2 => 7,
        DType::I32 => 8,
        DType::I64 => 9,
        _ => -1,
    }
}

/// Converts a size to a kernel's `int` argument, or names the field that is too large.
pub fn to_i32(field: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::unsupported(field, format!("{v} exceeds the kernels' 32-bit range")))
}

/// Strides as `i64` kernel arguments.
pub fn push_strides(args: &mut KernelArgs, layout: &Layout) {
    for &s in &layout.strides {
        args.push(s as i64);
    }
}

/// Pushes any kernel argument; a helper so launchers read as one list.
pub fn arg<T: KernelArg>(args: &mut KernelArgs, v: T) {
    args.push(v);
}

/// Whether every row of `t` (its last dimension contiguous, the others the row strides) starts on
/// a 16-byte boundary at `ptr`, so a kernel can move it in 16-byte vectors.
pub fn rows_16b(ptr: DevicePtr, t: &Layout) -> bool {
    let (Some((&inner, outer)), bytes) = (t.strides.split_last(), t.dtype.size_bytes()) else { return false };
    ptr.0 % 16 == 0 && inner == 1 && outer.iter().all(|&s| (s * bytes) % 16 == 0)
}

/// Grid size for `n` items at `per_block` items per block, capped for grid-stride loops.
pub fn blocks_for(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block.max(1)).clamp(1, 65_535) as u32
}

impl<R: Runtime> Backend for GpuBackend<R> {
    type Buffer = R::Buffer;
    type Stream = R::Stream;

    fn name(&self) -> &str {
        &self.name
    }
    fn device_info(&self) -> &DeviceInfo {
        self.rt.device_info()
    }
    fn default_stream(&self) -> &R::Stream {
        self.rt.default_stream()
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<R::Buffer> {
        let mut b = self.rt.alloc(bytes)?;
        self.rt.memset(&mut b, 0, self.rt.default_stream())?;
        Ok(b)
    }
    fn upload(&self, bytes: &[u8]) -> Result<R::Buffer> {
        let mut b = self.rt.alloc(bytes.len())?;
        self.rt.copy_h2d(bytes, &mut b, 0, self.rt.default_stream())?;
        Ok(b)
    }
    fn download(&self, buf: &R::Buffer, out: &mut [u8]) -> Result<()> {
        if out.len() != self.rt.buffer_len(buf) {
            return Err(Error::invalid("out", format!("{} bytes for a {}-byte buffer", out.len(), self.rt.buffer_len(buf))));
        }
        self.rt.synchronize()?;
        self.checks.take_all(&self.rt, self.rt.default_stream())?;
        self.rt.copy_d2h(buf, 0, out, self.rt.default_stream())?;
        self.rt.synchronize_stream(self.rt.default_stream())
    }
    fn buffer_len(&self, buf: &R::Buffer) -> usize {
        self.rt.buffer_len(buf)
    }
    fn synchronize(&self, stream: &R::Stream) -> Result<()> {
        self.rt.synchronize_stream(stream)?;
        self.checks.take(&self.rt, self.rt.stream_key(stream), stream)
    }
}
