//! Numeric formats: fp8 flavours, E8M0 scales, packed FP4 E2M1, MXFP4/MXFP8 blocks.
//!
//! Conversions never hide policy: encoders take a [`Saturation`] and scale derivation a
//! [`ScaleRounding`]. All storage types are `#[repr(transparent)]` bytes and `bytemuck::Pod`.
//! bf16 and f16 are [`half::bf16`] and [`half::f16`] (round-to-nearest-even from f32).

mod minifloat;
mod mx;
mod mx_tensor;

pub use half::{bf16, f16};
pub use mx::{Mxfp4Block, Mxfp8Block, MX_BLOCK};
pub use mx_tensor::*;

use minifloat::{Spec, Specials};

/// What an encoder does with values beyond the largest finite magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Saturation {
    /// Clamp to ±max finite (NVIDIA `__NV_SATFINITE`); Inf too. NaN stays NaN.
    Finite,
    /// IEEE-like: overflow becomes Inf where the format has it, else NaN (ml_dtypes behaviour).
    /// Formats with neither (E2M1) clamp.
    NonFinite,
}

/// How a positive real is turned into a power-of-two scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleRounding {
    /// 2^floor(log2 x) (OCP MX reference: shared exponent = floor(log2 amax) - emax_elem).
    Floor,
    /// 2^ceil(log2 x) (NVIDIA `cudaRoundPosInf`; FlashMLA's 656-B cache scales).
    Up,
    /// Round to nearest in the linear domain, ties to the even exponent code (ml_dtypes).
    Nearest,
}

macro_rules! minifloat_type {
    ($(#[$doc:meta])* $name:ident, $spec:expr, max = $max:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            pub(crate) const SPEC: Spec = $spec;
            /// Largest finite value (checked against the encoder's grid in tests).
            pub const MAX: f32 = $max;
            pub const fn from_bits(b: u8) -> Self {
                Self(b)
            }
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            pub fn to_f32(self) -> f32 {
                Self::SPEC.decode(self.0 as u32)
            }
            /// Round-half-even encode with an explicit overflow policy.
            pub fn from_f32(x: f32, sat: Saturation) -> Self {
                Self(Self::SPEC.encode(x, sat) as u8)
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
    max = 448.0
);
minifloat_type!(
    /// FP8 E4M3 "fnuz" (bias 8, max 240, no Inf, no -0, 0x80 = NaN): AMD gfx942 (MI300X).
    F8E4M3Fnuz,
    Spec { ebits: 4, mbits: 3, bias: 8, specials: Specials::FiniteUnsignedZeroNan },
    max = 240.0
);
minifloat_type!(
    /// OCP FP8 E5M2 (bias 15, max 57344, IEEE Inf/NaN).
    F8E5M2,
    Spec { ebits: 5, mbits: 2, bias: 15, specials: Specials::Ieee },
    max = 57344.0
);
minifloat_type!(
    /// One FP4 E2M1 code in the low nibble (bias 1, max 6, no Inf/NaN; NaN encodes as +0).
    F4E2M1,
    Spec { ebits: 2, mbits: 1, bias: 1, specials: Specials::FiniteOnly },
    max = 6.0
);


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
        Self((even.0 & 0x0F) | (odd.0 << 4))
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
    /// 2^(S-127), NaN for 255.
    pub fn to_f32(self) -> f32 {
        if self.0 == 255 {
            f32::NAN
        } else {
            2f64.powi(self.0 as i32 - 127) as f32
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
    /// Encodes a positive real as a power of two with the given rounding. Non-positive, NaN
    /// inputs give NaN (the format has no zero); the result is clamped to [2^-127, 2^127].
    pub fn from_f32(x: f32, rounding: ScaleRounding) -> Self {
        if x.is_nan() || x <= 0.0 {
            return Self::NAN;
        }
        if x.is_infinite() {
            return Self::from_exponent(127);
        }
        let x = x as f64;
        let mut e = x.log2().floor() as i32;
        if 2f64.powi(e) > x {
            e -= 1;
        } else if 2f64.powi(e + 1) <= x {
            e += 1;
        }
        let exact = 2f64.powi(e) == x;
        let e = match rounding {
            ScaleRounding::Floor => e,
            ScaleRounding::Up => {
                if exact {
                    e
                } else {
                    e + 1
                }
            }
            ScaleRounding::Nearest => {
                let mid = 1.5 * 2f64.powi(e);
                if x > mid || (x == mid && (e + 127) % 2 != 0) {
                    e + 1
                } else {
                    e
                }
            }
        };
        Self::from_exponent(e)
    }
}
