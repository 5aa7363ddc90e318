//! hipBLASLt entry points (signatures and enum values of hipBLASLt's `hipblaslt.h` and
//! `hipblas-common.h`) over the stand-in's BLAS-Lt model. With no algorithm for the operands the
//! heuristic returns HIPBLAS_STATUS_SUCCESS with `*returnAlgoCount = 0`.

use crate::runtime::{dev, stream};
use k3_standin::error::{self, invalid, Kind, Result};
use k3_standin::gemm::{Elem, Layout, MatmulDesc};
use k3_standin::gemm_abi::{host_f32, Abi, DescAttr, LayoutAttr, PrefAttr};
use std::ffi::{c_int, c_void};

type Status = c_int;
type Handle = *mut c_void;

const SUCCESS: Status = 0;

fn status(k: Kind) -> Status {
    match k {
        Kind::NoDevice | Kind::NotInitialized => 1,
        Kind::OutOfMemory => 2,
        Kind::InvalidValue | Kind::InvalidHandle => 3,
        Kind::NotSupported => 7,
        _ => 5,
    }
}

fn status_name(k: Kind) -> &'static str {
    match status(k) {
        1 => "HIPBLAS_STATUS_NOT_INITIALIZED",
        2 => "HIPBLAS_STATUS_ALLOC_FAILED",
        3 => "HIPBLAS_STATUS_INVALID_VALUE",
        7 => "HIPBLAS_STATUS_NOT_SUPPORTED",
        _ => "HIPBLAS_STATUS_EXECUTION_FAILED",
    }
}

fn run(call: &str, f: impl FnOnce() -> Result<()>) -> Status {
    match error::guard("hipblaslt", call, status_name, f) {
        Ok(()) => SUCCESS,
        Err(e) => status(e.kind),
    }
}

const ABI: Abi = Abi {
    name: "hipblasLt",
    op_n: 111,
    op_t: 112,
    compute_32f: 2,
    desc: |a| match a {
        0 => Some(DescAttr::TransA),
        1 => Some(DescAttr::TransB),
        2 => Some(DescAttr::Epilogue),
        3 => Some(DescAttr::BiasPointer),
        4 => Some(DescAttr::BiasDataType),
        5..=10 | 14 => Some(DescAttr::NullOnly),
        13 => Some(DescAttr::PointerMode),
        _ => None,
    },
    layout: |a| match a {
        0 => Some(LayoutAttr::BatchCount),
        1 => Some(LayoutAttr::BatchOffset),
        2 => Some(LayoutAttr::Type),
        3 => Some(LayoutAttr::Order),
        4 => Some(LayoutAttr::Rows),
        5 => Some(LayoutAttr::Cols),
        6 => Some(LayoutAttr::Ld),
        _ => None,
    },
    pref: |a| match a {
        0 => Some(PrefAttr::SearchMode),
        1 => Some(PrefAttr::MaxWorkspace),
        _ => None,
    },
};

fn put(p: *mut Handle, v: u64) -> Result<()> {
    crate::runtime::put(p, v as Handle, "output handle")
}

#[no_mangle]
pub extern "C" fn hipblasLtCreate(h: *mut Handle) -> Status {
    run("hipblasLtCreate", || put(h, dev()?.lt_create()))
}

