//! OCP microscaling blocks: 32 elements sharing one E8M0 scale. The quantisation rules (shared
//! exponent, element rounding and saturation, zero and non-finite blocks) are specified in the
//! parent module's docs.

use super::{floor_log2, F4E2M1x2, F8E4M3Fn, Saturation, E8M0, F4E2M1};

/// Elements per MX block.
pub const MX_BLOCK: usize = 32;

/// MXFP4: 32 E2M1 values (16 packed bytes, low nibble even) and one E8M0 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
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

/// The all-zero block, as `quantize` makes it (scale 2^0).
impl Default for Mxfp4Block {
    fn default() -> Self {
        Mxfp4Block { codes: [F4E2M1x2(0); 16], scale: E8M0::ONE }
    }
}

/// The all-zero block, as `quantize` makes it (scale 2^0).
impl Default for Mxfp8Block {
    fn default() -> Self {
        Mxfp8Block { elems: [F8E4M3Fn(0); 32], scale: E8M0::ONE }
    }
}

/// The block's shared scale: 2^clamp(floor(log2 amax) - emax_elem, -127, 127); 2^0 for an
/// all-zero block; NaN if any value is NaN or ±Inf.
fn shared_scale(values: &[f32; MX_BLOCK], emax_elem: i32) -> E8M0 {
    if values.iter().any(|v| !v.is_finite()) {
        return E8M0::NAN;
    }
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return E8M0::ONE;
    }
    E8M0::from_exponent(floor_log2(amax) - emax_elem)
}

impl Mxfp4Block {
    /// E2M1's largest exponent (6 = 1.5 * 2^2).
    pub const EMAX_ELEM: i32 = 2;

    pub fn quantize(values: &[f32; MX_BLOCK]) -> Self {
        Self::quantize_with_scale(values, shared_scale(values, Self::EMAX_ELEM))
    }

    /// Quantises with a given scale: each element is x / scale rounded half-to-even (exactly,
    /// one rounding) and saturated to ±6. A NaN scale gives zero codes.
    pub fn quantize_with_scale(values: &[f32; MX_BLOCK], scale: E8M0) -> Self {
        let mut block = Mxfp4Block { codes: [F4E2M1x2(0); 16], scale };
        if let Some(s) = scale.exponent() {
            let q = |x: f32| F4E2M1::from_f32_scaled(x, -s, Saturation::Finite);
            for (c, pair) in block.codes.iter_mut().zip(values.chunks_exact(2)) {
                *c = F4E2M1x2::pack(q(pair[0]), q(pair[1]));
            }
        }
        block
    }

    /// Element * 2^(S-127), exact in f32 (module docs).
    pub fn dequantize(&self) -> [f32; MX_BLOCK] {
        let s = self.scale.to_f32();
        let mut out = [0f32; MX_BLOCK];
        for (pair, c) in out.chunks_exact_mut(2).zip(&self.codes) {
            let (a, b) = c.to_f32x2();
            pair[0] = a * s;
            pair[1] = b * s;
        }
        out
    }
}

impl Mxfp8Block {
    /// E4M3's largest exponent (448 = 1.75 * 2^8).
    pub const EMAX_ELEM: i32 = 8;

    pub fn quantize(values: &[f32; MX_BLOCK]) -> Self {
        Self::quantize_with_scale(values, shared_scale(values, Self::EMAX_ELEM))
    }

    /// Quantises with a given scale: each element is x / scale rounded half-to-even (exactly,
    /// one rounding) and saturated to ±448. A NaN scale gives zero codes.
    pub fn quantize_with_scale(values: &[f32; MX_BLOCK], scale: E8M0) -> Self {
        let mut block = Mxfp8Block { elems: [F8E4M3Fn(0); 32], scale };
        if let Some(s) = scale.exponent() {
            for (e, &x) in block.elems.iter_mut().zip(values) {
                *e = F8E4M3Fn::from_f32_scaled(x, -s, Saturation::Finite);
            }
        }
        block
    }

    /// Element * 2^(S-127), exact in f32 (module docs).
    pub fn dequantize(&self) -> [f32; MX_BLOCK] {
        let s = self.scale.to_f32();
        let mut out = [0f32; MX_BLOCK];
        for (o, e) in out.iter_mut().zip(&self.elems) {
            *o = e.to_f32() * s;
        }
        out
    }
}
