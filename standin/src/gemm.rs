//! The BLAS-Lt stand-in (cuBLASLt / hipBLASLt): descriptors as the libraries define them
//! (column-major layouts, per-operand transposes, the bias epilogue), an algorithm heuristic that
//! answers for the operand sets the stand-in computes, and `matmul`, enqueued in stream order
//! (captured into graphs like any other work) and computed with the CPU reference GEMM of
//! kernel-api: `D = alpha · op(A) · op(B) + beta · C (+ bias)`, f32 accumulation.
//!
//! `K3_STANDIN_BLAS_REJECT=bf16,f32` (or `all`) makes the heuristic find no algorithm for
//! operands of those dtypes, so a caller's fallback path can be exercised.

use crate::device::Device;
use crate::error::{invalid, Error, Kind, Result};
use crate::graph::Node;
use crate::handles::Table;
use crate::stream::StreamRef;
use crate::memory::Memory;
use crate::personality::Vendor;
use half::bf16;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::{Gemm, GemmArgs, GemmParams};
use kernel_api::{Backend, BackendExt, DType, HostTensor};

/// Element types the stand-in computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    Bf16,
    /// Another `cudaDataType` / `hipDataType` value: accepted in descriptors, never computed.
    Other(i32),
}

impl Elem {
    /// From a `cudaDataType` / `hipDataType` (the two share these values: R_32F = 0, R_16BF = 14).
    pub fn from_raw(v: i32) -> Self {
        match v {
            0 => Elem::F32,
            14 => Elem::Bf16,
            other => Elem::Other(other),
        }
    }
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::Bf16 => 2,
            Elem::Other(_) => 1,
        }
    }
    fn name(self) -> String {
        match self {
            Elem::F32 => "f32".into(),
            Elem::Bf16 => "bf16".into(),
            Elem::Other(v) => format!("data type {v}"),
        }
    }
}

/// A matrix layout (column-major, as both libraries default to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub elem: Elem,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub row_major: bool,
    pub batch: i32,
}

/// A matmul descriptor's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDesc {
    pub compute_32f: bool,
    pub scale_f32: bool,
    pub trans_a: bool,
    pub trans_b: bool,
    pub bias: bool,
    /// An epilogue other than default or bias (not computed by the stand-in).
    pub other_epilogue: Option<u32>,
    pub bias_ptr: u64,
    pub bias_elem: Option<Elem>,
    pub device_pointer_mode: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preference {
    pub max_workspace: u64,
}

/// The BLAS objects of one device.
pub struct BlasState {
    pub handles: Table<()>,
    pub descs: Table<MatmulDesc>,
    pub layouts: Table<Layout>,
    pub prefs: Table<Preference>,
}

impl BlasState {
    pub fn new(vendor: Vendor) -> Self {
        let p = if vendor == Vendor::Cuda { "cublasLt" } else { "hipblasLt" };
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        BlasState {
            handles: Table::new("BLAS-Lt handle", leak(format!("{p}Destroy"))),
            descs: Table::new("matmul descriptor", leak(format!("{p}MatmulDescDestroy"))),
            layouts: Table::new("matrix layout", leak(format!("{p}MatrixLayoutDestroy"))),
            prefs: Table::new("matmul preference", leak(format!("{p}MatmulPreferenceDestroy"))),
        }
    }
}

/// The algorithm id the heuristic hands out: the stand-in has one (the CPU reference).
pub const ALGO_ID: u64 = 0x4b33_5354_414e_4431;

/// Why the stand-in has no algorithm for these operands (`None` = it has one).
pub fn unsupported(d: &MatmulDesc, a: &Layout, b: &Layout, c: &Layout, dl: &Layout) -> Option<String> {
    if !d.compute_32f || !d.scale_f32 {
        return Some("only 32-bit float compute and scale types are emulated".into());
    }
    if d.device_pointer_mode {
        return Some("alpha/beta in device memory are not emulated".into());
    }
    if let Some(e) = d.other_epilogue {
        return Some(format!("epilogue {e} is not emulated (default and bias are)"));
    }
    if [a, b, c, dl].iter().any(|l| l.row_major || l.batch != 1) {
        return Some("only single column-major matrices are emulated".into());
    }
    let ok = matches!((a.elem, b.elem, dl.elem), (Elem::Bf16, Elem::Bf16, _) | (Elem::F32, Elem::F32, Elem::F32));
    if !ok || c.elem != dl.elem {
        return Some(format!("operands {}·{} -> {} (C {}) are not emulated", a.elem.name(), b.elem.name(), dl.elem.name(), c.elem.name()));
    }
    if d.bias && d.bias_elem.unwrap_or(dl.elem) != dl.elem {
        return Some("a bias of a dtype other than D's is not emulated".into());
    }
    let reject = std::env::var("K3_STANDIN_BLAS_REJECT").unwrap_or_default();
    let reject: Vec<&str> = reject.split(',').map(str::trim).collect();
    if reject.contains(&"all") || reject.contains(&a.elem.name().as_str()) {
        return Some(format!("K3_STANDIN_BLAS_REJECT rejects {} operands", a.elem.name()));
    }
    None
}

