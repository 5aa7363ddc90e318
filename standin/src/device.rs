//! The emulated device: one per stand-in library (process-wide), its allocation table, handle
//! tables, and the SIMT emulator that runs its kernels. Every driver call goes through
//! [`Device::lock`]; work runs synchronously when it is enqueued (so stream order, event order
//! and "finished before the call returned" all hold), unless its stream is capturing.

use crate::error::{Error, Kind, Result};
use crate::gemm::BlasState;
use crate::graph::Node;
use crate::handles::Table;
use crate::image::{self, Image, Target};
use crate::memory::Memory;
use crate::personality::{self, Personality, Vendor};
use crate::stream::{Event, Stream};
use k3_backend_simt::{ParamKind, SimtKernel, SimtRuntime};
use k3_kernels::Runtime;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// A loaded image.
pub struct Module {
    pub image: Image,
    /// Functions already looked up, by name (one handle per kernel, as the drivers do).
    pub functions: HashMap<String, u64>,
}

/// A kernel of a loaded module, resolved to the emulator's build of it.
#[derive(Clone)]
pub struct Function {
    pub module: u64,
    pub name: Arc<str>,
    pub kernel: SimtKernel,
    pub params: Vec<ParamKind>,
    pub static_smem: u32,
    pub regs: Option<u32>,
    /// Threads per block this kernel can launch with (registers, launch bounds, device limit).
    pub max_threads: u32,
    /// Dynamic shared memory a launch may ask for (raised by the opt-in attribute call).
    pub max_dynamic_smem: u32,
}

/// Everything behind the device lock.
pub struct State {
    pub mem: Memory,
    pub streams: Table<Stream>,
    pub events: Table<Event>,
    pub modules: Table<Module>,
    pub functions: Table<Function>,
    pub graphs: Table<Arc<Vec<Node>>>,
    pub execs: Table<Arc<Vec<Node>>>,
    pub blas: BlasState,
    pub initialized: bool,
}

/// The device of one stand-in library.
pub struct Device {
    pub personality: Personality,
    pub simt: SimtRuntime,
    state: Mutex<State>,
}

static DEVICE: OnceLock<std::result::Result<Device, Error>> = OnceLock::new();

/// The process's device for `vendor` (made on first use from `K3_STANDIN_ARCH`), or why there
/// is none (`NoDevice`: a personality of the other vendor, an unknown name).
pub fn device(vendor: Vendor) -> Result<&'static Device> {
    DEVICE.get_or_init(|| Device::new(vendor)).as_ref().map_err(Clone::clone)
}

impl Device {
    fn new(vendor: Vendor) -> Result<Self> {
        let personality = personality::from_env(vendor).map_err(|m| Error::new(Kind::NoDevice, m))?;
        let simt = SimtRuntime::new(vendor.warp_size())
            .and_then(|r| r.with_shared_limit(personality.smem_per_block_optin as usize))
            .map_err(|e| Error::new(Kind::NoDevice, format!("the SIMT emulator cannot start: {e}")))?;
        let mem = Memory::new(personality.total_mem)?;
        let destroy = |v: Vendor, cu: &'static str, hip: &'static str| if v == Vendor::Cuda { cu } else { hip };
        Ok(Device {
            simt,
            state: Mutex::new(State {
                mem,
                streams: Table::new("stream", destroy(vendor, "cuStreamDestroy", "hipStreamDestroy")),
                events: Table::new("event", destroy(vendor, "cuEventDestroy", "hipEventDestroy")),
                modules: Table::new("module", destroy(vendor, "cuModuleUnload", "hipModuleUnload")),
                functions: Table::new("function", destroy(vendor, "cuModuleUnload of its module", "hipModuleUnload of its module")),
                graphs: Table::new("graph", destroy(vendor, "cuGraphDestroy", "hipGraphDestroy")),
                execs: Table::new("executable graph", destroy(vendor, "cuGraphExecDestroy", "hipGraphExecDestroy")),
                blas: BlasState::new(vendor),
                initialized: false,
            }),
            personality,
        })
    }

