//! Numeric formats: fp8 flavours, FP4 E2M1 (packed in pairs), E8M0 scales, MXFP4/MXFP8 blocks.
//!
//! This module doc is the spec. `tests/formats.rs` checks every rule below bit for bit, against
//! the `microfloat` crate (which matches ml_dtypes) and against the exact definitions.
//!
//! Conversions never hide policy: element encoders take a [`Saturation`] and scale derivation
//! takes a [`ScaleRounding`]. All storage types are `#[repr(transparent)]` bytes and
//! `bytemuck::Pod`, so byte buffers cast to them directly. bf16 and f16 are [`half::bf16`] and
//! [`half::f16`] (round-to-nearest-even from f32).
//!
//! # Bit layouts and specials
//!
//! | Type | Bits (MSB to LSB) | Bias | Smallest subnormal | Max finite (code) | Specials |
//! |---|---|---|---|---|---|
//! | [`F8E4M3Fn`] (OCP E4M3) | `S EEEE MMM` | 7 | 2^-9 | 448 (`0x7E`) | NaN = `S.1111.111` (`0x7F`, `0xFF`); no Inf; ±0 |
//! | [`F8E4M3Fnuz`] | `S EEEE MMM` | 8 | 2^-10 | 240 (`0x7F`) | NaN = `0x80` only; no Inf; no -0 |
//! | [`F8E5M2`] (OCP E5M2) | `S EEEEE MM` | 15 | 2^-16 | 57344 (`0x7B`) | ±Inf = `S.11111.00`; NaN = `S.11111.{01,10,11}`; ±0 |
//! | [`F4E2M1`] (OCP FP4) | `S EE M` (one nibble) | 1 | 0.5 | 6 (`0x7`) | none (no Inf, no NaN); ±0 |
//! | [`E8M0`] (OCP scale) | `EEEEEEEE` | 127 | none | 2^127 (`0xFE`) | NaN = `0xFF`; no sign, no zero, no Inf |
//!
//! With exponent field E, mantissa field M and m mantissa bits, a code that is not special has
//! the value (-1)^S * 2^(E - bias) * (1 + M / 2^m) when E > 0 (normal) and
//! (-1)^S * 2^(1 - bias) * (M / 2^m) when E = 0 (subnormal). E8M0 is 2^(E - 127), so code 0 is
//! 2^-127 (an f32 subnormal). Decoding (`to_f32`) is exact for every code: all these values are
//! f32 values. E2M1's magnitudes are {0, 0.5, 1, 1.5, 2, 3, 4, 6}; an [`F4E2M1`] holds its code
//! in the low nibble and ignores any higher bits.
//!
//! # Encoding an element (`from_f32(x, sat)`)
//!
//! 1. **NaN** gives the format's NaN: e4m3fn `S.1111.111` and e5m2 `S.11111.10` (quiet NaN)
//!    with the sign of the input NaN, e4m3fnuz `0x80`. E2M1 has no NaN and gives +0 (`0x0`).
//! 2. Otherwise |x| is **rounded to nearest, ties to even** (IEEE roundTiesToEven) on the
//!    format's grid extended upward with an unbounded exponent: within the binade
//!    [2^e, 2^(e+1)) the step is 2^(e - m); below the smallest normal 2^(1 - bias) the step is
//!    the subnormal step 2^(1 - bias - m), so values under half of the smallest subnormal give
//!    zero and the exact half-way value goes to the even neighbour (zero). The computation is
//!    exact (no intermediate rounding).
//! 3. **Overflow**: if the rounded magnitude exceeds the max finite value, or x is ±Inf, then
//!    - [`Saturation::Finite`] gives ±max (NVIDIA's `__NV_SATFINITE` convention);
//!    - [`Saturation::NonFinite`] gives e5m2 ±Inf; e4m3fn NaN with x's sign; e4m3fnuz NaN `0x80`;
//!      E2M1, which has neither, saturates to ±6 (so both modes agree for E2M1).
//!
//!    NaN stays NaN in both modes. Because rounding comes first, the overflow thresholds are
//!    |x| > 464 for e4m3fn (exactly 464 is the tie between 448, mantissa `110`, and the
//!    non-existent 480, and goes to the even 448), |x| >= 248 for e4m3fnuz (the tie goes to
//!    the even 256), |x| >= 61440 for e5m2 (to the even 65536 = Inf), |x| >= 7 for E2M1.
//! 4. **Sign**: the result carries x's sign, including -0, except in e4m3fnuz, where every
//!    zero result (from -0 or a tiny negative) is `0x00`.
//!
//! With `NonFinite` this is bit-identical to ml_dtypes and `microfloat` for every f32 except:
//! E2M1 NaN (they give -0, `0x8`) and e4m3fn |x| = 464 (microfloat 0.1.3 gives NaN; ml_dtypes,
//! which rounds the mantissa first, agrees with us).
//!
//! # E8M0 scales (`E8M0::from_f32(x, rounding)`)
//!
//! NaN, x <= 0 (including -0) and +Inf give NaN (`0xFF`): the format has no zero, no sign and
//! no Inf. Otherwise, with k = floor(log2 x) taken exactly from the float's exponent:
//! - [`ScaleRounding::Floor`] gives 2^k;
//! - [`ScaleRounding::Up`] gives 2^ceil(log2 x), i.e. 2^k if x is a power of two, else 2^(k+1);
//! - [`ScaleRounding::Nearest`] gives the nearer of 2^k and 2^(k+1) in the linear domain, the tie
//!   x = 1.5 * 2^k going up (this is what ml_dtypes and microfloat do: ml_dtypes' round-to-even
//!   looks at the implicit bit, which is always 1).
//!
//! The exponent is then clamped to [-127, 127]: inputs whose result would be below 2^-127 give
//! 2^-127 (`0x00`), above 2^127 give 2^127 (`0xFE`). `Nearest` equals microfloat's f8e8m0fnu
//! for every positive finite f32; ml_dtypes differs only for x >= 1.5 * 2^127, where it gives
//! NaN. [`E8M0::from_exponent`] clamps the same way. `to_f32` is 2^(S - 127) exactly, NaN for
//! `0xFF`.
//!
//! # Packed FP4 ([`F4E2M1x2`])
//!
//! One byte holds two E2M1 codes: element 2j in the **low** nibble (bits 0-3), element 2j+1 in
//! the high nibble (bits 4-7), as in compressed-tensors' `mxfp4-pack-quantized` checkpoints and
//! NVIDIA's `__nv_fp4x2_e2m1`. Example (the K3 checkpoint): `0x2A` is (-1.0, +1.0), `0x7F` is
//! (-6.0, +6.0), `0xF1` is (+0.5, -6.0) as (even, odd).
//!
//! # MX blocks ([`Mxfp4Block`], [`Mxfp8Block`]; OCP Microscaling v1.0)
//!
//! 32 elements share one E8M0 scale 2^(S - 127). In memory a block is its element bytes
//! followed by the scale byte (17 bytes for MXFP4, 33 for MXFP8; alignment 1). Checkpoints
//! store codes and scales as separate tensors; these blocks are for host staging and tests.
//! `quantize(values)`:
//! - if any value is NaN or ±Inf, the scale is NaN (`0xFF`) and all codes are 0: the block
//!   dequantizes to 32 NaNs (OCP: a NaN scale makes every element NaN);
//! - if every value is ±0, the scale is 2^0 and the codes are the signed zeros (any scale
//!   gives zero; the OCP reference would store 2^-127);
//! - otherwise the shared exponent is X = clamp(floor(log2 amax) - emax_elem, -127, 127) with
//!   emax_elem = 2 for E2M1 (6 = 1.5 * 2^2) and 8 for E4M3 (448 = 1.75 * 2^8) (the OCP
//!   reference and compressed-tensors), and each element is the element encoding of x * 2^-X,
//!   computed exactly, with [`Saturation::Finite`]: x * 2^-X < 2^(emax_elem + 1) may still
//!   round above the element max (E2M1 [7, 8) -> 6, E4M3 (464, 512) -> 448) and saturates.
//!
//! `quantize_with_scale(values, scale)` applies the element rule with a given scale (a NaN scale
//! gives zero codes). `dequantize` returns element * 2^(S - 127), exact in f32 whenever the
//! product fits f32, which holds for every block `quantize` makes; a hand-made block with a
//! large scale (e.g. MXFP8 with S > 246) can overflow to ±Inf.
//!
//! # Which hardware uses which flavour
//!
//! | Hardware | fp8 (KV cache, activations) | Block-scaled MX in hardware |
//! |---|---|---|
//! | NVIDIA Ada / Hopper (sm_89, sm_90: H100, H200) | E4M3fn, E5M2 | none (MXFP4 weights are dequantized in software) |
//! | NVIDIA Blackwell (sm_100: B200) | E4M3fn, E5M2 | MXFP8, MXFP4 (E2M1 + E8M0 scales) |
//! | AMD CDNA3 (gfx942: MI300X, MI325X) | E4M3fnuz (and E5M2fnuz, not provided here) | none |
//! | AMD CDNA4 (gfx950: MI350X, MI355X) | E4M3fn, E5M2 | MXFP8, MXFP4 |
//!
//! A KV-cache or activation dtype therefore names the flavour (`F8E4M3Fn` vs `F8E4M3Fnuz`):
//! the same byte means different values (e.g. `0x7F` is NaN in fn and 240 in fnuz).

