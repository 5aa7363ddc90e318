//! Dense GEMM: `out = x · Wᵀ (+ bias)`, the projection of every linear layer.
//!
//! Semantics, for row m in 0..M and output column n in 0..N:
//!
//! ```text
//! out[m, n] = round_out( Σ_{k<K} x[m, k] · W[n, k]  (+ bias[n]) )
//! ```
//!
//! - `W` is in the checkpoint layout `[out, in] = [N, K]`, so no transpose copy is ever needed.
//! - Inputs are decoded exactly to f32 (bf16 → f32 is exact); products are accumulated in f32
//!   (at least; a backend may use more) and the bias is added in f32 before the single rounding
//!   to the output dtype (round-to-nearest-even).
//! - `M = 0` is an empty batch: `run` writes nothing and succeeds. `N` and `K` are at least 1.
//! - dtypes are part of the params (not read off the tensors) because a GPU plan chooses its
//!   kernel or cuBLASLt/hipBLASLt algorithm from them; `check_args` then insists the tensors match.
//!
//! Accepted dtypes: `x`, `W`, `out`, `bias` each f32 or bf16, in any combination.
//!
//! Layouts: `x` `[M, K]` and `W` `[N, K]` need unit stride along K and a row stride of at least
//! K (a column slice of a wider activation is fine; overlapping rows are not, as BLAS leading
//! dimensions require); `bias` `[N]` has unit stride; `out` `[M, N]` is contiguous.
//!
//! ## The CPU backend
//!
//! The CPU reference hands f32 rows to the [`gemm`](https://crates.io/crates/gemm) crate
//! (sarah-ek, the engine under faer), then adds the bias and rounds. f32 operands are used in
//! place (any row stride); bf16 operands are decoded to contiguous f32 first, every call. It was chosen over `matrixmultiply` (bluss, used by ndarray) after measuring
//! both on the 2-core build VM (f32, y = x·Wᵀ with W as `[N, K]`):
//!
//! | shape (M, K, N) | gemm 1 thread | gemm 2 threads | matrixmultiply |
//! |---|---|---|---|
//! | 64, 128, 160 | 81 GFLOP/s | 46 GFLOP/s | 117 GFLOP/s |
//! | 64, 1024, 1024 | 78 GFLOP/s | 127 GFLOP/s | 98 GFLOP/s (1 or 2 threads) |
//! | 1, 1024, 1024 (decode GEMV) | 15 GFLOP/s | 15 GFLOP/s | 3.4 GFLOP/s |
//!
//! - gemm has a real GEMV path for M = 1 (decode), about 4× faster here, and scales over rayon
//!   threads (the backend's pool) where matrixmultiply's `threading` feature did not.
//! - Build cost: gemm with `default-features = false, features = ["std", "rayon"]` builds in
//!   about 12 s (2 cores, release, rayon included) against 4 s for matrixmultiply.
//! - MSRV: matrixmultiply declares 1.75. gemm 0.19 and its `pulp` / `dyn-stack` dependencies
//!   declare no `rust-version`; their AVX-512 code (which would need Rust 1.89 target features)
//!   sits behind the `x86-v4` feature that this workspace leaves off, and the crate avoids newer
//!   std APIs on purpose (its `msrv_*` helpers). Only rustc 1.95 was available to build with here.
//! - Determinism: gemm splits the M/N tiles across threads and never splits the K reduction, and
//!   its K blocking comes from cache sizes, not the thread count. Results are therefore bit
//!   identical for any thread count on one machine (pinned by a test in `tests/dense_props.rs`,
//!   1 vs 2 threads). They may differ between CPUs with different SIMD kernels (AVX2 vs NEON).
//! - bf16 weights are converted per call: at M = 1, K = N = 1024 that takes about 0.25 ms
//!   against 0.14 ms for the product itself (benches/README.md). A CPU runner that cares
//!   converts its weights to f32 once at load and passes f32 `W`, which is used in place.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Dim, Layout, TensorMut, TensorRef};

/// The dtypes every GEMM tensor may have.
pub const GEMM_DTYPES: &[DType] = &[DType::F32, DType::BF16];

/// Shape and dtypes of one GEMM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmParams {
    /// Rows of `x` and `out` (tokens); 0 is an empty batch.
    pub m: usize,
    /// Output features: rows of `W`, columns of `out`.
    pub n: usize,
    /// Input features: the reduction length.
    pub k: usize,
    pub x_dtype: DType,
    pub w_dtype: DType,
    pub out_dtype: DType,
    /// dtype of the bias `[N]`, or `None` for a GEMM without bias.
    pub bias_dtype: Option<DType>,
}

impl GemmParams {
    /// A GEMM without bias.
    pub fn new(m: usize, n: usize, k: usize, x_dtype: DType, w_dtype: DType, out_dtype: DType) -> Self {
        GemmParams { m, n, k, x_dtype, w_dtype, out_dtype, bias_dtype: None }
    }
}

