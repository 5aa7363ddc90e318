// Grouped expert GEMMs over block-aligned routing and the top-k combine (kernel-api
// ops/moe_gemm.rs is the spec; vLLM fused_moe kernels 1/2 and moe_sum, FlashInfer grouped GEMM).
//
// Two grouped-GEMM kernels with the same arguments, tiles and epilogues, chosen by the launcher:
// one block per (M-block of the align output, tile of kMoeBN = 64 output columns); blocks past
// num_tokens_post_padded or with expert -1 write zeros to their pairs' rows of the tile and exit
// (moe_zero_unserved_rows). Per row chunk the block loops over k
// in kMoeBK = 32 steps (= the MX block, so one E8M0 scale per weight row and per input row):
//   - gather: the chunk's input rows (token p / top_k for GateUp, pair p for Down) into shared
//     memory, optionally replaced by their MXFP8 round trip (amax by a 32-lane shuffle
//     reduction over the 32 lanes that hold one row's MX block);
//   - decode: the expert's weight rows of the tile (GateUp: the 64 gate rows AND the matching
//     64 up rows, so the epilogue holds both accumulators of an output) into shared memory;
//     MXFP4 as e2m1(code) * 2^(S-127), which is exact in f32 and in bf16;
//   - multiply, accumulating in f32 in ascending k.
// Epilogue: GateUp applies SiTU-GLU to the (gate, up) accumulator pair; Down multiplies by the
// pair's router weight; one rounding to the output dtype. Rows of pairs no expert serves (the
// align op lists them after the served runs, in blocks with expert -1) are written as zeros by
// the blocks that hold them, so every row of the output is written and nothing clears it first.
//
// Split over k (decode sizes, block_m <= 16: moe_gemm_grouped_m16_splitk_mma): grid.y runs over
// (split, column tile), split z multiplies k in [z * k_chunk, min(k, (z + 1) * k_chunk)) and
// writes its raw f32 accumulators (gate at column j, up at pitch + j, the pitch n rounded up to 4:
// moe_partial_pitch) to the workspace rows of its pairs; moe_gemm_splitk_reduce then sums the
// splits in ascending order (a fixed order: the result is deterministic, no atomics) and applies
// the epilogue (it also zeroes the unserved rows; the split GEMM's blocks without an expert only
// exit).
//
// The align outputs are device data and are checked (k3/checks.h) where they are read: once per
// block num_tokens_post_padded (a multiple of block_m in [0, max_padded]) and the block's expert
// id (in [-1, experts)), once per row its sorted token id (in [0, pairs], pairs = the padding
// sentinel). A bad block is treated as one without an expert (its listed rows are zeroed), a bad
// row as padding, and the first one reported.
// A pair listed twice is not looked for (two blocks then write its row; the CPU reference
// rejects it).
//
// moe_gemm_grouped_mma (bf16 input, bf16 or MXFP4 weights: every operand is exact in bf16, and
// the MXFP8 round trip of a bf16 row stays on bf16's grid; rows contiguous along k and 16-B
// aligned, else the launcher takes moe_gemm_grouped): 4 warps; row chunks of kMmaRM = 64 pairs
// in a 2x2 warp grid of 32 rows x 32 columns, or, in the twin moe_gemm_grouped_m16_mma that the
// launcher takes at block_m <= 16, chunks of 16 pairs in a 1x4 grid of 16 x 16 (so every warp
// issues MMAs on a decode-sized M-block), of the gate (and up) outputs as k3::mma fragments of
// the target's bf16 shape (m16n8k16 mma.sync at warp 32, 16x16x16 MFMA at warp 64), loaded
// from bf16 shared tiles (pitch 144 B: bank-conflict free) through a_coord/b_coord.
// Memory at full width: every lane moves 16-B chunks (8 bf16 of an input or weight row, or 32
// MXFP4 codes = one MX block), k steps of kMmaBK = 64 in a multi-stage pipeline (see
// moe_gemm_mma_block: MXFP4 weights 4 steps deep, 3 on AMD; bf16 weights 2): weights and 16-row
// activation steps by asynchronous copies (cp.async on sm_80+) into rings in shared memory, the
// E8M0 bytes and, on AMD, the weights through registers. MXFP4 stays raw in shared memory and is decoded at
// fragment load (moe_mxfp4.cuh: the e2m1 magnitudes' f32 bytes by table lookups, or sm_100a/103a's
// fp4 convert, one multiply by the E8M0 scale, exact, the bf16 value as the product's high half;
// gfx950's scaled convert where it is exact). Both operands' fragments read k through
// k3::mma::k_perm, so a lane's B slots are adjacent k: one 8-byte load (bf16) or two adjacent
// code bytes (MXFP4) per fragment. Fragments of
// 16-row groups without a pair, and column fragments past n, are skipped (warp-uniform tests);
// a chunk without any pair is skipped whole. Dense and MXFP4 weights reach the MMAs as the same bf16
// operands in the same order, so MXFP4 results equal the bf16 twin's bit for bit.
//
// moe_gemm_grouped_m16{,_splitk}_mma_f32a (f32 input at block_m <= 16: model-k3's activations at
// decode, with bf16 or MXFP4 weights): the 16-row kernels with the activation ring holding the f32
// rows as they are (16-B chunks of 4 values, cp.async on NVIDIA); each A fragment load splits its
// values into three bf16 planes whose sum is the f32 value exactly (mma_f32_planes.cuh), and each
// weight fragment, read and decoded once, meets the three planes in three MMAs: the products are
// exact, so the f32 input is never rounded. See MoeMmaSharedF32 for the ring's layout.
//
// moe_gemm_grouped (f32 weights, f32 input in larger M-blocks, other layouts: the spec decodes
// exactly to f32, and an f32 operand is never rounded to bf16): 256 threads, SIMT f32 FMA, row
// chunks of kMoeRM = 16 (stopping at the first padding sentinel), f32 shared tiles; each thread
// owns one column and kMoeRM / 4 rows and accumulates every output in ascending k (the contract's
// sequential order), the same order for dense and MXFP4 weights (so MXFP4 equals the bf16 twin bit
// for bit here too).
#include "k3/compat.h"
#include "moe_mxfp4.cuh"
#include "mma_f32_planes.cuh"