/// One matmul call with everything it needs copied (so it can sit in a graph).
#[derive(Clone, Debug)]
pub struct GemmCall {
    pub desc: MatmulDesc,
    pub a: Layout,
    pub b: Layout,
    pub c: Layout,
    pub d: Layout,
    pub a_ptr: u64,
    pub b_ptr: u64,
    pub c_ptr: u64,
    pub d_ptr: u64,
    pub alpha: f32,
    pub beta: f32,
    pub workspace: u64,
    pub workspace_bytes: usize,
}

/// `(rows, cols)` of `op(X)` for a layout.
fn op_dims(l: &Layout, trans: bool) -> (u64, u64) {
    if trans {
        (l.cols, l.rows)
    } else {
        (l.rows, l.cols)
    }
}

/// Bytes a column-major layout spans from its first element.
fn span(l: &Layout) -> Result<usize> {
    if l.rows == 0 || l.cols == 0 {
        return Ok(0);
    }
    let ld = u64::try_from(l.ld).map_err(|_| invalid("negative leading dimension"))?;
    if ld < l.rows {
        return Err(invalid(format!("leading dimension {ld} below the {} rows", l.rows)));
    }
    (l.cols - 1)
        .checked_mul(ld)
        .and_then(|e| e.checked_add(l.rows))
        .and_then(|e| e.checked_mul(l.elem.size() as u64))
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(|| invalid("matrix size overflows"))
}

/// Reads element (r, c) of a column-major matrix.
///
/// # Safety
/// The element lies inside a live allocation (checked by the caller through [`span`]).
unsafe fn load(l: &Layout, base: u64, r: u64, c: u64) -> f32 {
    let i = (r + c * l.ld as u64) as usize;
    // SAFETY: forwarded.
    unsafe {
        match l.elem {
            Elem::F32 => (base as *const f32).add(i).read_unaligned(),
            Elem::Bf16 => bf16::from_bits((base as *const u16).add(i).read_unaligned()).to_f32(),
            Elem::Other(_) => f32::NAN,
        }
    }
}

impl GemmCall {
    /// Checks shapes: op(A) is m×k, op(B) k×n, C and D m×n.
    pub fn validate(&self) -> Result<()> {
        let (m, k) = op_dims(&self.a, self.desc.trans_a);
        let (k2, n) = op_dims(&self.b, self.desc.trans_b);
        if k != k2 || (self.d.rows, self.d.cols) != (m, n) || (self.c.rows, self.c.cols) != (m, n) {
            return Err(invalid(format!(
                "shapes do not chain: op(A) {m}x{k}, op(B) {k2}x{n}, C {}x{}, D {}x{}",
                self.c.rows, self.c.cols, self.d.rows, self.d.cols
            )));
        }
        if let Some(why) = unsupported(&self.desc, &self.a, &self.b, &self.c, &self.d) {
            return Err(Error::new(Kind::NotSupported, why));
        }
        Ok(())
    }

