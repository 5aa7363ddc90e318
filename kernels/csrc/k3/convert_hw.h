// Hardware conversions for hot loops: packed f32 -> bf16x2 and fp8x2 -> f32x2 / f16x2 / bf16x2,
// each one or a few instructions where the target has them, the software path of k3/convert.h
// elsewhere (and in the SIMT build, whose results are the reference the tests hold them to).
//
//   function                target: instruction (else software)
//   pack_bf16x2_rn          sm_80+: cvt.rn.bf16x2.f32; gfx950: v_cvt_pk_bf16_f32;
//                           gfx942: round-to-nearest-even by integer add (v_add3_u32) + v_perm_b32
//   e4m3fn_x2_to_f32        sm_89+: cvt.rn.f16x2.e4m3x2 + 2 cvt.f32.f16; gfx950: v_cvt_pk_f32_fp8
//   e4m3fnuz_x2_to_f32      gfx942: v_cvt_pk_f32_fp8 (gfx942's fp8 is the fnuz flavour)
//   e5m2_x2_to_f32          sm_89+: cvt.rn.f16x2.e5m2x2 + 2 cvt.f32.f16; gfx950: v_cvt_pk_f32_bf8
//   e2m1_x2_to_f32          sm_100a/103a: cvt.rn.f16x2.e2m1x2 (F2FP.F16.E2M1.UNPACK_B) + 2 cvt.f32.f16
//   *_x2_to_bf16x2          the f32 pair, then its high halves (one v_perm_b32 / PRMT): every fp8
//                           value is exact in bf16, so truncation is the correctly rounded result
//   *_x2_to_f16x2           sm_89+: cvt.rn.f16x2.{e4m3,e5m2}x2 alone (every fp8 value is exact in
//                           f16); elsewhere from the f32 pair
//   byte_perm               CUDA: prmt (__byte_perm); HIP: v_perm_b32: four bytes picked from
//                           eight, the lookup of the table-driven decodes (ops/moe_mxfp4.cuh)
//
// Packing: two values travel in one 32-bit word, element 0 in the low half (the lower address
// when stored), as the MMA fragments hold them; fp8 pairs are a 16-bit word, element 0 in the
// low byte; fp4 pairs a byte, element 0 in the low nibble.
//
// Semantics (what the emulator implements and the tests check bit for bit): results are exactly
// those of k3/convert.h (round to nearest even for f32 -> bf16; exact decoding for fp8, fp4) for
// every non-NaN input. A NaN input gives a NaN whose bits are the target's (PTX returns the
// canonical NaN, AMD keeps sign and payload, the software path quiets the input): no kernel
// relies on NaN bits, and the tests check only that a NaN stays a NaN.
// Included by k3/compat.h (after k3/convert.h).
#ifndef K3_CONVERT_HW_H
#define K3_CONVERT_HW_H

K3_BEGIN

struct f32x2 {
  float lo, hi;
};

namespace detail {
K3_DEVICE uint32_t pack_halves(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }
// bf16x2 from two f32 whose low 16 bits are zero (exact in bf16): their high halves.
K3_DEVICE uint32_t high_halves(float lo, float hi) {
#if K3_TARGET_HIP
  return __builtin_amdgcn_perm(float_as_uint(hi), float_as_uint(lo), 0x07060302u);
#elif K3_TARGET_CUDA
  return __byte_perm(float_as_uint(lo), float_as_uint(hi), 0x7632);
#else
  return (float_as_uint(lo) >> 16) | (float_as_uint(hi) & 0xffff0000u);
#endif
}
// IEEE binary16 bits of an f32 that is exactly representable in f16 (software path only).
K3_DEVICE uint16_t exact_f16_bits(float f) {
  const uint32_t u = float_as_uint(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a == 0) return sign;
  const int e = static_cast<int>(a >> 23) - 127;
  if (e >= -14) return static_cast<uint16_t>(sign | ((e + 15) << 10) | ((a & 0x7fffffu) >> 13));
  // f16 subnormal: value = m * 2^-24, m exact by assumption.
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | (mant >> (-e - 14 + 13)));
}
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 890
K3_DEVICE f32x2 f16x2_to_f32(uint32_t h) {
  float lo, hi;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}" : "=f"(lo), "=f"(hi) : "r"(h));
  return f32x2{lo, hi};
}
#endif
}  // namespace detail

