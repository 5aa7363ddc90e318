// Format conversions of the dialect, elementwise over n values (grid-stride loops).
#include "k3/compat.h"

K3_KERNEL void convert_from_f32(const float* x, int n, uint16_t* bf16_bits, uint8_t* e4m3fn, uint8_t* e4m3fnuz,
                                uint8_t* e5m2) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned i = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); i < static_cast<unsigned>(n); i += stride) {
    bf16_bits[i] = k3::f32_to_bf16(x[i]).bits;
    e4m3fn[i] = k3::f32_to_e4m3fn(x[i]);
    e4m3fnuz[i] = k3::f32_to_e4m3fnuz(x[i]);
    e5m2[i] = k3::f32_to_e5m2(x[i]);
  }
}
K3_EXPORT(convert_from_f32);

// from_bf16[i] = bf16_bits[i] as f32; the fp8 outputs decode codes[i] in each flavour.
K3_KERNEL void convert_to_f32(const uint16_t* bf16_bits, const uint8_t* codes, int n, float* from_bf16,
                              float* from_e4m3fn, float* from_e4m3fnuz, float* from_e5m2) {
  const unsigned stride = k3::grid_dim_x() * k3::block_dim_x();
  for (unsigned i = k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x(); i < static_cast<unsigned>(n); i += stride) {
    from_bf16[i] = k3::bf16_to_f32(k3::bf16{bf16_bits[i]});
    from_e4m3fn[i] = k3::e4m3fn_to_f32(codes[i]);
    from_e4m3fnuz[i] = k3::e4m3fnuz_to_f32(codes[i]);
    from_e5m2[i] = k3::e5m2_to_f32(codes[i]);
  }
}
K3_EXPORT(convert_to_f32);