    /// Computes the product now.
    pub fn run(&self, mem: &Memory) -> Result<()> {
        let (m, k) = op_dims(&self.a, self.desc.trans_a);
        let n = self.d.cols;
        if m == 0 || n == 0 {
            return Ok(());
        }
        mem.check_range(self.a_ptr, span(&self.a)?, "matmul A")?;
        mem.check_range(self.b_ptr, span(&self.b)?, "matmul B")?;
        mem.check_range(self.d_ptr, span(&self.d)?, "matmul D")?;
        if self.beta != 0.0 {
            mem.check_range(self.c_ptr, span(&self.c)?, "matmul C")?;
        }
        let bias_elem = self.desc.bias_elem.unwrap_or(self.d.elem);
        if self.desc.bias {
            mem.check_range(self.desc.bias_ptr, m as usize * bias_elem.size(), "matmul bias")?;
        }
        if self.workspace != 0 {
            mem.check_range(self.workspace, self.workspace_bytes, "matmul workspace")?;
        }
        let (m, n, k) = (m as usize, n as usize, k as usize);
        // D (m×n, column-major) is the row-major n×m product x·Wᵀ with x[j][p] = op(B)(p, j)
        // and W[i][p] = op(A)(i, p): the CPU reference's form.
        let mut x = vec![0f32; n * k];
        let mut w = vec![0f32; m * k];
        // SAFETY: every element read lies in the ranges checked above.
        unsafe {
            for j in 0..n {
                for p in 0..k {
                    let (r, c) = if self.desc.trans_b { (j, p) } else { (p, j) };
                    x[j * k + p] = load(&self.b, self.b_ptr, r as u64, c as u64);
                }
            }
            for i in 0..m {
                for p in 0..k {
                    let (r, c) = if self.desc.trans_a { (p, i) } else { (i, p) };
                    w[i * k + p] = load(&self.a, self.a_ptr, r as u64, c as u64);
                }
            }
        }
        let prod = reference_gemm(n, m, k, &x, &w)?;
        for j in 0..n {
            for i in 0..m {
                let mut v = self.alpha * prod[j * m + i];
                if self.beta != 0.0 {
                    // SAFETY: C's range was checked above.
                    v += self.beta * unsafe { load(&self.c, self.c_ptr, i as u64, j as u64) };
                }
                if self.desc.bias {
                    let b = Layout { elem: bias_elem, rows: m as u64, cols: 1, ld: m as i64, row_major: false, batch: 1 };
                    // SAFETY: the bias range was checked above.
                    v += unsafe { load(&b, self.desc.bias_ptr, i as u64, 0) };
                }
                let at = i + j * self.d.ld as usize;
                // SAFETY: D's range was checked above.
                unsafe {
                    match self.d.elem {
                        Elem::F32 => (self.d_ptr as *mut f32).add(at).write_unaligned(v),
                        Elem::Bf16 => (self.d_ptr as *mut u16).add(at).write_unaligned(bf16::from_f32(v).to_bits()),
                        Elem::Other(_) => {}
                    }
                }
            }
        }
        Ok(())
    }
}

impl Default for MatmulDesc {
    fn default() -> Self {
        MatmulDesc {
            compute_32f: false,
            scale_f32: true,
            trans_a: false,
            trans_b: false,
            bias: false,
            other_epilogue: None,
            bias_ptr: 0,
            bias_elem: None,
            device_pointer_mode: false,
        }
    }
}

/// The four layouts of a matmul, in A, B, C, D order.
pub type Layouts = [u64; 4];

impl Device {
    pub fn lt_create(&self) -> u64 {
        self.lock().blas.handles.insert(())
    }

    pub fn lt_destroy(&self, h: u64) -> Result<()> {
        self.lock().blas.handles.remove(h)
    }

    pub fn desc_create(&self, d: MatmulDesc) -> u64 {
        self.lock().blas.descs.insert(d)
    }

    pub fn desc_destroy(&self, h: u64) -> Result<()> {
        self.lock().blas.descs.remove(h).map(|_| ())
    }

    /// Changes one attribute of a descriptor.
    pub fn desc_update(&self, h: u64, f: impl FnOnce(&mut MatmulDesc) -> Result<()>) -> Result<()> {
        f(self.lock().blas.descs.get_mut(h)?)
    }

    pub fn layout_create(&self, l: Layout) -> u64 {
        self.lock().blas.layouts.insert(l)
    }

    pub fn layout_destroy(&self, h: u64) -> Result<()> {
        self.lock().blas.layouts.remove(h).map(|_| ())
    }

    pub fn layout_update(&self, h: u64, f: impl FnOnce(&mut Layout) -> Result<()>) -> Result<()> {
        f(self.lock().blas.layouts.get_mut(h)?)
    }

    pub fn pref_create(&self) -> u64 {
        self.lock().blas.prefs.insert(Preference::default())
    }

    pub fn pref_destroy(&self, h: u64) -> Result<()> {
        self.lock().blas.prefs.remove(h).map(|_| ())
    }

    pub fn pref_update(&self, h: u64, f: impl FnOnce(&mut Preference) -> Result<()>) -> Result<()> {
        f(self.lock().blas.prefs.get_mut(h)?)
    }

    fn lookup(&self, handle: u64, desc: u64, layouts: Layouts) -> Result<(MatmulDesc, [Layout; 4])> {
        let st = self.lock();
        st.blas.handles.get(handle)?;
        let d = *st.blas.descs.get(desc)?;
        let mut ls = [Layout { elem: Elem::F32, rows: 0, cols: 0, ld: 0, row_major: false, batch: 1 }; 4];
        for (l, h) in ls.iter_mut().zip(layouts) {
            *l = *st.blas.layouts.get(h)?;
        }
        Ok((d, ls))
    }

    /// The heuristic: `Ok(ALGO_ID)` when the stand-in computes these operands, else why not.
    pub fn heuristic(&self, handle: u64, desc: u64, layouts: Layouts, pref: u64) -> Result<std::result::Result<u64, String>> {
        let (d, [a, b, c, dl]) = self.lookup(handle, desc, layouts)?;
        self.lock().blas.prefs.get(pref)?;
        Ok(match unsupported(&d, &a, &b, &c, &dl) {
            None => Ok(ALGO_ID),
            Some(why) => Err(why),
        })
    }