    pub fn vendor(&self) -> Vendor {
        self.personality.vendor
    }

    /// The device state (a poisoned lock is recovered: every update keeps the tables consistent).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `cuInit` / `hipInit`: later calls need it (CUDA's rule; HIP initialises implicitly).
    pub fn init(&self) {
        self.lock().initialized = true;
    }

    pub fn require_init(&self) -> Result<()> {
        if self.vendor() == Vendor::Cuda && !self.lock().initialized {
            return Err(Error::new(Kind::NotInitialized, "cuInit has not been called"));
        }
        Ok(())
    }

    // ---- memory ----

    pub fn alloc(&self, len: usize) -> Result<u64> {
        let mut st = self.lock();
        st.forbid_during_capture("a device allocation")?;
        st.mem.alloc(len)
    }

    pub fn free(&self, ptr: u64) -> Result<()> {
        let mut st = self.lock();
        st.forbid_during_capture("freeing device memory")?;
        st.mem.free(ptr)
    }

    /// Whether `ptr` is a device address (in an allocation, live or freed).
    pub fn is_device_ptr(&self, ptr: u64) -> bool {
        self.lock().mem.owns(ptr)
    }

    pub fn mem_info(&self) -> (u64, u64) {
        let st = self.lock();
        (st.mem.free_bytes(), st.mem.total())
    }

    // ---- modules ----

    /// Loads the image at `ptr` and checks it was built for this device.
    ///
    /// # Safety
    /// `ptr` must point to a complete image.
    pub unsafe fn load_module(&self, ptr: *const u8) -> Result<u64> {
        // SAFETY: forwarded.
        let image = unsafe { image::parse_at(ptr) }?;
        self.check_target(&image.target)?;
        Ok(self.lock().modules.insert(Module { image, functions: HashMap::new() }))
    }