namespace {

constexpr int kMoeThreads = 256;
constexpr int kMoeRM = 16;  // rows per chunk
constexpr int kMoeBN = 64;  // output columns per block
constexpr int kMoeBK = 32;  // k per step (= the MX block)
constexpr int kMoeRowsPerThread = kMoeRM * kMoeBN / kMoeThreads;
constexpr int kMoeRowStep = kMoeThreads / kMoeBN;

// E2M1 magnitude code (0..7) -> 0, 0.5, 1, 1.5, 2, 3, 4, 6 (exact).
K3_DEVICE float moe_e2m1(unsigned code) {
  const unsigned m = code & 7u;
  float v = m < 2u ? 0.5f * static_cast<float>(m)
                   : (1.0f + 0.5f * static_cast<float>(m & 1u)) * static_cast<float>(1u << ((m >> 1) - 1u));
  return (code & 8u) != 0 ? -v : v;
}

// 2^e for e in [-127, 127] as an exact f32.
K3_DEVICE float moe_pow2(int e) {
  return e >= -126 ? k3::uint_as_float(static_cast<uint32_t>(e + 127) << 23) : k3::uint_as_float(0x00400000u);
}

// floor(log2 a) of a finite a > 0 (subnormals included).
K3_DEVICE int moe_floor_log2(float a) {
  const uint32_t u = k3::float_as_uint(a);
  const int ef = static_cast<int>(u >> 23);
  if (ef != 0) return ef - 127;
  int e = -127;
  for (uint32_t m = u & 0x7fffffu; (m & 0x400000u) == 0; m <<= 1) --e;
  return e;
}

// The max of v over aligned groups of `lanes` consecutive lanes (a power of two up to the warp),
// 1 when any of them has a NaN or Inf (bad = 1: its own flag, or-reduced alongside).
K3_DEVICE float moe_block_max(float amax, float& bad, int lanes) {
  for (int off = lanes / 2; off > 0; off >>= 1) {
    const float oa = k3::shfl_xor(amax, off);
    const float ob = k3::shfl_xor(bad, off);
    amax = oa > amax ? oa : amax;
    bad = ob > bad ? ob : bad;
  }
  return amax;
}

// The MXFP8 round trip of v (formats::Mxfp8Block::quantize then dequantize) in a block whose
// largest magnitude is amax (bad: the block holds a NaN or Inf).
K3_DEVICE float moe_mxfp8_apply(float v, float amax, float bad) {
  if (bad != 0.0f) return k3::uint_as_float(0x7fc00000u);
  if (amax == 0.0f) return v;
  int x = moe_floor_log2(amax) - 8;  // E4M3's largest exponent is 8
  x = x < -127 ? -127 : (x > 127 ? 127 : x);
  const uint8_t code = k3::f32_to_e4m3fn(v * moe_pow2(-x));
  return k3::e4m3fn_to_f32(code) * moe_pow2(x);
}

// The MXFP8 round trip of v, one of the 32 values of a block held by 32 consecutive lanes.
// Every lane of the warp must call it.
K3_DEVICE float moe_mxfp8_round_trip(float v) {
  float bad = (v - v) != 0.0f || v != v ? 1.0f : 0.0f;  // NaN or +-Inf
  const float amax = moe_block_max(k3::abs_f32(v), bad, 32);
  return moe_mxfp8_apply(v, amax, bad);
}

// The expert of M-block `blk`, or -1 when the block lies past num_tokens_post_padded or has no
// expert (-1 from an expert map, or an invalid count or id, reported through err).
K3_DEVICE int moe_block_expert(int blk, int block_m, const int* num_post_padded, int max_padded,
                               const int* expert_ids, int64_t eid_s0, int experts, k3::ErrorRecord* err) {
  const int used = *num_post_padded;
  if (used < 0 || used > max_padded) {
    k3::record_violation(err, k3::kCheckMoeGemmPostPadded, k3::kCheckRange, 0, -1, used, 0, static_cast<int64_t>(max_padded) + 1);
    return -1;
  }
  if (used % block_m != 0) {
    k3::record_violation(err, k3::kCheckMoeGemmPostPadded, k3::kCheckMultiple, 0, -1, used, block_m, 0);
    return -1;
  }
  if (blk * block_m >= used) return -1;
  const int e = expert_ids[blk * eid_s0];
  if (e < -1 || e >= experts) {
    k3::record_violation(err, k3::kCheckMoeGemmExpertIds, k3::kCheckRange, blk, -1, e, -1, experts);
    return -1;
  }
  return e;
}

// The pair of entry i of sorted_token_ids, whose value is p; -1 for the padding sentinel or a
// value outside [0, pairs] (reported through err).
K3_DEVICE int moe_entry_pair(int64_t i, int p, int pairs, k3::ErrorRecord* err) {
  if (p < 0 || p > pairs) {
    k3::record_violation(err, k3::kCheckMoeGemmSortedTokenIds, k3::kCheckRange, i, -1, p, 0, static_cast<int64_t>(pairs) + 1);
    return -1;
  }
  return p < pairs ? p : -1;
}

// The pair of row `row` of M-block `blk`; -1 for the padding sentinel, a row past the block, or
// an entry outside [0, pairs] (reported through err).
K3_DEVICE int moe_row_pair(const int* sorted, int64_t sorted_s0, int blk, int block_m, int row, int pairs,
                           k3::ErrorRecord* err) {
  if (row >= block_m) return -1;
  const int64_t i = static_cast<int64_t>(blk) * block_m + row;
  return moe_entry_pair(i, sorted[i * sorted_s0], pairs, err);
}

// The sorted id of row `row` of M-block `blk` (the split-k reduce and the 16-row GEMMs read a
// block's ids once, one per thread, then check them with moe_entry_pair). Every thread of the
// block loads, with no branch around the load (a thread that needs no id passes row 0), so the
// block's expert-id reads go out while it is in flight. In bounds: the grid has at most
// max_padded / block_m M-blocks (the launcher's), and the index is clamped to sorted_token_ids'
// length.
K3_DEVICE int moe_read_row_id(const int* sorted, int64_t sorted_s0, int blk, int block_m, int row, int max_padded) {
  const int64_t i = static_cast<int64_t>(blk) * block_m + row;
  return sorted[(i < max_padded ? i : max_padded - 1) * sorted_s0];
}

// Rows of an M-block when the block has no expert (moe_block_expert returned -1): the align op
// puts the pairs no expert serves (dropped by an expert map, or with an invalid id) right after
// the served runs, packed, so the entries before the block's first sentinel are such pairs;
// columns j, j + j_step, ... < j_end of their rows are written as zeros. row_id(r) is the sorted
// id of the block's row r (entry first + r of sorted_token_ids, or where a kernel staged it),
// r < rows. Uniform over the threads that call it (all read the same ids).
template <class RowId>
K3_DEVICE void moe_zero_unserved_rows(RowId row_id, int64_t first, int rows, int pairs, void* out, int out_dt,
                                      int64_t out_s0, int64_t out_s1, int j, int j_end, int j_step,
                                      k3::ErrorRecord* err) {
  for (int r = 0; r < rows; ++r) {
    const int p = moe_entry_pair(first + r, row_id(r), pairs, err);
    if (p < 0) return;
    for (int c = j; c < j_end; c += j_step) k3::store_f32(out, out_dt, p * out_s0 + c * out_s1, 0.0f);
  }
}

// Floats per half of a split-k partial row: n rounded up to 4, so every split's gate and up
// halves of every pair start on a 16-byte boundary (the workspace is 256-byte aligned) and the
// reduce reads 4 columns in one load for any n; the pad columns are never written nor stored.
// The launcher sizes the workspace with the same rounding (kernels/src/ops/moe_gemm.rs).
K3_DEVICE int64_t moe_partial_pitch(int n) { return (static_cast<int64_t>(n) + 3) & ~static_cast<int64_t>(3); }

// Column tiles of an n-column output, and the k split of a split GEMM's block (its grid.y runs
// over split x tiles + tile). The split GEMM's epilogue finds its partial rows from these and the
// kernel's arguments instead of a pointer computed before the k loop: that pointer stayed live
// across the loop and held the f32a split kernel at 144 registers on sm_90a (3 blocks per SM;
// 12 B of spills when bounded to 128), now 128 without spills (4 blocks).
K3_DEVICE int moe_column_tiles(int n) { return (n + kMoeBN - 1) / kMoeBN; }
K3_DEVICE int64_t moe_split_of_block(int n) { return static_cast<int>(k3::block_idx_y()) / moe_column_tiles(n); }

// moe_zero_unserved_rows over the block's column tile [n0, min(n0 + kMoeBN, n)), the ids read
// from sorted_token_ids.
K3_DEVICE void moe_zero_unserved_tile(const int* sorted, int64_t sorted_s0, int blk, int block_m, int pairs, void* out,
                                      int out_dt, int64_t out_s0, int64_t out_s1, int n0, int n, k3::ErrorRecord* err) {
  const int64_t first = static_cast<int64_t>(blk) * block_m;
  const int end = n0 + kMoeBN < n ? n0 + kMoeBN : n;
  moe_zero_unserved_rows([&](int r) { return sorted[(first + r) * sorted_s0]; }, first, block_m, pairs, out, out_dt,
                         out_s0, out_s1, n0 + static_cast<int>(k3::thread_idx_x()), end,
                         static_cast<int>(k3::block_dim_x()), err);
}

}  // namespace

K3_KERNEL void moe_gemm_grouped(const void* input, int in_dt, int64_t in_s0, int64_t in_s1, const void* weight,
                                int w_dt, int64_t w_s0, int64_t w_s1, int64_t w_s2, const uint8_t* scale,
                                int64_t sc_s0, int64_t sc_s1, int64_t sc_s2, const int* sorted, int64_t sorted_s0,
                                const int* expert_ids, int64_t eid_s0, const int* num_post_padded,
                                const float* topk_weights, int64_t tw_s0, int64_t tw_s1, void* out, int out_dt,
                                int64_t out_s0, int64_t out_s1, int pairs, int top_k, int experts, int block_m, int k,
                                int n, int max_padded, int gate_up, float beta, float linear_beta, int mxfp8,
                                int k_chunk, float* partial, k3::ErrorRecord* err) {
  (void)k_chunk, (void)partial;  // never split over k (the launcher sends k_chunk >= k, no partial)
  K3_SHARED(float, a_tile, [kMoeRM][kMoeBK + 1]);
  K3_SHARED(float, w_tile, [2 * kMoeBN][kMoeBK + 1]);
  K3_SHARED(int, row_pair, [kMoeRM]);

  const int tid = static_cast<int>(k3::thread_idx_x());
  const int blk = static_cast<int>(k3::block_idx_x());
  const int n0 = static_cast<int>(k3::block_idx_y()) * kMoeBN;
  const int e = moe_block_expert(blk, block_m, num_post_padded, max_padded, expert_ids, eid_s0, experts, err);
  if (e < 0) {
    moe_zero_unserved_tile(sorted, sorted_s0, blk, block_m, pairs, out, out_dt, out_s0, out_s1, n0, n, err);
    return;
  }

  const int col = tid % kMoeBN;
  const int row0 = tid / kMoeBN;
  const int w_rows = gate_up ? 2 * kMoeBN : kMoeBN;
  for (int m0 = 0; m0 < block_m; m0 += kMoeRM) {
    if (tid < kMoeRM) row_pair[tid] = moe_row_pair(sorted, sorted_s0, blk, block_m, m0 + tid, pairs, err);
    k3::sync_threads();
    if (row_pair[0] < 0) break;  // runs are packed: the rest of the block is padding

    float acc_g[kMoeRowsPerThread];
    float acc_u[kMoeRowsPerThread];
    for (int i = 0; i < kMoeRowsPerThread; ++i) acc_g[i] = acc_u[i] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += kMoeBK) {
      const int kn = k - k0 < kMoeBK ? k - k0 : kMoeBK;
      // Gather the chunk's input rows; lanes map to consecutive k of one row.
      for (int idx = tid; idx < kMoeRM * kMoeBK; idx += kMoeThreads) {
        const int r = idx / kMoeBK;
        const int kk = idx % kMoeBK;
        const int p = row_pair[r];
        float v = 0.0f;
        if (p >= 0 && kk < kn) {
          const int64_t in_row = gate_up ? p / top_k : p;
          v = k3::load_f32(input, in_dt, in_row * in_s0 + static_cast<int64_t>(k0 + kk) * in_s1);
        }
        if (mxfp8) v = moe_mxfp8_round_trip(v);  // k % 32 == 0: the 32 lanes hold one MX block
        a_tile[r][kk] = v;
      }
      // Decode the expert's weight rows of this tile.
      for (int idx = tid; idx < w_rows * kMoeBK; idx += kMoeThreads) {
        const int lr = idx / kMoeBK;
        const int kk = idx % kMoeBK;
        const int j = n0 + lr % kMoeBN;
        float v = 0.0f;
        if (j < n && kk < kn) {
          const int64_t row = lr < kMoeBN ? j : n + j;
          const int64_t kc = k0 + kk;
          if (scale != nullptr) {
            const uint8_t byte = static_cast<const uint8_t*>(weight)[e * w_s0 + row * w_s1 + (kc / 2) * w_s2];
            const float s = k3::load_f32(scale, k3::kE8M0, e * sc_s0 + row * sc_s1 + (kc / kMoeBK) * sc_s2);
            v = moe_e2m1((kc & 1) != 0 ? byte >> 4 : byte & 0x0fu) * s;
          } else {
            v = k3::load_f32(weight, w_dt, e * w_s0 + row * w_s1 + kc * w_s2);
          }
        }
        w_tile[lr][kk] = v;
      }
      k3::sync_threads();
      for (int kk = 0; kk < kn; ++kk) {
        const float wg = w_tile[col][kk];
        const float wu = gate_up ? w_tile[kMoeBN + col][kk] : 0.0f;
        for (int i = 0; i < kMoeRowsPerThread; ++i) {
          const float a = a_tile[row0 + i * kMoeRowStep][kk];
          acc_g[i] += a * wg;
          acc_u[i] += a * wu;
        }
      }
      k3::sync_threads();  // tiles are consumed before the next step overwrites them
    }

    const int j = n0 + col;
    for (int i = 0; i < kMoeRowsPerThread; ++i) {
      const int p = row_pair[row0 + i * kMoeRowStep];
      if (p < 0 || j >= n) continue;
      float v;
      if (gate_up) {
        v = k3::situ_glu_f32(acc_g[i], acc_u[i], beta, linear_beta);
      } else {
        v = acc_g[i] * topk_weights[(p / top_k) * tw_s0 + (p % top_k) * tw_s1];
      }
      k3::store_f32(out, out_dt, p * out_s0 + j * out_s1, v);
    }
    k3::sync_threads();  // row_pair is rewritten by the next chunk
  }
}
K3_EXPORT(moe_gemm_grouped);

