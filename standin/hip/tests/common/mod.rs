//! The test harness: the built `libk3_standin_hip.so` opened with libloading, its exports called
//! through their C signatures (as backend-rocm calls them), and the code objects of
//! `kernels/csrc/tests/reduce.cu` that build.rs compiled for gfx942 and gfx950.
#![allow(dead_code)]

use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A capture in global mode forbids allocations and synchronising calls from every thread of the
/// process (the drivers' rule, which the stand-in keeps), and the test harness runs tests on
/// parallel threads: the test that captures in global mode holds this lock for writing, every
/// other test of the binary for reading, so none of them allocates during that capture.
static CAPTURE: RwLock<()> = RwLock::new(());

/// Held by every test that does not capture in global mode (see [`CAPTURE`]).
pub fn beside_captures() -> RwLockReadGuard<'static, ()> {
    CAPTURE.read().unwrap_or_else(|e| e.into_inner())
}

/// Held by a test that captures in global mode (see [`CAPTURE`]).
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    CAPTURE.write().unwrap_or_else(|e| e.into_inner())
}

pub mod images {
    include!(concat!(env!("OUT_DIR"), "/test_images.rs"));
}

pub type H = *mut c_void;

/// The stand-in library next to this test binary's deps folder.
pub fn library_path() -> PathBuf {
    standin_library("libk3_standin_hip.so")
}

macro_rules! api {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// Every function of the HIP subset, resolved once.
        #[allow(non_snake_case)]
        pub struct Hip { $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)* _lib: Library }
        impl Hip {
            fn open() -> Hip {
                let path = library_path();
                // SAFETY: loading the stand-in runs only Rust and C++ static initialisers.
                let lib = unsafe { Library::new(&path) }.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                // SAFETY: each symbol is looked up with its C signature from hip_runtime_api.h / hipblaslt.h.
                unsafe {
                    Hip { $($name: *lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(stringify!($name).as_bytes())
                        .unwrap_or_else(|e| panic!("{}: {e}", stringify!($name))),)* _lib: lib }
                }
            }
        }
    };
}

api! {
    hipInit: fn(c_uint) -> c_int;
    hipDriverGetVersion: fn(*mut c_int) -> c_int;
    hipRuntimeGetVersion: fn(*mut c_int) -> c_int;
    hipGetDeviceCount: fn(*mut c_int) -> c_int;
    hipSetDevice: fn(c_int) -> c_int;
    hipGetDevice: fn(*mut c_int) -> c_int;
    hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> c_int;
    hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> c_int;
    hipDeviceTotalMem: fn(*mut usize, c_int) -> c_int;
    hipGetDeviceProperties: fn(H, c_int) -> c_int;
    hipGetDevicePropertiesR0600: fn(H, c_int) -> c_int;
    hipGetErrorName: fn(c_int) -> *const c_char;
    hipGetErrorString: fn(c_int) -> *const c_char;
    hipGetLastError: fn() -> c_int;
    hipPeekAtLastError: fn() -> c_int;
    hipMalloc: fn(*mut H, usize) -> c_int;
    hipFree: fn(H) -> c_int;
    hipMemcpyAsync: fn(H, *const c_void, usize, c_int, H) -> c_int;
    hipMemsetAsync: fn(H, c_int, usize, H) -> c_int;
    hipMemGetInfo: fn(*mut usize, *mut usize) -> c_int;
    hipModuleLoadData: fn(*mut H, *const c_void) -> c_int;
    hipModuleUnload: fn(H) -> c_int;
    hipModuleGetFunction: fn(*mut H, H, *const c_char) -> c_int;
    hipModuleLaunchKernel: fn(H, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, H, *mut *mut c_void, *mut *mut c_void) -> c_int;
    hipFuncGetAttribute: fn(*mut c_int, c_int, H) -> c_int;
    hipStreamCreateWithFlags: fn(*mut H, c_uint) -> c_int;
    hipStreamDestroy: fn(H) -> c_int;
    hipStreamSynchronize: fn(H) -> c_int;
    hipStreamWaitEvent: fn(H, H, c_uint) -> c_int;
    hipDeviceSynchronize: fn() -> c_int;
    hipEventCreate: fn(*mut H) -> c_int;
    hipEventCreateWithFlags: fn(*mut H, c_uint) -> c_int;
    hipEventDestroy: fn(H) -> c_int;
    hipEventRecord: fn(H, H) -> c_int;
    hipEventSynchronize: fn(H) -> c_int;
    hipEventQuery: fn(H) -> c_int;
    hipEventElapsedTime: fn(*mut f32, H, H) -> c_int;
    hipStreamBeginCapture: fn(H, c_int) -> c_int;
    hipStreamEndCapture: fn(H, *mut H) -> c_int;
    hipGraphInstantiate: fn(*mut H, H, *mut H, *mut c_char, usize) -> c_int;
    hipGraphLaunch: fn(H, H) -> c_int;
    hipGraphExecDestroy: fn(H) -> c_int;
    hipGraphDestroy: fn(H) -> c_int;
    hipStreamIsCapturing: fn(H, *mut c_int) -> c_int;
    hipblasLtCreate: fn(*mut H) -> c_int;
    hipblasLtDestroy: fn(H) -> c_int;
    hipblasLtMatmulDescCreate: fn(*mut H, c_int, c_int) -> c_int;
    hipblasLtMatmulDescDestroy: fn(H) -> c_int;
    hipblasLtMatmulDescSetAttribute: fn(H, c_int, *const c_void, usize) -> c_int;
    hipblasLtMatrixLayoutCreate: fn(*mut H, c_int, u64, u64, i64) -> c_int;
    hipblasLtMatrixLayoutDestroy: fn(H) -> c_int;
    hipblasLtMatrixLayoutSetAttribute: fn(H, c_int, *const c_void, usize) -> c_int;
    hipblasLtMatmulPreferenceCreate: fn(*mut H) -> c_int;
    hipblasLtMatmulPreferenceDestroy: fn(H) -> c_int;
    hipblasLtMatmulPreferenceSetAttribute: fn(H, c_int, *const c_void, usize) -> c_int;
    hipblasLtMatmulAlgoGetHeuristic: fn(H, H, H, H, H, H, H, c_int, *mut c_void, *mut c_int) -> c_int;
    hipblasLtMatmul: fn(H, H, *const c_void, *const c_void, H, *const c_void, H, *const c_void, *const c_void, H, H, H, *const c_void, H, usize, H) -> c_int;
}

