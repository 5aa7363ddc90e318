//! OCP microscaling blocks: 32 elements sharing one E8M0 scale.
//!
//! Quantisation follows the OCP MX reference (and compressed-tensors): the shared exponent is
//! floor(log2 amax) - emax of the element format, elements are rounded half-to-even and
//! saturated. Dequantisation is exact: element value times 2^(S-127).

use super::{F4E2M1x2, F8E4M3Fn, Saturation, E8M0, F4E2M1};

/// Elements per MX block.
pub const MX_BLOCK: usize = 32;

/// MXFP4: 32 E2M1 values (16 packed bytes, low nibble even) and one E8M0 scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Mxfp4Block {
    pub codes: [F4E2M1x2; 16],
    pub scale: E8M0,
}

/// MXFP8: 32 E4M3 (OCP) values and one E8M0 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Mxfp8Block {
    pub elems: [F8E4M3Fn; 32],
    pub scale: E8M0,
}

impl Default for Mxfp8Block {
    fn default() -> Self {
        Mxfp8Block { elems: [F8E4M3Fn(0); 32], scale: E8M0::ONE }
    }
}

/// Shared exponent for a block: floor(log2 amax) - emax_elem, 2^0 for an all-zero block.
fn shared_scale(values: &[f32; MX_BLOCK], emax_elem: i32) -> E8M0 {
    let amax = values.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    if amax == 0.0 || !amax.is_finite() {
        return E8M0::ONE;
    }
    let e = E8M0::from_f32(amax, super::ScaleRounding::Floor).exponent().unwrap_or(0);
    E8M0::from_exponent(e - emax_elem)
}

impl Mxfp4Block {
    /// E2M1's largest exponent (6 = 1.5 * 2^2).
    pub const EMAX_ELEM: i32 = 2;

    pub fn quantize(values: &[f32; MX_BLOCK]) -> Self {
        let scale = shared_scale(values, Self::EMAX_ELEM);
        Self::quantize_with_scale(values, scale)
    }

    /// Quantises with a given scale (elements saturate to ±6).
    pub fn quantize_with_scale(values: &[f32; MX_BLOCK], scale: E8M0) -> Self {
        let inv = 1.0 / scale.to_f32() as f64;
        let mut codes = [F4E2M1x2(0); 16];
        for (j, c) in codes.iter_mut().enumerate() {
            let a = (values[2 * j] as f64 * inv) as f32;
            let b = (values[2 * j + 1] as f64 * inv) as f32;
            *c = F4E2M1x2::pack(F4E2M1::from_f32(a, Saturation::Finite), F4E2M1::from_f32(b, Saturation::Finite));
        }
        Mxfp4Block { codes, scale }
    }

    pub fn dequantize(&self) -> [f32; MX_BLOCK] {
        let s = self.scale.to_f32();
        let mut out = [0f32; MX_BLOCK];
        for (j, c) in self.codes.iter().enumerate() {
            let (a, b) = c.to_f32x2();
            out[2 * j] = a * s;
            out[2 * j + 1] = b * s;
        }
        out
    }
}

impl Mxfp8Block {
    /// E4M3's largest exponent (448 = 1.75 * 2^8).
    pub const EMAX_ELEM: i32 = 8;

    pub fn quantize(values: &[f32; MX_BLOCK]) -> Self {
        let scale = shared_scale(values, Self::EMAX_ELEM);
        let inv = 1.0 / scale.to_f32() as f64;
        let mut elems = [F8E4M3Fn(0); 32];
        for (e, &v) in elems.iter_mut().zip(values) {
            *e = F8E4M3Fn::from_f32((v as f64 * inv) as f32, Saturation::Finite);
        }
        Mxfp8Block { elems, scale }
    }

    pub fn dequantize(&self) -> [f32; MX_BLOCK] {
        let s = self.scale.to_f32();
        let mut out = [0f32; MX_BLOCK];
        for (o, e) in out.iter_mut().zip(&self.elems) {
            *o = e.to_f32() * s;
        }
        out
    }
}
