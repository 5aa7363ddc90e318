//! One parameterised codec for the small IEEE-like element formats (the fp8 flavours and FP4
//! E2M1); the rules it implements are specified in the parent module's docs.
//!
//! Decoding is a 256-entry table built at compile time. Encoding is exact: the input goes to
//! f64 (exact for every f32, subnormals included), its binary exponent is read from the f64
//! bits, and the magnitude is rounded half-to-even to an integer number of quanta with no
//! intermediate rounding anywhere.

use super::Saturation;

/// How a format spends its special encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Specials {
    /// IEEE: all-ones exponent is Inf (mantissa 0) or NaN (e5m2).
    Ieee,
    /// "fn": no Inf; only S.1111.111 is NaN (e4m3fn).
    FiniteNanAllOnes,
    /// "fnuz": no Inf, no -0; 0x80 is the only NaN (e4m3fnuz).
    FiniteUnsignedZeroNan,
    /// No Inf, no NaN (E2M1).
    FiniteOnly,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    pub ebits: u32,
    pub mbits: u32,
    pub bias: i32,
    pub specials: Specials,
}

/// 2^e as an f32, exact for -126 <= e <= 127.
const fn pow2_f32(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// 2^e as an f64, exact for -1022 <= e <= 1023.
fn pow2_f64(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// floor(log2 |x|) of a nonzero finite f64, read from its exponent field (subnormal f64s, which
/// never come from an f32, report -1023; callers clamp far above that).
pub(crate) fn f64_exponent(x: f64) -> i32 {
    ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

impl Spec {
    const fn sign_bit(&self) -> u32 {
        1 << (self.ebits + self.mbits)
    }
    const fn exp_field_max(&self) -> u32 {
        (1 << self.ebits) - 1
    }
    /// Exponent of the smallest normal; subnormals are multiples of 2^(emin - mbits).
    const fn emin(&self) -> i32 {
        1 - self.bias
    }

    /// Code of the largest finite magnitude (sign bit clear).
    const fn max_finite_code(&self) -> u32 {
        let all = self.sign_bit() - 1;
        match self.specials {
            // The all-ones exponent is special: the max has the exponent below it, full mantissa.
            Specials::Ieee => all - (1 << self.mbits),
            Specials::FiniteNanAllOnes => all - 1,
            Specials::FiniteUnsignedZeroNan | Specials::FiniteOnly => all,
        }
    }

    /// The code a NaN input encodes to. E2M1 has no NaN: +0.
    const fn nan_code(&self, negative: bool) -> u32 {
        let s = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            // Quiet NaN: all-ones exponent, top mantissa bit set.
            Specials::Ieee => s | (self.exp_field_max() << self.mbits) | (1 << (self.mbits - 1)),
            Specials::FiniteNanAllOnes => s | (self.sign_bit() - 1),
            Specials::FiniteUnsignedZeroNan => self.sign_bit(),
            Specials::FiniteOnly => 0,
        }
    }

    /// What `Saturation::NonFinite` gives for a value beyond the largest finite magnitude.
    const fn overflow_code(&self, negative: bool) -> u32 {
        let s = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            Specials::Ieee => s | (self.exp_field_max() << self.mbits), // ±Inf
            Specials::FiniteNanAllOnes | Specials::FiniteUnsignedZeroNan => self.nan_code(negative),
            Specials::FiniteOnly => s | self.max_finite_code(), // nothing else to give: saturate
        }
    }

    /// The value of a code; bits above the format's width are ignored.
    const fn decode(&self, code: u32) -> f32 {
        let code = code & (2 * self.sign_bit() - 1);
        let negative = code & self.sign_bit() != 0;
        let mag = code & (self.sign_bit() - 1);
        let e = mag >> self.mbits;
        let m = mag & ((1 << self.mbits) - 1);
        match self.specials {
            Specials::Ieee if e == self.exp_field_max() => {
                return if m != 0 {
                    f32::NAN
                } else if negative {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                };
            }
            Specials::FiniteNanAllOnes if mag == self.sign_bit() - 1 => return f32::NAN,
            Specials::FiniteUnsignedZeroNan if code == self.sign_bit() => return f32::NAN,
            _ => {}
        }
        // Normal: (2^mbits + m) * 2^(e - bias - mbits); subnormal (e = 0): m * 2^(emin - mbits).
        let (significand, e) = if e == 0 { (m, 1) } else { (m | (1 << self.mbits), e as i32) };
        let v = significand as f32 * pow2_f32(e - self.bias - self.mbits as i32);
        if negative {
            -v
        } else {
            v
        }
    }

    /// `decode` of every byte, for table lookup.
    pub(crate) const fn decode_table(&self) -> [f32; 256] {
        let mut t = [0f32; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = self.decode(i as u32);
            i += 1;
        }
        t
    }

    /// Encodes x * 2^scale_exp (exactly: the product is never rounded before the format's own
    /// round-half-even) with the given overflow policy. `scale_exp` is within [-254, 254].
    pub(crate) fn encode_scaled(&self, x: f32, scale_exp: i32, sat: Saturation) -> u32 {
        let negative = x.is_sign_negative();
        if x.is_nan() {
            return self.nan_code(negative);
        }
        // f32 -> f64 is exact and a power-of-two product of it cannot under- or overflow f64.
        let a = (x as f64).abs() * pow2_f64(scale_exp);
        let Some(mag) = self.round_magnitude(a) else {
            return match sat {
                Saturation::Finite => (if negative { self.sign_bit() } else { 0 }) | self.max_finite_code(),
                Saturation::NonFinite => self.overflow_code(negative),
            };
        };
        if mag == 0 && self.specials == Specials::FiniteUnsignedZeroNan {
            return 0; // fnuz has no negative zero
        }
        (if negative { self.sign_bit() } else { 0 }) | mag
    }

    /// The round-half-even magnitude code of a non-negative, non-NaN `a`, or None when it rounds
    /// above the largest finite magnitude (or is Inf).
    fn round_magnitude(&self, a: f64) -> Option<u32> {
        if a == f64::INFINITY {
            return None;
        }
        if a == 0.0 {
            return Some(0);
        }
        // a lies in [2^e, 2^(e+1)) with e = floor(log2 a), or below 2^emin (subnormal range,
        // where the spacing is that of the emin binade). The quantum 2^(e - mbits) divides a's
        // binade into 2^mbits steps; q is a in quanta, rounded half to even (an exact f64
        // product, then an exact rounding).
        let e = f64_exponent(a).max(self.emin());
        let q = (a * pow2_f64(self.mbits as i32 - e)).round_ties_even() as u64;
        // Codes are linear in q: code = (biased exponent << mbits) + (q - 2^mbits)
        //                            = ((e - emin) << mbits) + q,
        // which also holds in the subnormal range (e = emin, q < 2^mbits) and when rounding
        // carries into the next binade (q = 2^(mbits+1)).
        let code = (((e - self.emin()) as u64) << self.mbits) + q;
        (code <= self.max_finite_code() as u64).then_some(code as u32)
    }
}
