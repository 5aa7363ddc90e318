//! Dense GEMM through hipBLASLt: `out[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N])`, row-major, f32
//! accumulation (`HIPBLAS_COMPUTE_32F`) — the contract of `kernel_api::ops::gemm`, handed over
//! by the GEMM launcher through the runtime's vendor-GEMM hook, as on CUDA with cuBLASLt.
//!
//! hipBLASLt is column-major, so the product is computed as `outᵀ[N,M] = op(W)·xᵀ` with `W`
//! viewed as column-major `[K, N]` and transposed (`TRANSA = HIPBLAS_OP_T`), `x` as `[K, M]`
//! untransposed and `outᵀ` as `[N, M]` with leading dimension N; a bias goes through the bias
//! epilogue (`bias[row of outᵀ] = bias[n]`). Operand checks, spans, alignments and the
//! workspace a plan offers are shared with CUDA (`k3_kernels::vendor_gemm`).
//!
//! Accepted: x, W bf16 with out bf16 or f32; x, W, out all f32. When hipBLASLt has no algorithm
//! for the operands (the heuristic returns none) the call is `Unsupported` and the launcher
//! runs the dialect's kernels instead; `k3 doctor` shows which route a runtime takes and why.
//!
//! Library: `K3_HIPBLASLT_LIBRARY` (a full path), else `libhipblaslt.so{,.1,.0}` beside an
//! explicitly selected HIP runtime (`K3_HIP_LIBRARY`; a system hipBLASLt is never mixed with
//! it), else in the ROCm folders and through the loader. Used only with a HIP runtime of major
//! version 6 or newer: older hipBLASLt releases took other data-type enums.

use crate::dylib::{self, Lib};
use crate::runtime::{RocmBuffer, RocmRuntime, RocmStream};
use crate::sys::hipblaslt::*;
use k3_kernels::vendor_gemm::{lt_workspace_bytes, operand_span, pointer_alignment, LtGemm};
use k3_kernels::VendorGemmArgs;
use kernel_api::ops::gemm::GemmParams;
use kernel_api::{DType, Error, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

/// Which dense GEMMs the contract's `Gemm` sends to hipBLASLt (`K3_ROCM_GEMM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum GemmRoute {
    /// hipBLASLt for every dtype combination it takes, when it loads (the default); otherwise
    /// the dialect's GEMM kernels.
    Auto = 0,
    /// hipBLASLt for every dtype combination it takes; a missing library is the op's error.
    HipBlasLt = 1,
    /// Always the dialect's GEMM kernels (`csrc/ops/dense_gemm.cu`).
    Kernels = 2,
}

impl GemmRoute {
    /// `K3_ROCM_GEMM` (`auto`, `hipblaslt`, `kernels`; unset = auto).
    pub fn from_env() -> Result<Self> {
        crate::env::choice("K3_ROCM_GEMM", &[("auto", GemmRoute::Auto), ("hipblaslt", GemmRoute::HipBlasLt), ("kernels", GemmRoute::Kernels)])
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => GemmRoute::HipBlasLt,
            2 => GemmRoute::Kernels,
            _ => GemmRoute::Auto,
        }
    }
}

/// The library name in messages.
const LIBRARY: &str = "hipBLASLt";

static LIB: OnceLock<std::result::Result<(Lib, HipblasLtFns), String>> = OnceLock::new();

