// Typed element access for op kernels: a dtype code travels as a kernel argument and
// load_f32 / store_f32 convert through the bit-exact conversions of k3/convert.h, so one kernel
// body serves f32, f16, bf16 and the fp8 flavours (the launcher validates the codes; kernels
// never see an unsupported one). The codes match k3_kernels::dtype_code on the Rust side.
// Included by k3/compat.h.
#ifndef K3_TENSOR_H
#define K3_TENSOR_H

K3_BEGIN

enum DtypeCode : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kF8E4M3Fn = 3,
  kF8E4M3Fnuz = 4,
  kF8E5M2 = 5,
  kE8M0 = 6,
  kU8 = 7,
  kI32 = 8,
  kI64 = 9,
};

// IEEE binary16, round half to even (as half::f16::from_f32).
K3_DEVICE uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // below 2^-25: zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = m * 2^(e-150); one f16 subnormal step is 2^-24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h += 1u;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((ax - 0x38000000u) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1u;
  return static_cast<uint16_t>(sign | h);
}

K3_DEVICE float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e != 0) return uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return uint_as_float(sign);
  // Subnormal: m * 2^-24, exact in f32.
  float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

K3_DEVICE float load_f32(const void* base, int dtype, int64_t i) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(base)[i];
    case kF16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case kBF16:
      return bf16_to_f32(bf16{static_cast<const uint16_t*>(base)[i]});
    case kF8E4M3Fn:
      return e4m3fn_to_f32(static_cast<const uint8_t*>(base)[i]);
    case kF8E4M3Fnuz:
      return e4m3fnuz_to_f32(static_cast<const uint8_t*>(base)[i]);
    case kF8E5M2:
      return e5m2_to_f32(static_cast<const uint8_t*>(base)[i]);
    case kE8M0: {
      const uint8_t s = static_cast<const uint8_t*>(base)[i];
      return s == 255 ? uint_as_float(0x7fc00000u) : (s == 0 ? uint_as_float(0x00400000u) : uint_as_float(static_cast<uint32_t>(s) << 23));
    }
    case kU8:
      return static_cast<float>(static_cast<const uint8_t*>(base)[i]);
    case kI32:
      return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    default:
      return static_cast<float>(static_cast<const int64_t*>(base)[i]);
  }
}

K3_DEVICE void store_f32(void* base, int dtype, int64_t i, float v) {
  switch (dtype) {
    case kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(v);
      break;
    case kBF16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(v).bits;
      break;
    case kF8E4M3Fn:
      static_cast<uint8_t*>(base)[i] = f32_to_e4m3fn(v);
      break;
    case kF8E4M3Fnuz:
      static_cast<uint8_t*>(base)[i] = f32_to_e4m3fnuz(v);
      break;
    case kF8E5M2:
      static_cast<uint8_t*>(base)[i] = f32_to_e5m2(v);
      break;
    default:
      break;  // launchers never pass a non-float output code
  }
}

K3_DEVICE int64_t load_index(const void* base, int dtype, int64_t i) {
  return dtype == kI64 ? static_cast<const int64_t*>(base)[i] : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
}

K3_END

#endif  // K3_TENSOR_H