#[no_mangle]
pub extern "C" fn hipblasLtDestroy(h: Handle) -> Status {
    run("hipblasLtDestroy", || dev()?.lt_destroy(h as u64))
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulDescCreate(d: *mut Handle, compute: c_int, scale: c_int) -> Status {
    run("hipblasLtMatmulDescCreate", || {
        let desc = MatmulDesc { compute_32f: compute == ABI.compute_32f, scale_f32: Elem::from_raw(scale) == Elem::F32, ..MatmulDesc::default() };
        put(d, dev()?.desc_create(desc))
    })
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulDescDestroy(d: Handle) -> Status {
    run("hipblasLtMatmulDescDestroy", || dev()?.desc_destroy(d as u64))
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulDescSetAttribute(d: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("hipblasLtMatmulDescSetAttribute", || unsafe { ABI.set_desc(dev()?, d as u64, attr, buf as *const u8, size) })
}

#[no_mangle]
pub extern "C" fn hipblasLtMatrixLayoutCreate(l: *mut Handle, dtype: c_int, rows: u64, cols: u64, ld: i64) -> Status {
    run("hipblasLtMatrixLayoutCreate", || {
        put(l, dev()?.layout_create(Layout { elem: Elem::from_raw(dtype), rows, cols, ld, row_major: false, batch: 1 }))
    })
}

#[no_mangle]
pub extern "C" fn hipblasLtMatrixLayoutDestroy(l: Handle) -> Status {
    run("hipblasLtMatrixLayoutDestroy", || dev()?.layout_destroy(l as u64))
}

#[no_mangle]
pub extern "C" fn hipblasLtMatrixLayoutSetAttribute(l: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("hipblasLtMatrixLayoutSetAttribute", || unsafe { ABI.set_layout(dev()?, l as u64, attr, buf as *const u8, size) })
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulPreferenceCreate(p: *mut Handle) -> Status {
    run("hipblasLtMatmulPreferenceCreate", || put(p, dev()?.pref_create()))
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulPreferenceDestroy(p: Handle) -> Status {
    run("hipblasLtMatmulPreferenceDestroy", || dev()?.pref_destroy(p as u64))
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulPreferenceSetAttribute(p: Handle, attr: c_int, buf: *const c_void, size: usize) -> Status {
    // SAFETY: the caller's buffer holds `size` bytes.
    run("hipblasLtMatmulPreferenceSetAttribute", || unsafe { ABI.set_pref(dev()?, p as u64, attr, buf as *const u8, size) })
}

/// `hipblasLtMatmulAlgo_t` (16 bytes of data, then the workspace bound) and the heuristic result
/// around it, as `hipblaslt.h` lays them out.
#[repr(C)]
pub struct Algo {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

#[repr(C)]
pub struct HeuristicResult {
    pub algo: Algo,
    pub workspace_size: usize,
    pub state: Status,
    pub waves_count: f32,
    pub reserved: [c_int; 4],
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmulAlgoGetHeuristic(
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
    run("hipblasLtMatmulAlgoGetHeuristic", || {
        if requested < 1 || results.is_null() || count.is_null() {
            return Err(invalid("requestedAlgoCount < 1 or a null output"));
        }
        let found = dev()?.heuristic(h as u64, desc as u64, [a as u64, b as u64, c as u64, d as u64], pref as u64)?;
        let n = match found {
            Ok(id) => {
                let mut data = [0u8; 16];
                data[..8].copy_from_slice(&id.to_le_bytes());
                let r = HeuristicResult {
                    algo: Algo { data, max_workspace_bytes: 0 },
                    workspace_size: 0,
                    state: SUCCESS,
                    waves_count: 1.0,
                    reserved: [0; 4],
                };
                // SAFETY: `results` holds at least `requested` >= 1 entries.
                unsafe { results.write(r) };
                1
            }
            Err(_) => 0,
        };
        // SAFETY: checked non-null above.
        unsafe { count.write(n) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn hipblasLtMatmul(
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
    algo: *const Algo,
    workspace: *mut c_void,
    workspace_bytes: usize,
    s: Handle,
) -> Status {
    run("hipblasLtMatmul", || {
        // SAFETY: host scalars (the host pointer mode) and the heuristic's algorithm, as the API requires.
        let (alpha, beta) = unsafe { (host_f32(alpha as *const u8, "alpha")?, host_f32(beta as *const u8, "beta")?) };
        let id = if algo.is_null() {
            None
        } else {
            // SAFETY: non-null, an algorithm struct from the caller.
            let data = unsafe { (*algo).data };
            Some(u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8])))
        };
        dev()?.matmul(
            h as u64,
            desc as u64,
            [a_l as u64, b_l as u64, c_l as u64, d_l as u64],
            [a as u64, b as u64, c as u64, d as u64],
            (alpha, beta),
            id,
            (workspace as u64, workspace_bytes),
            stream(s),
        )
    })
}
