//! One parameterised encoder/decoder for the small IEEE-like formats (fp8 flavours, FP4 E2M1).
//! Every conversion is exact arithmetic in f64: decoding is a power-of-two product and
//! encoding rounds half to even on the format's grid extended past its largest exponent, then
//! applies the requested overflow policy.

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

impl Spec {
    const fn sign_bit(&self) -> u32 {
        1 << (self.ebits + self.mbits)
    }
    const fn max_exp_field(&self) -> u32 {
        (1 << self.ebits) - 1
    }

    /// Largest finite magnitude's code (without sign).
    pub(crate) const fn max_finite_code(&self) -> u32 {
        let all = (1 << (self.ebits + self.mbits)) - 1;
        match self.specials {
            // exponent all-ones is special: max is (all-ones - 1) exponent, full mantissa.
            Specials::Ieee => all - (1 << self.mbits),
            Specials::FiniteNanAllOnes => all - 1,
            Specials::FiniteUnsignedZeroNan | Specials::FiniteOnly => all,
        }
    }

    pub(crate) fn nan_code(&self, negative: bool) -> Option<u32> {
        let s = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            Specials::Ieee => Some(s | (self.max_exp_field() << self.mbits) | (1 << (self.mbits - 1)) | 0),
            Specials::FiniteNanAllOnes => Some(s | ((1 << (self.ebits + self.mbits)) - 1)),
            Specials::FiniteUnsignedZeroNan => Some(self.sign_bit()),
            Specials::FiniteOnly => None,
        }
    }

    fn inf_code(&self, negative: bool) -> Option<u32> {
        match self.specials {
            Specials::Ieee => Some(if negative { self.sign_bit() } else { 0 } | (self.max_exp_field() << self.mbits)),
            _ => None,
        }
    }

    /// Magnitude of an unsigned code (exponent and mantissa fields only), ignoring specials.
    fn magnitude(&self, code: u32) -> f64 {
        let e = (code >> self.mbits) & self.max_exp_field();
        let m = code & ((1 << self.mbits) - 1);
        if e == 0 {
            m as f64 * 2f64.powi(1 - self.bias - self.mbits as i32)
        } else {
            (1.0 + m as f64 / (1u32 << self.mbits) as f64) * 2f64.powi(e as i32 - self.bias)
        }
    }

    pub(crate) fn decode(&self, code: u32) -> f32 {
        let neg = code & self.sign_bit() != 0;
        let mag_code = code & (self.sign_bit() - 1);
        let e = mag_code >> self.mbits;
        match self.specials {
            Specials::Ieee if e == self.max_exp_field() => {
                if mag_code & ((1 << self.mbits) - 1) == 0 {
                    return if neg { f32::NEG_INFINITY } else { f32::INFINITY };
                }
                return f32::NAN;
            }
            Specials::FiniteNanAllOnes if mag_code == self.sign_bit() - 1 => return f32::NAN,
            Specials::FiniteUnsignedZeroNan if code == self.sign_bit() => return f32::NAN,
            _ => {}
        }
        let v = self.magnitude(mag_code) as f32;
        if neg {
            -v
        } else {
            v
        }
    }

    pub(crate) fn max_finite(&self) -> f64 {
        self.magnitude(self.max_finite_code())
    }

    /// Round-half-even encode with the given overflow policy.
    pub(crate) fn encode(&self, x: f32, sat: Saturation) -> u32 {
        let neg = x.is_sign_negative();
        let sign = if neg { self.sign_bit() } else { 0 };
        if x.is_nan() {
            // Formats without NaN have nothing better than zero; callers of FiniteOnly formats
            // are documented to map NaN to +0.
            return self.nan_code(neg).unwrap_or(0);
        }
        let a = (x as f64).abs();
        if x.is_infinite() {
            return match sat {
                Saturation::Finite => sign | self.max_finite_code(),
                Saturation::NonFinite => {
                    self.inf_code(neg).or_else(|| self.nan_code(neg)).unwrap_or(sign | self.max_finite_code())
                }
            };
        }
        let emin = 1 - self.bias; // exponent of the smallest normal
        let e = if a == 0.0 { emin } else { (a.log2().floor() as i32).max(emin) };
        // log2 may be off by one near powers of two; fix it exactly.
        let e = if a != 0.0 && e > emin && 2f64.powi(e) > a { e - 1 } else if a >= 2f64.powi(e + 1) { e + 1 } else { e };
        let quantum = 2f64.powi(e - self.mbits as i32);
        let q = round_half_even(a / quantum);
        let r = q * quantum;
        let code = if r > self.max_finite() {
            match sat {
                Saturation::Finite => self.max_finite_code(),
                Saturation::NonFinite => match self.inf_code(neg).or_else(|| self.nan_code(neg)) {
                    Some(c) => return c,
                    None => self.max_finite_code(),
                },
            }
        } else if r < 2f64.powi(emin) {
            (r / 2f64.powi(emin - self.mbits as i32)) as u32
        } else {
            let er = r.log2().floor() as i32;
            let er = if 2f64.powi(er) > r { er - 1 } else if r >= 2f64.powi(er + 1) { er + 1 } else { er };
            let m = (r / 2f64.powi(er - self.mbits as i32)) as u32 - (1 << self.mbits);
            (((er + self.bias) as u32) << self.mbits) | m
        };
        if code == 0 && self.specials == Specials::FiniteUnsignedZeroNan {
            return 0; // fnuz has no negative zero
        }
        sign | code
    }
}

fn round_half_even(v: f64) -> f64 {
    let f = v.floor();
    let d = v - f;
    if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else {
        f
    }
}