// bf16x2 of (lo, hi), each rounded to nearest even.
K3_DEVICE uint32_t pack_bf16x2_rn(float lo, float hi) {
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 800
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#elif K3_TARGET_HIP && defined(__gfx950__)
  typedef float v2f __attribute__((ext_vector_type(2)));
  typedef __bf16 v2bf __attribute__((ext_vector_type(2)));
  const v2f x = {lo, hi};
  return __builtin_bit_cast(uint32_t, __builtin_convertvector(x, v2bf));
#elif K3_TARGET_HIP
  // Round to nearest even on the bit pattern, then the high halves; NaNs keep a quiet pattern.
  const uint32_t a = float_as_uint(lo), b = float_as_uint(hi);
  const uint32_t ra = (a & 0x7fffffffu) > 0x7f800000u ? (a | 0x00400000u) : a + 0x7fffu + ((a >> 16) & 1u);
  const uint32_t rb = (b & 0x7fffffffu) > 0x7f800000u ? (b | 0x00400000u) : b + 0x7fffu + ((b >> 16) & 1u);
  return __builtin_amdgcn_perm(rb, ra, 0x07060302u);
#else
  return detail::pack_halves(f32_to_bf16(lo).bits, f32_to_bf16(hi).bits);
#endif
}

// The two e4m3fn codes of `codes` (element 0 in the low byte) as f32.
K3_DEVICE f32x2 e4m3fn_x2_to_f32(uint16_t codes) {
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(codes));
  return detail::f16x2_to_f32(h);
#elif K3_TARGET_HIP && defined(__gfx950__)
  typedef float v2f __attribute__((ext_vector_type(2)));
  const v2f v = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(codes), false);
  return f32x2{v[0], v[1]};
#else
  return f32x2{e4m3fn_to_f32(static_cast<uint8_t>(codes & 0xffu)), e4m3fn_to_f32(static_cast<uint8_t>(codes >> 8))};
#endif
}

// The two e4m3fnuz codes as f32 (hardware on gfx942 only: NVIDIA and gfx950 have no fnuz).
K3_DEVICE f32x2 e4m3fnuz_x2_to_f32(uint16_t codes) {
#if K3_TARGET_HIP && defined(__gfx942__)
  typedef float v2f __attribute__((ext_vector_type(2)));
  const v2f v = __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(codes), false);
  return f32x2{v[0], v[1]};
#else
  return f32x2{e4m3fnuz_to_f32(static_cast<uint8_t>(codes & 0xffu)), e4m3fnuz_to_f32(static_cast<uint8_t>(codes >> 8))};
#endif
}

// The two OCP e5m2 codes as f32 (gfx942's bf8 is the fnuz flavour: software there).
K3_DEVICE f32x2 e5m2_x2_to_f32(uint16_t codes) {
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(codes));
  return detail::f16x2_to_f32(h);
#elif K3_TARGET_HIP && defined(__gfx950__)
  typedef float v2f __attribute__((ext_vector_type(2)));
  const v2f v = __builtin_amdgcn_cvt_pk_f32_bf8(static_cast<int>(codes), false);
  return f32x2{v[0], v[1]};
#else
  return f32x2{e5m2_to_f32(static_cast<uint8_t>(codes & 0xffu)), e5m2_to_f32(static_cast<uint8_t>(codes >> 8))};
#endif
}

// The fp4 (e2m1) converts: sm_100a and sm_103a (arch-specific PTX; not sm_90a).
#if K3_TARGET_CUDA && (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL))
#define K3_HW_E2M1 1
#else
#define K3_HW_E2M1 0
#endif