// One inlined body on the GPUs (an out-of-line call on AMD goes through a scratch stack); the
// host SIMT build has no use for it.
#if K3_TARGET_SIMT
#define MOE_INLINE
#else
#define MOE_INLINE __attribute__((always_inline))
#endif
// The MMA kernel's block size (4 warps), so AMD may give it the whole register file (the default
// bound of 1024 threads caps a lane at 128 VGPRs + AGPRs).
#if K3_TARGET_HIP
#define MOE_MMA_BOUNDS __attribute__((amdgpu_flat_work_group_size(4 * K3_WARP_SIZE, 4 * K3_WARP_SIZE)))
#elif K3_TARGET_CUDA
#define MOE_MMA_BOUNDS __launch_bounds__(128)
#else
#define MOE_MMA_BOUNDS
#endif
// The k-steps of a pipeline step (moe_gemm_mma_block).
#if K3_TARGET_CUDA
#define MOE_UNROLL_K_STEPS K3_UNROLL
#else
#define MOE_UNROLL_K_STEPS
#endif
// The split-k kernels: 4 resident blocks per SM asked for on NVIDIA (<= 128 registers, what the
// shared memory allows on H200; the launcher's split count takes the resident blocks per target
// from a table checked against the resource report, kernels/src/ops/moe_gemm.rs).
#if K3_TARGET_CUDA
#define MOE_MMA_SPLIT_BOUNDS __launch_bounds__(128, 4)
#else
#define MOE_MMA_SPLIT_BOUNDS MOE_MMA_BOUNDS
#endif

namespace {

constexpr int kMmaRM = 64;                          // rows per chunk (block_m > 16: 2x2 warps of 32x32)
constexpr int kMmaSmallRM = 16;                     // rows per chunk at block_m <= 16 (1x4 warps of 16x16)
constexpr int kMmaThreads = 4 * k3::kWarpSize;      // the launcher sends exactly 4 warps
constexpr int kMmaBK = 64;                          // k per pipeline step (two MX blocks)
// bf16 row pitch of the shared tiles: 144 B = 36 words, so the 8 lanes of a 16-B store phase
// (consecutive chunks of one row) fall in distinct banks, and the fragment loads (k-permuted:
// k3::mma::load_a_kperm, load_b_transposed_kperm; on m16n8k16 lane (g, q) reads 8 bytes at
// word 36g + 2q + k/2 of its row) cover each bank exactly twice per 32 lanes, the minimum for
// 256 bytes.
constexpr int kMmaLds = kMmaBK + 8;
constexpr int kBf16Chunk = 8;                       // bf16 per 16-B chunk
constexpr int kBf16ChunksPerRow = kMmaBK / kBf16Chunk;
constexpr int kMxChunkK = 32;                       // k per 16-B MXFP4 chunk = one MX block
constexpr int kMxChunksPerRow = kMmaBK / kMxChunkK;
static_assert(kMmaThreads % kBf16ChunksPerRow == 0, "every thread stages whole activation chunks");

// The MXFP8 round trip of a 16-B chunk held by one lane: 8 bf16 (4 consecutive lanes holding
// the 32 values of one MX block) or, kF32, 4 f32 (8 lanes); the amax and NaN/Inf flag are reduced
// over those lanes. Every lane of the warp must call it.
template <bool kF32>
MOE_INLINE K3_DEVICE k3::u32x4 moe_mxfp8_chunk(k3::u32x4 x) {
  constexpr int kVals = kF32 ? 4 : 8;
  float f[kVals];
  K3_UNROLL
  for (int h = 0; h < 4; ++h) {
    if constexpr (kF32) {
      f[h] = k3::uint_as_float(x.v[h]);
    } else {
      f[2 * h] = k3::uint_as_float(x.v[h] << 16);
      f[2 * h + 1] = k3::uint_as_float(x.v[h] & 0xffff0000u);
    }
  }
  float amax = 0.0f, bad = 0.0f;
  K3_UNROLL
  for (int i = 0; i < kVals; ++i) {
    const float a = k3::abs_f32(f[i]);
    amax = a > amax ? a : amax;
    bad = (f[i] - f[i]) != 0.0f || f[i] != f[i] ? 1.0f : bad;
  }
  amax = moe_block_max(amax, bad, 32 / kVals);
  k3::u32x4 o;
  K3_UNROLL
  for (int h = 0; h < 4; ++h) {
    if constexpr (kF32) {
      o.v[h] = k3::float_as_uint(moe_mxfp8_apply(f[h], amax, bad));
    } else {
      o.v[h] = k3::pack_bf16x2_rn(moe_mxfp8_apply(f[2 * h], amax, bad), moe_mxfp8_apply(f[2 * h + 1], amax, bad));
    }
  }
  return o;
}

// The MMA twin of moe_gemm_grouped's block (see the header). kGateUp selects the stage at compile
// time so the down stage carries no up accumulators. The launcher guarantees 16-B rows: input
// and weights contiguous along k, row strides and base addresses multiples of 16 bytes, k a
// multiple of 8 (of 32 for MXFP4).
//
// Pipeline depth, in steps of kMmaBK = 64 k, and shared memory (static: at most 48 KiB).
//  - MXFP4 weights, 4 steps (3 on AMD): a raw gate/up step is 128 rows x 32 code bytes, kept at a
//    48-B pitch (16-B multiple for the copies; rows at word 12g, so the 8 rows of an m16n8k16 B
//    fragment read distinct banks): 4 x 128 x 48 = 24576 B, inside the two bf16 steps' bytes
//    (2 x 128 x 72 x 2 = 36864; on AMD 3 steps, 18432 B, the size of its one bf16 step), plus
//    4 x 128 x 2 = 1024 B of E8M0 bytes. a_tile's 64 rows hold 4 16-row activation steps. On
//    AMD the codes go through registers with the scales (two register sets, kRegAhead = 2 steps
//    ahead), which is what bounds the ring there; elsewhere they are async copies issued 3
//    steps ahead and only the scale bytes take the register path.
//  - bf16 weights, 2 steps: 2 x 18432 B (3 would be 55296 B with the activations: past 48 KiB).
//    On AMD one step, staged through registers (the HIP AsyncCopy is synchronous): 2 steps would
//    take the block to 47616 B, 1 block per CU on MI300X's 64 KiB instead of 2.
// The block holds 47872 B on NVIDIA and in the emulator: 4 blocks per SM on H200
// (4 x (47872 + 1024 reserved) = 191 KiB of 228), as many as the 16-row kernels' <= 128
// registers allow; on AMD 29184 B, 2 blocks per CU on MI300X.
#if K3_TARGET_HIP
constexpr int kMxStages = 3;
#else
constexpr int kMxStages = 4;
#endif
constexpr int kRegAhead = 2;  // steps ahead the register-staged parts run (near and far sets)
constexpr int kBf16Stages = 2;
#if K3_TARGET_HIP
constexpr int kBf16Tiles = 1;
#else
constexpr int kBf16Tiles = kBf16Stages;
#endif
static_assert(kBf16Tiles > 1 || kMxStages == kRegAhead + 1, "register-staged codes (AMD) ride with their scales");
constexpr int kMxPitch = 48;                        // bytes per staged MXFP4 weight row (32 used)
constexpr int kMxChunk = 16;                        // code bytes per 16-B chunk (kMxChunkK k)

// The block's shared memory, declared once in the kernel for both stages (the down stage uses
// the first kMoeBN weight rows).
struct alignas(16) MoeMmaShared {
  k3::bf16 a_tile[kMmaRM][kMmaLds];
  union {
    k3::bf16 w_tile[kBf16Tiles][2 * kMoeBN][kMmaLds];  // bf16 weights
    uint8_t w_mx[kMxStages][2 * kMoeBN][kMxPitch];      // MXFP4 weights: raw steps
  };
  uint8_t w_scale[kMxStages][2 * kMoeBN][kMxChunksPerRow];  // their E8M0 bytes
  int row_pair[kMmaRM];
  int row_in[kMmaRM];    // the input row of each pair (its token for GateUp), -1 for none
  float row_w[kMmaRM];   // Down: the pair's router weight
};
static_assert(sizeof(MoeMmaShared::w_mx) <= sizeof(MoeMmaShared::w_tile), "the raw ring fits in the bf16 tiles");

// The 16-row kernels' form for f32 activations (kF32A: moe_gemm_grouped_m16*_mma_f32a). The
// activation ring holds the f32 rows as they are (16-B chunks of 4 values); each A fragment load
// splits them into three bf16 planes (mma_f32_planes.cuh) that meet the same B fragment, so the
// products stay exact and the weights are read and decoded once. Row pitch kF32Lds: on m16n8k16
// the 8 lanes of a 16-B load phase read rows g, g + 1 at k_perm columns 4q, which 80 floats
// (16 words mod 32) put in 8 distinct bank quads; the 16x16x16 MFMA's lanes run down the rows at
// one column, which 68 floats (4 words mod 32) spread. The activation slots follow the weights'
// ring (MXFP4 4 steps, bf16 2; on AMD one tile through registers), and each weight format's A and
// W rings share a union with the other's, since f32 rows at the bf16 input's ring depths would
// not fit beside the bf16 weight tiles: 48320 B on NVIDIA and in the emulator at warp 32 (4
// blocks per SM on H200, as the bf16 kernels), 23744 B on AMD (2 blocks per CU on MI300X, 5 on
// MI355X).
#if K3_WARP_SIZE == 32
constexpr int kF32Lds = kMmaBK + 16;
#else
constexpr int kF32Lds = kMmaBK + 4;
#endif
constexpr int kF32Chunk = 4;                           // f32 per 16-B chunk
constexpr int kF32AMxSlots = kBf16Tiles > 1 ? kMxStages : 1;
constexpr int kF32ADenseSlots = kBf16Tiles > 1 ? kBf16Stages : 1;

struct alignas(16) MoeMmaSharedF32 {
  union {
    struct {
      float a_mx[kF32AMxSlots * kMmaSmallRM][kF32Lds];
      uint8_t w_mx[kMxStages][2 * kMoeBN][kMxPitch];
    };
    struct {
      float a_dense[kF32ADenseSlots * kMmaSmallRM][kF32Lds];
      k3::bf16 w_tile[kBf16Tiles][2 * kMoeBN][kMmaLds];
    };
  };
  uint8_t w_scale[kMxStages][2 * kMoeBN][kMxChunksPerRow];
  int row_pair[kMmaSmallRM];
  int row_in[kMmaSmallRM];
  float row_w[kMmaSmallRM];
};

template <bool kF32A>
struct MoeMmaSharedFor {
  typedef MoeMmaShared type;
  typedef k3::bf16 elem;  // of the activation rows
};
template <>
struct MoeMmaSharedFor<true> {
  typedef MoeMmaSharedF32 type;
  typedef float elem;
};

// The first activation row of the block's shared memory: a_tile, or (f32) the ring of the
// weight format's layout.
MOE_INLINE K3_DEVICE k3::bf16* moe_a_rows(MoeMmaShared& sh, bool) { return &sh.a_tile[0][0]; }
MOE_INLINE K3_DEVICE float* moe_a_rows(MoeMmaSharedF32& sh, bool mx) { return mx ? &sh.a_mx[0][0] : &sh.a_dense[0][0]; }

// Issue the asynchronous copies of a 16-row activation step (kChunks 16-B chunks of kChunkK
// elements per thread, T = bf16 or f32) into the ring slot at a_slot, rows kLds elements apart
// (rows without a pair and k past k_end are zero-filled).
template <int kChunks, int kChunkK, int kLds, class T, int kMaxPending>
MOE_INLINE K3_DEVICE void moe_mma_issue_a(k3::AsyncCopy<kMaxPending>& cp, T* a_slot, const int* row_in, int tid,
                                          const T* in, int64_t in_s0, int k0, int k_end) {
  constexpr int kPerRow = kMmaBK / kChunkK;
  K3_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const int q = tid + i * kMmaThreads;
    const int in_row = row_in[q / kPerRow];
    const int kc = k0 + (q % kPerRow) * kChunkK;
    const bool ok = in_row >= 0 && kc < k_end;
    cp.copy_16b_or_zero(a_slot + (q / kPerRow) * kLds + (q % kPerRow) * kChunkK, ok ? in + in_row * in_s0 + kc : in, ok);
  }
}