/// libhipblaslt, found once, every symbol checked.
fn library() -> std::result::Result<&'static (Lib, HipblasLtFns), String> {
    LIB.get_or_init(|| {
        let explicit_hip = std::env::var_os("K3_HIP_LIBRARY").filter(|v| !v.is_empty());
        let found = match explicit_hip {
            // Beside the selected runtime only, unless K3_HIPBLASLT_LIBRARY names one.
            Some(hip) if std::env::var_os("K3_HIPBLASLT_LIBRARY").is_none_or(|v| v.is_empty()) => {
                let dirs: Vec<PathBuf> = PathBuf::from(hip).parent().map(PathBuf::from).into_iter().collect();
                dylib::find_in(&dylib::HIPBLASLT, &dirs, false)
            }
            _ => dylib::find(&dylib::HIPBLASLT),
        };
        let lib = found.map_err(|nf| {
            format!("{LIBRARY} not found ({}); install ROCm's hipblaslt or set K3_HIPBLASLT_LIBRARY=/full/path/libhipblaslt.so", nf.describe())
        })?;
        // SAFETY: a library found as libhipblaslt exports hipBLASLt's C API (sys/hipblaslt.rs).
        let fns = unsafe { HipblasLtFns::load(&lib.lib) }.map_err(|missing| format!("{} lacks {missing:?}", lib.found_as))?;
        Ok((lib, fns))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A hipBLASLt handle of one runtime and its heuristic cache.
pub struct HipBlasLt {
    handle: hipblasLtHandle_t,
    fns: HipblasLtFns,
    location: String,
    algos: Mutex<HashMap<AlgoKey, hipblasLtMatmulAlgo_t>>,
}

// SAFETY: a hipBLASLt handle may be used from any thread (calls are serialised per stream by the
// caller, and the algorithm cache is behind a mutex).
unsafe impl Send for HipBlasLt {}
// SAFETY: as above.
unsafe impl Sync for HipBlasLt {}

impl Drop for HipBlasLt {
    fn drop(&mut self) {
        // SAFETY: created by hipblasLtCreate, destroyed once.
        let _ = unsafe { (self.fns.hipblasLtDestroy)(self.handle) };
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AlgoKey {
    gemm: LtGemm,
    align: [u32; 4],
    workspace: usize,
}

fn hip_type(dt: DType) -> hipDataType {
    match dt {
        DType::BF16 => HIP_R_16BF,
        _ => HIP_R_32F,
    }
}

fn status(call: &str, rc: hipblasStatus_t) -> Result<()> {
    if rc == HIPBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver { call: call.to_string(), why: format!("hipblasStatus_t {rc}") })
    }
}

/// Frees hipBLASLt descriptors on every path out of a GEMM.
struct Descs<'a> {
    fns: &'a HipblasLtFns,
    op: Option<hipblasLtMatmulDesc_t>,
    layouts: Vec<hipblasLtMatrixLayout_t>,
    pref: Option<hipblasLtMatmulPreference_t>,
}

impl Drop for Descs<'_> {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once and is destroyed once here.
        unsafe {
            if let Some(d) = self.op.take() {
                let _ = (self.fns.hipblasLtMatmulDescDestroy)(d);
            }
            for l in self.layouts.drain(..) {
                let _ = (self.fns.hipblasLtMatrixLayoutDestroy)(l);
            }
            if let Some(p) = self.pref.take() {
                let _ = (self.fns.hipblasLtMatmulPreferenceDestroy)(p);
            }
        }
    }
}

impl RocmRuntime {
    fn hipblaslt(&self) -> Result<&HipBlasLt> {
        self.blaslt
            .get_or_init(|| {
                if self.hip.major() < 6 {
                    return Err(format!(
                        "the HIP runtime is {}: hipBLASLt is used from ROCm 6 on (older releases took other data-type enums)",
                        crate::hip::version_string(self.hip.runtime_version)
                    ));
                }
                let (lib, fns) = library()?;
                self.bind().map_err(|e| e.to_string())?;
                let mut handle: hipblasLtHandle_t = std::ptr::null_mut();
                // SAFETY: resolved symbol; valid out-pointer.
                let rc = unsafe { (fns.hipblasLtCreate)(&mut handle) };
                if rc != HIPBLAS_STATUS_SUCCESS {
                    return Err(format!("hipblasLtCreate ({}) failed: hipblasStatus_t {rc}", lib.found_as));
                }
                Ok(HipBlasLt { handle, fns: *fns, location: lib.found_as.clone(), algos: Mutex::new(HashMap::new()) })
            })
            .as_ref()
            .map_err(|why| Error::Unavailable { why: why.clone() })
    }

    /// The current [`GemmRoute`] (from `K3_ROCM_GEMM` when the runtime was made).
    pub fn gemm_route(&self) -> GemmRoute {
        GemmRoute::from_u8(self.gemm_route.load(Ordering::Relaxed))
    }

    /// Changes the route. Plans keep their workspace size: re-query `Gemm::workspace_size`
    /// after a change (a run with too small a workspace is an `InvalidInput`, never a fault).
    pub fn set_gemm_route(&self, route: GemmRoute) {
        self.gemm_route.store(route as u8, Ordering::Relaxed);
    }

