// MXFP4 decoding in registers for the MoE GEMM (ops/moe_gemm.cu), shared with its emulator
// test (tests/moe_mxfp4.cu): 16-byte chunks of E2M1 codes (low nibble = even element) and their
// E8M0 block scale to bf16 pairs, bit-exact with kernel_api::formats::Mxfp4Block::dequantize
// rounded to bf16 (every MXFP4 value is exact in bf16; a NaN scale gives NaNs), and the MMA B
// fragment of a raw staged MXFP4 tile (load_b_mxfp4: the GEMM decodes at fragment load).
#ifndef K3_OPS_MOE_MXFP4_CUH
#define K3_OPS_MOE_MXFP4_CUH

namespace moe {

// The two nonzero bytes of the f32 of E2M1 magnitude m = 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6: for
// m >= 2 the bits (m << 22) + (126 << 23)) as 8-byte k3::byte_perm pools indexed by m: kE2m1Top
// the top byte (sign 0, exponent bits 7..1), kE2m1Mid the byte below (exponent bit 0, mantissa
// bits 22..16); the low 16 bits are zero. The E2M1 sign (code bit 3) becomes f32 bit 31.
constexpr uint32_t kE2m1Top[2] = {0x3f3f3f00u, 0x40404040u};
constexpr uint32_t kE2m1Mid[2] = {0xc0800000u, 0xc0804000u};

// E8M0 scale byte as f32 (k3::load_f32's kE8M0 decode: 255 is NaN, 0 is 2^-127).
K3_DEVICE float e8m0_f32(uint32_t s) {
  const uint32_t bits = s == 0u ? 0x00400000u : s << 23;
  return k3::uint_as_float(s == 255u ? 0x7fc00000u : bits);
}

// The two E2M1 codes of the low byte of `byte` (element 0 in the low nibble) as f32 by table
// lookups: the magnitudes from two lookups shared by both codes (the nibbles' low 3 bits index
// the pools), their f32 words from two more byte permutes (bytes 2 and 3 of the lookups are pool
// byte 0 = 0), the signs from one OR each. The same values as k3::e2m1_x2_to_f32's software
// decode, in fewer instructions.
K3_DEVICE k3::f32x2 e2m1_x2_by_lookup(uint32_t byte) {
  const uint32_t idx = byte & 0x77u;
  const uint32_t top = k3::byte_perm(kE2m1Top[0], kE2m1Top[1], idx);  // top(m0), top(m1), 0, 0
  const uint32_t mid = k3::byte_perm(kE2m1Mid[0], kE2m1Mid[1], idx);  // mid(m0), mid(m1), 0, 0
  const uint32_t lo = k3::byte_perm(mid, top, 0x4022u) | ((byte & 0x08u) << 28);
  const uint32_t hi = k3::byte_perm(mid, top, 0x5122u) | ((byte & 0x80u) << 24);
  return k3::f32x2{k3::uint_as_float(lo), k3::uint_as_float(hi)};
}

// An E2M1 pair as f32 times the block scale as a bf16 pair (element 0 in the low half):
// e2m1 x 2^(S-127) is exact in f32 and in bf16, so the product's high half is the bf16 value.
K3_DEVICE uint32_t mxfp4_scaled_bf16x2(k3::f32x2 v, float s) { return k3::detail::high_halves(v.lo * s, v.hi * s); }

// Two E2M1 codes (the low 8 bits of `byte`, element 0 in the low nibble) times the block scale
// as a bf16 pair. Where the target converts fp4 (K3_HW_E2M1: sm_100a/103a) the codes' f32 come
// from k3::e2m1_x2_to_f32 (mxfp4_byte_to_bf16x2_cvt: 6 instructions per byte there, the convert,
// two f16 -> f32, two multiplies, one permute), elsewhere from the lookups (12 instructions per
// byte on sm_90a, 14 on gfx942, where computing the bits arithmetically took 20). The emulator
// runs both forms for every code and scale byte (tests/moe_mxfp4.cu).
K3_DEVICE uint32_t mxfp4_byte_to_bf16x2_cvt(uint32_t byte, float s) { return mxfp4_scaled_bf16x2(k3::e2m1_x2_to_f32(byte), s); }
K3_DEVICE uint32_t mxfp4_byte_to_bf16x2(uint32_t byte, float s) {
#if K3_HW_E2M1
  return mxfp4_byte_to_bf16x2_cvt(byte, s);
#else
  return mxfp4_scaled_bf16x2(e2m1_x2_by_lookup(byte), s);
#endif
}

// gfx950 converts and scales a code pair in one instruction (v_cvt_scalef32_pk_bf16_fp4, which
// multiplies by the exponent part of its f32 scale). The decodes take it where every product is
// a normal, finite bf16 (scales 2^-125 .. 2^125, E8M0 bytes 2 .. 252), so any rounding the
// instruction does agrees with the exact result; the table path keeps the rest (zero,
// subnormal and NaN scales, products past bf16's range), whose handling by the instruction no
// run here has seen. Compiled, not yet run on an MI355X; the emulator runs the table path.
K3_DEVICE bool mxfp4_hw_scale(float s) {
#if K3_TARGET_HIP && defined(__gfx950__)
  return s >= 0x1p-125f && s <= 0x1p125f;
#else
  static_cast<void>(s);
  return false;
#endif
}
K3_DEVICE uint32_t mxfp4_byte_to_bf16x2_hw(uint32_t byte, float s) {
#if K3_TARGET_HIP && defined(__gfx950__)
  typedef __bf16 v2bf __attribute__((ext_vector_type(2)));
  return __builtin_bit_cast(uint32_t, static_cast<v2bf>(__builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(byte, s, 0)));
#else
  return mxfp4_byte_to_bf16x2(byte, s);  // never taken: mxfp4_hw_scale is false here
#endif
}

// Eight E2M1 codes (element 0 in the low nibble) times the block scale as four bf16 pairs.
K3_DEVICE k3::u32x4 mxfp4_word_to_bf16(uint32_t w, float s) {
  k3::u32x4 o;
  if (mxfp4_hw_scale(s)) {
    for (int h = 0; h < 4; ++h) o.v[h] = mxfp4_byte_to_bf16x2_hw(w >> (8 * h), s);
  } else {
    for (int h = 0; h < 4; ++h) o.v[h] = mxfp4_byte_to_bf16x2(w >> (8 * h), s);
  }
  return o;
}

// The MMA B fragment at k = kk.. of a weight tile staged raw, decoded at fragment load, with its k
// read through k3::mma::k_perm (the A fragments of the same MMAs are loaded with load_a_kperm):
// B[k][n] = W[n][k], W's row n at codes + n * pitch (byte i: k = 2i in the low nibble, 2i + 1 in
// the high one), its E8M0 bytes at scales + n * sc_pitch (one per MX block of 32 k). A lane's four
// slots are then four adjacent k from a multiple of 4: two adjacent code bytes, one 2-byte load.
// The same bf16 values as mxfp4_word_to_bf16 (so the MMA sees the dense twin's operands). kk is a
// multiple of S::K, so a lane's slots lie in one MX block and share one scale.
template <class S>
K3_DEVICE void load_b_mxfp4(k3::mma::FragB<S>& f, const uint8_t* codes, int pitch, const uint8_t* scales,
                            int sc_pitch, int kk) {
  static_assert(S::kBSlots == 4, "a lane's slots are two code bytes");
  static_assert(32 % S::K == 0, "a fragment lies in one MX block");
  const k3::mma::RC rc0 = k3::mma::b_coord<S>(0);
  const int k0 = kk + k3::mma::k_perm<S>(rc0.row);  // a multiple of 4 (k_perm_puts_b_slots_adjacent)
  const float s = e8m0_f32(scales[rc0.col * sc_pitch + k0 / 32]);
  const uint32_t two = *reinterpret_cast<const uint16_t*>(codes + rc0.col * pitch + k0 / 2);
  const uint32_t bytes[2] = {two & 0xffu, two >> 8};
  uint32_t pairs[2];
  if (mxfp4_hw_scale(s)) {  // false at compile time but on gfx950
    for (int i = 0; i < 2; ++i) pairs[i] = mxfp4_byte_to_bf16x2_hw(bytes[i], s);
  } else {
    for (int i = 0; i < 2; ++i) pairs[i] = mxfp4_byte_to_bf16x2(bytes[i], s);
  }
  for (int i = 0; i < S::kBSlots; i += 2) {
    f.x[i] = static_cast<uint16_t>(pairs[i / 2]);
    f.x[i + 1] = static_cast<uint16_t>(pairs[i / 2] >> 16);
  }
}

}  // namespace moe

#endif  // K3_OPS_MOE_MXFP4_CUH