// Weight chunk q of a step (kPerRow chunks of kChunkK k per tile row): its tile row, the weight
// row it reads (the gate rows, then the up rows at n + j), its first k, and whether it lies in
// the tile, below n and below k_end.
struct MoeWChunk {
  int lr;
  int64_t row;
  int kc;
  bool ok;
};
template <int kWRows, int kPerRow, int kChunkK>
MOE_INLINE K3_DEVICE MoeWChunk moe_w_chunk(int q, int n0, int n, int k0, int k_end) {
  const int lr = q / kPerRow;
  const int j = n0 + lr % kMoeBN;
  const int kc = k0 + (q % kPerRow) * kChunkK;
  return MoeWChunk{lr, lr < kMoeBN ? j : n + j, kc, q < kWRows * kPerRow && j < n && kc < k_end};
}

// Issue an MXFP4 weight step (kMxChunksPerRow chunks of 16 code bytes per row, with one E8M0
// byte each). kCodes: the codes into slot `slot` of w_mx asynchronously (kAsync) or into the
// registers x; kScales: the scale bytes into the registers sc. Chunks past n or k_end read as
// zero codes.
template <int kWRows, bool kAsync, bool kCodes, bool kScales, int kMaxPending, int kChunks, class Sh>
MOE_INLINE K3_DEVICE void moe_mma_issue_mx(k3::AsyncCopy<kMaxPending>& cp, Sh& sh, int slot,
                                           k3::u32x4 (&x)[kAsync ? 1 : kChunks], uint32_t (&sc)[kChunks], int tid,
                                           const uint8_t* codes, int64_t w_s1, const uint8_t* sc_e, int64_t sc_s1,
                                           int64_t sc_s2, int n0, int n, int k0, int k_end) {
  K3_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const int q = tid + i * kMmaThreads;
    if (q >= kWRows * kMxChunksPerRow) break;
    const MoeWChunk c = moe_w_chunk<kWRows, kMxChunksPerRow, kMxChunkK>(q, n0, n, k0, k_end);
    const uint8_t* src = c.ok ? codes + c.row * w_s1 + c.kc / 2 : codes;
    if constexpr (kScales) sc[i] = c.ok ? sc_e[c.row * sc_s1 + (c.kc / kMxChunkK) * sc_s2] : 0u;
    if constexpr (kCodes && kAsync) {
      cp.copy_16b_or_zero(&sh.w_mx[slot][c.lr][(q % kMxChunksPerRow) * kMxChunk], src, c.ok);
    } else if constexpr (kCodes) {
      const k3::u32x4 zero16 = {{0u, 0u, 0u, 0u}};
      x[i] = c.ok ? k3::load_16b(src) : zero16;
    }
  }
}

// Load an activation step (64-row chunks, or 16 rows at warp 64; 16-B chunks of kChunkK
// elements of T) into registers.
template <int kChunks, int kTotal, int kChunkK, class T>
MOE_INLINE K3_DEVICE void moe_mma_load_a(k3::u32x4 (&a)[kChunks], const int* row_in, int tid, const T* in,
                                         int64_t in_s0, int k0, int k_end) {
  constexpr int kPerRow = kMmaBK / kChunkK;
  const k3::u32x4 zero16 = {{0u, 0u, 0u, 0u}};
  K3_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const int q = tid + i * kMmaThreads;
    const int in_row = q < kTotal ? row_in[q / kPerRow] : -1;
    const int kc = k0 + (q % kPerRow) * kChunkK;
    a[i] = in_row >= 0 && kc < k_end ? k3::load_16b(in + in_row * in_s0 + kc) : zero16;
  }
}

// Load a bf16 weight step into registers.
template <int kChunks, int kWRows>
MOE_INLINE K3_DEVICE void moe_mma_load_w(k3::u32x4 (&w)[kChunks], int tid, const k3::bf16* w_e, int64_t w_s1, int n0,
                                         int n, int k0, int k_end) {
  const k3::u32x4 zero16 = {{0u, 0u, 0u, 0u}};
  K3_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const MoeWChunk c = moe_w_chunk<kWRows, kBf16ChunksPerRow, kBf16Chunk>(tid + i * kMmaThreads, n0, n, k0, k_end);
    w[i] = c.ok ? k3::load_16b(w_e + c.row * w_s1 + c.kc) : zero16;
  }
}

// Issue the asynchronous copies of a bf16 weight step into w_tile[slot] (chunks past n or
// k_end zero-filled).
template <int kWRows, int kMaxPending, int kChunks, class Sh>
MOE_INLINE K3_DEVICE void moe_mma_issue_w(k3::AsyncCopy<kMaxPending>& cp, Sh& sh, int slot, int tid,
                                          const k3::bf16* w_e, int64_t w_s1, int n0, int n, int k0, int k_end) {
  K3_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    const int q = tid + i * kMmaThreads;
    if (q >= kWRows * kBf16ChunksPerRow) break;
    const MoeWChunk c = moe_w_chunk<kWRows, kBf16ChunksPerRow, kBf16Chunk>(q, n0, n, k0, k_end);
    cp.copy_16b_or_zero(&sh.w_tile[slot][c.lr][(q % kBf16ChunksPerRow) * kBf16Chunk],
                        c.ok ? w_e + c.row * w_s1 + c.kc : w_e, c.ok);
  }
}

// The B fragment (B[k][n] = W[n][k]) of weight tile rows r.. at k = kk.. from ring slot `slot`:
// a bf16 step, or decoded now from a raw MXFP4 step.
template <class S, bool kMx, class Sh>
MOE_INLINE K3_DEVICE void moe_mma_load_w_frag(k3::mma::FragB<S>& fb, const Sh& sh, int slot, int r, int kk) {
  if constexpr (kMx) {
    moe::load_b_mxfp4(fb, &sh.w_mx[slot][r][0], kMxPitch, &sh.w_scale[slot][r][0], kMxChunksPerRow, kk);
  } else {
    k3::mma::load_b_transposed_kperm(fb, &sh.w_tile[slot][r][kk], kMmaLds);
  }
}