// SAFETY: function pointers into a library that stays loaded.
unsafe impl Sync for Hip {}
// SAFETY: as above.
unsafe impl Send for Hip {}

/// The library, opened once per test process. A CUDA personality left in K3_STANDIN_ARCH by a
/// `standin-env.sh cuda` in the same shell is not this library's: the default (gfx942) is used.
pub fn hip() -> &'static Hip {
    static HIP: OnceLock<Hip> = OnceLock::new();
    HIP.get_or_init(|| {
        if std::env::var("K3_STANDIN_ARCH").is_ok_and(|a| a.starts_with("sm_")) && std::env::var_os("K3_HIP_TEST_CHILD").is_none() {
            std::env::remove_var("K3_STANDIN_ARCH");
        }
        Hip::open()
    })
}

pub const HOST_TO_DEVICE: c_int = 1;
pub const DEVICE_TO_HOST: c_int = 2;
pub const DEVICE_TO_DEVICE: c_int = 3;
pub const DEFAULT: c_int = 4;

impl Hip {
    /// hipGetErrorString of a code, as text.
    pub fn text(&self, e: c_int) -> String {
        // SAFETY: the stand-in returns static NUL-terminated strings.
        unsafe { CStr::from_ptr((self.hipGetErrorString)(e)) }.to_string_lossy().into_owned()
    }

    /// Asserts success, naming the call and the stand-in's message on failure.
    pub fn ok(&self, what: &str, e: c_int) {
        assert_eq!(e, 0, "{what}: {}", self.text(e));
    }

    pub fn malloc(&self, bytes: usize) -> H {
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.ok("hipMalloc", unsafe { (self.hipMalloc)(&mut p, bytes) });
        p
    }

    pub fn upload<T: Copy>(&self, v: &[T]) -> H {
        let bytes = std::mem::size_of_val(v);
        let p = self.malloc(bytes);
        // SAFETY: p holds `bytes` bytes; v is a host slice of that size.
        self.ok("hipMemcpyAsync", unsafe { (self.hipMemcpyAsync)(p, v.as_ptr() as *const c_void, bytes, HOST_TO_DEVICE, std::ptr::null_mut()) });
        p
    }

    pub fn download<T: Copy + Default>(&self, p: H, n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        // SAFETY: out holds n elements; p at least as many (the callers' allocations).
        let rc = unsafe { (self.hipMemcpyAsync)(out.as_mut_ptr() as H, p, n * std::mem::size_of::<T>(), DEVICE_TO_HOST, std::ptr::null_mut()) };
        self.ok("hipMemcpyAsync D2H", rc);
        out
    }

