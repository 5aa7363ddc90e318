// A bf16 GEMM built only from the warp-level MMA fragments: C = A * B + bias[col], with A (MxK)
// and B (KxN) row-major bf16 and C (MxN) row-major f32. Each warp computes one S::M x S::N tile,
// loading its fragments straight from global memory; the epilogue goes through c_coord, the
// (lane, slot) -> (row, col) map, so it is the same code for every shape.
// M, N, K must be multiples of the shape's M, N, K.
#include "k3/compat.h"

template <class S>
K3_DEVICE void gemm_tiles(const k3::bf16* a, const k3::bf16* b, const float* bias, float* c, int m, int n, int k) {
  using namespace k3::mma;
  const int tiles_n = n / S::N;
  const int warps_per_block = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  const int tile = static_cast<int>(k3::block_idx_x()) * warps_per_block + static_cast<int>(k3::warp_id());
  if (tile >= (m / S::M) * tiles_n) return;  // the whole warp leaves together
  const int row0 = tile / tiles_n * S::M;
  const int col0 = tile % tiles_n * S::N;
  FragC<S> acc;
  fill(acc, 0.0f);
  for (int kk = 0; kk < k; kk += S::K) {
    FragA<S> fa;
    FragB<S> fb;
    load_a(fa, a + row0 * k + kk, k);
    load_b(fb, b + kk * n + col0, n);
    mma_sync(acc, fa, fb, acc);
  }
  for (int s = 0; s < S::kCSlots; ++s) {
    const RC rc = c_coord<S>(s);
    const int col = col0 + rc.col;
    c[(row0 + rc.row) * n + col] = acc.x[s] + bias[col];
  }
}

// The target's default shape (16x8x16 at warp 32, 16x16x16 at warp 64).
K3_KERNEL void gemm_bf16_mma(const k3::bf16* a, const k3::bf16* b, const float* bias, float* c, int m, int n, int k) {
  gemm_tiles<k3::mma::Bf16Shape>(a, b, bias, c, m, n, k);
}
K3_EXPORT(gemm_bf16_mma);

#if K3_WARP_SIZE == 64
// The 32x32x8 MFMA shape (AMD wave64 only).
K3_KERNEL void gemm_bf16_mma_32x32x8(const k3::bf16* a, const k3::bf16* b, const float* bias, float* c, int m, int n,
                                     int k) {
  gemm_tiles<k3::mma::M32N32K8>(a, b, bias, c, m, n, k);
}
K3_EXPORT(gemm_bf16_mma_32x32x8);
#endif
