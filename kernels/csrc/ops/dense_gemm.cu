// Dense GEMM out[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) (kernel-api ops/gemm.rs is the spec): the
// dialect's tiled GEMM for runtimes without a vendor GEMM. Two kernels, chosen by the launcher:
//
// - dense_gemm_bf16_mma (x and W both bf16): 64x64 output tile per block, 4 warps in a 2x2 grid,
//   each warp owning a 32x32 sub-tile made of k3::mma fragments of the target's bf16 shape
//   (m16n8k16 mma.sync at warp 32, 16x16x16 MFMA at warp 64). Per 32-wide K step the block stages
//   the x and W tiles in shared memory (rows padded by 8 bf16 against bank conflicts); fragments
//   are loaded from there through a_coord/b_coord. Products are exact, sums f32.
// - dense_gemm_f32_fma (any operand f32): the spec decodes inputs exactly to f32, so an f32
//   operand is never rounded to bf16; 64x64 tile, 16-deep K step, 256 threads each computing a
//   4x4 register tile with f32 FMAs from K-major shared tiles.
//
// Both have the same epilogue: accumulator + bias in f32, rounded once to the output dtype, with
// every index bounds-checked, so any M (>= 1; M = 0 is never launched), N and K work (tails are
// zero-filled in shared memory). Grid: x = N tiles, y = M tiles.
#include "k3/compat.h"
#include "dense_reduce.cuh"

#define DENSE_GEMM_BM 64
#define DENSE_GEMM_BN 64
#define DENSE_GEMM_MMA_BK 32
#define DENSE_GEMM_MMA_LDS (DENSE_GEMM_MMA_BK + 8)  // 80-B rows: ldmatrix's 8 rows per phase hit distinct banks
#define DENSE_GEMM_F32_BK 16
#define DENSE_GEMM_F32_THREADS 256

// out[row, col] = acc + bias[col], rounded once; rows and columns outside the matrix are skipped.
K3_DEVICE void dense_gemm_store(void* out, int out_dt, const void* bias, int bias_dt, int m, int n, int64_t row,
                                int64_t col, float acc) {
  if (row >= m || col >= n) return;
  if (bias != nullptr) acc += k3::load_f32(bias, bias_dt, col);
  k3::store_f32(out, out_dt, row * n + col, acc);
}