    pub fn stream(&self) -> H {
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.ok("hipStreamCreateWithFlags", unsafe { (self.hipStreamCreateWithFlags)(&mut s, 1) });
        s
    }

    pub fn event(&self) -> H {
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.ok("hipEventCreate", unsafe { (self.hipEventCreate)(&mut e) });
        e
    }

    /// The personality's arch (`gfx942`), from the device attributes.
    pub fn arch(&self) -> String {
        let mut prop = vec![0u8; 1472];
        // SAFETY: a buffer of the R0600 size.
        let rc = unsafe { (self.hipGetDevicePropertiesR0600)(prop.as_mut_ptr() as H, 0) };
        if rc != 0 {
            // HIP 5 imitation: the original layout.
            // SAFETY: a buffer larger than the R0000 size.
            self.ok("hipGetDeviceProperties", unsafe { (self.hipGetDeviceProperties)(prop.as_mut_ptr() as H, 0) });
            return cstr_at(&prop, 396).split(':').next().unwrap_or("").to_string();
        }
        cstr_at(&prop, 1160).split(':').next().unwrap_or("").to_string()
    }

    /// Loads the reduce code object for this device's arch, if build.rs made one.
    pub fn reduce_module(&self) -> Option<H> {
        let arch = self.arch();
        let Some((_, _, img)) = images::IMAGES.iter().find(|(_, t, _)| *t == arch) else {
            let require = std::env::var("K3_REQUIRE_DEVICE_COMPILE").is_ok_and(|v| v == "1");
            assert!(!require, "K3_REQUIRE_DEVICE_COMPILE=1 but no {arch} code object: {:?}", images::UNAVAILABLE);
            println!("skipped: no {arch} code object was compiled: {:?}", images::UNAVAILABLE);
            return None;
        };
        let mut m = std::ptr::null_mut();
        // SAFETY: a complete code object embedded by build.rs.
        self.ok("hipModuleLoadData", unsafe { (self.hipModuleLoadData)(&mut m, img.as_ptr() as *const c_void) });
        Some(m)
    }

    pub fn function(&self, m: H, name: &str) -> Result<H, c_int> {
        let c = std::ffi::CString::new(name).expect("name");
        let mut f = std::ptr::null_mut();
        // SAFETY: out-pointer to a local, a C string.
        match unsafe { (self.hipModuleGetFunction)(&mut f, m, c.as_ptr()) } {
            0 => Ok(f),
            e => Err(e),
        }
    }

    /// Launches with kernelParams built from `args` (each a pointer to one value).
    pub fn launch(&self, f: H, grid: u32, block: u32, shared: u32, stream: H, args: &mut [*mut c_void]) -> c_int {
        // SAFETY: args holds one pointer per kernel parameter (the callers' kernels).
        unsafe { (self.hipModuleLaunchKernel)(f, grid, 1, 1, block, 1, 1, shared, stream, args.as_mut_ptr(), std::ptr::null_mut()) }
    }
}

/// The NUL-terminated string at `at` in `b`.
pub fn cstr_at(b: &[u8], at: usize) -> String {
    let end = b[at..].iter().position(|&c| c == 0).map(|e| at + e).unwrap_or(b.len());
    String::from_utf8_lossy(&b[at..end]).into_owned()
}

/// Arguments of block_reduce(const float* x, int n, float* block_sums, float* total, int* positives, int* max_val).
pub struct ReduceArgs {
    pub x: H,
    pub n: c_int,
    pub sums: H,
    pub total: H,
    pub positives: H,
    pub max: H,
}

impl ReduceArgs {
    pub fn params(&mut self) -> Vec<*mut c_void> {
        vec![
            &mut self.x as *mut H as *mut c_void,
            &mut self.n as *mut c_int as *mut c_void,
            &mut self.sums as *mut H as *mut c_void,
            &mut self.total as *mut H as *mut c_void,
            &mut self.positives as *mut H as *mut c_void,
            &mut self.max as *mut H as *mut c_void,
        ]
    }
}

/// Re-runs this test binary's `test` (an ignored one) with `env`, returning its output; the
/// child fails the parent when it fails. A process holds one device personality, so each
/// personality is checked in a process of its own.
pub fn in_child(test: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("exe");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("K3_HIP_TEST_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .expect("child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{test} with {env:?} failed:\n{text}");
    text
}

/// `name` built by cargo for this test: beside the test binary in `deps/` (where `cargo test`
/// leaves a dependency's cdylib), else one level up (where `cargo build` puts it).
pub fn standin_library(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    let beside = deps.join(name);
    if beside.exists() {
        return beside;
    }
    deps.parent().expect("target dir").join(name)
}
