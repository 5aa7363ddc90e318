//! CPU GEMM: f32 rows (in place, or decoded from bf16), multiplied with the `gemm` crate; then
//! the bias is added and the result rounded once.
//! Why that crate and what it guarantees: see [`crate::ops::gemm`].

use super::{read_f32, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{check_workspace, Gemm, GemmArgs, GemmParams, GemmPlan};
use crate::tensor::{decode_f32, encode_f32, TensorMut, TensorRef};
use rayon::prelude::*;

impl Gemm for CpuBackend {
    fn supports(&self, _params: &GemmParams) -> Result<()> {
        Ok(())
    }

    fn run(&self, plan: &GemmPlan, mut args: GemmArgs<'_, Self>, workspace: Option<&mut HostBuffer>, _stream: &CpuStream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), Gemm::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let x = F32Rows::of(&args.x, "x")?;
        let w = F32Rows::of(&args.w, "w")?;
        let mut y = vec![0f32; p.m * p.n];
        matmul_x_wt(&x, &w, &mut y, p.m, p.n, p.k)?;
        if let Some(b) = &args.bias {
            let bias = read_f32(b)?;
            for row in y.chunks_exact_mut(p.n) {
                for (v, b) in row.iter_mut().zip(&bias) {
                    *v += b;
                }
            }
        }
        write_contiguous_f32(&mut args.out, &y)
    }
}

/// A rank-2 GEMM operand as f32 rows with unit inner stride: an f32 tensor whose buffer is
/// 4-byte aligned is used in place; anything else is decoded into contiguous rows.
struct F32Rows<'a> {
    data: std::borrow::Cow<'a, [f32]>,
    /// Index of element (0, 0) in `data`.
    start: usize,
    row_stride: usize,
    rows: usize,
    cols: usize,
}

impl<'a> F32Rows<'a> {
    fn of(t: &TensorRef<'a, CpuBackend>, field: &str) -> Result<Self> {
        let l = &t.layout;
        let (&[rows, cols], &[row_stride, 1]) = (&l.shape[..], &l.strides[..]) else {
            return Err(Error::invalid(field, format!("expected a rank-2 tensor with unit inner stride, got {l:?}")));
        };
        if l.dtype == DType::F32 && rows >= 1 {
            let bytes = &t.buf.0[..t.buf.0.len() / 4 * 4];
            let last = (rows - 1).checked_mul(row_stride).and_then(|e| e.checked_add(l.offset)?.checked_add(cols));
            if let (Ok(data), Some(last)) = (bytemuck::try_cast_slice::<u8, f32>(bytes), last) {
                if last <= data.len() && cfg!(target_endian = "little") {
                    return Ok(F32Rows { data: data.into(), start: l.offset, row_stride, rows, cols });
                }
            }
        }
        let data = read_rows_f32(t, field)?;
        Ok(F32Rows { data: data.into(), start: 0, row_stride: cols, rows, cols })
    }

    /// Pointer to element (0, 0) after checking that every row lies inside `data`.
    fn base(&self) -> Option<*const f32> {
        let last = self.rows.checked_sub(1)?.checked_mul(self.row_stride)?.checked_add(self.start)?.checked_add(self.cols)?;
        (last <= self.data.len()).then(|| self.data[self.start..].as_ptr())
    }
}

/// `y[M, N] = x[M, K] · w[N, K]ᵀ`, with the rayon pool's thread count.
fn matmul_x_wt(x: &F32Rows<'_>, w: &F32Rows<'_>, y: &mut [f32], m: usize, n: usize, k: usize) -> Result<()> {
    let (Some(xp), Some(wp)) = (x.base(), w.base()) else {
        return Err(Error::invalid("x", "an operand row lies outside its data".to_string()));
    };
    if x.rows != m || x.cols != k || w.rows != n || w.cols != k || y.len() != m * n {
        return Err(Error::invalid("x", format!("operands do not form a {m}x{k} by {n}x{k} product")));
    }
    // Row strides fit isize: they index inside slices, which never exceed isize::MAX bytes.
    let (xs, ws, ys) = (x.row_stride as isize, w.row_stride as isize, n as isize);
    // SAFETY: `base` checked that rows 0..m of x (k elements each, row stride xs) and rows 0..n
    // of w (k each, row stride ws) lie inside their slices, and y holds m·n elements (checked
    // above). lhs(i, l) = x[i·xs + l], rhs(l, j) = w[j·ws + l], dst(i, j) = y[i·n + j] stay in
    // those ranges for i < m, j < n, l < k. y is written only (read_dst = false) and, being a
    // fresh Vec, aliases neither input.
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            ys,
            false,
            xp,
            1,
            xs,
            wp,
            ws,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            ::gemm::Parallelism::Rayon(0),
        );
    }
    Ok(())
}

