// MXFP4 decoding in registers for the MoE GEMM (ops/moe_gemm.cu), shared with its emulator
// test (tests/moe_mxfp4.cu): 16-byte chunks of E2M1 codes (low nibble = even element) and their
// E8M0 block scale to bf16 pairs, bit-exact with kernel_api::formats::Mxfp4Block::dequantize
// rounded to bf16 (every MXFP4 value is exact in bf16; a NaN scale gives NaNs).
#ifndef K3_OPS_MOE_MXFP4_CUH
#define K3_OPS_MOE_MXFP4_CUH

namespace moe {

// f32 bits of the E2M1 code (bit 3 sign): magnitudes 0, 0.5 exactly, else 2^((m>>1)-1) x
// (1 + (m&1)/2) = exponent (m>>1)+126 and mantissa bit (m&1), i.e. (m << 22) + (126 << 23).
K3_DEVICE uint32_t e2m1_f32_bits(uint32_t code) {
  const uint32_t m = code & 7u;
  const uint32_t mag = m >= 2u ? (m << 22) + (126u << 23) : m * 0x3f000000u;
  return mag | ((code & 8u) << 28);
}

// E8M0 scale byte as f32 (k3::load_f32's kE8M0 decode: 255 is NaN, 0 is 2^-127).
K3_DEVICE float e8m0_f32(uint32_t s) {
  return s == 255u ? k3::uint_as_float(0x7fc00000u) : (s == 0u ? k3::uint_as_float(0x00400000u) : k3::uint_as_float(s << 23));
}

// Eight E2M1 codes (element 0 in the low nibble) times the block scale as four bf16 pairs:
// e2m1 x 2^(S-127) is exact in f32 and in bf16, so the product's high half is the bf16 value.
K3_DEVICE k3::u32x4 mxfp4_word_to_bf16(uint32_t w, float s) {
  k3::u32x4 o;
  for (int h = 0; h < 4; ++h) {
    const uint32_t byte = w >> (8 * h);
    const float lo = k3::uint_as_float(e2m1_f32_bits(byte)) * s;
    const float hi = k3::uint_as_float(e2m1_f32_bits(byte >> 4)) * s;
    o.v[h] = k3::detail::high_halves(lo, hi);
  }
  return o;
}

}  // namespace moe

#endif  // K3_OPS_MOE_MXFP4_CUH
