//! Conformance tests of [`crate::ops::Gemm`].

use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::ops::{Gemm, GemmArgs, GemmParams};
use crate::tensor::{HostTensor, Layout, TensorRef};
use crate::tolerance::{assert_close, Tolerance};


/// Naive `x · Wᵀ (+ b)` in f64 over the values the op sees (already rounded to their dtypes).
fn oracle(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|l| x[i * k + l] as f64 * w[j * k + l] as f64).sum();
            y[i * n + j] = (dot + bias.map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    y
}

/// Tolerance for an output of `out_dt` computed from exactly representable inputs: f32 output
/// = one f32 sum of K ≤ 160 products (error ~√K·2⁻²⁴ ≪ 1e-5); bf16 output = one rounding.
fn tolerance(out_dt: DType) -> Tolerance {
    Tolerance::for_dtype(out_dt)
}

/// Uploads values of logical shape `shape` as a view whose innermost rows are padded by `pad`
/// elements (so every outer stride is larger than contiguous) and that starts `offset` elements
/// into its buffer. Padding is NaN, so a backend that reads it shows non-finite outputs.
pub(crate) fn upload_padded<B: Backend>(b: &B, dt: DType, shape: &[usize], v: &[f32], pad: usize, offset: usize) -> DeviceTensor<B> {
    let rank = shape.len();
    let cols = shape[rank - 1];
    let rows = v.len() / cols.max(1);
    let row_stride = cols + pad;
    let mut strides = vec![1usize; rank];
    let mut s = row_stride;
    for d in (0..rank - 1).rev() {
        strides[d] = s;
        s *= shape[d];
    }
    let mut flat = vec![f32::NAN; offset + rows * row_stride];
    for r in 0..rows {
        flat[offset + r * row_stride..offset + r * row_stride + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
    }
    let host = HostTensor::from_f32(dt, &[flat.len()], &flat).unwrap();
    let buf = b.upload(&host.bytes).unwrap();
    DeviceTensor { buf, layout: Layout { dtype: dt, shape: shape.to_vec(), strides, offset } }
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    x_dt: DType,
    w_dt: DType,
    out_dt: DType,
    bias_dt: Option<DType>,
    /// Row padding and offset of x (0, 0 = contiguous).
    x_pad: usize,
    x_offset: usize,
}

fn run_case<B: Backend + Gemm>(b: &B, rng: &mut TestRng, c: &Case) {
    let (m, n, k) = (c.m, c.n, c.k);
    let x = round_through(c.x_dt, &rng.normals(m * k, 1.0));
    let w = round_through(c.w_dt, &rng.normals(n * k, 1.0 / (k as f32).sqrt()));
    let bias = c.bias_dt.map(|dt| round_through(dt, &rng.normals(n, 0.5)));
    let want = oracle(&x, &w, bias.as_deref(), m, n, k);

    let params = GemmParams { m, n, k, x_dtype: c.x_dt, w_dtype: c.w_dt, out_dtype: c.out_dt, bias_dtype: c.bias_dt };
    let plan = Gemm::plan(b, &params).expect("plan");
    let xt = upload_padded(b, c.x_dt, &[m, k], &x, c.x_pad, c.x_offset);
    let wt = upload_f32(b, c.w_dt, &[n, k], &w).unwrap();
    let bt = bias.as_ref().zip(c.bias_dt).map(|(v, dt)| upload_f32(b, dt, &[n], v).unwrap());
    let mut out = b.zeros(c.out_dt, &[m, n]).unwrap();
    let args = GemmArgs { x: xt.as_ref(), w: wt.as_ref(), bias: bt.as_ref().map(|t| t.as_ref()), out: out.as_mut() };
    let mut ws = b.workspace(Gemm::workspace_size(b, &plan)).expect("workspace");
    Gemm::run(b, &plan, args, ws.as_mut(), b.default_stream()).expect("run");
    let got = download_f32(b, &out).unwrap();
    let what = format!("gemm m{m} n{n} k{k} x {} w {} out {} bias {:?}", c.x_dt, c.w_dt, c.out_dt, c.bias_dt);
    assert_close(&what, &got, &want, tolerance(c.out_dt));
}

/// x·Wᵀ against a naive f64 product, M ∈ {1, 7, 64}, N/K ∈ {96, 128, 160}, bf16 and f32.
pub fn gemm_matches_f64_oracle<B: Backend + Gemm>(b: &B) {
    let mut rng = TestRng::new(21);
    let dts = [
        (DType::F32, DType::F32, DType::F32),
        (DType::BF16, DType::BF16, DType::BF16),
        (DType::BF16, DType::BF16, DType::F32),
        (DType::F32, DType::BF16, DType::F32),
        (DType::BF16, DType::F32, DType::BF16),
    ];
    for &m in &[1, 7, 64] {
        for &(n, k) in &[(96, 128), (160, 96), (128, 160)] {
            for &(x_dt, w_dt, out_dt) in &dts {
                let c = Case { m, n, k, x_dt, w_dt, out_dt, bias_dt: None, x_pad: 0, x_offset: 0 };
                run_case(b, &mut rng, &c);
            }
        }
    }
    // Multi-tile M (GPU kernels tile M by 64) and a single output column.
    for &(m, n, k) in &[(130, 72, 40), (65, 1, 48)] {
        for &(x_dt, w_dt, out_dt) in &[(DType::BF16, DType::BF16, DType::F32), (DType::F32, DType::F32, DType::F32)] {
            let c = Case { m, n, k, x_dt, w_dt, out_dt, bias_dt: None, x_pad: 0, x_offset: 0 };
            run_case(b, &mut rng, &c);
        }
    }
}

/// Row-strided x at an offset, with and without a bias (f32 and bf16), odd shapes.
pub fn gemm_strided_x_and_bias<B: Backend + Gemm>(b: &B) {
    let mut rng = TestRng::new(22);
    for &(m, n, k) in &[(1, 96, 128), (7, 160, 96), (64, 128, 160), (5, 3, 1), (3, 17, 33)] {
        for &(x_dt, bias_dt) in &[(DType::BF16, Some(DType::F32)), (DType::F32, Some(DType::BF16)), (DType::BF16, None)] {
            let out_dt = if bias_dt == Some(DType::F32) { DType::F32 } else { DType::BF16 };
            let c = Case { m, n, k, x_dt, w_dt: DType::BF16, out_dt, bias_dt, x_pad: 3 + rng.below(40), x_offset: 1 + rng.below(9) };
            run_case(b, &mut rng, &c);
        }
    }
}

/// M = 0 is an empty batch: planned and run without error, nothing written.
pub fn gemm_empty_batch<B: Backend + Gemm>(b: &B) {
    let params = GemmParams::new(0, 8, 4, DType::BF16, DType::BF16, DType::F32);
    let plan = Gemm::plan(b, &params).expect("plan");
    let x = b.zeros(DType::BF16, &[0, 4]).unwrap();
    let w = upload_f32(b, DType::BF16, &[8, 4], &[1.0; 32]).unwrap();
    let mut out = b.zeros(DType::F32, &[0, 8]).unwrap();
    let mut ws = b.workspace(Gemm::workspace_size(b, &plan)).expect("workspace");
    let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() };
    Gemm::run(b, &plan, args, ws.as_mut(), b.default_stream()).expect("run");
    assert!(download_f32(b, &out).unwrap().is_empty());
}