mod minifloat;
mod mx;
mod mx_tensor;

pub use half::{bf16, f16};
pub use mx::{Mxfp4Block, Mxfp8Block, MX_BLOCK};
pub use mx_tensor::*;

use minifloat::{Spec, Specials};

/// What an encoder does with values beyond the largest finite magnitude (module docs, rule 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Saturation {
    /// Clamp to ±max finite (NVIDIA `__NV_SATFINITE`); Inf too. NaN stays NaN.
    Finite,
    /// IEEE-like: overflow becomes Inf where the format has it, else NaN (ml_dtypes behaviour).
    /// E2M1, which has neither, saturates.
    NonFinite,
}

/// How a positive real becomes a power-of-two E8M0 scale (module docs, "E8M0 scales").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleRounding {
    /// 2^floor(log2 x) (OCP MX reference: shared exponent = floor(log2 amax) - emax_elem).
    Floor,
    /// 2^ceil(log2 x) (NVIDIA `cudaRoundPosInf`; FlashMLA's 656-B cache scales).
    Up,
    /// Nearest power of two in the linear domain, the tie 1.5 * 2^k going up (ml_dtypes).
    Nearest,
}

macro_rules! minifloat_type {
    ($(#[$doc:meta])* $name:ident, $spec:expr, bits = $bits:expr, max = $max:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            const SPEC: Spec = $spec;
            const MASK: u8 = ((1u16 << $bits) - 1) as u8;
            const DECODE: [f32; 256] = Self::SPEC.decode_table();
            /// Largest finite value.
            pub const MAX: f32 = $max;
            /// The code in the low bits of `b` (higher bits are dropped for sub-byte formats).
            pub const fn from_bits(b: u8) -> Self {
                Self(b & Self::MASK)
            }
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// The exact value (NaN for NaN codes, ±Inf for e5m2's infinities).
            pub fn to_f32(self) -> f32 {
                Self::DECODE[self.0 as usize]
            }
            /// Round-half-even encode with an explicit overflow policy (module docs).
            pub fn from_f32(x: f32, sat: Saturation) -> Self {
                Self(Self::SPEC.encode_scaled(x, 0, sat) as u8)
            }
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }
    };
}

