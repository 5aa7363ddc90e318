// 16-byte vector loads/stores: out = 2 * x over n floats with a vector body and scalar tail, a
// raw 16-byte copy of bytes and the typed 4-element store.
#include "k3/compat.h"

K3_KERNEL void vec_scale2(const float* x, float* out, int n) {
  const int vec_n = k3::aligned16(x) && k3::aligned16(out) ? n / 4 : 0;
  const int tid = static_cast<int>(k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x());
  const int stride = static_cast<int>(k3::grid_dim_x() * k3::block_dim_x());
  for (int i = tid; i < vec_n; i += stride) {
    k3::f32x4 v = k3::load_f32x4(x + 4 * i);
    for (int j = 0; j < 4; ++j) v.v[j] *= 2.0f;
    k3::store_f32x4(out + 4 * i, v);
  }
  for (int i = 4 * vec_n + tid; i < n; i += stride) out[i] = 2.0f * x[i];
}
K3_EXPORT(vec_scale2);

K3_KERNEL void vec_copy16(const unsigned char* src, unsigned char* dst, int chunks) {
  const int tid = static_cast<int>(k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x());
  if (tid < chunks) k3::store_16b(dst + 16 * tid, k3::load_16b(src + 16 * tid));
}
K3_EXPORT(vec_copy16);

// out4 <- x through store_f32x4 (4 elements of `dtype` per store), out2 through store_f32x2 (2 per
// store), out1 one store_f32 at a time: the three must hold the same bytes for every float dtype.
K3_KERNEL void vec_store_typed(const float* x, void* out4, void* out2, void* out1, int dtype, int quads) {
  const int q = static_cast<int>(k3::block_idx_x() * k3::block_dim_x() + k3::thread_idx_x());
  if (q >= quads) return;
  const k3::f32x4 v = k3::load_f32x4(x + 4 * q);
  const int64_t i = 4 * static_cast<int64_t>(q);
  k3::store_f32x4(out4, dtype, i, v);
  k3::store_f32x2(out2, dtype, i, v.v[0], v.v[1]);
  k3::store_f32x2(out2, dtype, i + 2, v.v[2], v.v[3]);
  for (int c = 0; c < 4; ++c) k3::store_f32(out1, dtype, i + c, v.v[c]);
}
K3_EXPORT(vec_store_typed);
