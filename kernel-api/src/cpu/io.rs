//! Decoding and encoding tensor arguments of the CPU backend. Callers validate layouts first
//! (plans do); these helpers still never index outside the buffer.

use super::{CpuBackend, HostBuffer};
use crate::error::{Error, Result};
use crate::tensor::{decode_f32, decode_i64, encode_f32, Layout, TensorMut, TensorRef};

fn check_fits(layout: &Layout, buf: &HostBuffer) -> Result<()> {
    match layout.span_bytes() {
        Some(n) if n <= buf.0.len() => Ok(()),
        _ => Err(Error::invalid("tensor", format!("layout {:?} does not fit a {}-byte buffer", layout.shape, buf.0.len()))),
    }
}

/// All elements in logical row-major order, decoded to f32.
pub fn read_f32(t: &TensorRef<'_, CpuBackend>) -> Result<Vec<f32>> {
    check_fits(&t.layout, t.buf)?;
    let s = t.layout.dtype.size_bytes();
    Ok(t.layout.element_offsets().into_iter().map(|o| decode_f32(t.layout.dtype, &t.buf.0[o * s..o * s + s])).collect())
}

/// All elements of an integer tensor in logical order.
pub fn read_i64(t: &TensorRef<'_, CpuBackend>) -> Result<Vec<i64>> {
    check_fits(&t.layout, t.buf)?;
    let s = t.layout.dtype.size_bytes();
    Ok(t.layout.element_offsets().into_iter().map(|o| decode_i64(t.layout.dtype, &t.buf.0[o * s..o * s + s])).collect())
}

/// Writes values (logical row-major order) rounding once to the tensor's dtype.
pub fn write_f32(t: &mut TensorMut<'_, CpuBackend>, values: &[f32]) -> Result<()> {
    check_fits(&t.layout, t.buf)?;
    let offs = t.layout.element_offsets();
    if offs.len() != values.len() {
        return Err(Error::invalid("output", format!("{} values for {} elements", values.len(), offs.len())));
    }
    let dt = t.layout.dtype;
    let s = dt.size_bytes();
    for (o, &v) in offs.into_iter().zip(values) {
        encode_f32(dt, v, &mut t.buf.0[o * s..o * s + s]);
    }
    Ok(())
}

/// Like [`write_f32`] for a `[rows, row_len]` view of the values, but writes only the rows with
/// `written[row]` set; the other rows keep their contents.
pub fn write_f32_rows(t: &mut TensorMut<'_, CpuBackend>, values: &[f32], row_len: usize, written: &[bool]) -> Result<()> {
    check_fits(&t.layout, t.buf)?;
    let offs = t.layout.element_offsets();
    if offs.len() != values.len() || written.len().checked_mul(row_len) != Some(values.len()) {
        return Err(Error::invalid("output", format!("{} values for {} elements in {} rows", values.len(), offs.len(), written.len())));
    }
    let dt = t.layout.dtype;
    let s = dt.size_bytes();
    for (i, (o, &v)) in offs.into_iter().zip(values).enumerate() {
        if written[i / row_len.max(1)] {
            encode_f32(dt, v, &mut t.buf.0[o * s..o * s + s]);
        }
    }
    Ok(())
}