    fn check_target(&self, t: &Target) -> Result<()> {
        let p = &self.personality;
        let (maj, min) = p.cc;
        let ok = match (t, p.vendor) {
            (Target::Cubin { major, minor, arch_specific: true }, Vendor::Cuda) => (*major, *minor) == (maj, min),
            (Target::Cubin { major, minor, arch_specific: false }, Vendor::Cuda) => *major == maj && *minor <= min,
            (Target::Ptx { target }, Vendor::Cuda) => {
                let digits: String = target.trim_start_matches("sm_").chars().take_while(|c| c.is_ascii_digit()).collect();
                let suffix = target.trim_start_matches("sm_").trim_start_matches(|c: char| c.is_ascii_digit());
                match digits.parse::<u32>() {
                    Ok(v) if suffix == "a" => (v / 10, v % 10) == (maj, min),
                    Ok(v) if suffix == "f" => v / 10 == maj && v % 10 <= min,
                    Ok(v) => v <= maj * 10 + min,
                    Err(_) => false,
                }
            }
            (Target::Amd { gfx }, Vendor::Hip) => gfx == p.arch,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::new(
                Kind::NoBinaryForGpu,
                format!("the image targets {t:?}, which does not run on this {} ({})", p.product, p.arch),
            ))
        }
    }

    pub fn unload_module(&self, h: u64) -> Result<()> {
        let mut st = self.lock();
        let m = st.modules.remove(h)?;
        for f in m.functions.values() {
            let _ = st.functions.remove(*f);
        }
        Ok(())
    }

    /// The kernel `name` of module `h`: it must be in the image and in the emulator's registry,
    /// with the parameter list the image declares.
    pub fn get_function(&self, h: u64, name: &str) -> Result<u64> {
        let mut st = self.lock();
        let m = st.modules.get(h)?;
        if let Some(&f) = m.functions.get(name) {
            return Ok(f);
        }
        let meta = m.image.kernel(name).cloned().ok_or_else(|| {
            Error::new(Kind::NotFound, format!("no kernel `{name}` in this image (it has: {})", m.image.names().join(", ")))
        })?;
        let kernel = self.simt.kernel(&self.simt.module(), name).map_err(|e| {
            Error::new(Kind::NotFound, format!("kernel `{name}` is in the image but the emulator cannot run it: {e}"))
        })?;
        let params = kernel.params();
        if let Some(declared) = &meta.params {
            let same = declared.len() == params.len()
                && declared.iter().zip(&params).all(|(d, k)| {
                    d.size as usize == k.size() && d.pointer.is_none_or(|p| p == (*k == ParamKind::Pointer))
                });
            if !same {
                return Err(Error::new(
                    Kind::InvalidImage,
                    format!(
                        "kernel `{name}`: the image declares parameters {declared:?} but the emulator's build takes {params:?} \
                         (image and sources out of step: rebuild)"
                    ),
                ));
            }
        }
        let p = &self.personality;
        let max_threads = self.max_threads(meta.regs, meta.max_threads);
        let max_dynamic_smem = p.smem_per_block.saturating_sub(meta.static_smem);
        let f = Function {
            module: h,
            name: Arc::from(name),
            kernel,
            params,
            static_smem: meta.static_smem,
            regs: meta.regs,
            max_threads,
            max_dynamic_smem,
        };
        let fh = st.functions.insert(f);
        if let Ok(m) = st.modules.get_mut(h) {
            m.functions.insert(name.to_string(), fh);
        }
        Ok(fh)
    }

    /// Threads per block a kernel can launch with: the device limit, its launch bounds, and
    /// its registers (allocated per warp in units of 256 on NVIDIA; a wave's VGPRs on AMD).
    fn max_threads(&self, regs: Option<u32>, bound: Option<u32>) -> u32 {
        let p = &self.personality;
        let mut t = p.max_threads_per_block;
        if let Some(b) = bound.filter(|&b| b > 0) {
            t = t.min(b);
        }
        if let Some(r) = regs.filter(|&r| r > 0) {
            let w = p.warp_size();
            let per_warp = match p.vendor {
                Vendor::Cuda => (r * w).div_ceil(256) * 256,
                Vendor::Hip => r * w,
            };
            let warps = p.regs_per_block / per_warp.max(1);
            t = t.min(warps * w);
        }
        t
    }

    /// A function's attribute table, read under the lock.
    pub fn function(&self, h: u64) -> Result<Function> {
        self.lock().functions.get(h).cloned()
    }

    /// Raises the dynamic shared memory a kernel may use (the opt-in attribute).
    pub fn set_max_dynamic_smem(&self, h: u64, bytes: i64) -> Result<()> {
        let limit = self.personality.smem_per_block_optin;
        let mut st = self.lock();
        let f = st.functions.get_mut(h)?;
        let most = limit.saturating_sub(f.static_smem);
        match u32::try_from(bytes) {
            Ok(b) if b <= most => {
                f.max_dynamic_smem = b;
                Ok(())
            }
            _ => Err(Error::new(
                Kind::InvalidValue,
                format!(
                    "`{}`: {bytes} bytes of dynamic shared memory exceed the {most} this device allows ({limit} per block minus {} static)",
                    f.name, f.static_smem
                ),
            )),
        }
    }
}

impl State {
    /// The rule of CUDA's and HIP's global / thread-local capture modes: a call that may be
    /// unsafe during capture (allocation, free, a device-wide sync) fails, and invalidates the
    /// capture, when this thread captures in a mode other than relaxed or another thread
    /// captures in global mode.
    pub fn forbid_during_capture(&mut self, what: &str) -> Result<()> {
        let me = std::thread::current().id();
        let mut blocked = None;
        for (h, s) in self.streams.values_mut() {
            if let Some(c) = s.capture.as_mut() {
                if c.forbids(me) {
                    c.invalidate(format!("{what} was requested while capturing"));
                    blocked = Some((*h, c.mode));
                }
            }
        }
        match blocked {
            Some((h, mode)) => Err(Error::new(
                Kind::CaptureUnsupported,
                format!("{what} is not permitted while stream {h:#x} is capturing in {mode:?} mode (the capture is now invalid)"),
            )),
            None => Ok(()),
        }
    }
}