template <class S, bool kGateUp, int kRM, bool kSplit, bool kMx, bool kF32A, class Sh>
MOE_INLINE K3_DEVICE void moe_gemm_mma_block(Sh& sh, int e, const void* input, int64_t in_s0,
                                             const void* weight, int64_t w_s0, int64_t w_s1, const uint8_t* scale,
                                             int64_t sc_s0, int64_t sc_s1, int64_t sc_s2, const int* sorted,
                                             int64_t sorted_s0, const float* topk_weights, int64_t tw_s0,
                                             int64_t tw_s1, void* out, int out_dt, int64_t out_s0, int64_t out_s1,
                                             int pairs, int top_k, int block_m, int n0, int k_begin, int k_end,
                                             int n, float beta, float linear_beta, int mxfp8, float* partial,
                                             float late_w, k3::ErrorRecord* err) {
  using namespace k3::mma;
  static_assert(S::M == 16, "row groups of 16 are fragment rows");
  // The 4 warps tile the kRM x kMoeBN chunk: 2x2 of 32x32 at 64 rows, 1x4 of 16x16 at 16 rows,
  // so at block_m <= 16 every warp has a live row group.
  static_assert(kRM == kMmaRM || kRM == kMmaSmallRM, "64- or 16-row chunks");
  constexpr int kWarpsM = kRM == kMmaRM ? 2 : 1;
  constexpr int kWarpsN = 4 / kWarpsM;
  constexpr int kFragsM = kRM / kWarpsM / S::M;
  constexpr int kFragsN = kMoeBN / kWarpsN / S::N;
  static_assert(kFragsM >= 1 && kFragsN >= 1, "a warp tile holds whole fragments");
  static_assert(!kF32A || kRM == kMmaSmallRM, "f32 activations take the 16-row kernels");
  constexpr int kWRows = kGateUp ? 2 * kMoeBN : kMoeBN;
  // The activation rows: bf16, or f32 (kF32A) split into three planes at fragment load.
  typedef typename MoeMmaSharedFor<kF32A>::elem AElem;
  constexpr int kAChunkK = kF32A ? kF32Chunk : kBf16Chunk;  // k per 16-B chunk
  constexpr int kAPerRow = kMmaBK / kAChunkK;
  constexpr int kALds = kF32A ? kF32Lds : kMmaLds;
  constexpr int kPlanes = kF32A ? 3 : 1;
  // Chunks each thread stages per step: activations, bf16 weights, MXFP4 weights (the last two
  // rounded up; chunk ids past the tile stage nothing).
  constexpr int kATotal = kRM * kAPerRow;
  constexpr int kAChunks = (kATotal + kMmaThreads - 1) / kMmaThreads;
  constexpr int kWChunks = (kWRows * kBf16ChunksPerRow + kMmaThreads - 1) / kMmaThreads;
  constexpr int kXChunks = (kWRows * kMxChunksPerRow + kMmaThreads - 1) / kMmaThreads;
  // What goes through asynchronous copies (see the pipeline below): 16-row activation steps
  // when the ring holds kStages of them and every thread copies whole chunks (bf16: a_tile's 64
  // rows; f32: MoeMmaSharedF32's slots, except on AMD); MXFP4 codes except on AMD.
  constexpr int kStages = kMx ? kMxStages : kBf16Stages;
  constexpr bool kAsyncW = kBf16Tiles > 1;  // weights (MXFP4 codes or bf16 rows) by async copies
  constexpr bool kAsyncA = (kF32A ? kAsyncW : kRM * kStages <= kMmaRM) && kATotal % kMmaThreads == 0;
  constexpr bool kRegW = !kMx && !kAsyncW;  // bf16 weights through registers into one tile (AMD)
  constexpr int kAsyncPerStep = (kAsyncA ? kAChunks : 0) + (kAsyncW ? (kMx ? kXChunks : kWChunks) : 0);
  constexpr int kMaxPending = kAsyncPerStep > 0 ? (kStages - 1) * kAsyncPerStep : 1;
  // The register-staged MXFP4 parts (E8M0 bytes; AMD's codes) run kRegAhead steps ahead in two
  // register sets, the async ring kStages - 1 ahead; on AMD the two are the same step.
  static_assert(!kMx || kStages >= kRegAhead + 1, "the ring reaches at least as far as the registers");
  constexpr bool kMxTogether = kStages == kRegAhead + 1;  // codes and scales of one step at once

  AElem* const a_rows = moe_a_rows(sh, kMx);
  auto& w_tile = sh.w_tile[0];  // the single bf16 tile of the register path
  int* row_pair = sh.row_pair;
  int* row_in = sh.row_in;
  float* row_w = sh.row_w;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int blk = static_cast<int>(k3::block_idx_x());

  const int warp = static_cast<int>(k3::warp_id());
  const int wm = (warp / kWarpsN) * (kRM / kWarpsM);
  const int wn = (warp % kWarpsN) * (kMoeBN / kWarpsN);
  // Column fragments wholly past n are skipped (warp-uniform, like the row fragments below).
  bool col_live[kFragsN];
  K3_UNROLL
  for (int j = 0; j < kFragsN; ++j) col_live[j] = n0 + wn + j * S::N < n;
  const AElem* in_a = static_cast<const AElem*>(input);
  const k3::bf16* w_bf16 = static_cast<const k3::bf16*>(weight) + e * w_s0;
  const uint8_t* w_mx = static_cast<const uint8_t*>(weight) + e * w_s0;
  const uint8_t* sc_e = scale != nullptr ? scale + e * sc_s0 : nullptr;
  const int steps = (k_end - k_begin + kMmaBK - 1) / kMmaBK;

  // The 16-row kernels run one chunk (their launcher sends block_m <= 16), whose rows the kernel
  // staged before the block (moe_gemm_mma_kernel); the 64-row kernel stages each chunk's here.
  // The bound says "once" to the compiler: as min(block_m, 16) the loop kept state live across
  // its back edge (sm_90a: 128 registers and 32 B of stack in the 16-row kernel, 118 and none).
  constexpr bool kRowsStaged = kRM == kMmaSmallRM;
  const int m_end = kRowsStaged ? 1 : block_m;
  for (int m0 = 0; m0 < m_end; m0 += kRM) {
    if (!kRowsStaged && tid < kRM) {
      const int p = moe_row_pair(sorted, sorted_s0, blk, block_m, m0 + tid, pairs, err);
      row_pair[tid] = p;
      row_in[tid] = p < 0 ? -1 : (kGateUp ? p / top_k : p);
      if (!kGateUp) row_w[tid] = p < 0 ? 0.0f : topk_weights[(p / top_k) * tw_s0 + (p % top_k) * tw_s1];
    }
    k3::sync_threads();
    // Which 16-row groups of the chunk hold a pair: fragments of empty groups are neither
    // multiplied nor stored, and an empty chunk is skipped (the same value in every thread).
    unsigned live_groups = 0;
    for (int r = 0; r < kRM; ++r) live_groups |= row_pair[r] >= 0 ? 1u << (r / 16) : 0u;
    if (live_groups == 0) {
      k3::sync_threads();  // row_pair is rewritten by the next chunk
      continue;
    }
    bool row_live[kFragsM];
    K3_UNROLL
    for (int i = 0; i < kFragsM; ++i) row_live[i] = ((live_groups >> ((wm + i * S::M) / 16)) & 1u) != 0;

    FragC<S> acc_g[kFragsM][kFragsN];
    FragC<S> acc_u[kGateUp ? kFragsM : 1][kGateUp ? kFragsN : 1];
    K3_UNROLL
    for (int i = 0; i < kFragsM; ++i) {
      K3_UNROLL
      for (int j = 0; j < kFragsN; ++j) {
        fill(acc_g[i][j], 0.0f);
        if constexpr (kGateUp) fill(acc_u[i][j], 0.0f);
      }
    }

    // The k pipeline, kStages deep. Step t lands in slot t % kStages of its ring, or in a single
    // tile:
    //  - asynchronous (k3::AsyncCopy: cp.async on sm_80+, deferred copies in the emulator): the
    //    activations of 16-row chunks (a_tile's 64 rows hold kStages 16-row slots) and, except on
    //    AMD, the weights (raw MXFP4 code bytes into w_mx, bf16 rows into w_tile), issued
    //    kStages - 1 iterations ahead; each thread waits for its own copies before the barrier.
    //  - through registers, loaded kRegAhead = 2 iterations ahead and stored into their ring slot
    //    before iteration t's barrier: the E8M0 bytes (w_scale; cp.async moves 4 B at least, a
    //    step has 2 B per row), and on AMD the code bytes too (the HIP AsyncCopy is a synchronous
    //    register copy: issued ahead it would stall; see k3/async_copy.h). Two register sets
    //    (steps s + 1 and s + 2); where the ring is deeper than that (MXFP4 on NVIDIA and in the
    //    emulator: codes 3 steps ahead), a step's scales follow its codes by one iteration.
    //  - through registers into a single tile, loaded one iteration ahead: the activations of
    //    64-row chunks (or at warp 64, where 16 rows are half a chunk per thread) and the bf16
    //    weights on AMD; a second barrier then ends the iteration.
    // MXFP4 is decoded at fragment load (moe::load_b_mxfp4) into the bf16 values the dense twin
    // stores, which then meet the same MMAs in the same order.
    k3::AsyncCopy<kMaxPending> cp;
    k3::u32x4 a_reg[kAsyncA ? 1 : kAChunks];
    k3::u32x4 w_reg[kRegW ? kWChunks : 1];
    k3::u32x4 x_near[kAsyncW ? 1 : kXChunks], x_far[kAsyncW ? 1 : kXChunks];  // codes, steps t+1, t+2 (AMD)
    uint32_t sc_near[kMx ? kXChunks : 1] = {}, sc_far[kMx ? kXChunks : 1] = {};  // E8M0 bytes, same steps
    // Iterations s < 0 only issue (the first kStages - 1 steps). One commit group per
    // iteration, empty or not, so wait<kStages - 2> counts steps.
    K3_NO_UNROLL
    for (int s = 1 - kStages; s < steps; ++s) {
      const int slot = s < 0 ? 0 : s % kStages;
      if (s >= 0) {
        cp.template wait<kStages - 2>();  // this thread's copies of step s landed
        if constexpr (kAsyncA) {
          if (mxfp8) {
            // The MXFP8 round trip in place, on the chunks this thread copied itself.
            K3_UNROLL
            for (int i = 0; i < kAChunks; ++i) {
              const int q = tid + i * kMmaThreads;
              AElem* dst = a_rows + (slot * kRM + q / kAPerRow) * kALds + (q % kAPerRow) * kAChunkK;
              k3::store_16b(dst, moe_mxfp8_chunk<kF32A>(k3::load_16b(dst)));  // the lanes of an MX block
            }
          }
        } else {
          K3_UNROLL
          for (int i = 0; i < kAChunks; ++i) {
            const int q = tid + i * kMmaThreads;
            const k3::u32x4 v = mxfp8 ? moe_mxfp8_chunk<kF32A>(a_reg[i]) : a_reg[i];  // the lanes of an MX block
            if (kATotal % kMmaThreads != 0 && q >= kATotal) break;
            k3::store_16b(a_rows + (q / kAPerRow) * kALds + (q % kAPerRow) * kAChunkK, v);
          }
        }
        if constexpr (kRegW) {
          K3_UNROLL
          for (int i = 0; i < kWChunks; ++i) {
            const int q = tid + i * kMmaThreads;
            if (q >= kWRows * kBf16ChunksPerRow) break;
            k3::store_16b(&w_tile[q / kBf16ChunksPerRow][(q % kBf16ChunksPerRow) * kBf16Chunk], w_reg[i]);
          }
        }
      }
      if constexpr (kMx) {
        K3_UNROLL
        for (int i = 0; i < kXChunks; ++i) {
          const int q = tid + i * kMmaThreads;
          if (q >= kWRows * kMxChunksPerRow) break;
          if (s >= 0) {
            sh.w_scale[slot][q / kMxChunksPerRow][q % kMxChunksPerRow] = static_cast<uint8_t>(sc_near[i]);
            if constexpr (!kAsyncW) {
              k3::store_16b(&sh.w_mx[slot][q / kMxChunksPerRow][(q % kMxChunksPerRow) * kMxChunk], x_near[i]);
            }
          }
          sc_near[i] = sc_far[i];
          if constexpr (!kAsyncW) x_near[i] = x_far[i];
        }
      }
      k3::sync_threads();
      // Issue ahead: step s + kStages - 1 into the ring slot step s - 1 used (every warp is past
      // it: the barrier above), and step s + 1 into the registers of the single tiles.
      const int t = s + kStages - 1;
      if (t < steps) {
        if constexpr (kAsyncA) {
          moe_mma_issue_a<kAChunks, kAChunkK, kALds>(cp, a_rows + (t % kStages) * kRM * kALds, row_in, tid, in_a, in_s0,
                                                     k_begin + t * kMmaBK, k_end);
        }
        if constexpr (kMx) {
          moe_mma_issue_mx<kWRows, kAsyncW, true, kMxTogether>(cp, sh, t % kStages, x_far, sc_far, tid, w_mx, w_s1, sc_e,
                                                                sc_s1, sc_s2, n0, n, k_begin + t * kMmaBK, k_end);
        } else if constexpr (kAsyncW) {
          moe_mma_issue_w<kWRows, kMaxPending, kWChunks>(cp, sh, t % kStages, tid, w_bf16, w_s1, n0, n,
                                                         k_begin + t * kMmaBK, k_end);
        }
      }
      if constexpr (kMx && !kMxTogether) {
        // The E8M0 bytes of step s + kRegAhead into the far set (its codes were issued earlier).
        const int t2 = s + kRegAhead;
        if (t2 >= 0 && t2 < steps) {
          moe_mma_issue_mx<kWRows, kAsyncW, false, true>(cp, sh, t2 % kStages, x_far, sc_far, tid, w_mx, w_s1, sc_e,
                                                          sc_s1, sc_s2, n0, n, k_begin + t2 * kMmaBK, k_end);
        }
      }
      cp.commit();
      if (s + 1 >= 0 && s + 1 < steps) {
        const int k1 = k_begin + (s + 1) * kMmaBK;
        if constexpr (!kAsyncA) moe_mma_load_a<kAChunks, kATotal, kAChunkK>(a_reg, row_in, tid, in_a, in_s0, k1, k_end);
        if constexpr (kRegW) moe_mma_load_w<kWChunks, kWRows>(w_reg, tid, w_bf16, w_s1, n0, n, k1, k_end);
      }
      if (s < 0) continue;

      const int k0 = k_begin + s * kMmaBK;
      const int kn = k_end - k0 < kMmaBK ? k_end - k0 : kMmaBK;
      const int a_base = kAsyncA ? slot * kRM : 0;
      const int w_slot = kRegW ? 0 : slot;
      // Ascending k, one fragment step at a time: the same order for dense and MXFP4 weights.
      // Columns past k hold zeros in both tiles. f32 activations: the hi, mid and lo planes'
      // products in that order, over the whole step (a tail step's zero columns add 0), unrolled
      // on NVIDIA: over kn nvcc kept the planes' loop rolled (sm_90a: 146 registers, 3 blocks per
      // SM; unrolled: 128, 4). On AMD the pragma gave gfx942's bf16 split kernel 2 SGPR spills.
      const int kk_end = kF32A ? kMmaBK : kn;
      MOE_UNROLL_K_STEPS
      for (int kk = 0; kk < kk_end; kk += S::K) {
        FragA<S> fa[kFragsM][kPlanes];
        K3_UNROLL
        for (int i = 0; i < kFragsM; ++i) {
          if (!row_live[i]) continue;
          const AElem* at = a_rows + (a_base + wm + i * S::M) * kALds + kk;
          if constexpr (kF32A) {
            f32planes::load_a_split3<S>(fa[i], at, kALds);
          } else {
            load_a_kperm(fa[i][0], at, kALds);
          }
        }
        K3_UNROLL
        for (int j = 0; j < kFragsN; ++j) {
          if (!col_live[j]) continue;
          // B[k][n] = W[n][k]: the weight tile is B transposed.
          FragB<S> fb;
          moe_mma_load_w_frag<S, kMx>(fb, sh, w_slot, wn + j * S::N, kk);
          K3_UNROLL
          for (int i = 0; i < kFragsM; ++i) {
            K3_UNROLL
            for (int pl = 0; pl < kPlanes; ++pl) {
              if (row_live[i]) mma_sync(acc_g[i][j], fa[i][pl], fb, acc_g[i][j]);
            }
          }
          if constexpr (kGateUp) {
            moe_mma_load_w_frag<S, kMx>(fb, sh, w_slot, kMoeBN + wn + j * S::N, kk);
            K3_UNROLL
            for (int i = 0; i < kFragsM; ++i) {
              K3_UNROLL
              for (int pl = 0; pl < kPlanes; ++pl) {
                if (row_live[i]) mma_sync(acc_u[i][j], fa[i][pl], fb, acc_u[i][j]);
              }
            }
          }
        }
      }
      if (!kAsyncA || kRegW) k3::sync_threads();  // the single tiles are consumed before the next store
    }
    if constexpr (kRowsStaged && !kGateUp && !kSplit) {
      // The router weights the kernel's threads 0..15 loaded before the block (late_w), stored
      // only now: the epilogue is their one use, so their load ran under the pipeline.
      if (tid < kRM) row_w[tid] = late_w;
      k3::sync_threads();
    }

    // Epilogue from the fragments: the gate and up accumulators of a slot share (row, col).
    // Split over k: the raw accumulators go to this split's partial rows (gate at col, up at
    // pitch + col), and moe_gemm_splitk_reduce sums the splits in order and applies the epilogue.
    // Where the C slots pair up along a row (warp 32), two adjacent columns go into the partial
    // rows in one 8-byte store (16-B aligned workspace, even pitch). The output path keeps one
    // store per slot: pairing it there too grew the m16 kernel's code by half on sm_90a for
    // stores that are a small part of its traffic.
    constexpr int kStep = kSplit && k3::mma::c_pairs_adjacent<S>() ? 2 : 1;
    K3_UNROLL
    for (int i = 0; i < kFragsM; ++i) {
      if (!row_live[i]) continue;
      K3_UNROLL
      for (int j = 0; j < kFragsN; ++j) {
        if (!col_live[j]) continue;
        K3_UNROLL
        for (int s = 0; s < S::kCSlots; s += kStep) {
          const RC rc = c_coord<S>(s);
          const int p = row_pair[wm + i * S::M + rc.row];
          const int col = n0 + wn + j * S::N + rc.col;
          if (p < 0 || col >= n) continue;
          if constexpr (kSplit) {
            const int64_t pitch = moe_partial_pitch(n);
            float* dst = partial + (moe_split_of_block(n) * pairs + p) * (kGateUp ? 2 * pitch : pitch) + col;
            if (kStep == 2 && col + 1 < n) {  // col is even
              k3::store_f32x2(dst, k3::kF32, 0, acc_g[i][j].x[s], acc_g[i][j].x[s + kStep - 1]);
              if constexpr (kGateUp) k3::store_f32x2(dst, k3::kF32, pitch, acc_u[i][j].x[s], acc_u[i][j].x[s + kStep - 1]);
            } else {
              dst[0] = acc_g[i][j].x[s];
              if constexpr (kGateUp) dst[pitch] = acc_u[i][j].x[s];
            }
            continue;
          }
          float v;
          if constexpr (kGateUp) {
            v = k3::situ_glu_f32(acc_g[i][j].x[s], acc_u[i][j].x[s], beta, linear_beta);
          } else {
            v = acc_g[i][j].x[s] * row_w[wm + i * S::M + rc.row];
          }
          k3::store_f32(out, out_dt, p * out_s0 + col * out_s1, v);
        }
      }
    }
    k3::sync_threads();  // row_pair is rewritten by the next chunk
  }
}

}  // namespace