fn bf16_bits_to_f32(le_bits: u16) -> f32 {
    f32::from_bits((u16::from_le(le_bits) as u32) << 16)
}

/// Appends one row of `dtype` values to `out` (bf16 → f32 is a shift the compiler vectorises).
fn decode_row(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) {
    match (dtype, bytemuck::try_cast_slice::<u8, u16>(bytes)) {
        (DType::BF16, Ok(h)) => out.extend(h.iter().map(|&b| bf16_bits_to_f32(b))),
        (DType::F32, _) => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        (dt, _) => out.extend(bytes.chunks_exact(dt.size_bytes()).map(|c| decode_f32(dt, c))),
    }
}

/// Decodes a rank-2 tensor with unit inner stride to contiguous f32 rows. A large contiguous
/// bf16 operand (a weight matrix) is decoded in parallel straight into its final allocation:
/// on a fresh 4 MiB buffer the page faults cost as much as the conversion.
fn read_rows_f32(t: &TensorRef<'_, CpuBackend>, field: &str) -> Result<Vec<f32>> {
    let l = &t.layout;
    let (&[rows, cols], &[row_stride, 1]) = (&l.shape[..], &l.strides[..]) else {
        return Err(Error::invalid(field, format!("expected a rank-2 tensor with unit inner stride, got {l:?}")));
    };
    let size = l.dtype.size_bytes();
    // Bytes of rows r0..r0+count when they are packed back to back (or of one strided row).
    let span = |r0: usize, elems: usize| {
        let start = r0.checked_mul(row_stride)?.checked_add(l.offset)?.checked_mul(size)?;
        t.buf.0.get(start..start.checked_add(elems.checked_mul(size)?)?)
    };
    let n = rows.checked_mul(cols).ok_or_else(|| Error::invalid(field, "rows x cols overflows".to_string()))?;
    if l.dtype == DType::BF16 && (row_stride == cols || rows <= 1) && n >= 1 << 16 {
        if let Some(Ok(h)) = span(0, n).map(bytemuck::try_cast_slice::<u8, u16>) {
            return Ok(h.par_iter().map(|&b| bf16_bits_to_f32(b)).collect());
        }
    }
    let mut out = Vec::with_capacity(n);
    for r in 0..rows {
        let bytes = span(r, cols).ok_or_else(|| Error::invalid(field, format!("row {r} lies outside the buffer")))?;
        decode_row(l.dtype, bytes, &mut out);
    }
    Ok(out)
}

/// Writes logical-order values into a contiguous output in one pass (falls back to the general
/// writer for other layouts).
pub(super) fn write_contiguous_f32(t: &mut TensorMut<'_, CpuBackend>, values: &[f32]) -> Result<()> {
    if !t.layout.is_contiguous() {
        return write_f32(t, values);
    }
    let dt = t.layout.dtype;
    let size = dt.size_bytes();
    let start = t.layout.offset.checked_mul(size);
    let bytes = start.and_then(|s| t.buf.0.get_mut(s..s.checked_add(values.len().checked_mul(size)?)?));
    match bytes {
        Some(bytes) if t.layout.numel() == Some(values.len()) => {
            for (chunk, &v) in bytes.chunks_exact_mut(size).zip(values) {
                encode_f32(dt, v, chunk);
            }
            Ok(())
        }
        _ => Err(Error::invalid("out", format!("{} values do not fit the output layout {:?}", values.len(), t.layout.shape))),
    }
}