    /// Enqueues `D = alpha · op(A) · op(B) + beta · C (+ bias)` on `stream`.
    pub fn matmul(&self, handle: u64, desc: u64, layouts: Layouts, ptrs: [u64; 4], scale: (f32, f32), algo: Option<u64>, workspace: (u64, usize), stream: StreamRef) -> Result<()> {
        let (d, [a, b, c, dl]) = self.lookup(handle, desc, layouts)?;
        if algo.is_some_and(|id| id != ALGO_ID) {
            return Err(invalid("the algorithm was not produced by this library's heuristic"));
        }
        let call = GemmCall {
            desc: d,
            a,
            b,
            c,
            d: dl,
            a_ptr: ptrs[0],
            b_ptr: ptrs[1],
            c_ptr: ptrs[2],
            d_ptr: ptrs[3],
            alpha: scale.0,
            beta: scale.1,
            workspace: workspace.0,
            workspace_bytes: workspace.1,
        };
        call.validate()?;
        self.enqueue(stream, Node::Gemm(Box::new(call)))
    }
}

/// `out[rows, cols] = x[rows, k] · w[cols, k]ᵀ` in f32 through kernel-api's CPU backend.
fn reference_gemm(rows: usize, cols: usize, k: usize, x: &[f32], w: &[f32]) -> Result<Vec<f32>> {
    let fail = |e: kernel_api::Error| Error::new(Kind::LaunchFailed, format!("CPU reference GEMM: {e}"));
    let cpu = CpuBackend::new();
    let params = GemmParams::new(rows, cols, k, DType::F32, DType::F32, DType::F32);
    let plan = Gemm::plan(&cpu, &params).map_err(fail)?;
    let xt = cpu.upload_tensor(&HostTensor::from_f32(DType::F32, &[rows, k], x).map_err(fail)?).map_err(fail)?;
    let wt = cpu.upload_tensor(&HostTensor::from_f32(DType::F32, &[cols, k], w).map_err(fail)?).map_err(fail)?;
    let mut out = cpu.zeros(DType::F32, &[rows, cols]).map_err(fail)?;
    let args = GemmArgs { x: xt.as_ref(), w: wt.as_ref(), bias: None, out: out.as_mut() };
    Gemm::run(&cpu, &plan, args, None, cpu.default_stream()).map_err(fail)?;
    Ok(cpu.download_tensor(&out).map_err(fail)?.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(elem: Elem, rows: u64, cols: u64) -> Layout {
        Layout { elem, rows, cols, ld: rows as i64, row_major: false, batch: 1 }
    }

    /// The backend's "TN" call: A = W as column-major K×N transposed, B = x as K×M, D = N×M.
    #[test]
    fn tn_product_with_bias_matches_a_direct_sum() {
        let mut mem = Memory::new(1 << 30).unwrap();
        let (m, n, k) = (3usize, 5usize, 7usize);
        let xs: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let ws: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let put = |mem: &mut Memory, v: &[f32]| {
            let p = mem.alloc(v.len() * 4).unwrap();
            // SAFETY: a fresh allocation of that many bytes.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p as *mut f32, v.len()) };
            p
        };
        let (xp, wp, bp) = (put(&mut mem, &xs), put(&mut mem, &ws), put(&mut mem, &bias));
        let dp = mem.alloc(m * n * 4).unwrap();
        let desc = MatmulDesc {
            compute_32f: true,
            scale_f32: true,
            trans_a: true,
            trans_b: false,
            bias: true,
            other_epilogue: None,
            bias_ptr: bp,
            bias_elem: Some(Elem::F32),
            device_pointer_mode: false,
        };
        let call = GemmCall {
            desc,
            a: layout(Elem::F32, k as u64, n as u64),
            b: layout(Elem::F32, k as u64, m as u64),
            c: layout(Elem::F32, n as u64, m as u64),
            d: layout(Elem::F32, n as u64, m as u64),
            a_ptr: wp,
            b_ptr: xp,
            c_ptr: dp,
            d_ptr: dp,
            alpha: 1.0,
            beta: 0.0,
            workspace: 0,
            workspace_bytes: 0,
        };
        call.validate().unwrap();
        call.run(&mem).unwrap();
        // SAFETY: D holds m*n f32.
        let out = unsafe { std::slice::from_raw_parts(dp as *const f32, m * n) };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| xs[i * k + p] as f64 * ws[j * k + p] as f64).sum::<f64>() + bias[j] as f64;
                assert!((out[i * n + j] as f64 - want).abs() < 1e-5, "({i},{j}) {} vs {want}", out[i * n + j]);
            }
        }
        mem.free(xp).unwrap();
        assert_eq!(call.run(&mem).unwrap_err().kind, Kind::IllegalAddress, "B was freed");
    }
}