minifloat_type!(
    /// OCP FP8 E4M3 "fn" (bias 7, max 448, no Inf, NaN = S.1111.111): NVIDIA sm_89+, AMD gfx950.
    F8E4M3Fn,
    Spec { ebits: 4, mbits: 3, bias: 7, specials: Specials::FiniteNanAllOnes },
    bits = 8,
    max = 448.0
);
minifloat_type!(
    /// FP8 E4M3 "fnuz" (bias 8, max 240, no Inf, no -0, 0x80 = NaN): AMD gfx942 (MI300X).
    F8E4M3Fnuz,
    Spec { ebits: 4, mbits: 3, bias: 8, specials: Specials::FiniteUnsignedZeroNan },
    bits = 8,
    max = 240.0
);
minifloat_type!(
    /// OCP FP8 E5M2 (bias 15, max 57344, IEEE Inf/NaN).
    F8E5M2,
    Spec { ebits: 5, mbits: 2, bias: 15, specials: Specials::Ieee },
    bits = 8,
    max = 57344.0
);
minifloat_type!(
    /// One FP4 E2M1 code in the low nibble (bias 1, max 6, no Inf/NaN; NaN encodes as +0).
    F4E2M1,
    Spec { ebits: 2, mbits: 1, bias: 1, specials: Specials::FiniteOnly },
    bits = 4,
    max = 6.0
);

