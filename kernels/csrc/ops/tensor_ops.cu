// Strided copy with dtype conversion and in-place accumulation (kernel-api ops/tensor_ops.rs).
// Layouts are passed as 4 sizes and 4 strides (rank <= 4, leading dims padded with size 1);
// a grid-stride loop walks the logical row-major index.
#include "k3/compat.h"

K3_DEVICE int64_t k3_strided_offset(int64_t i, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1, int64_t s2,
                                    int64_t s3) {
  const int64_t i3 = i % n3;
  i /= n3;
  const int64_t i2 = i % n2;
  i /= n2;
  const int64_t i1 = i % n1;
  const int64_t i0 = i / n1;
  return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
}

K3_KERNEL void copy_cast(const void* x, int x_dt, void* out, int out_dt, int64_t numel, int64_t n1, int64_t n2,
                         int64_t n3, int64_t xs0, int64_t xs1, int64_t xs2, int64_t xs3, int64_t os0, int64_t os1,
                         int64_t os2, int64_t os3) {
  const int64_t step = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t i = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); i < numel; i += step) {
    const float v = k3::load_f32(x, x_dt, k3_strided_offset(i, n1, n2, n3, xs0, xs1, xs2, xs3));
    k3::store_f32(out, out_dt, k3_strided_offset(i, n1, n2, n3, os0, os1, os2, os3), v);
  }
}
K3_EXPORT(copy_cast);

K3_KERNEL void add_assign(void* acc, int acc_dt, const void* x, int x_dt, int64_t numel, int64_t n1, int64_t n2,
                          int64_t n3, int64_t as0, int64_t as1, int64_t as2, int64_t as3, int64_t xs0, int64_t xs1,
                          int64_t xs2, int64_t xs3) {
  const int64_t step = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t i = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); i < numel; i += step) {
    const int64_t ao = k3_strided_offset(i, n1, n2, n3, as0, as1, as2, as3);
    const float v = k3::load_f32(acc, acc_dt, ao) + k3::load_f32(x, x_dt, k3_strided_offset(i, n1, n2, n3, xs0, xs1, xs2, xs3));
    k3::store_f32(acc, acc_dt, ao, v);
  }
}
K3_EXPORT(add_assign);
