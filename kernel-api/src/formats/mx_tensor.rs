//! Row-level MXFP4 in the checkpoint layout (`mxfp4-pack-quantized`, k3-architecture.md 3.4).
//!
//! A `[rows, cols]` weight is stored as two row-major byte tensors:
//! - `weight_packed` `[rows, cols/2]`: byte `j` of a row holds column `2j` in the low nibble and
//!   column `2j+1` in the high nibble (FP4 E2M1 codes: bit 3 sign, bits 0-2 index
//!   {0, 0.5, 1, 1.5, 2, 3, 4, 6});
//! - `weight_scale` `[rows, cols/32]`: one E8M0 byte S per 32 consecutive columns, scale 2^(S-127).
//!
//! Dequantisation is exact (every value is representable in bf16 and f32); S = 255 (NaN in OCP MX)
//! decodes to NaN. Quantisation follows [`Mxfp4Block::quantize`] (shared exponent
//! floor(log2 amax) - 2, round half to even, saturate to ±6).

use super::{F4E2M1x2, Mxfp4Block, E8M0, MX_BLOCK};
use crate::error::{ensure, Error, Result};

/// Checks `cols` and returns (packed bytes, scale bytes) for `rows x cols` values.
fn mxfp4_sizes(rows: usize, cols: usize) -> Result<(usize, usize)> {
    ensure(cols.is_multiple_of(MX_BLOCK), "cols", || format!("{cols} columns is not a multiple of the MX block ({MX_BLOCK})"))?;
    let packed = rows.checked_mul(cols / 2).ok_or_else(|| Error::invalid("rows", "rows x cols overflows usize"))?;
    Ok((packed, rows * (cols / MX_BLOCK)))
}

/// Dequantises an MXFP4 `[rows, cols]` weight to f32 (row-major, exact).
pub fn mxfp4_dequantize(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    let (n_packed, n_scales) = mxfp4_sizes(rows, cols)?;
    ensure(packed.len() == n_packed, "packed", || format!("{} bytes for [{rows}, {}]", packed.len(), cols / 2))?;
    ensure(scales.len() == n_scales, "scales", || format!("{} bytes for [{rows}, {}]", scales.len(), cols / MX_BLOCK))?;
    let mut out = Vec::with_capacity(rows * cols);
    // One group = 16 packed bytes sharing one scale byte.
    for (group, &s) in packed.chunks_exact(MX_BLOCK / 2).zip(scales) {
        let scale = E8M0::from_bits(s).to_f32();
        for &byte in group {
            let (even, odd) = F4E2M1x2::from_bits(byte).to_f32x2();
            out.push(even * scale);
            out.push(odd * scale);
        }
    }
    Ok(out)
}

/// Quantises a row-major `[rows, cols]` f32 matrix to MXFP4: `(weight_packed, weight_scale)`.
pub fn mxfp4_quantize_rows(values: &[f32], rows: usize, cols: usize) -> Result<(Vec<u8>, Vec<u8>)> {
    let (n_packed, n_scales) = mxfp4_sizes(rows, cols)?;
    ensure(values.len() == rows * cols, "values", || format!("{} values for [{rows}, {cols}]", values.len()))?;
    let mut packed = Vec::with_capacity(n_packed);
    let mut scales = Vec::with_capacity(n_scales);
    for chunk in values.chunks_exact(MX_BLOCK) {
        let mut block = [0f32; MX_BLOCK];
        block.copy_from_slice(chunk);
        let q = Mxfp4Block::quantize(&block);
        packed.extend(q.codes.iter().map(|c| c.to_bits()));
        scales.push(q.scale.to_bits());
    }
    Ok((packed, scales))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked bytes of k3-architecture.md 3.4 with scales 127 (x1) and 120 (x2^-7).
    #[test]
    fn worked_bytes() {
        let mut packed = vec![0u8; 32];
        packed[..3].copy_from_slice(&[0x2A, 0x7F, 0xF1]);
        packed[16..19].copy_from_slice(&[0x2A, 0x7F, 0xF1]);
        let v = mxfp4_dequantize(&packed, &[127, 120], 2, 32).unwrap();
        let want = [-1.0, 1.0, -6.0, 6.0, 0.5, -6.0];
        assert_eq!(&v[..6], &want);
        assert!(v[6..32].iter().all(|&x| x == 0.0));
        let scaled: Vec<f32> = want.iter().map(|w| w * 2f32.powi(-7)).collect();
        assert_eq!(&v[32..38], &scaled[..]);
    }

    /// Values on the E2M1 grid whose group maximum has magnitude 4 or 6 round-trip exactly.
    #[test]
    fn grid_values_round_trip() {
        let grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let (rows, cols) = (3, 64);
        let mut v = Vec::new();
        for i in 0..rows * cols {
            let scale = 2f32.powi((i / 32) as i32 % 5 - 2);
            let m = if i % 32 == 7 { 6.0 } else { grid[(i * 5 + 3) % 7] };
            v.push(if i % 3 == 0 { -m * scale } else { m * scale });
        }
        let (p, s) = mxfp4_quantize_rows(&v, rows, cols).unwrap();
        assert_eq!((p.len(), s.len()), (rows * cols / 2, rows * cols / 32));
        assert_eq!(mxfp4_dequantize(&p, &s, rows, cols).unwrap(), v);
    }

    #[test]
    fn shape_errors_name_the_field() {
        assert_eq!(mxfp4_dequantize(&[0; 8], &[127], 1, 16).unwrap_err().field(), Some("cols"));
        assert_eq!(mxfp4_dequantize(&[0; 15], &[127], 1, 32).unwrap_err().field(), Some("packed"));
        assert_eq!(mxfp4_dequantize(&[0; 16], &[127, 1], 1, 32).unwrap_err().field(), Some("scales"));
        assert_eq!(mxfp4_quantize_rows(&[0.0; 31], 1, 32).unwrap_err().field(), Some("values"));
        assert_eq!(mxfp4_quantize_rows(&[], usize::MAX, 64).unwrap_err().field(), Some("rows"));
    }
}
