// The MoE GEMM's in-register MXFP4 decode (ops/moe_mxfp4.cuh) over every code byte and every
// scale byte, grid-stride.
#include "k3/compat.h"
#include "ops/moe_mxfp4.cuh"

// For scale S in 0..255 and chunk c in 0..15 (the 16 code bytes 16c..16c+15, one 16-B chunk):
// out[(S * 16 + c) * 16 + w] = the four bf16 pairs of word w (w = 0..3) as 16 u32, i.e. the 32
// bf16 values of the chunk in element order; out_cvt the same through mxfp4_byte_to_bf16x2_cvt
// (the sm_100a/103a form, here with the software e2m1 decode).
K3_KERNEL void moe_mxfp4_decode_all(uint32_t* out, uint32_t* out_cvt) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned i = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); i < 256u * 16u; i += stride) {
    const unsigned s = i / 16u, c = i % 16u;
    const float sf = moe::e8m0_f32(s);
    for (unsigned w = 0; w < 4; ++w) {
      const unsigned b0 = 16u * c + 4u * w;
      const uint32_t word = b0 | ((b0 + 1u) << 8) | ((b0 + 2u) << 16) | ((b0 + 3u) << 24);
      const k3::u32x4 v = moe::mxfp4_word_to_bf16(word, sf);
      for (int h = 0; h < 4; ++h) {
        out[i * 16u + 4u * w + h] = v.v[h];
        out_cvt[i * 16u + 4u * w + h] = moe::mxfp4_byte_to_bf16x2_cvt(b0 + h, sf);
      }
    }
  }
}
K3_EXPORT(moe_mxfp4_decode_all);