    /// Where dense GEMMs go on this runtime, for reports: `hipBLASLt (<path>)`, or the
    /// dialect's kernels and the reason (`K3_ROCM_GEMM=kernels`, no library, ...).
    pub fn gemm_route_summary(&self) -> String {
        match (self.gemm_route(), self.hipblaslt()) {
            (GemmRoute::Kernels, _) => "the dialect's GEMM kernels (K3_ROCM_GEMM=kernels)".into(),
            (_, Ok(h)) => format!("{LIBRARY} ({}) for bf16/f32 operands, the dialect's kernels otherwise", h.location),
            (GemmRoute::HipBlasLt, Err(e)) => format!("none: K3_ROCM_GEMM=hipblaslt but {e}"),
            (GemmRoute::Auto, Err(e)) => format!("the dialect's GEMM kernels ({e})"),
        }
    }

    /// Workspace for `p` on hipBLASLt under the current route, `None` when the dialect kernels
    /// take it (the `Runtime::vendor_gemm_workspace` hook).
    pub(crate) fn blaslt_workspace(&self, p: &GemmParams) -> Option<usize> {
        let takes = LtGemm::from_params(p).supports(LIBRARY).is_ok();
        let ws = lt_workspace_bytes(p);
        match self.gemm_route() {
            GemmRoute::Kernels => None,
            GemmRoute::HipBlasLt => takes.then_some(ws),
            GemmRoute::Auto => (takes && self.hipblaslt().is_ok()).then_some(ws),
        }
    }