/// Bad params and mismatched tensors are typed errors naming the field.
pub fn gemm_rejects_bad_args<B: Backend + Gemm>(b: &B) {
    let p = GemmParams::new(4, 6, 8, DType::BF16, DType::BF16, DType::F32);
    let field = |p: GemmParams| Gemm::plan(b, &p).err().and_then(|e| e.field().map(str::to_string));
    assert_eq!(field(GemmParams { k: 0, ..p.clone() }).as_deref(), Some("params.k"));
    assert_eq!(field(GemmParams { n: 0, ..p.clone() }).as_deref(), Some("params.n"));
    assert_eq!(field(GemmParams { x_dtype: DType::F16, ..p.clone() }).as_deref(), Some("params.x_dtype"));
    assert_eq!(field(GemmParams { w_dtype: DType::I32, ..p.clone() }).as_deref(), Some("params.w_dtype"));
    assert_eq!(field(GemmParams { out_dtype: DType::F8E4M3Fn, ..p.clone() }).as_deref(), Some("params.out_dtype"));
    assert_eq!(field(GemmParams { bias_dtype: Some(DType::U8), ..p.clone() }).as_deref(), Some("params.bias_dtype"));
    assert_eq!(field(GemmParams { m: usize::MAX / 2, ..p.clone() }).as_deref(), Some("params.m"));

    let plan = Gemm::plan(b, &p).unwrap();
    let x = b.zeros(DType::BF16, &[4, 8]).unwrap();
    let w = b.zeros(DType::BF16, &[6, 8]).unwrap();
    let bias = b.zeros(DType::F32, &[6]).unwrap();
    let x_f32 = b.zeros(DType::F32, &[4, 8]).unwrap();
    let w_k9 = b.zeros(DType::BF16, &[6, 9]).unwrap(); // K mismatch between x and W
    let w_t = b.zeros(DType::BF16, &[8, 6]).unwrap(); // [K, N] instead of [N, K]
    let x_col = DeviceTensor::<B> { buf: b.upload(&[0u8; 64]).unwrap(), layout: Layout { strides: vec![1, 4], ..x.layout.clone() } };
    let mut out = b.zeros(DType::F32, &[4, 6]).unwrap();
    let mut out_bf16 = b.zeros(DType::BF16, &[4, 6]).unwrap();
    let mut out_n5 = b.zeros(DType::F32, &[4, 5]).unwrap();
    let run = |x: TensorRef<'_, B>, w: TensorRef<'_, B>, bias: Option<TensorRef<'_, B>>, out: &mut DeviceTensor<B>| {
        let args = GemmArgs { x, w, bias, out: out.as_mut() };
        Gemm::run(b, &plan, args, None, b.default_stream()).unwrap_err().field().map(str::to_string)
    };
    assert_eq!(run(x_f32.as_ref(), w.as_ref(), None, &mut out).as_deref(), Some("x"), "x dtype differs from the plan");
    assert_eq!(run(x_col.as_ref(), w.as_ref(), None, &mut out).as_deref(), Some("x"), "column-major x");
    assert_eq!(run(x.as_ref(), w_k9.as_ref(), None, &mut out).as_deref(), Some("w"), "K mismatch");
    assert_eq!(run(x.as_ref(), w_t.as_ref(), None, &mut out).as_deref(), Some("w"), "transposed W");
    assert_eq!(run(x.as_ref(), w.as_ref(), Some(bias.as_ref()), &mut out).as_deref(), Some("bias"), "bias not planned");
    assert_eq!(run(x.as_ref(), w.as_ref(), None, &mut out_bf16).as_deref(), Some("out"), "out dtype");
    assert_eq!(run(x.as_ref(), w.as_ref(), None, &mut out_n5).as_deref(), Some("out"), "out shape");
    // Overlapping rows (row stride 0 and 4 < K = 8).
    for stride in [0, 4] {
        let x_overlap = DeviceTensor::<B> { buf: b.upload(&[0u8; 64]).unwrap(), layout: Layout { strides: vec![stride, 1], ..x.layout.clone() } };
        assert_eq!(run(x_overlap.as_ref(), w.as_ref(), None, &mut out).as_deref(), Some("x"), "x row stride {stride}");
    }
    // A layout that does not fit its buffer.
    let short = DeviceTensor::<B> { buf: b.upload(&[0u8; 60]).unwrap(), layout: x.layout.clone() };
    assert_eq!(run(short.as_ref(), w.as_ref(), None, &mut out).as_deref(), Some("x"), "x overruns its buffer");

    let planned_bias = Gemm::plan(b, &GemmParams { bias_dtype: Some(DType::F32), ..p.clone() }).unwrap();
    let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() };
    let e = Gemm::run(b, &planned_bias, args, None, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("bias"), "{e}");
}

