//! Conformance tests of the data-movement ops (exact: no arithmetic beyond one rounding).

use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt};
use crate::dtype::DType;
use crate::ops::tensor_ops::{AddAssign, AddAssignArgs, CopyCast, CopyCastArgs, ElementwiseParams};
use crate::tensor::Layout;


/// A strided view (the k slice of a fused [T, 3, H, D] projection) copied contiguous and cast:
/// bit-exact against rounding the selected values once.
pub fn copy_cast_strided_view_exact<B: Backend + CopyCast>(b: &B) {
    let mut rng = TestRng::new(31);
    let (t, h, d) = (5, 3, 4);
    let fused = rng.normals(t * 3 * h * d, 1.0);
    let src = upload_f32(b, DType::F32, &[t * 3 * h * d], &fused).unwrap();
    for out_dt in [DType::F32, DType::BF16, DType::F8E4M3Fn] {
        let mut out = b.zeros(out_dt, &[t, h, d]).unwrap();
        let view = Layout { dtype: DType::F32, shape: vec![t, h, d], strides: vec![3 * h * d, d, 1], offset: h * d };
        let plan = CopyCast::plan(b, &ElementwiseParams { shape: vec![t, h, d] }).unwrap();
        let args = CopyCastArgs { x: crate::tensor::TensorRef::new(&src.buf, view), out: out.as_mut() };
        CopyCast::run(b, &plan, args, b.default_stream()).unwrap();
        let got = download_f32(b, &out).unwrap();
        let want: Vec<f32> = (0..t).flat_map(|i| fused[i * 3 * h * d + h * d..i * 3 * h * d + 2 * h * d].to_vec()).collect();
        assert_eq!(got, round_through(out_dt, &want), "copy_cast to {out_dt}");
    }
}

pub fn copy_cast_rejects_mismatch<B: Backend + CopyCast>(b: &B) {
    let x = b.zeros(DType::F32, &[4, 4]).unwrap();
    let mut out = b.zeros(DType::F32, &[4, 5]).unwrap();
    let plan = CopyCast::plan(b, &ElementwiseParams { shape: vec![4, 4] }).unwrap();
    let e = CopyCast::run(b, &plan, CopyCastArgs { x: x.as_ref(), out: out.as_mut() }, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("out"));
    // A view reaching past the end of its buffer is rejected, not read.
    let view = Layout { dtype: DType::F32, shape: vec![4, 4], strides: vec![5, 1], offset: 0 };
    let mut out = b.zeros(DType::F32, &[4, 4]).unwrap();
    let args = CopyCastArgs { x: crate::tensor::TensorRef::new(&x.buf, view), out: out.as_mut() };
    assert_eq!(CopyCast::run(b, &plan, args, b.default_stream()).unwrap_err().field(), Some("x"));
    assert!(CopyCast::plan(b, &ElementwiseParams { shape: vec![] }).is_err());
}

/// acc += x in f32, rounded once to the accumulator dtype.
pub fn add_assign_exact<B: Backend + AddAssign>(b: &B) {
    let mut rng = TestRng::new(32);
    let n = 37;
    let a = rng.normals(n, 1.0);
    let x = rng.normals(n, 1.0);
    for (acc_dt, x_dt) in [(DType::F32, DType::F32), (DType::F32, DType::BF16), (DType::BF16, DType::BF16)] {
        let mut acc = upload_f32(b, acc_dt, &[n], &a).unwrap();
        let xt = upload_f32(b, x_dt, &[n], &x).unwrap();
        let plan = AddAssign::plan(b, &ElementwiseParams { shape: vec![n] }).unwrap();
        AddAssign::run(b, &plan, AddAssignArgs { acc: acc.as_mut(), x: xt.as_ref() }, b.default_stream()).unwrap();
        let (ar, xr) = (round_through(acc_dt, &a), round_through(x_dt, &x));
        let want: Vec<f32> = ar.iter().zip(&xr).map(|(p, q)| p + q).collect();
        assert_eq!(download_f32(b, &acc).unwrap(), round_through(acc_dt, &want), "{acc_dt} += {x_dt}");
    }
}

