//! cuBLASLt over the stand-in's BLAS-Lt model, exported as `k3_standin_<cuBLASLt name>`: the
//! cuBLASLt stand-in library (`standin/cublaslt`, soname libcublasLt.so) forwards each call here,
//! so GEMMs share this driver's memory, streams and captures. Signatures and enum values of
//! CUDA 13's `cublasLt.h`. With no algorithm for the operands the heuristic returns
//! CUBLAS_STATUS_NOT_SUPPORTED and a count of 0, as cuBLASLt does.

use k3_standin::error::{self, invalid, Kind, Result};
use k3_standin::gemm::{Elem, Layout, MatmulDesc};
use k3_standin::gemm_abi::{host_f32, Abi, DescAttr, LayoutAttr, PrefAttr};
use k3_standin::{device, Device, StreamRef, Vendor};
use std::ffi::{c_int, c_void};

type Status = c_int;
type Handle = *mut c_void;

const SUCCESS: Status = 0;
const NOT_SUPPORTED: Status = 15;
/// The cuBLASLt version reported (13.0.0 as `cublasLtGetVersion` encodes it).
const VERSION: usize = 130_000;

fn status(k: Kind) -> Status {
    match k {
        Kind::NoDevice | Kind::NotInitialized | Kind::InvalidContext => 1,
        Kind::OutOfMemory => 3,
        Kind::InvalidValue | Kind::InvalidHandle => 7,
        Kind::NotSupported => NOT_SUPPORTED,
        _ => 13,
    }
}

fn status_name(k: Kind) -> &'static str {
    match status(k) {
        1 => "CUBLAS_STATUS_NOT_INITIALIZED",
        3 => "CUBLAS_STATUS_ALLOC_FAILED",
        7 => "CUBLAS_STATUS_INVALID_VALUE",
        15 => "CUBLAS_STATUS_NOT_SUPPORTED",
        _ => "CUBLAS_STATUS_EXECUTION_FAILED",
    }
}

fn run(call: &str, f: impl FnOnce() -> Result<()>) -> Status {
    match error::guard("cublaslt", call, status_name, f) {
        Ok(()) => SUCCESS,
        Err(e) => status(e.kind),
    }
}

fn dev() -> Result<&'static Device> {
    device(Vendor::Cuda)
}

const ABI: Abi = Abi {
    name: "cublasLt",
    op_n: 0,
    op_t: 1,
    compute_32f: 68,
    desc: |a| match a {
        0 => Some(DescAttr::ComputeType),
        1 => Some(DescAttr::ScaleType),
        2 => Some(DescAttr::PointerMode),
        3 => Some(DescAttr::TransA),
        4 => Some(DescAttr::TransB),
        7 => Some(DescAttr::Epilogue),
        8 => Some(DescAttr::BiasPointer),
        26 => Some(DescAttr::BiasDataType),
        11 | 17..=21 => Some(DescAttr::NullOnly),
        _ => None,
    },
    layout: |a| match a {
        0 => Some(LayoutAttr::Type),
        1 => Some(LayoutAttr::Order),
        2 => Some(LayoutAttr::Rows),
        3 => Some(LayoutAttr::Cols),
        4 => Some(LayoutAttr::Ld),
        5 => Some(LayoutAttr::BatchCount),
        6 => Some(LayoutAttr::BatchOffset),
        _ => None,
    },
    pref: |a| match a {
        0 => Some(PrefAttr::SearchMode),
        1 => Some(PrefAttr::MaxWorkspace),
        5..=8 => Some(PrefAttr::Hint),
        _ => None,
    },
};

