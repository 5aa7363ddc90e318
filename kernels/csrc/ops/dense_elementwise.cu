// Elementwise ops of the dense family (kernel-api ops/elementwise.rs is the spec): SiTU-GLU,
// sigmoid gate, embedding gather. Grid-stride loops over the logical [rows, cols] index, so
// consecutive threads touch consecutive columns of a row (coalesced); inputs take any row
// stride with unit column stride, outputs are contiguous. f32 math, one rounding at the store.
#include "k3/compat.h"

// SiTU(g, u) = beta * tanh(g / beta) * sigmoid(g) * (lb > 0 ? lb * tanh(u / lb) : u).
// gate and up are [rows, cols] with row strides g_rs, u_rs (a fused [M, 2N] input is passed as
// two views of one buffer: up = gate + N, same row stride). lb <= 0 means no up-branch cap.
K3_KERNEL void dense_situ_glu(const void* gate, int g_dt, int64_t g_rs, const void* up, int u_dt, int64_t u_rs,
                              void* out, int out_dt, int64_t rows, int cols, float beta, float lb) {
  const int64_t total = rows * cols;
  const int64_t step = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t i = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); i < total;
       i += step) {
    const int64_t r = i / cols, c = i % cols;
    const float g = k3::load_f32(gate, g_dt, r * g_rs + c);
    const float u = k3::load_f32(up, u_dt, r * u_rs + c);
    k3::store_f32(out, out_dt, i, k3::situ_glu_f32(g, u, beta, lb));
  }
}
K3_EXPORT(dense_situ_glu);

// out = x * sigmoid(g); x, g [rows, cols] with row strides x_rs, g_rs.
K3_KERNEL void dense_sigmoid_gate(const void* x, int x_dt, int64_t x_rs, const void* g, int g_dt, int64_t g_rs,
                                  void* out, int out_dt, int64_t rows, int cols) {
  const int64_t total = rows * cols;
  const int64_t step = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t i = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); i < total;
       i += step) {
    const int64_t r = i / cols, c = i % cols;
    const float v = k3::load_f32(x, x_dt, r * x_rs + c) * k3::sigmoid_f32(k3::load_f32(g, g_dt, r * g_rs + c));
    k3::store_f32(out, out_dt, i, v);
  }
}
K3_EXPORT(dense_sigmoid_gate);

// out[m, :] = table[ids[m], :]; table [vocab, d] with row stride t_rs; ids [rows] with stride
// id_stride. The plan checked the ids; an id that changed on the device since is not read past
// the table: its row is written as NaN (visible, never an out-of-bounds read) and reported
// through err (k3/checks.h). Same dtype in and out copies the bits (exact even for NaN payloads).
K3_KERNEL void dense_embedding_gather(const void* table, int t_dt, int64_t t_rs, const void* ids, int id_dt,
                                      int64_t id_stride, void* out, int out_dt, int64_t rows, int d, int64_t vocab,
                                      k3::ErrorRecord* err) {
  const int64_t total = rows * d;
  const int64_t step = static_cast<int64_t>(k3::grid_dim_x()) * k3::block_dim_x();
  for (int64_t i = static_cast<int64_t>(k3::block_idx_x()) * k3::block_dim_x() + k3::thread_idx_x(); i < total;
       i += step) {
    const int64_t r = i / d, c = i % d;
    const int64_t id = k3::load_index(ids, id_dt, r * id_stride);
    if (id < 0 || id >= vocab) {
      if (c == 0) k3::record_violation(err, k3::kCheckEmbeddingIds, k3::kCheckRange, r, -1, id, 0, vocab);
      k3::store_f32(out, out_dt, i, k3::uint_as_float(0x7fc00000u));
      continue;
    }
    const int64_t src = id * t_rs + c;
    if (t_dt == out_dt && t_dt == k3::kF32) {
      static_cast<uint32_t*>(out)[i] = static_cast<const uint32_t*>(table)[src];
    } else if (t_dt == out_dt && t_dt == k3::kBF16) {
      static_cast<uint16_t*>(out)[i] = static_cast<const uint16_t*>(table)[src];
    } else {
      k3::store_f32(out, out_dt, i, k3::load_f32(table, t_dt, src));
    }
  }
}
K3_EXPORT(dense_embedding_gather);
