// Numeric conversions, one portable software path for every target, bit-identical to the
// Rust side (kernel-api): bf16 <-> f32 as half::bf16 (round to nearest even; NaN keeps sign and
// high payload with the quiet bit set), fp8 encode/decode as kernel_api::formats with
// Saturation::Finite (round half to even on the format's grid, overflow and +-Inf clamp to the
// largest finite value, NaN stays NaN).
// Included by k3/compat.h (after the target header, which provides float_as_uint).
#ifndef K3_CONVERT_H
#define K3_CONVERT_H

K3_BEGIN

// bf16 storage: the bit pattern of a bfloat16 value.
struct bf16 {
  uint16_t bits;
};

K3_DEVICE bf16 f32_to_bf16(float f) {
  uint32_t x = float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((x >> 16) | 0x0040u)};
  const uint32_t round_bit = 0x00008000u;
  uint16_t hi = static_cast<uint16_t>(x >> 16);
  // Round up when the dropped half is above one half, or exactly one half and hi is odd.
  if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) hi = static_cast<uint16_t>(hi + 1u);
  return bf16{hi};
}

K3_DEVICE float bf16_to_f32(bf16 h) {
  uint32_t b = h.bits;
  if ((b & 0x7fffu) > 0x7f80u) b |= 0x0040u;
  return uint_as_float(b << 16);
}

namespace detail {
enum MinifloatSpecials { kIeeeSpecials = 0, kNanAllOnes = 1, kUnsignedZeroNan = 2, kNoSpecials = 3 };

// A small float with E exponent bits, M mantissa bits, exponent bias BIAS and the given use of
// special encodings (IEEE Inf/NaN; "fn": only S.1111.111 is NaN; "fnuz": 0x80 is the only NaN;
// none: every code is finite and a NaN encodes to +0, as E2M1's).
template <int E, int M, int BIAS, int SPECIALS>
struct Minifloat {
  static constexpr uint32_t kSign = 1u << (E + M);
  static constexpr uint32_t kMag = kSign - 1u;  // all magnitude bits
  static constexpr int kMaxExpField = (1 << E) - 1;
  static constexpr uint32_t kMaxFinite = SPECIALS == kIeeeSpecials ? kMag - (1u << M)
                                         : SPECIALS == kNanAllOnes ? kMag - 1u
                                                                   : kMag;

  K3_DEVICE static uint32_t nan_code(uint32_t sign) {
    return SPECIALS == kIeeeSpecials ? sign | (static_cast<uint32_t>(kMaxExpField) << M) | (1u << (M - 1))
           : SPECIALS == kNanAllOnes ? sign | kMag
           : SPECIALS == kNoSpecials ? 0u
                                     : kSign;
  }

  K3_DEVICE static uint8_t encode(float x) {
    const uint32_t u = float_as_uint(x);
    const uint32_t sign = (u >> 31) != 0 ? kSign : 0u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint8_t>(nan_code(sign));
    if (a == 0x7f800000u) return static_cast<uint8_t>(sign | kMaxFinite);
    uint32_t code = 0;
    const int exp_field = static_cast<int>(a >> 23);
    if (exp_field != 0) {  // f32 subnormals are far below half the smallest subnormal here
      int e = exp_field - 127;
      const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // value = mant * 2^(e-23)
      const int emin = 1 - BIAS;                          // exponent of the smallest normal
      const int shift = 23 - M + (e < emin ? emin - e : 0);
      uint32_t q = 0;  // the value in units of the target quantum, rounded half to even
      if (shift < 25) {
        q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
      }
      if (e >= emin) {
        if (q == (2u << M)) {  // rounding carried into the next binade
          q = 1u << M;
          ++e;
        }
        const int ecode = e + BIAS;
        code = ecode > kMaxExpField ? kMag + 1u : (static_cast<uint32_t>(ecode) << M) | (q - (1u << M));
      } else {
        code = q;  // subnormal; q == 2^M is the smallest normal and encodes the same way
      }
      if (code > kMaxFinite) code = kMaxFinite;
    }
    if (SPECIALS == kUnsignedZeroNan && code == 0) return 0;  // no negative zero
    return static_cast<uint8_t>(sign | code);
  }

  K3_DEVICE static float decode(uint8_t c) {
    const uint32_t mag = c & kMag;
    const bool neg = (c & kSign) != 0;
    const uint32_t e = mag >> M;
    const uint32_t m = mag & ((1u << M) - 1u);
    if (SPECIALS == kIeeeSpecials && e == static_cast<uint32_t>(kMaxExpField)) {
      if (m != 0) return uint_as_float(0x7fc00000u);
      return uint_as_float(neg ? 0xff800000u : 0x7f800000u);
    }
    if (SPECIALS == kNanAllOnes && mag == kMag) return uint_as_float(0x7fc00000u);
    if (SPECIALS == kUnsignedZeroNan && c == kSign) return uint_as_float(0x7fc00000u);
    float v;
    if (e == 0) {
      v = static_cast<float>(m) * uint_as_float(static_cast<uint32_t>(127 + 1 - BIAS - M) << 23);
    } else {
      v = uint_as_float(((e + 127u - BIAS) << 23) | (m << (23 - M)));
    }
    return neg ? -v : v;
  }
};

typedef Minifloat<4, 3, 7, kNanAllOnes> E4M3Fn;
typedef Minifloat<4, 3, 8, kUnsignedZeroNan> E4M3Fnuz;
typedef Minifloat<5, 2, 15, kIeeeSpecials> E5M2;
typedef Minifloat<2, 1, 1, kNoSpecials> E2M1;
}  // namespace detail

// fp8 e4m3fn (OCP; NVIDIA sm_89+, AMD gfx950): bias 7, max 448, NaN = S.1111.111.
K3_DEVICE uint8_t f32_to_e4m3fn(float x) { return detail::E4M3Fn::encode(x); }
K3_DEVICE float e4m3fn_to_f32(uint8_t c) { return detail::E4M3Fn::decode(c); }
// fp8 e4m3fnuz (AMD gfx942): bias 8, max 240, 0x80 is the only NaN, no negative zero.
K3_DEVICE uint8_t f32_to_e4m3fnuz(float x) { return detail::E4M3Fnuz::encode(x); }
K3_DEVICE float e4m3fnuz_to_f32(uint8_t c) { return detail::E4M3Fnuz::decode(c); }
// fp8 e5m2 (OCP): bias 15, max 57344, IEEE Inf/NaN; encode saturates Inf to the max finite.
K3_DEVICE uint8_t f32_to_e5m2(float x) { return detail::E5M2::encode(x); }
K3_DEVICE float e5m2_to_f32(uint8_t c) { return detail::E5M2::decode(c); }
// fp4 e2m1 (OCP; MXFP4's elements): the low 4 bits of `c`, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
K3_DEVICE float e2m1_to_f32(uint8_t c) { return detail::E2M1::decode(static_cast<uint8_t>(c & 0xfu)); }

K3_END

#endif  // K3_CONVERT_H