namespace {

// The MMA kernels' body: the stage picks the block instance (gate/up or down). grid.y runs over
// (k split, column tile): split z covers k in [z * k_chunk, min(k, (z + 1) * k_chunk)), k_chunk a
// multiple of kMmaBK; with more than one split `partial` is the workspace of raw accumulators.
template <int kRM, bool kSplit, bool kF32A>
MOE_INLINE K3_DEVICE void moe_gemm_mma_kernel(const void* input, int64_t in_s0, const void* weight, int64_t w_s0,
                                              int64_t w_s1, const uint8_t* scale, int64_t sc_s0, int64_t sc_s1,
                                              int64_t sc_s2, const int* sorted, int64_t sorted_s0,
                                              const int* expert_ids, int64_t eid_s0, const int* num_post_padded,
                                              const float* topk_weights, int64_t tw_s0, int64_t tw_s1, void* out,
                                              int out_dt, int64_t out_s0, int64_t out_s1, int pairs, int top_k,
                                              int experts, int block_m, int k, int n, int max_padded, int gate_up,
                                              float beta, float linear_beta, int mxfp8, int k_chunk, float* partial,
                                              k3::ErrorRecord* err) {
  typedef typename MoeMmaSharedFor<kF32A>::type Sh;
  K3_SHARED(Sh, sh_block, [1]);
  Sh& sh = sh_block[0];
  const int blk = static_cast<int>(k3::block_idx_x());
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int64_t first = static_cast<int64_t>(blk) * block_m;
  // The 16-row kernels (decode; block_m <= 16, one row chunk) read their rows' sorted ids before
  // the block's expert id, so the two round trips overlap (in the block's chunk loop the ids
  // waited for the expert): lane i of every warp reads row i's id (row 0's past the rows).
  constexpr bool kRowsRead = kRM == kMmaSmallRM;
  const int rows = block_m < kRM ? block_m : kRM;
  const int lane = tid % k3::kWarpSize;
  const bool reader = kRowsRead && tid < rows;
  const int id = kRowsRead ? moe_read_row_id(sorted, sorted_s0, blk, block_m, lane < rows ? lane : 0, max_padded) : 0;
  const int e = moe_block_expert(blk, block_m, num_post_padded, max_padded, expert_ids, eid_s0, experts, err);
  if (e < 0) {
    // The split GEMM leaves its unserved rows to moe_gemm_splitk_reduce.
    if constexpr (!kSplit) {
      const int n0 = static_cast<int>(k3::block_idx_y()) * kMoeBN;
      if constexpr (kRowsRead) {
        // The ids from the lanes that read them (a cold path: pairs an expert map drops).
        moe_zero_unserved_rows([&](int r) { return k3::shfl(id, r); }, first, rows, pairs, out, out_dt, out_s0, out_s1,
                               n0 + tid, n0 + kMoeBN < n ? n0 + kMoeBN : n, static_cast<int>(k3::block_dim_x()), err);
      } else {
        moe_zero_unserved_tile(sorted, sorted_s0, blk, block_m, pairs, out, out_dt, out_s0, out_s1, n0, n, err);
      }
    }
    return;
  }
  // The block's rows (moe_gemm_mma_block's chunk loop, whose barrier orders these stores): pair
  // (checked) and input row. The unsplit down stage's router weight (the split twin's reduce
  // applies it) is loaded here and stored by the block after its k loop, the weight's only use
  // being the epilogue: its round trip runs under the pipeline instead of before it.
  float late_w = 0.0f;
  if (kRowsRead && tid < kRM) {
    const int p = reader ? moe_entry_pair(first + tid, id, pairs, err) : -1;
    sh.row_pair[tid] = p;
    sh.row_in[tid] = p < 0 ? -1 : (gate_up ? p / top_k : p);
    if (!kSplit && !gate_up && p >= 0) late_w = topk_weights[(p / top_k) * tw_s0 + (p % top_k) * tw_s1];
  }
  int n0 = static_cast<int>(k3::block_idx_y()) * kMoeBN, k_begin = 0, k_end = k;
  if constexpr (kSplit) {
    const int split = moe_split_of_block(n);
    n0 = (static_cast<int>(k3::block_idx_y()) % moe_column_tiles(n)) * kMoeBN;
    k_begin = split * k_chunk;
    k_end = k - k_begin < k_chunk ? k : k_begin + k_chunk;
  } else {
    (void)k_chunk, (void)partial;
  }
  // One instance per stage and weight format (MXFP4 decodes at fragment load from a raw ring).
#define MOE_MMA_BLOCK(kGateUp, kMx)                                                                                 \
  moe_gemm_mma_block<k3::mma::Bf16Shape, kGateUp, kRM, kSplit, kMx, kF32A>(                                         \
      sh, e, input, in_s0, weight, w_s0, w_s1, scale, sc_s0, sc_s1, sc_s2, sorted, sorted_s0, topk_weights, tw_s0, \
      tw_s1, out, out_dt, out_s0, out_s1, pairs, top_k, block_m, n0, k_begin, k_end, n, beta, linear_beta, mxfp8,  \
      partial, late_w, err)
  if (gate_up) {
    if (scale != nullptr) {
      MOE_MMA_BLOCK(true, true);
    } else {
      MOE_MMA_BLOCK(true, false);
    }
  } else if (scale != nullptr) {
    MOE_MMA_BLOCK(false, true);
  } else {
    MOE_MMA_BLOCK(false, false);
  }
#undef MOE_MMA_BLOCK
}

}  // namespace