    /// `out = x · Wᵀ (+ bias)` through hipBLASLt, enqueued on `stream` (no allocation, no sync;
    /// the heuristic query on a new shape is host-side only). The `Runtime::vendor_gemm` hook.
    pub fn gemm_hipblaslt(&self, p: &GemmParams, a: VendorGemmArgs<'_, RocmBuffer>, stream: &RocmStream) -> Result<()> {
        let g = LtGemm { params: p.clone(), x_row_stride: a.x.row_stride, w_row_stride: a.w.row_stride };
        g.supports(LIBRARY)?;
        if p.bias_dtype.is_some() != a.bias.is_some() {
            return Err(Error::invalid("bias", "must be given exactly when the GEMM has a bias dtype"));
        }
        if p.m == 0 {
            return Ok(());
        }
        let overflow = |f: &str| Error::invalid(f.to_string(), "size overflows");
        let check = |field: &str, buf: &RocmBuffer, offset: usize, bytes: Option<usize>| -> Result<u64> {
            let bytes = bytes.ok_or_else(|| overflow(field))?;
            k3_kernels::check_range(field, offset, bytes, buf.len())?;
            Ok(buf.device_ptr().0 + offset as u64)
        };
        let x = check("x", a.x.buf, a.x.offset_bytes, operand_span(p.m, p.k, g.x_row_stride, p.x_dtype.size_bytes()))?;
        let w = check("w", a.w.buf, a.w.offset_bytes, operand_span(p.n, p.k, g.w_row_stride, p.w_dtype.size_bytes()))?;
        let bias = match (&a.bias, p.bias_dtype) {
            (Some(b), Some(dt)) => Some(check("bias", b.buf, b.offset_bytes, p.n.checked_mul(dt.size_bytes()))?),
            _ => None,
        };
        let out_bytes = p.m.checked_mul(p.n).and_then(|e| e.checked_mul(p.out_dtype.size_bytes())).ok_or_else(|| overflow("out"))?;
        let out = check("out", a.out, a.out_offset_bytes, Some(out_bytes))?;
        let (ws_ptr, ws_len) = a.workspace.as_ref().map(|b| (b.device_ptr().0, b.len())).unwrap_or((0, 0));
        let dim = |v: usize| i64::try_from(v).map_err(|_| Error::invalid("params", format!("{v} exceeds i64")));

        let lt = self.hipblaslt()?;
        self.bind()?;
        let f = &lt.fns;
        let mut d = Descs { fns: f, op: None, layouts: Vec::new(), pref: None };
        let mut op: hipblasLtMatmulDesc_t = std::ptr::null_mut();
        // SAFETY: resolved symbol; valid out-pointer.
        status("hipblasLtMatmulDescCreate", unsafe { (f.hipblasLtMatmulDescCreate)(&mut op, HIPBLAS_COMPUTE_32F, HIP_R_32F) })?;
        d.op = Some(op);
        let set = |attr, v: *const c_void, size: usize| {
            // SAFETY: `v` points at a value of the attribute's documented type and size.
            status("hipblasLtMatmulDescSetAttribute", unsafe { (f.hipblasLtMatmulDescSetAttribute)(op, attr, v, size) })
        };
        set(HIPBLASLT_MATMUL_DESC_TRANSA, (&HIPBLAS_OP_T as *const i32).cast(), 4)?;
        set(HIPBLASLT_MATMUL_DESC_TRANSB, (&HIPBLAS_OP_N as *const i32).cast(), 4)?;
        let (epilogue, bias_ptr, bias_type) = (HIPBLASLT_EPILOGUE_BIAS, bias.unwrap_or(0) as *const c_void, p.bias_dtype.map(hip_type));
        if let Some(bt) = bias_type {
            set(HIPBLASLT_MATMUL_DESC_EPILOGUE, (&epilogue as *const u32).cast(), 4)?;
            set(HIPBLASLT_MATMUL_DESC_BIAS_POINTER, (&bias_ptr as *const *const c_void).cast(), std::mem::size_of::<*const c_void>())?;
            set(HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (&bt as *const i32).cast(), 4)?;
        }
        // A = W as column-major [K, N] (ld = W's row stride), B = x as [K, M], D = outᵀ [N, M].
        let mut layout = |dt: DType, rows: usize, cols: usize, ld: usize| -> Result<hipblasLtMatrixLayout_t> {
            let mut l: hipblasLtMatrixLayout_t = std::ptr::null_mut();
            // SAFETY: resolved symbol; valid out-pointer.
            status("hipblasLtMatrixLayoutCreate", unsafe { (f.hipblasLtMatrixLayoutCreate)(&mut l, hip_type(dt), rows as u64, cols as u64, dim(ld)?) })?;
            d.layouts.push(l);
            Ok(l)
        };
        let a_l = layout(p.w_dtype, p.k, p.n, g.w_row_stride)?;
        let b_l = layout(p.x_dtype, p.k, p.m, g.x_row_stride)?;
        let d_l = layout(p.out_dtype, p.n, p.m, p.n)?;

        let key = AlgoKey {
            align: [pointer_alignment(w), pointer_alignment(x), pointer_alignment(out), pointer_alignment(bias.unwrap_or(0))],
            gemm: g,
            workspace: ws_len,
        };
        let cached = lt.algos.lock().ok().and_then(|m| m.get(&key).copied());
        let algo = match cached {
            Some(a) => a,
            None => {
                let mut pref: hipblasLtMatmulPreference_t = std::ptr::null_mut();
                // SAFETY: resolved symbol; valid out-pointer.
                status("hipblasLtMatmulPreferenceCreate", unsafe { (f.hipblasLtMatmulPreferenceCreate)(&mut pref) })?;
                d.pref = Some(pref);
                let max_ws = ws_len as u64;
                // SAFETY: MAX_WORKSPACE_BYTES takes a uint64_t.
                let rc = unsafe { (f.hipblasLtMatmulPreferenceSetAttribute)(pref, HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&max_ws as *const u64).cast(), 8) };
                status("hipblasLtMatmulPreferenceSetAttribute", rc)?;
                let mut result = hipblasLtMatmulHeuristicResult_t::default();
                let mut count = 0;
                // SAFETY: live descriptors; room for the one result requested.
                let rc = unsafe { (f.hipblasLtMatmulAlgoGetHeuristic)(lt.handle, op, a_l, b_l, d_l, d_l, pref, 1, &mut result, &mut count) };
                if rc != HIPBLAS_STATUS_SUCCESS || count < 1 || result.state != HIPBLAS_STATUS_SUCCESS {
                    return Err(Error::unsupported(
                        "gemm",
                        format!("{LIBRARY} has no algorithm for {:?} with {ws_len} B workspace (status {rc}, {count} found)", key.gemm),
                    ));
                }
                if let Ok(mut m) = lt.algos.lock() {
                    m.insert(key, result.algo);
                }
                result.algo
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: every pointer was range-checked against its buffer above; descriptors are
        // live; alpha/beta are host f32 (the default pointer mode, scale type 32F); C = D with
        // beta 0 so C is never read; the stream belongs to this device.
        let rc = unsafe {
            (f.hipblasLtMatmul)(
                lt.handle,
                op,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                a_l,
                x as *const c_void,
                b_l,
                (&beta as *const f32).cast(),
                out as *const c_void,
                d_l,
                out as *mut c_void,
                d_l,
                &algo,
                ws_ptr as *mut c_void,
                ws_len,
                stream.raw(),
            )
        };
        status("hipblasLtMatmul", rc)
    }
}
