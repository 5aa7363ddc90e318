//! # libk3_standin_cublaslt.so: the cuBLASLt stand-in (soname `libcublasLt.so`)
//!
//! Every cuBLASLt call backend-cuda makes, forwarded to `k3_standin_<name>` in the CUDA driver
//! stand-in already loaded in the process (found by its soname `libcuda.so` with RTLD_NOLOAD:
//! this library never loads a driver itself). GEMMs therefore run on the driver stand-in's
//! memory and streams, and are captured into its graphs. Without the driver stand-in every call
//! returns CUBLAS_STATUS_NOT_INITIALIZED and says why on stderr.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

type Handle = *mut c_void;
const NOT_INITIALIZED: c_int = 1;

/// The driver stand-in's handle, when the process has it loaded.
fn driver() -> Option<usize> {
    static DRIVER: OnceLock<Option<usize>> = OnceLock::new();
    *DRIVER.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only looks the library up among those already loaded.
        let h = unsafe { libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        // SAFETY: a symbol lookup on a live handle.
        let marker = !h.is_null() && !unsafe { libc::dlsym(h, c"k3_standin_cublasLtCreate".as_ptr()) }.is_null();
        if !marker {
            eprintln!(
                "k3 cuBLASLt stand-in: the CUDA driver stand-in is not loaded in this process (set K3_CUDA_DRIVER_LIBRARY \
                 to libk3_standin_cuda.so; see scripts/standin-env.sh): every cuBLASLt call fails"
            );
        }
        marker.then_some(h as usize)
    })
}

/// The driver stand-in's `name`, as a function pointer of type `F`.
fn target<F: Copy>(name: &CStr) -> Option<F> {
    let h = driver()?;
    // SAFETY: a symbol lookup on the live handle.
    let p = unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) };
    // SAFETY: the caller names a function of exactly type F (the same C signature).
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

macro_rules! forward {
    ($($name:ident ( $($a:ident : $t:ty),* ) -> $r:ty = $fallback:expr;)*) => {$(
        /// Forwarded to the driver stand-in's `k3_standin_` function of the same name.
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> $r {
            type F = unsafe extern "C" fn($($t),*) -> $r;
            static FN: OnceLock<Option<F>> = OnceLock::new();
            let name = concat!("k3_standin_", stringify!($name), "\0");
            let f = FN.get_or_init(|| CStr::from_bytes_with_nul(name.as_bytes()).ok().and_then(target::<F>));
            match f {
                // SAFETY: the same signature, implemented by the driver stand-in.
                Some(f) => unsafe { f($($a),*) },
                None => $fallback,
            }
        }
    )*};
}

forward! {
    cublasLtGetVersion() -> usize = 0;
    cublasLtCreate(h: *mut Handle) -> c_int = NOT_INITIALIZED;
    cublasLtDestroy(h: Handle) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulDescCreate(d: *mut Handle, compute: c_int, scale: c_int) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulDescDestroy(d: Handle) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulDescSetAttribute(d: Handle, attr: c_int, buf: *const c_void, size: usize) -> c_int = NOT_INITIALIZED;
    cublasLtMatrixLayoutCreate(l: *mut Handle, dtype: c_int, rows: u64, cols: u64, ld: i64) -> c_int = NOT_INITIALIZED;
    cublasLtMatrixLayoutDestroy(l: Handle) -> c_int = NOT_INITIALIZED;
    cublasLtMatrixLayoutSetAttribute(l: Handle, attr: c_int, buf: *const c_void, size: usize) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulPreferenceCreate(p: *mut Handle) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulPreferenceDestroy(p: Handle) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulPreferenceSetAttribute(p: Handle, attr: c_int, buf: *const c_void, size: usize) -> c_int = NOT_INITIALIZED;
    cublasLtMatmulAlgoGetHeuristic(h: Handle, desc: Handle, a: Handle, b: Handle, c: Handle, d: Handle, pref: Handle, requested: c_int, results: *mut c_void, count: *mut c_int) -> c_int = NOT_INITIALIZED;
    cublasLtMatmul(h: Handle, desc: Handle, alpha: *const c_void, a: *const c_void, a_l: Handle, b: *const c_void, b_l: Handle, beta: *const c_void, c: *const c_void, c_l: Handle, d: *mut c_void, d_l: Handle, algo: *const c_void, workspace: *mut c_void, workspace_bytes: usize, s: Handle) -> c_int = NOT_INITIALIZED;
}