fn put(p: *mut Handle, v: u64) -> Result<()> {
    if p.is_null() {
        return Err(invalid("output handle pointer is null"));
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { p.write(v as Handle) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtGetVersion() -> usize {
    VERSION
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtCreate(h: *mut Handle) -> Status {
    run("cublasLtCreate", || put(h, dev()?.lt_create()))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtDestroy(h: Handle) -> Status {
    run("cublasLtDestroy", || dev()?.lt_destroy(h as u64))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulDescCreate(d: *mut Handle, compute: c_int, scale: c_int) -> Status {
    run("cublasLtMatmulDescCreate", || {
        let desc = MatmulDesc { compute_32f: compute == ABI.compute_32f, scale_f32: Elem::from_raw(scale) == Elem::F32, ..MatmulDesc::default() };
        put(d, dev()?.desc_create(desc))
    })
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulDescDestroy(d: Handle) -> Status {
    run("cublasLtMatmulDescDestroy", || dev()?.desc_destroy(d as u64))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulDescSetAttribute(d: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("cublasLtMatmulDescSetAttribute", || unsafe { ABI.set_desc(dev()?, d as u64, attr, buf as *const u8, size) })
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatrixLayoutCreate(l: *mut Handle, dtype: c_int, rows: u64, cols: u64, ld: i64) -> Status {
    run("cublasLtMatrixLayoutCreate", || {
        put(l, dev()?.layout_create(Layout { elem: Elem::from_raw(dtype), rows, cols, ld, row_major: false, batch: 1 }))
    })
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatrixLayoutDestroy(l: Handle) -> Status {
    run("cublasLtMatrixLayoutDestroy", || dev()?.layout_destroy(l as u64))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatrixLayoutSetAttribute(l: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("cublasLtMatrixLayoutSetAttribute", || unsafe { ABI.set_layout(dev()?, l as u64, attr, buf as *const u8, size) })
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulPreferenceCreate(p: *mut Handle) -> Status {
    run("cublasLtMatmulPreferenceCreate", || put(p, dev()?.pref_create()))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulPreferenceDestroy(p: Handle) -> Status {
    run("cublasLtMatmulPreferenceDestroy", || dev()?.pref_destroy(p as u64))
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulPreferenceSetAttribute(p: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("cublasLtMatmulPreferenceSetAttribute", || unsafe { ABI.set_pref(dev()?, p as u64, attr, buf as *const u8, size) })
}

/// `cublasLtMatmulHeuristicResult_t`: the 64-byte algorithm, then its requirements.
#[repr(C)]
pub struct HeuristicResult {
    pub algo: [u64; 8],
    pub workspace_size: usize,
    pub state: Status,
    pub waves_count: f32,
    pub reserved: [c_int; 4],
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmulAlgoGetHeuristic(
    h: Handle,
    desc: Handle,
    a: Handle,
    b: Handle,
    c: Handle,
    d: Handle,
    pref: Handle,
    requested: c_int,
    results: *mut HeuristicResult,
    count: *mut c_int,
) -> Status {
    let mut found = false;
    let rc = run("cublasLtMatmulAlgoGetHeuristic", || {
        if requested < 1 || results.is_null() || count.is_null() {
            return Err(invalid("requestedAlgoCount < 1 or a null output"));
        }
        let r = dev()?.heuristic(h as u64, desc as u64, [a as u64, b as u64, c as u64, d as u64], pref as u64)?;
        let n = match r {
            Ok(id) => {
                let mut algo = [0u64; 8];
                algo[0] = id;
                // SAFETY: `results` holds at least `requested` >= 1 entries.
                unsafe { results.write(HeuristicResult { algo, workspace_size: 0, state: SUCCESS, waves_count: 1.0, reserved: [0; 4] }) };
                found = true;
                1
            }
            Err(_) => 0,
        };
        // SAFETY: checked non-null above.
        unsafe { count.write(n) };
        Ok(())
    });
    if rc == SUCCESS && !found {
        NOT_SUPPORTED
    } else {
        rc
    }
}

#[no_mangle]
pub extern "C" fn k3_standin_cublasLtMatmul(
    h: Handle,
    desc: Handle,
    alpha: *const c_void,
    a: *const c_void,
    a_l: Handle,
    b: *const c_void,
    b_l: Handle,
    beta: *const c_void,
    c: *const c_void,
    c_l: Handle,
    d: *mut c_void,
    d_l: Handle,
    algo: *const [u64; 8],
    workspace: *mut c_void,
    workspace_bytes: usize,
    s: Handle,
) -> Status {
    run("cublasLtMatmul", || {
        // SAFETY: host scalars (the host pointer mode), as the API requires.
        let (alpha, beta) = unsafe { (host_f32(alpha as *const u8, "alpha")?, host_f32(beta as *const u8, "beta")?) };
        // SAFETY: null or an algorithm from the caller.
        let id = (!algo.is_null()).then(|| unsafe { (*algo)[0] });
        dev()?.matmul(
            h as u64,
            desc as u64,
            [a_l as u64, b_l as u64, c_l as u64, d_l as u64],
            [a as u64, b as u64, c as u64, d as u64],
            (alpha, beta),
            id,
            (workspace as u64, workspace_bytes),
            StreamRef::from_raw(s as u64),
        )
    })
}