template <class S>
K3_DEVICE void dense_gemm_mma_block(const k3::bf16* x, int64_t ldx, const k3::bf16* w, int64_t ldw, const void* bias,
                                    int bias_dt, void* out, int out_dt, int m, int n, int k) {
  using namespace k3::mma;
  constexpr int kWarpTile = 32;  // each of the 2x2 warps owns a 32x32 sub-tile
  constexpr int kFragsM = kWarpTile / S::M;
  constexpr int kFragsN = kWarpTile / S::N;
  K3_SHARED(k3::bf16, xs, [DENSE_GEMM_BM][DENSE_GEMM_MMA_LDS]);
  K3_SHARED(k3::bf16, ws, [DENSE_GEMM_BN][DENSE_GEMM_MMA_LDS]);

  const int tid = static_cast<int>(k3::thread_idx_x());
  const int threads = static_cast<int>(k3::block_dim_x());
  const int warp = static_cast<int>(k3::warp_id());
  const int wm = (warp / 2) * kWarpTile;
  const int wn = (warp % 2) * kWarpTile;
  const int64_t m0 = static_cast<int64_t>(k3::block_idx_y()) * DENSE_GEMM_BM;
  const int64_t n0 = static_cast<int64_t>(k3::block_idx_x()) * DENSE_GEMM_BN;
  // Fragment rows (or columns) wholly past the matrix are skipped; the test is warp-uniform, so
  // every lane of a warp still takes part in each mma it issues (M = 1 decode runs 1 of the 2
  // row fragments of a warp and idles the second warp row). Loops keep compile-time bounds so
  // the fragments stay in registers.
  const int64_t live_rows = m - (m0 + wm);  // rows of this warp's sub-tile inside the matrix
  const int64_t live_cols = n - (n0 + wn);
  FragC<S> acc[kFragsM][kFragsN];
  K3_UNROLL
  for (int i = 0; i < kFragsM; ++i) {
    K3_UNROLL
    for (int j = 0; j < kFragsN; ++j) fill(acc[i][j], 0.0f);
  }

  const k3::bf16 zero = {0};
  for (int k0 = 0; k0 < k; k0 += DENSE_GEMM_MMA_BK) {
    // Stage both tiles: consecutive threads read consecutive k of one row (coalesced).
    for (int i = tid; i < DENSE_GEMM_BM * DENSE_GEMM_MMA_BK; i += threads) {
      const int r = i / DENSE_GEMM_MMA_BK, c = i % DENSE_GEMM_MMA_BK;
      const int64_t row = m0 + r;
      const int kk = k0 + c;
      xs[r][c] = (row < m && kk < k) ? x[row * ldx + kk] : zero;
    }
    for (int i = tid; i < DENSE_GEMM_BN * DENSE_GEMM_MMA_BK; i += threads) {
      const int r = i / DENSE_GEMM_MMA_BK, c = i % DENSE_GEMM_MMA_BK;
      const int64_t col = n0 + r;
      const int kk = k0 + c;
      ws[r][c] = (col < n && kk < k) ? w[col * ldw + kk] : zero;
    }
    k3::sync_threads();
    K3_UNROLL
    for (int kk = 0; kk < DENSE_GEMM_MMA_BK; kk += S::K) {
      FragA<S> fa[kFragsM];
      FragB<S> fb[kFragsN];
      K3_UNROLL
      for (int i = 0; i < kFragsM; ++i) load_a_ldsm(fa[i], &xs[wm + i * S::M][kk], DENSE_GEMM_MMA_LDS);
      // B[k][n] = W[n][k]: the W tile is B transposed.
      K3_UNROLL
      for (int j = 0; j < kFragsN; ++j) load_b_transposed_ldsm(fb[j], &ws[wn + j * S::N][kk], DENSE_GEMM_MMA_LDS);
      K3_UNROLL
      for (int i = 0; i < kFragsM; ++i) {
        K3_UNROLL
        for (int j = 0; j < kFragsN; ++j) {
          if (i * S::M < live_rows && j * S::N < live_cols) mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
      }
    }
    k3::sync_threads();  // the next stage overwrites the tiles
  }

  K3_UNROLL
  for (int i = 0; i < kFragsM; ++i) {
    K3_UNROLL
    for (int j = 0; j < kFragsN; ++j) {
      K3_UNROLL
      for (int s = 0; s < S::kCSlots; ++s) {
        const RC rc = c_coord<S>(s);
        dense_gemm_store(out, out_dt, bias, bias_dt, m, n, m0 + wm + i * S::M + rc.row, n0 + wn + j * S::N + rc.col,
                         acc[i][j].x[s]);
      }
    }
  }
}

// Block: 4 warps (4 * kWarpSize threads). bias may be null.
K3_KERNEL void dense_gemm_bf16_mma(const k3::bf16* x, int64_t ldx, const k3::bf16* w, int64_t ldw, const void* bias,
                                   int bias_dt, void* out, int out_dt, int m, int n, int k) {
  dense_gemm_mma_block<k3::mma::Bf16Shape>(x, ldx, w, ldw, bias, bias_dt, out, out_dt, m, n, k);
}
K3_EXPORT(dense_gemm_bf16_mma);

// Block: DENSE_GEMM_F32_THREADS threads as a 16x16 grid; thread (ty, tx) owns rows ty + 16i and
// columns tx + 16j (i, j < 4), so shared reads are broadcast/contiguous and stores coalesced.
K3_KERNEL void dense_gemm_f32_fma(const void* x, int x_dt, int64_t ldx, const void* w, int w_dt, int64_t ldw,
                                  const void* bias, int bias_dt, void* out, int out_dt, int m, int n, int k) {
  K3_SHARED(float, xs, [DENSE_GEMM_F32_BK][DENSE_GEMM_BM + 4]);  // K-major: xs[k][row]
  K3_SHARED(float, ws, [DENSE_GEMM_F32_BK][DENSE_GEMM_BN + 4]);  // K-major: ws[k][col]
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = static_cast<int64_t>(k3::block_idx_y()) * DENSE_GEMM_BM;
  const int64_t n0 = static_cast<int64_t>(k3::block_idx_x()) * DENSE_GEMM_BN;
  float acc[4][4];
  K3_UNROLL
  for (int i = 0; i < 4; ++i) {
    K3_UNROLL
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  }

  for (int k0 = 0; k0 < k; k0 += DENSE_GEMM_F32_BK) {
    for (int i = tid; i < DENSE_GEMM_BM * DENSE_GEMM_F32_BK; i += DENSE_GEMM_F32_THREADS) {
      const int r = i / DENSE_GEMM_F32_BK, c = i % DENSE_GEMM_F32_BK;
      const int64_t row = m0 + r;
      const int kk = k0 + c;
      xs[c][r] = (row < m && kk < k) ? k3::load_f32(x, x_dt, row * ldx + kk) : 0.0f;
    }
    for (int i = tid; i < DENSE_GEMM_BN * DENSE_GEMM_F32_BK; i += DENSE_GEMM_F32_THREADS) {
      const int r = i / DENSE_GEMM_F32_BK, c = i % DENSE_GEMM_F32_BK;
      const int64_t col = n0 + r;
      const int kk = k0 + c;
      ws[c][r] = (col < n && kk < k) ? k3::load_f32(w, w_dt, col * ldw + kk) : 0.0f;
    }
    k3::sync_threads();
    for (int kk = 0; kk < DENSE_GEMM_F32_BK; ++kk) {
      float a[4], b[4];
      K3_UNROLL
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
      K3_UNROLL
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
      K3_UNROLL
      for (int i = 0; i < 4; ++i) {
        K3_UNROLL
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    k3::sync_threads();
  }

  K3_UNROLL
  for (int i = 0; i < 4; ++i) {
    K3_UNROLL
    for (int j = 0; j < 4; ++j)
      dense_gemm_store(out, out_dt, bias, bias_dt, m, n, m0 + ty + 16 * i, n0 + tx + 16 * j, acc[i][j]);
  }
}
K3_EXPORT(dense_gemm_f32_fma);