// The two e2m1 codes of the low byte of `codes` (element 0 in the low nibble) as f32 (exact).
K3_DEVICE f32x2 e2m1_x2_to_f32(uint32_t codes) {
#if K3_HW_E2M1
  uint32_t h;
  asm("{\n\t.reg .b8 c;\n\tcvt.u8.u32 c, %1;\n\tcvt.rn.f16x2.e2m1x2 %0, c;\n\t}" : "=r"(h) : "r"(codes));
  return detail::f16x2_to_f32(h);
#else
  return f32x2{e2m1_to_f32(static_cast<uint8_t>(codes)), e2m1_to_f32(static_cast<uint8_t>(codes >> 4))};
#endif
}

// fp8x2 -> bf16x2 (exact).
K3_DEVICE uint32_t e4m3fn_x2_to_bf16x2(uint16_t codes) {
  const f32x2 v = e4m3fn_x2_to_f32(codes);
  return detail::high_halves(v.lo, v.hi);
}
K3_DEVICE uint32_t e4m3fnuz_x2_to_bf16x2(uint16_t codes) {
  const f32x2 v = e4m3fnuz_x2_to_f32(codes);
  return detail::high_halves(v.lo, v.hi);
}
K3_DEVICE uint32_t e5m2_x2_to_bf16x2(uint16_t codes) {
  const f32x2 v = e5m2_x2_to_f32(codes);
  return detail::high_halves(v.lo, v.hi);
}

// fp8x2 -> f16x2 (exact).
K3_DEVICE uint32_t e4m3fn_x2_to_f16x2(uint16_t codes) {
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(codes));
  return h;
#else
  const f32x2 v = e4m3fn_x2_to_f32(codes);
  return detail::pack_halves(detail::exact_f16_bits(v.lo), detail::exact_f16_bits(v.hi));
#endif
}
K3_DEVICE uint32_t e4m3fnuz_x2_to_f16x2(uint16_t codes) {
  const f32x2 v = e4m3fnuz_x2_to_f32(codes);
  return detail::pack_halves(detail::exact_f16_bits(v.lo), detail::exact_f16_bits(v.hi));
}
K3_DEVICE uint32_t e5m2_x2_to_f16x2(uint16_t codes) {
#if K3_TARGET_CUDA && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(codes));
  return h;
#else
  const f32x2 v = e5m2_x2_to_f32(codes);
  return detail::pack_halves(detail::exact_f16_bits(v.lo), detail::exact_f16_bits(v.hi));
#endif
}

// Byte i (i = 0..3) of the result is byte (sel >> 4i) & 7 of the 8-byte pool lo (bytes 0..3),
// hi (bytes 4..7): PTX prmt's default mode. Each of the four selector nibbles must be 0..7 (prmt
// would replicate a byte's sign for nibble bit 3, which v_perm_b32 has no twin for): the SIMT
// form traps on any other, where the targets would disagree. On HIP the nibbles spread into
// v_perm_b32's selector bytes (folded for a constant selector, three or four ALU ops otherwise).
K3_DEVICE uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#if K3_TARGET_CUDA
  return __byte_perm(lo, hi, sel);
#elif K3_TARGET_HIP
  const uint32_t bytes = (sel & 0xfu) | ((sel & 0xf0u) << 4) | ((sel & 0xf00u) << 8) | ((sel & 0xf000u) << 12);
  return __builtin_amdgcn_perm(hi, lo, bytes);
#else
  if ((sel & 0x8888u) != 0) trap("k3::byte_perm: a selector nibble past 7");
  const uint64_t pool = (static_cast<uint64_t>(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((pool >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

// e4m3 (fn or fnuz, chosen at run time) pair -> bf16x2: the MLA cache flavour switch.
K3_DEVICE uint32_t e4m3_x2_to_bf16x2(uint16_t codes, bool fnuz) {
  return fnuz ? e4m3fnuz_x2_to_bf16x2(codes) : e4m3fn_x2_to_bf16x2(codes);
}

K3_END

#endif  // K3_CONVERT_HW_H