// The MMA kernels: moe_gemm_grouped's arguments (the launcher sends bf16 or MXFP4 weights and
// 16-B rows, see moe_gemm_mma_block: w_dt, in_s1 = w_s2 = 1 are then implied, and in_dt by the
// kernel), 4 warps (4 * kWarpSize threads), one moe_gemm_mma_kernel instance each.
#define MOE_MMA_KERNEL(name, bounds, kRM, kSplit, kF32A)                                                           \
  K3_KERNEL bounds void name(                                                                                      \
      const void* input, int in_dt, int64_t in_s0, int64_t in_s1, const void* weight, int w_dt, int64_t w_s0,      \
      int64_t w_s1, int64_t w_s2, const uint8_t* scale, int64_t sc_s0, int64_t sc_s1, int64_t sc_s2,               \
      const int* sorted, int64_t sorted_s0, const int* expert_ids, int64_t eid_s0, const int* num_post_padded,     \
      const float* topk_weights, int64_t tw_s0, int64_t tw_s1, void* out, int out_dt, int64_t out_s0,              \
      int64_t out_s1, int pairs, int top_k, int experts, int block_m, int k, int n, int max_padded, int gate_up,   \
      float beta, float linear_beta, int mxfp8, int k_chunk, float* partial, k3::ErrorRecord* err) {               \
    (void)in_dt, (void)w_dt, (void)in_s1, (void)w_s2;                                                              \
    moe_gemm_mma_kernel<kRM, kSplit, kF32A>(input, in_s0, weight, w_s0, w_s1, scale, sc_s0, sc_s1, sc_s2, sorted,  \
                                            sorted_s0, expert_ids, eid_s0, num_post_padded, topk_weights, tw_s0,   \
                                            tw_s1, out, out_dt, out_s0, out_s1, pairs, top_k, experts, block_m, k, \
                                            n, max_padded, gate_up, beta, linear_beta, mxfp8, k_chunk, partial,    \
                                            err);                                                                  \
  }

// bf16 input, row chunks of 64 (block_m > 16).
MOE_MMA_KERNEL(moe_gemm_grouped_mma, MOE_MMA_BOUNDS, kMmaRM, false, false)
K3_EXPORT(moe_gemm_grouped_mma);

// bf16 input at block_m <= 16 (decode): row chunks of 16, each warp 16 rows x 16 columns, so all
// 4 warps issue MMAs for a full M-block.
MOE_MMA_KERNEL(moe_gemm_grouped_m16_mma, MOE_MMA_BOUNDS, kMmaSmallRM, false, false)
K3_EXPORT(moe_gemm_grouped_m16_mma);

// moe_gemm_grouped_m16_mma split over k (the launcher's choice at decode sizes): grid.y runs
// over (split, column tile); each block multiplies its k range and writes the raw accumulators
// to `partial` (moe_gemm_splitk_reduce finishes). Its own instance, so the unsplit kernels carry
// neither the k range nor the second store path in their registers.
MOE_MMA_KERNEL(moe_gemm_grouped_m16_splitk_mma, MOE_MMA_SPLIT_BOUNDS, kMmaSmallRM, true, false)
K3_EXPORT(moe_gemm_grouped_m16_splitk_mma);

// The two 16-row kernels for f32 input (moe_gemm_mma_block's kF32A: the activation ring holds
// the f32 rows, each A fragment is split into three exact bf16 planes), block_m <= 16.
MOE_MMA_KERNEL(moe_gemm_grouped_m16_mma_f32a, MOE_MMA_BOUNDS, kMmaSmallRM, false, true)
K3_EXPORT(moe_gemm_grouped_m16_mma_f32a);
MOE_MMA_KERNEL(moe_gemm_grouped_m16_splitk_mma_f32a, MOE_MMA_SPLIT_BOUNDS, kMmaSmallRM, true, true)
K3_EXPORT(moe_gemm_grouped_m16_splitk_mma_f32a);
#undef MOE_MMA_KERNEL