/// Tensor arguments of a GEMM.
#[derive(Debug)]
pub struct GemmArgs<'a, B: Backend + ?Sized> {
    /// `[M, K]`, dtype `params.x_dtype`, unit stride along K, any row stride.
    pub x: TensorRef<'a, B>,
    /// `[N, K]` (checkpoint `[out, in]`), dtype `params.w_dtype`, unit stride along K.
    pub w: TensorRef<'a, B>,
    /// `[N]`, dtype `params.bias_dtype`; present exactly when the params have a bias dtype.
    pub bias: Option<TensorRef<'a, B>>,
    /// `[M, N]`, dtype `params.out_dtype`, contiguous.
    pub out: TensorMut<'a, B>,
}

/// A validated GEMM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    pub params: GemmParams,
}

/// Rows of a `[rows, k]` operand must not overlap (BLAS: leading dimension ≥ k).
fn check_row_stride(field: &str, layout: &Layout, k: usize) -> Result<()> {
    let (rows, stride) = (layout.shape[0], layout.strides[0]);
    ensure(rows <= 1 || stride >= k, field, || format!("row stride {stride} is below the row length {k}"))
}

fn check_dtype(field: &str, dt: DType) -> Result<()> {
    ensure(GEMM_DTYPES.contains(&dt), field, || format!("dtype {dt} not accepted (expected f32 or bf16)"))
}

impl GemmPlan {
    /// Backend-independent validation.
    pub fn new(p: &GemmParams) -> Result<Self> {
        ensure(p.n >= 1, "params.n", || "must be at least 1".into())?;
        ensure(p.k >= 1, "params.k", || "must be at least 1".into())?;
        check_dtype("params.x_dtype", p.x_dtype)?;
        check_dtype("params.w_dtype", p.w_dtype)?;
        check_dtype("params.out_dtype", p.out_dtype)?;
        if let Some(b) = p.bias_dtype {
            check_dtype("params.bias_dtype", b)?;
        }
        let fits = |a: usize, b: usize| a.checked_mul(b).and_then(|e| e.checked_mul(4)).is_some_and(|n| n <= isize::MAX as usize);
        ensure(fits(p.m, p.k), "params.m", || "m x k overflows".into())?;
        ensure(fits(p.n, p.k), "params.n", || "n x k overflows".into())?;
        ensure(fits(p.m, p.n), "params.m", || "m x n overflows".into())?;
        Ok(GemmPlan { params: p.clone() })
    }

    /// Floating-point operations of one run (2·M·N·K, multiply and add counted apart).
    pub fn flops(&self) -> u64 {
        let p = &self.params;
        2 * p.m as u64 * p.n as u64 * p.k as u64
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &GemmArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        a.x.check(b, "x")?.dtype(&[p.x_dtype])?.shape(&[Dim::Is(p.m), Dim::Is(p.k)])?.unit_inner_stride()?;
        check_row_stride("x", &a.x.layout, p.k)?;
        a.w.check(b, "w")?.dtype(&[p.w_dtype])?.shape(&[Dim::Is(p.n), Dim::Is(p.k)])?.unit_inner_stride()?;
        check_row_stride("w", &a.w.layout, p.k)?;
        match (&a.bias, p.bias_dtype) {
            (Some(t), Some(dt)) => {
                t.check(b, "bias")?.dtype(&[dt])?.shape(&[Dim::Is(p.n)])?.unit_inner_stride()?;
            }
            (None, None) => {}
            (Some(_), None) => return Err(Error::invalid("bias", "given, but the plan has no bias (params.bias_dtype is None)")),
            (None, Some(_)) => return Err(Error::invalid("bias", "missing, but the plan has params.bias_dtype set")),
        }
        a.out.check(b, "out")?.dtype(&[p.out_dtype])?.shape(&[Dim::Is(p.m), Dim::Is(p.n)])?.contiguous()?;
        Ok(())
    }
}

/// Dense GEMM `out = x · Wᵀ (+ bias)`.
pub trait Gemm: Backend {
    /// Whether this backend can run the GEMM (reasons if not).
    fn supports(&self, params: &GemmParams) -> Result<()>;
    fn plan(&self, params: &GemmParams) -> Result<GemmPlan> {
        let plan = GemmPlan::new(params)?;
        Gemm::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &GemmPlan) -> usize {
        0
    }
    fn run(&self, plan: &GemmPlan, args: GemmArgs<'_, Self>, workspace: Option<&mut Self::Buffer>, stream: &Self::Stream) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, matrix_class, Cost, CostBuilder};

impl GemmParams {
    /// x, W, out (and the bias) once each; 2·M·N·K FLOPs in the class of x and W.
    pub fn cost(&self) -> Result<Cost> {
        let (m, n, k) = (dim(self.m), dim(self.n), dim(self.k));
        CostBuilder::new("params")
            .bytes(&[m, k, elem_bytes(self.x_dtype)])
            .bytes(&[n, k, elem_bytes(self.w_dtype)])
            .bytes(&[m, n, elem_bytes(self.out_dtype)])
            .bytes(&[n, self.bias_dtype.map_or(0, elem_bytes)])
            .flops(matrix_class(self.x_dtype, self.w_dtype), &[2, m, n, k])
            .build()
    }
}
