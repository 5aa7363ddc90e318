//! Properties of the element and scale encoders over random f32 bit patterns (every class of
//! f32: NaNs, infinities, subnormals, huge and tiny values), against the microfloat oracle and
//! the spec's documented differences (`formats_common`).

mod formats_common;

use formats_common::{expected_finite, expected_nonfinite, ALL};
use kernel_api::formats::{Saturation, ScaleRounding, E8M0};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn random_bits_encode_like_microfloat(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        for f in ALL {
            let (nf, fin) = ((f.ours_enc)(x, Saturation::NonFinite), (f.ours_enc)(x, Saturation::Finite));
            prop_assert_eq!(nf, expected_nonfinite(&f, x), "{} NonFinite {:e}", f.name, x);
            prop_assert_eq!(fin, expected_finite(&f, x), "{} Finite {:e}", f.name, x);
        }
    }

    /// Encoding is monotonic: x <= y implies decode(encode(x)) <= decode(encode(y)).
    #[test]
    fn encode_is_monotonic(a in any::<u32>(), b in any::<u32>()) {
        let (x, y) = (f32::from_bits(a), f32::from_bits(b));
        prop_assume!(!x.is_nan() && !y.is_nan());
        let (x, y) = if x <= y { (x, y) } else { (y, x) };
        for f in ALL {
            for sat in [Saturation::Finite, Saturation::NonFinite] {
                let (dx, dy) = ((f.ours_dec)((f.ours_enc)(x, sat)), (f.ours_dec)((f.ours_enc)(y, sat)));
                // NonFinite overflow of e4m3 gives NaN, which has no order.
                if !dx.is_nan() && !dy.is_nan() {
                    prop_assert!(dx <= dy, "{} {:?}: {:e} -> {:e}, {:e} -> {:e}", f.name, sat, x, dx, y, dy);
                }
            }
        }
    }

    #[test]
    fn random_bits_e8m0_nearest_like_microfloat(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        // Agreement on every f32: NaN, x <= 0 and +Inf give NaN on both sides.
        let oracle = microfloat::f8e8m0fnu::from_f32(x).to_bits();
        prop_assert_eq!(E8M0::from_f32(x, ScaleRounding::Nearest).to_bits(), oracle, "{:e}", x);
    }
}
