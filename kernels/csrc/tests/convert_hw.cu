// The packed hardware conversions of k3/convert_hw.h over their whole input space (fp8, fp4 pairs)
// or a list of f32 pairs (bf16 packing), grid-stride.
#include "k3/compat.h"

// out[i] = pack_bf16x2_rn(x[2i], x[2i+1]).
K3_KERNEL void convert_hw_pack_bf16x2(const float* x, int pairs, uint32_t* out) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned i = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); i < static_cast<unsigned>(pairs); i += stride) {
    out[i] = k3::pack_bf16x2_rn(x[2 * i], x[2 * i + 1]);
  }
}
K3_EXPORT(convert_hw_pack_bf16x2);

// For every 16-bit pair of codes c (element 0 in the low byte), in each flavour f (0 e4m3fn,
// 1 e4m3fnuz, 2 e5m2): f32[f][2c..2c+2], bf16x2[f][c], f16x2[f][c].
K3_KERNEL void convert_hw_fp8_pairs(float* f32, uint32_t* bf16x2, uint32_t* f16x2) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  const unsigned n = 65536u;
  for (unsigned c = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); c < n; c += stride) {
    const uint16_t codes = static_cast<uint16_t>(c);
    const k3::f32x2 v[3] = {k3::e4m3fn_x2_to_f32(codes), k3::e4m3fnuz_x2_to_f32(codes), k3::e5m2_x2_to_f32(codes)};
    const uint32_t b[3] = {k3::e4m3fn_x2_to_bf16x2(codes), k3::e4m3fnuz_x2_to_bf16x2(codes), k3::e5m2_x2_to_bf16x2(codes)};
    const uint32_t h[3] = {k3::e4m3fn_x2_to_f16x2(codes), k3::e4m3fnuz_x2_to_f16x2(codes), k3::e5m2_x2_to_f16x2(codes)};
    for (int f = 0; f < 3; ++f) {
      f32[(f * n + c) * 2] = v[f].lo;
      f32[(f * n + c) * 2 + 1] = v[f].hi;
      bf16x2[f * n + c] = b[f];
      f16x2[f * n + c] = h[f];
    }
    // The run-time flavour switch the MLA loader uses agrees with the fixed forms.
    if (k3::e4m3_x2_to_bf16x2(codes, false) != b[0] || k3::e4m3_x2_to_bf16x2(codes, true) != b[1]) k3::trap("e4m3_x2_to_bf16x2");
  }
}
K3_EXPORT(convert_hw_fp8_pairs);

// For every fp4 code pair c (one byte, element 0 in the low nibble): f32[2c..2c+2].
K3_KERNEL void convert_hw_e2m1_pairs(float* f32) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned c = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); c < 256u; c += stride) {
    const k3::f32x2 v = k3::e2m1_x2_to_f32(c);
    f32[2 * c] = v.lo;
    f32[2 * c + 1] = v.hi;
  }
}
K3_EXPORT(convert_hw_e2m1_pairs);

// out[i] = byte_perm(in[3i], in[3i + 1], in[3i + 2]), grid-stride.
K3_KERNEL void convert_hw_byte_perm(const uint32_t* in, int n, uint32_t* out) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned i = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); i < static_cast<unsigned>(n); i += stride) {
    out[i] = k3::byte_perm(in[3 * i], in[3 * i + 1], in[3 * i + 2]);
  }
}
K3_EXPORT(convert_hw_byte_perm);