// Rows (4 floats of each at this thread's columns) that sum_rows_in_order loads before adding
// any: every load of a group is issued with no condition (a row index past the last one reads
// the last row again, which is not added), so all of them are in flight together. A rolled loop
// (clang's choice on AMD) waited for each row before issuing the next. 8 covers, in one round
// trip, the split counts kernels/src/ops/moe_gemm.rs picks for K3's gate-up GEMM at batch 1
// (4 on H200, 6 on B300 and MI300X; MI355X's 10 takes two), and half of K3's 16 top-k slots.
constexpr int kSumRowsInFlight = 8;

// a += rows 0 .. count - 1 in ascending order, row z's 4 floats at src + z * stride;
// kPair: b += the 4 floats `second` floats after each (the split-k reduce's up half).
template <bool kPair>
K3_DEVICE void sum_rows_in_order(const float* src, int count, int64_t stride, int64_t second, k3::f32x4& a, k3::f32x4& b) {
  for (int z0 = 0; z0 < count; z0 += kSumRowsInFlight) {
    k3::f32x4 av[kSumRowsInFlight], bv[kSumRowsInFlight];
    const float* at = src + z0 * stride;
    K3_UNROLL
    for (int i = 0; i < kSumRowsInFlight; ++i) {
      av[i] = k3::load_f32x4(at);
      if constexpr (kPair) bv[i] = k3::load_f32x4(at + second);
      if (z0 + i + 1 < count) at += stride;
    }
    // A select, not a branch: behind a branch the compiler sinks the loads of the rows past it.
    K3_UNROLL
    for (int i = 0; i < kSumRowsInFlight; ++i) {
      const bool live = z0 + i < count;  // uniform
      K3_UNROLL
      for (int c = 0; c < 4; ++c) {
        a.v[c] = live ? a.v[c] + av[i].v[c] : a.v[c];
        if constexpr (kPair) b.v[c] = live ? b.v[c] + bv[i].v[c] : b.v[c];
      }
    }
  }
}

// Rows of an M-block whose sorted ids the split-k reduce stages in shared memory: the whole
// block at every block_m it runs at (the split GEMM's, <= 16; the launcher refuses more).
constexpr int kReduceStagedRows = 16;

// The split-k reduction: for every row of a served M-block (the same walk and checks as the
// GEMM) and output column, the splits' raw accumulators summed in ascending split order (fixed:
// the result is deterministic), then the GEMM's epilogue and one rounding; the rows of an
// M-block without an expert are written as zeros (moe_zero_unserved_rows). Grid: (M-blocks,
// column tiles of 4 x the block's threads); each thread owns 4 adjacent columns and reads each
// split's 4 gate partials (and 4 up partials) in one 16-byte load (moe_partial_pitch) for any
// n (no column-at-a-time path). The 4 results go out in one store when the output
// rows are contiguous and aligned (decided from the arguments: uniform), else one at a time.
K3_KERNEL void moe_gemm_splitk_reduce(const float* partial, int splits, const int* sorted, int64_t sorted_s0,
                                      const int* expert_ids, int64_t eid_s0, const int* num_post_padded,
                                      const float* topk_weights, int64_t tw_s0, int64_t tw_s1, void* out,
                                      int out_dt, int64_t out_s0, int64_t out_s1, int pairs, int top_k,
                                      int experts, int block_m, int n, int max_padded, int gate_up, float beta,
                                      float linear_beta, k3::ErrorRecord* err) {
  const int blk = static_cast<int>(k3::block_idx_x());
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int j0 = 4 * static_cast<int>(k3::block_idx_y() * k3::block_dim_x() + k3::thread_idx_x());
  // The rows' sorted ids, staged in shared memory one per thread and read together (checked per
  // row below, as moe_row_pair would): read in the row loop, each row's id waited for the
  // previous row's, a chain of block_m round trips per block at decode, where most rows are
  // padding. The reads go out before the block's expert is read (moe_read_row_id).
  K3_SHARED(int, staged_ids, [kReduceStagedRows]);
  const int rows = block_m < kReduceStagedRows ? block_m : kReduceStagedRows;  // block_m <= 16: checked by the launcher
  const bool stager = tid < rows;
  const int staged = moe_read_row_id(sorted, sorted_s0, blk, block_m, stager ? tid : 0, max_padded);
  const int e = moe_block_expert(blk, block_m, num_post_padded, max_padded, expert_ids, eid_s0, experts, err);
  if (stager) staged_ids[tid] = staged;
  k3::sync_threads();
  if (j0 >= n) return;
  const int cols = n - j0 < 4 ? n - j0 : 4;
  const int64_t first = static_cast<int64_t>(blk) * block_m;
  if (e < 0) {
    moe_zero_unserved_rows([&](int r) { return staged_ids[r]; }, first, rows, pairs, out, out_dt, out_s0, out_s1, j0,
                           j0 + cols, 1, err);
    return;
  }
  const int64_t pitch = moe_partial_pitch(n);
  const int64_t width = gate_up ? 2 * pitch : pitch;
  const int64_t split_stride = static_cast<int64_t>(pairs) * width;
  const bool vec_out = cols == 4 && out_s1 == 1 && out_s0 % 4 == 0 && k3::aligned16(out);
  for (int r = 0; r < rows; ++r) {
    const int p = moe_entry_pair(first + r, staged_ids[r], pairs, err);
    if (p < 0) continue;
    const float* src = partial + p * width + j0;
    k3::f32x4 g = {{0.0f, 0.0f, 0.0f, 0.0f}}, u = {{0.0f, 0.0f, 0.0f, 0.0f}};
    float w = 0.0f;
    if (gate_up) {  // uniform; one loop per stage: a load taken on one path only would be waited for at the merge
      sum_rows_in_order<true>(src, splits, split_stride, pitch, g, u);
    } else {
      w = topk_weights[(p / top_k) * tw_s0 + (p % top_k) * tw_s1];  // read with the partials (it needs p only)
      sum_rows_in_order<false>(src, splits, split_stride, 0, g, u);
    }
    k3::f32x4 v;
    K3_UNROLL
    for (int c = 0; c < 4; ++c) v.v[c] = gate_up ? k3::situ_glu_f32(g.v[c], u.v[c], beta, linear_beta) : g.v[c] * w;
    if (vec_out) {
      k3::store_f32x4(out, out_dt, p * out_s0 + j0, v);
    } else {
      for (int c = 0; c < cols; ++c) {
        // Selects, not v.v[c]: indexed at run time, v went to LDS on AMD (16 KiB, a slot per
        // thread of a 1024-thread block).
        const float x = c == 0 ? v.v[0] : (c == 1 ? v.v[1] : (c == 2 ? v.v[2] : v.v[3]));
        k3::store_f32(out, out_dt, p * out_s0 + (j0 + c) * out_s1, x);
      }
    }
  }
}
K3_EXPORT(moe_gemm_splitk_reduce);

// out[t, j] = sum over slots of y[t*top_k + slot, j], f32 in ascending slot order, rounded once.
// Grid: (tokens, grid-stride; tiles of 4 * blockDim columns), so a decode-sized batch still
// spreads its columns over several blocks. When the rows of y are contiguous and 16-B aligned
// (checked here from the arguments: uniform), each thread reads its 4 columns of every slot's row
// in one 16-byte load (and stores the 4 sums in one store when the output rows are contiguous
// and aligned); otherwise one column per thread and step. The per-column sum order is the same
// on both paths, so they give the same bits.
K3_KERNEL void moe_combine_sum(const float* y, int64_t y_s0, int64_t y_s1, void* out, int out_dt, int64_t out_s0,
                               int64_t out_s1, int tokens, int top_k, int hidden) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  const int j0 = static_cast<int>(k3::block_idx_y()) * 4 * nthreads;
  const int j_end = j0 + 4 * nthreads < hidden ? j0 + 4 * nthreads : hidden;
  const bool vec = y_s1 == 1 && y_s0 % 4 == 0 && hidden % 4 == 0 && k3::aligned16(y);
  const bool vec_out = vec && out_s1 == 1 && out_s0 % 4 == 0 && k3::aligned16(out);
  for (int t = static_cast<int>(k3::block_idx_x()); t < tokens; t += static_cast<int>(k3::grid_dim_x())) {
    const float* rows = y + static_cast<int64_t>(t) * top_k * y_s0;
    if (vec) {
      const int j = j0 + 4 * tid;
      if (j >= j_end) continue;
      k3::f32x4 acc = {{0.0f, 0.0f, 0.0f, 0.0f}}, unused;
      sum_rows_in_order<false>(rows + j, top_k, y_s0, 0, acc, unused);
      if (vec_out) {
        k3::store_f32x4(out, out_dt, t * out_s0 + j, acc);
      } else {
        for (int i = 0; i < 4; ++i) k3::store_f32(out, out_dt, t * out_s0 + (j + i) * out_s1, acc.v[i]);
      }
    } else {
      // Rows that are not 16-B aligned or contiguous (never K3's: y is the down stage's own
      // buffer). Kept rolled: nvcc unrolled it into 31 4-byte load sites, twice the vector path.
      K3_NO_UNROLL
      for (int j = j0 + tid; j < j_end; j += nthreads) {
        float acc = 0.0f;
        K3_NO_UNROLL
        for (int s = 0; s < top_k; ++s) acc += rows[s * y_s0 + j * y_s1];
        k3::store_f32(out, out_dt, t * out_s0 + j * out_s1, acc);
      }
    }
  }
}
K3_EXPORT(moe_combine_sum);