impl F4E2M1 {
    /// Encodes x * 2^scale_exp exactly (one rounding), for MX block quantisation.
    fn from_f32_scaled(x: f32, scale_exp: i32, sat: Saturation) -> Self {
        Self(Self::SPEC.encode_scaled(x, scale_exp, sat) as u8)
    }
}

impl F8E4M3Fn {
    /// Encodes x * 2^scale_exp exactly (one rounding), for MX block quantisation.
    fn from_f32_scaled(x: f32, scale_exp: i32, sat: Saturation) -> Self {
        Self(Self::SPEC.encode_scaled(x, scale_exp, sat) as u8)
    }
}

/// Two FP4 E2M1 codes in one byte: low nibble = even element, high nibble = odd element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F4E2M1x2(pub u8);

impl F4E2M1x2 {
    pub const fn from_bits(b: u8) -> Self {
        Self(b)
    }
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    pub fn pack(even: F4E2M1, odd: F4E2M1) -> Self {
        Self((even.0 & 0x0F) | ((odd.0 & 0x0F) << 4))
    }
    /// (even, odd) codes.
    pub fn unpack(self) -> (F4E2M1, F4E2M1) {
        (F4E2M1(self.0 & 0x0F), F4E2M1(self.0 >> 4))
    }
    /// (even, odd) values.
    pub fn to_f32x2(self) -> (f32, f32) {
        let (a, b) = self.unpack();
        (a.to_f32(), b.to_f32())
    }
    pub fn from_f32x2(even: f32, odd: f32, sat: Saturation) -> Self {
        Self::pack(F4E2M1::from_f32(even, sat), F4E2M1::from_f32(odd, sat))
    }
}

/// Unsigned power-of-two scale 2^(S-127); S = 255 is NaN; there is no zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct E8M0(pub u8);

impl E8M0 {
    pub const NAN: E8M0 = E8M0(255);
    pub const ONE: E8M0 = E8M0(127);

    pub const fn from_bits(b: u8) -> Self {
        Self(b)
    }
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    /// 2^(S-127) exactly, NaN for 255.
    pub fn to_f32(self) -> f32 {
        match self.0 {
            255 => f32::NAN,
            0 => f32::from_bits(1 << 22), // 2^-127, an f32 subnormal
            s => f32::from_bits((s as u32) << 23),
        }
    }
    /// The exponent S-127 (None for NaN).
    pub fn exponent(self) -> Option<i32> {
        (self.0 != 255).then(|| self.0 as i32 - 127)
    }
    /// 2^e, clamped to the representable range [-127, 127].
    pub fn from_exponent(e: i32) -> Self {
        Self((e.clamp(-127, 127) + 127) as u8)
    }
    /// A positive finite real as a power of two with the given rounding, clamped to
    /// [2^-127, 2^127]; NaN, non-positive and infinite inputs give NaN (module docs).
    pub fn from_f32(x: f32, rounding: ScaleRounding) -> Self {
        if !x.is_finite() || x <= 0.0 {
            return Self::NAN;
        }
        // x = 2^k * (1 + frac / 2^52) exactly: every f32, subnormals included, is a normal f64.
        let bits = (x as f64).to_bits();
        let k = minifloat::f64_exponent(x as f64);
        let frac = bits & ((1u64 << 52) - 1);
        let e = match rounding {
            ScaleRounding::Floor => k,
            ScaleRounding::Up => k + (frac != 0) as i32,
            ScaleRounding::Nearest => k + (frac >= 1 << 51) as i32,
        };
        Self::from_exponent(e)
    }
}

/// floor(log2 x) of a positive finite f32, exact.
fn floor_log2(x: f32) -> i32 {
    minifloat::f64_exponent(x as f64)
}
