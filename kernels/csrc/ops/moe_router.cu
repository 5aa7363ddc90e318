// MoE router (kernel-api ops/moe_router.rs is the spec): a logits kernel, then the selection.
//
// moe_router_logits: the f32 logits W_r x of every (token, expert) into the caller's workspace
// (rows of `lstride` >= E floats). The router weight is the bulk of the op (K3: 896 x 7168 bf16
// = 12.8 MB per layer, read at every decode step), so the grid spreads it over the card: a block
// of kRouterThreads holds kRouterThreads / kRouterGroupThreads experts, a group of 64 threads (two
// warps on NVIDIA, one wave on AMD) per expert row, and a tile of up to kRouterTokenTile tokens
// (grid.y). K3 at batch 1 is 224 blocks. A group reads its row in 16-byte chunks of 8 values, up
// to 8 chunks per thread in flight (a slab), and multiplies each against the tile's tokens
// (x rows are re-read per weight chunk: L1/L2 hits, the weight is read once per token tile).
// Products and sums in f32 (bf16 products are exact in f32); one group reduction per token.
// Past one token tile: moe_router_logits_mma for a bf16 weight (K3's), on the matrix units with
// the operands swapped (weight rows as A, tokens as B), f32 x cut into three exact bf16 planes,
// the hidden size split over blocks into logits planes (see its section below);
// moe_router_logits_batched for an f32 weight (or when the host keeps the logits off the matrix
// units), 4 experts per group, 16 per block, so every x chunk a thread loads serves four rows.
// moe_router_logits_unaligned is moe_router_logits' grid for rows that are not 16-byte aligned
// or contiguous (any strides, per-value dtype-dispatched loads).
//
// moe_router_topk: one block per token (grid-stride over tokens) reads its logits row (the sum
// of the MMA kernel's split planes, in plane order), then the sigmoid and the bias-corrected
// selection score go to shared memory. Group masking and the top-k are repeated block-level
// argmax selections over shared memory (thread-local best over strided candidates, warp shuffle
// reduction, one barrier, then every thread reduces the warps' winners itself: K3's top-16
// costs 16 barriers, was 64 and a serial pass of thread 0), with the total order
// "larger key first, lower index on ties, NaN like -inf", so the result does not depend on the
// reduction order. Weights come from the unbiased scores.
//
// Dynamic shared memory of moe_router_topk (launcher): scores[E] f32, sel[E] f32, blocked[E] i32,
// gscore[G] f32, gblocked[G] i32, chosen[top_k] i32.
#include "k3/compat.h"
#include "mma_f32_planes.cuh"

namespace {

constexpr int kRouterMaxWarps = 32;
constexpr int kRouterThreads = 256;      // the logits launchers' block size
constexpr int kRouterGroupThreads = 64;  // threads per expert row
constexpr int kRouterTokenTile = 8;      // tokens per block (grid.y)
constexpr int kRouterGroups = kRouterThreads / kRouterGroupThreads;

K3_DEVICE float router_key(float v) { return v != v ? k3::uint_as_float(0xff800000u) : v; }

// Whether candidate (ka, ia) ranks before (kb, ib); an index < 0 is "no candidate".
K3_DEVICE bool router_better(float ka, int ia, float kb, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  if (ka != kb) return ka > kb;
  return ia < ib;
}

// Index of the best entry of vals[0..n) whose blocked flag is 0 (keys via router_key), the
// same on every thread of the block; -1 when none is left. Thread i reads only the entries
// i, i + block size, ... (so the thread that owns an entry may flag it without a barrier). One
// barrier: the warps' winners go to buffer `parity` and every thread reduces them itself; the
// next call writes the other buffer, and the one after can only start once every thread has
// passed the next call's barrier, i.e. read this one. Every thread of the block must call it
// with the same arguments, alternating parity.
K3_DEVICE int router_block_argmax(const float* vals, const int* blocked, int n, float (*warp_key)[kRouterMaxWarps],
                                  int (*warp_idx)[kRouterMaxWarps], int parity) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  float best_k = 0.0f;
  int best_i = -1;
  for (int i = tid; i < n; i += nthreads) {
    if (blocked[i] != 0) continue;
    const float k = router_key(vals[i]);
    if (router_better(k, i, best_k, best_i)) {
      best_k = k;
      best_i = i;
    }
  }
  for (int off = k3::kWarpSize / 2; off > 0; off >>= 1) {
    const float ok = k3::shfl_xor(best_k, off);
    const int oi = k3::shfl_xor(best_i, off);
    if (router_better(ok, oi, best_k, best_i)) {
      best_k = ok;
      best_i = oi;
    }
  }
  if (k3::lane_id() == 0) {
    warp_key[parity][tid / k3::kWarpSize] = best_k;
    warp_idx[parity][tid / k3::kWarpSize] = best_i;
  }
  k3::sync_threads();
  const int warps = (nthreads + k3::kWarpSize - 1) / k3::kWarpSize;
  float bk = warp_key[parity][0];
  int bi = warp_idx[parity][0];
  for (int w = 1; w < warps; ++w) {
    if (router_better(warp_key[parity][w], warp_idx[parity][w], bk, bi)) {
      bk = warp_key[parity][w];
      bi = warp_idx[parity][w];
    }
  }
  return bi;
}

}  // namespace

// The logits kernels' block size, so AMD does not cap a lane at the 128 VGPRs of a 1024-thread
// block (the unaligned kernel spilled to scratch on gfx942 under that cap), and two blocks per
// SM on NVIDIA: K3's 224 blocks at batch 1 are resident at once on 132 SMs.
#if K3_TARGET_HIP
#define ROUTER_LOGITS_BOUNDS __attribute__((amdgpu_flat_work_group_size(256, 256)))
#elif K3_TARGET_CUDA
#define ROUTER_LOGITS_BOUNDS __launch_bounds__(256, 2)
#else
#define ROUTER_LOGITS_BOUNDS
#endif

namespace {

// 8 consecutive values of a bf16 (one 16-byte load) or f32 (two) row, kept as raw bits until
// they are multiplied, so a slab of chunks in flight costs 4 (8) registers each.
template <bool kBf16>
struct RouterChunk {
  k3::u32x4 raw[kBf16 ? 1 : 2];
};

template <bool kBf16>
K3_DEVICE K3_AMD_INLINE RouterChunk<kBf16> router_load_chunk(const void* row, int c) {
  RouterChunk<kBf16> ch;
  const char* p = static_cast<const char*>(row) + static_cast<int64_t>(c) * (kBf16 ? 16 : 32);
  for (int h = 0; h < (kBf16 ? 1 : 2); ++h) ch.raw[h] = k3::load_16b(p + 16 * h);
  return ch;
}

// Value i (0..7) of a chunk as f32 (bf16 -> f32 is exact: the bits shifted up).
template <bool kBf16>
K3_DEVICE K3_AMD_INLINE float router_chunk_at(const RouterChunk<kBf16>& ch, int i) {
  if (kBf16) {
    const uint32_t word = ch.raw[0].v[i >> 1];
    return k3::uint_as_float((i & 1) != 0 ? word & 0xffff0000u : word << 16);
  }
  return k3::uint_as_float(ch.raw[i >> 2].v[i & 3]);
}

// acc[r][j] += w_rows[r] . x_row(t0 + j) over this thread's chunks, for its kEPT expert rows and
// j < nt (uniform). The weight slab is loaded first, then each token's matching x chunks, all
// before the products (predicated loads, no branch between them), so kEPT x kSlab weight loads
// and then kSlab x loads are in flight at once; chunks past the row's end are skipped
// (chunks = hidden / 8). With kEPT = 4 each x chunk serves four rows: the L1 traffic of a token
// tile falls from 1 weight + 8 x loads per row and chunk to 1 + 2.
template <int kEPT, bool kWBf16, bool kXBf16>
K3_DEVICE K3_AMD_INLINE void router_dot_rows(const void* const (&w_rows)[kEPT], const void* x, int64_t xs0, int t0,
                                             int nt, int chunks, int gt, float (&acc)[kEPT][kRouterTokenTile]) {
  // Raw registers in flight: 32 (weight) + 32 (x) for any dtype pair and kEPT.
  constexpr int kSlabBase = kWBf16 && kXBf16 ? 8 : 4;
  constexpr int kSlab = kSlabBase / kEPT > 0 ? kSlabBase / kEPT : 1;
  constexpr int kXBytes = kXBf16 ? 2 : 4;
  for (int c0 = gt; c0 < chunks; c0 += kSlab * kRouterGroupThreads) {
    RouterChunk<kWBf16> wc[kEPT][kSlab];
    K3_UNROLL
    for (int r = 0; r < kEPT; ++r) {
      K3_UNROLL
      for (int s = 0; s < kSlab; ++s) {
        const int c = c0 + s * kRouterGroupThreads;
        wc[r][s] = c < chunks ? router_load_chunk<kWBf16>(w_rows[r], c) : RouterChunk<kWBf16>{};
      }
    }
    K3_UNROLL
    for (int j = 0; j < kRouterTokenTile; ++j) {
      if (j >= nt) break;
      const void* x_row = static_cast<const char*>(x) + (t0 + j) * xs0 * kXBytes;
      RouterChunk<kXBf16> xc[kSlab];  // all issued before the first product
      K3_UNROLL
      for (int s = 0; s < kSlab; ++s) {
        const int c = c0 + s * kRouterGroupThreads;
        xc[s] = c < chunks ? router_load_chunk<kXBf16>(x_row, c) : RouterChunk<kXBf16>{};
      }
      K3_UNROLL
      for (int s = 0; s < kSlab; ++s) {
        if (c0 + s * kRouterGroupThreads >= chunks) break;
        K3_UNROLL
        for (int r = 0; r < kEPT; ++r) {
          K3_UNROLL
          for (int i = 0; i < 8; ++i) {
            acc[r][j] += router_chunk_at<kXBf16>(xc[s], i) * router_chunk_at<kWBf16>(wc[r][s], i);
          }
        }
      }
    }
  }
}

// The group sums of acc[r][0..nt) into logits[(t0 + j) * lstride + expert]: a shuffle reduction
// per warp, then (two warps per group at warp 32) the warps' partials in order. Group g of block
// x holds experts (x * kRouterGroups + g) * kEPT + r. Every thread of the block calls it
// (barrier).
template <int kEPT>
K3_DEVICE K3_AMD_INLINE void router_store_logits(float (&acc)[kEPT][kRouterTokenTile], float* logits, int64_t lstride,
                                                 int experts, int t0, int nt) {
  constexpr int kWarps = kRouterThreads / k3::kWarpSize;
  constexpr int kGroupWarps = kRouterGroupThreads / k3::kWarpSize;
  constexpr int kSums = kRouterGroups * kEPT * kRouterTokenTile;
  K3_SHARED(float, partial, [kWarps][kEPT][kRouterTokenTile]);
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int warp = tid / k3::kWarpSize;
  K3_UNROLL
  for (int r = 0; r < kEPT; ++r) {
    K3_UNROLL
    for (int j = 0; j < kRouterTokenTile; ++j) {
      if (j >= nt) break;
      const float v = k3::warp_reduce_sum(acc[r][j]);
      if (k3::lane_id() == 0) partial[warp][r][j] = v;
    }
  }
  k3::sync_threads();
  static_assert(kSums <= kRouterThreads, "one sum per thread");
  if (tid < kSums) {
    const int g = tid / (kEPT * kRouterTokenTile), r = tid / kRouterTokenTile % kEPT, j = tid % kRouterTokenTile;
    const int e = (static_cast<int>(k3::block_idx_x()) * kRouterGroups + g) * kEPT + r;
    if (j < nt && e < experts) {
      float sum = 0.0f;
      for (int w = 0; w < kGroupWarps; ++w) sum += partial[g * kGroupWarps + w][r][j];
      logits[(t0 + j) * lstride + e] = sum;
    }
  }
  k3::sync_threads();  // partial is rewritten by the next token tile
}

// The 16-byte logits kernels' body: group g of the block holds kEPT consecutive experts (rows
// past the last expert read row experts - 1, in bounds, and store nothing).
template <int kEPT>
K3_DEVICE K3_AMD_INLINE void router_logits_body(const void* x, int x_dt, int64_t xs0, const void* w, int w_dt,
                                                int64_t ws0, float* logits, int64_t lstride, int tokens, int hidden,
                                                int experts) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int gt = tid % kRouterGroupThreads;
  const int e0 = (static_cast<int>(k3::block_idx_x()) * kRouterGroups + tid / kRouterGroupThreads) * kEPT;
  const int chunks = hidden / 8;
  const bool w_bf16 = w_dt == k3::kBF16, x_bf16 = x_dt == k3::kBF16;
  const void* w_rows[kEPT];
  K3_UNROLL
  for (int r = 0; r < kEPT; ++r) {
    const int e_row = e0 + r < experts ? e0 + r : experts - 1;
    w_rows[r] = static_cast<const char*>(w) + e_row * ws0 * (w_bf16 ? 2 : 4);
  }
  for (int t0 = static_cast<int>(k3::block_idx_y()) * kRouterTokenTile; t0 < tokens;
       t0 += static_cast<int>(k3::grid_dim_y()) * kRouterTokenTile) {
    const int nt = tokens - t0 < kRouterTokenTile ? tokens - t0 : kRouterTokenTile;
    float acc[kEPT][kRouterTokenTile] = {};
    if (w_bf16 && x_bf16) {
      router_dot_rows<kEPT, true, true>(w_rows, x, xs0, t0, nt, chunks, gt, acc);
    } else if (w_bf16) {
      router_dot_rows<kEPT, true, false>(w_rows, x, xs0, t0, nt, chunks, gt, acc);
    } else if (x_bf16) {
      router_dot_rows<kEPT, false, true>(w_rows, x, xs0, t0, nt, chunks, gt, acc);
    } else {
      router_dot_rows<kEPT, false, false>(w_rows, x, xs0, t0, nt, chunks, gt, acc);
    }
    router_store_logits<kEPT>(acc, logits, lstride, experts, t0, nt);
  }
}

}  // namespace

// x [T, H] (x_dt bf16/f32, row stride xs0, contiguous rows 16-byte aligned), w [E, H] (w_dt, ws0,
// the same), H % 8 == 0; logits [T, lstride] f32. One expert per thread group: grid
// (ceil(E / kRouterGroups), token tiles); the launcher's choice up to one token tile (decode).
K3_KERNEL ROUTER_LOGITS_BOUNDS void moe_router_logits(const void* x, int x_dt, int64_t xs0, const void* w, int w_dt,
                                                      int64_t ws0, float* logits, int64_t lstride, int tokens,
                                                      int hidden, int experts) {
  router_logits_body<1>(x, x_dt, xs0, w, w_dt, ws0, logits, lstride, tokens, hidden, experts);
}
K3_EXPORT(moe_router_logits);

// The same with 4 experts per thread group, so each x chunk a thread loads serves four rows:
// grid (ceil(E / (4 kRouterGroups)), token tiles); the launcher's choice past one token tile for
// an f32 weight (a bf16 one takes moe_router_logits_mma, unless the host keeps it off the
// matrix units to time the two side by side).
K3_KERNEL ROUTER_LOGITS_BOUNDS void moe_router_logits_batched(const void* x, int x_dt, int64_t xs0, const void* w,
                                                              int w_dt, int64_t ws0, float* logits, int64_t lstride,
                                                              int tokens, int hidden, int experts) {
  router_logits_body<4>(x, x_dt, xs0, w, w_dt, ws0, logits, lstride, tokens, hidden, experts);
}
K3_EXPORT(moe_router_logits_batched);

// Any strides and dtypes (k3::load_f32 per value); one expert per group, as moe_router_logits.
K3_KERNEL ROUTER_LOGITS_BOUNDS void moe_router_logits_unaligned(const void* x, int x_dt, int64_t xs0, int64_t xs1,
                                                                const void* w, int w_dt, int64_t ws0, int64_t ws1,
                                                                float* logits, int64_t lstride, int tokens, int hidden,
                                                                int experts) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int gt = tid % kRouterGroupThreads;
  const int e = static_cast<int>(k3::block_idx_x()) * kRouterGroups + tid / kRouterGroupThreads;
  const int e_row = e < experts ? e : experts - 1;
  for (int t0 = static_cast<int>(k3::block_idx_y()) * kRouterTokenTile; t0 < tokens;
       t0 += static_cast<int>(k3::grid_dim_y()) * kRouterTokenTile) {
    const int nt = tokens - t0 < kRouterTokenTile ? tokens - t0 : kRouterTokenTile;
    float acc[1][kRouterTokenTile] = {};
    for (int i = gt; i < hidden; i += kRouterGroupThreads) {
      const float wv = k3::load_f32(w, w_dt, e_row * ws0 + i * ws1);
      K3_UNROLL
      for (int j = 0; j < kRouterTokenTile; ++j) {
        if (j >= nt) break;
        acc[0][j] += k3::load_f32(x, x_dt, (t0 + j) * xs0 + i * xs1) * wv;
      }
    }
    router_store_logits<1>(acc, logits, lstride, experts, t0, nt);
  }
}
K3_EXPORT(moe_router_logits_unaligned);

namespace {

// ---- moe_router_logits_mma: the logits on the matrix units (bf16 weight, past one token tile) ----
// D[token][expert] = x W^T: x is A (M = 16 tokens per fragment), the weight is B (N = 8 experts
// per fragment on m16n8k16, 16 on the MFMA; B[k][e] = W[e][k], a row of W per lane). K runs in
// windows of 32, one 16-byte chunk of 8 values per lane and row: lane quad q holds chunk q of
// the window, whose halves h = 0 and 1 are two MMA k steps (step h's permuted column c,
// k3::mma::k_perm, is window column 8 (c / 4) + 4 h + c % 4, the same map for both operands, so
// each product pairs the right values). A weight chunk is then B's two registers of both steps
// as loaded. The block stages x once per slab of windows in shared memory, as the A fragments'
// registers in lane order (one 16-byte read per fragment and plane, conflict-free).
// f32 x is cut into three bf16 planes by truncation, x = hi + mid + lo exactly (hi: the top 8
// significant bits, mid: the next 8 of the remainder, lo: the rest, which has at most 8 and so
// is a bf16 too), so every product of the three MMAs is exact in f32, as the spec's f32 upcast
// asks; only the order and rounding of the f32 sums differ (k3/mma.h). bf16 x is one plane.
// Block: 4 warps, kRouterMmaTokens tokens (grid.x) x 64 experts (grid.y, 16 per warp) x one k
// split (grid.z); each split writes its raw sums to its own logits plane, which moe_router_topk
// adds in order.
constexpr int kRouterMmaWarps = 4;
constexpr int kRouterMmaThreads = kRouterMmaWarps * k3::kWarpSize;
constexpr int kRouterMmaExperts = 16 * kRouterMmaWarps;  // 16 experts (B columns) per warp
constexpr int kRouterMmaTokens = 32;                     // per block: two 16-row A fragments
constexpr int kRouterMmaTiles = kRouterMmaTokens / 16;
constexpr int kRouterWindow = 32;                        // k per window (a 16-byte bf16 chunk per quad)
constexpr int kRouterMmaSlab = 4;                        // windows per staged slab (weights in flight)

// The A rows a lane holds (m16n8k16 lane (g, q): rows g and g + 8; MFMA lane l: row l % 16), and
// for A slot s, which of those rows and which of the lane's 4 values of the k step.
template <class S>
K3_HOST_DEVICE constexpr int router_a_rows() {
  return S::kId == k3::layout::M16N8K16::kId ? 2 : 1;
}
template <class S>
K3_HOST_DEVICE constexpr int router_a_row(int s) {
  return S::kId == k3::layout::M16N8K16::kId ? (s >> 1) & 1 : 0;
}
template <class S>
K3_HOST_DEVICE constexpr int router_a_value(int s) {
  return S::kId == k3::layout::M16N8K16::kId ? 2 * (s >> 2) + (s & 1) : s;
}
// Checks those maps against the shapes' layouts: slot s of lane l is at row a(l, 0).row + 8 x
// row(s) and at permuted column 4 q + value(s), q the lane's quad, each register (slot pair) two
// adjacent values of one row; B slot i at 4 q + i.
template <class S>
K3_HOST_DEVICE constexpr bool router_fragment_maps_hold() {
  for (int lane = 0; lane < S::kWarp; ++lane) {
    const int ra = S::a(lane, 0).row, qa = k3::mma::k_perm<S>(S::a(lane, 0).col) / 4;
    for (int s = 0; s < S::kASlots; ++s) {
      if (S::a(lane, s).row != ra + 8 * router_a_row<S>(s)) return false;
      if (k3::mma::k_perm<S>(S::a(lane, s).col) != 4 * qa + router_a_value<S>(s)) return false;
      if (s % 2 == 0) continue;
      if (router_a_row<S>(s) != router_a_row<S>(s - 1) || router_a_value<S>(s) != router_a_value<S>(s - 1) + 1 ||
          router_a_value<S>(s - 1) % 2 != 0) {
        return false;
      }
    }
    const int qb = k3::mma::k_perm<S>(S::b(lane, 0).row) / 4;
    for (int i = 0; i < S::kBSlots; ++i) {
      if (k3::mma::k_perm<S>(S::b(lane, i).row) != 4 * qb + i || S::b(lane, i).col != S::b(lane, 0).col) return false;
    }
  }
  return true;
}
static_assert(router_fragment_maps_hold<k3::layout::M16N8K16>() && router_fragment_maps_hold<k3::layout::M16N16K16>(),
              "the router's window map");

// Slot i of a fragment register: its low half for even i.
K3_DEVICE K3_AMD_INLINE uint16_t router_half(uint32_t word, int i) {
  return static_cast<uint16_t>((i & 1) != 0 ? word >> 16 : word);
}

// The staged x of a slab in shared memory: for every plane, A fragment (tile, window) and k step,
// each lane's A registers of that step, lane after lane. A 16-byte read gives a lane its step's
// registers on m16n8k16 (4 words: kSteps = 1 per record) and both steps' on the MFMA (2 words
// each: kSteps = 2).
template <class S>
struct RouterXLayout {
  static constexpr int kWords = S::kASlots / 2;         // A registers per k step
  static constexpr int kSteps = 4 / kWords;             // k steps per 16-byte record
  static constexpr int kRecords = kRouterMmaTiles * kRouterMmaSlab * (2 / kSteps) * S::kWarp;
  // The record holding step h of (tile i, window s) for `lane`, and the word offset of step h in it.
  K3_DEVICE static int record(int i, int s, int h, int lane) {
    return ((i * kRouterMmaSlab + s) * (2 / kSteps) + h / kSteps) * S::kWarp + lane;
  }
  K3_DEVICE static int word(int h) { return (h % kSteps) * kWords; }
};
static_assert(RouterXLayout<k3::layout::M16N8K16>::kRecords * 16 == RouterXLayout<k3::layout::M16N16K16>::kRecords * 16,
              "one record size in shared memory for both shapes");
constexpr int kRouterXRecords = RouterXLayout<k3::mma::Bf16Shape>::kRecords;

// A thread's share of an x slab: units (tile, window, lane) of the A fragments, each the chunk
// (8 values at column 8 q of the window) of every A row of the lane, raw as loaded: 16 (bf16) or
// 32 (f32) bytes per chunk.
constexpr int kRouterUnits = kRouterMmaTiles * kRouterMmaSlab * k3::kWarpSize;
constexpr int kRouterThreadUnits = kRouterUnits / kRouterMmaThreads;
static_assert(kRouterUnits % kRouterMmaThreads == 0, "whole units per thread");
template <class S, bool kXBf16>
struct RouterXStage {
  k3::u32x4 raw[kRouterThreadUnits][router_a_rows<S>()][kXBf16 ? 1 : 2];
};

// Loads this thread's units of the slab at k w0 (unit u = tid + n x threads: lane u % warp,
// window u / warp % slab, tile u / (warp x slab)); tokens past the last and k past k_end read
// as zeros.
template <class S, bool kXBf16>
K3_DEVICE K3_AMD_INLINE void router_load_x_slab(RouterXStage<S, kXBf16>& st, const void* x, int64_t xs0, int t0,
                                                int tokens, int w0, int k_end) {
  const k3::u32x4 zero16 = {{0u, 0u, 0u, 0u}};
  const int tid = static_cast<int>(k3::thread_idx_x());
  K3_UNROLL
  for (int n = 0; n < kRouterThreadUnits; ++n) {
    const int u = tid + n * kRouterMmaThreads;
    const int lane = u % S::kWarp, s = u / S::kWarp % kRouterMmaSlab, i = u / (S::kWarp * kRouterMmaSlab);
    const k3::layout::RC a = S::a(lane, 0);
    const int k = w0 + s * kRouterWindow + 8 * (k3::mma::k_perm<S>(a.col) / 4);
    K3_UNROLL
    for (int r = 0; r < router_a_rows<S>(); ++r) {
      const int t = t0 + 16 * i + a.row + 8 * r;
      const bool ok = t < tokens && k < k_end;
      const char* src = static_cast<const char*>(x) + (t * xs0 + k) * (kXBf16 ? 2 : 4);
      K3_UNROLL
      for (int c = 0; c < (kXBf16 ? 1 : 2); ++c) st.raw[n][r][c] = ok ? k3::load_16b(src + 16 * c) : zero16;
    }
  }
}

// Splits the thread's staged units into their planes and stores them as A registers: step h's
// register m is word (4 h + value) / 2 of the chunk of row row(2 m), for the slots 2 m, 2 m + 1.
template <class S, bool kXBf16>
K3_DEVICE K3_AMD_INLINE void router_store_x_slab(k3::u32x4 (*xs)[kRouterXRecords], const RouterXStage<S, kXBf16>& st) {
  using L = RouterXLayout<S>;
  constexpr int kRows = router_a_rows<S>();
  const int tid = static_cast<int>(k3::thread_idx_x());
  K3_UNROLL
  for (int n = 0; n < kRouterThreadUnits; ++n) {
    const int u = tid + n * kRouterMmaThreads;
    const int lane = u % S::kWarp, s = u / S::kWarp % kRouterMmaSlab, i = u / (S::kWarp * kRouterMmaSlab);
    k3::u32x4 planes[kXBf16 ? 1 : 3][kRows];  // the rows' chunks, per plane
    K3_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kXBf16) {
        planes[0][r] = st.raw[n][r][0];
      } else {
        K3_UNROLL
        for (int c = 0; c < 2; ++c) {
          uint32_t hi[2], mid[2], lo[2];
          f32planes::split3(st.raw[n][r][c], hi, mid, lo);
          planes[0][r].v[2 * c] = hi[0], planes[0][r].v[2 * c + 1] = hi[1];
          planes[1][r].v[2 * c] = mid[0], planes[1][r].v[2 * c + 1] = mid[1];
          planes[2][r].v[2 * c] = lo[0], planes[2][r].v[2 * c + 1] = lo[1];
        }
      }
    }
    K3_UNROLL
    for (int p = 0; p < (kXBf16 ? 1 : 3); ++p) {
      K3_UNROLL
      for (int h = 0; h < 2; h += L::kSteps) {
        k3::u32x4 rec;
        K3_UNROLL
        for (int hh = 0; hh < L::kSteps; ++hh) {
          K3_UNROLL
          for (int m = 0; m < L::kWords; ++m) {
            const int v = 4 * (h + hh) + router_a_value<S>(2 * m);  // the register's first value
            rec.v[L::word(h + hh) + m] = planes[p][router_a_row<S>(2 * m)].v[v / 2];
          }
        }
        xs[p][L::record(i, s, h, lane)] = rec;
      }
    }
  }
}

// The logits of the token tile at t0 (every thread of the block calls it: barriers).
template <class S, bool kXBf16>
K3_DEVICE K3_AMD_INLINE void router_logits_mma_tile(k3::u32x4 (*xs)[kRouterXRecords], const void* x, int64_t xs0,
                                                    const k3::bf16* w, int64_t ws0, float* logits, int64_t lstride,
                                                    int t0, int tokens, int hidden, int experts, int k_chunk) {
  using namespace k3::mma;
  using L = RouterXLayout<S>;
  constexpr int kBTiles = 16 / S::N;  // expert fragments per warp
  constexpr int kPlanes = kXBf16 ? 1 : 3;
  constexpr int kSlabK = kRouterMmaSlab * kRouterWindow;
  const int e0 = static_cast<int>(k3::block_idx_y()) * kRouterMmaExperts + static_cast<int>(k3::warp_id()) * 16;
  const int split = static_cast<int>(k3::block_idx_z());
  const int k_begin = split * k_chunk;
  const int k_end = hidden - k_begin < k_chunk ? hidden : k_begin + k_chunk;
  const int lane = static_cast<int>(k3::lane_id());
  const RC b0 = b_coord<S>(0);
  const int qb = k_perm<S>(b0.row) / 4;
  // The lane's weight rows, one per expert fragment; rows past the last expert read the last
  // one (in bounds) and are multiplied but not stored (no branch around an MMA).
  const char* w_row[kBTiles];
  K3_UNROLL
  for (int j = 0; j < kBTiles; ++j) {
    const int e = e0 + j * S::N + b0.col < experts ? e0 + j * S::N + b0.col : experts - 1;
    w_row[j] = reinterpret_cast<const char*>(w + e * ws0) + 16 * qb;
  }
  bool a_live[kRouterMmaTiles];  // warp-uniform: the fragment holds a token
  K3_UNROLL
  for (int i = 0; i < kRouterMmaTiles; ++i) a_live[i] = t0 + 16 * i < tokens;
  FragC<S> acc[kRouterMmaTiles][kBTiles];
  K3_UNROLL
  for (int i = 0; i < kRouterMmaTiles; ++i) {
    K3_UNROLL
    for (int j = 0; j < kBTiles; ++j) fill(acc[i][j], 0.0f);
  }
  const k3::u32x4 zero16 = {{0u, 0u, 0u, 0u}};
  RouterXStage<S, kXBf16> st;
  router_load_x_slab<S, kXBf16>(st, x, xs0, t0, tokens, k_begin, k_end);
  for (int w0 = k_begin; w0 < k_end; w0 += kSlabK) {
    k3::u32x4 wb[kRouterMmaSlab][kBTiles];  // the weight slab, issued before the x planes are stored
    K3_UNROLL
    for (int s = 0; s < kRouterMmaSlab; ++s) {
      const int kw = w0 + s * kRouterWindow;
      K3_UNROLL
      for (int j = 0; j < kBTiles; ++j) wb[s][j] = kw + 8 * qb < k_end ? k3::load_16b(w_row[j] + 2 * kw) : zero16;
    }
    router_store_x_slab<S, kXBf16>(xs, st);
    k3::sync_threads();
    // The next slab's x into registers while this one multiplies.
    if (w0 + kSlabK < k_end) router_load_x_slab<S, kXBf16>(st, x, xs0, t0, tokens, w0 + kSlabK, k_end);
    K3_UNROLL
    for (int s = 0; s < kRouterMmaSlab; ++s) {
      if (w0 + s * kRouterWindow >= k_end) break;
      K3_UNROLL
      for (int h = 0; h < 2; ++h) {
        FragB<S> fb[kBTiles];  // the weight chunk's registers of step h
        K3_UNROLL
        for (int j = 0; j < kBTiles; ++j) {
          K3_UNROLL
          for (int m = 0; m < S::kBSlots; ++m) fb[j].x[m] = router_half(wb[s][j].v[2 * h + m / 2], m);
        }
        K3_UNROLL
        for (int i = 0; i < kRouterMmaTiles; ++i) {
          if (!a_live[i]) continue;
          K3_UNROLL
          for (int p = 0; p < kPlanes; ++p) {
            // One 16-byte read: the lane's A registers of step h (and h + 1 on the MFMA).
            const k3::u32x4 rec = xs[p][L::record(i, s, h, lane)];
            FragA<S> fa;
            K3_UNROLL
            for (int m = 0; m < S::kASlots; ++m) fa.x[m] = router_half(rec.v[L::word(h) + m / 2], m);
            K3_UNROLL
            for (int j = 0; j < kBTiles; ++j) mma_sync(acc[i][j], fa, fb[j], acc[i][j]);
          }
        }
      }
    }
    k3::sync_threads();  // xs is rewritten by the next slab
  }
  float* out = logits + split * (tokens * lstride);
  K3_UNROLL
  for (int i = 0; i < kRouterMmaTiles; ++i) {
    K3_UNROLL
    for (int j = 0; j < kBTiles; ++j) {
      if (!a_live[i]) continue;
      K3_UNROLL
      for (int s = 0; s < S::kCSlots; ++s) {
        const RC rc = c_coord<S>(s);
        const int t = t0 + 16 * i + rc.row, e = e0 + j * S::N + rc.col;
        if (t < tokens && e < experts) out[t * lstride + e] = acc[i][j].x[s];
      }
    }
  }
}

}  // namespace

#if K3_TARGET_HIP
#define ROUTER_MMA_BOUNDS __attribute__((amdgpu_flat_work_group_size(256, 256)))
#elif K3_TARGET_CUDA
#define ROUTER_MMA_BOUNDS __launch_bounds__(128, 3)
#else
#define ROUTER_MMA_BOUNDS
#endif

// x [T, H] (x_dt bf16/f32, row stride xs0), w [E, H] bf16 (row stride ws0), rows contiguous and
// 16-byte aligned, H % 8 == 0; logits: split z's sums of token t, expert e at
// (z * T + t) * lstride + e. k_chunk: a multiple of kRouterWindow. Block: 4 warps; grid
// (token tiles, grid-stride past 65535; ceil(E / kRouterMmaExperts); splits).
K3_KERNEL ROUTER_MMA_BOUNDS void moe_router_logits_mma(const void* x, int x_dt, int64_t xs0, const void* w,
                                                       int64_t ws0, float* logits, int64_t lstride, int tokens,
                                                       int hidden, int experts, int k_chunk) {
  K3_SHARED(k3::u32x4, xs, [3][kRouterXRecords]);  // one block of x planes for both bodies
  const k3::bf16* wb = static_cast<const k3::bf16*>(w);
  for (int t0 = static_cast<int>(k3::block_idx_x()) * kRouterMmaTokens; t0 < tokens;
       t0 += static_cast<int>(k3::grid_dim_x()) * kRouterMmaTokens) {
    if (x_dt == k3::kBF16) {
      router_logits_mma_tile<k3::mma::Bf16Shape, true>(xs, x, xs0, wb, ws0, logits, lstride, t0, tokens, hidden,
                                                       experts, k_chunk);
    } else {
      router_logits_mma_tile<k3::mma::Bf16Shape, false>(xs, x, xs0, wb, ws0, logits, lstride, t0, tokens, hidden,
                                                        experts, k_chunk);
    }
  }
}
K3_EXPORT(moe_router_logits_mma);

// logits: `splits` planes [T, lstride] f32 one after the other, summed in plane order (the split
// sums of moe_router_logits_mma; one plane from the other logits kernels; rows 16-byte aligned,
// lstride a multiple of 4 and >= E), bias [E] f32 (stride bs0) or null,
// topk_ids [T, K] i32 and topk_weights [T, K] f32 (strides), renormalize 0/1.
K3_KERNEL void moe_router_topk(const float* logits, int64_t lstride, int splits, const float* bias,
                               int64_t bs0, int* topk_ids,
                               int64_t is0, int64_t is1, float* topk_weights, int64_t ows0, int64_t ows1, int tokens,
                               int experts, int top_k, int n_group, int topk_group, int renormalize, float scaling) {
  K3_SHARED(float, warp_key, [2][kRouterMaxWarps]);
  K3_SHARED(int, warp_idx, [2][kRouterMaxWarps]);
  float* scores = k3::dynamic_shared<float>();
  float* sel = scores + experts;
  int* blocked = reinterpret_cast<int*>(sel + experts);
  float* gscore = reinterpret_cast<float*>(blocked + experts);
  int* gblocked = reinterpret_cast<int*>(gscore + n_group);
  int* chosen = gblocked + n_group;

  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  const int group_size = experts / n_group;
  int parity = 0;  // router_block_argmax's buffer

  for (int t = static_cast<int>(k3::block_idx_x()); t < tokens; t += static_cast<int>(k3::grid_dim_x())) {
    // 2-3. sigmoid scores and selection scores, 4 logits per 16-byte load (the row's padding
    // past E is read, never used).
    const float* row = logits + t * lstride;
    for (int e4 = 4 * tid; e4 < experts; e4 += 4 * nthreads) {
      k3::f32x4 l = k3::load_f32x4(row + e4);
      const float* part = row + e4;
      K3_NO_UNROLL
      for (int z = 1; z < splits; ++z) {
        part += tokens * lstride;
        const k3::f32x4 m = k3::load_f32x4(part);
        for (int i = 0; i < 4; ++i) l.v[i] += m.v[i];
      }
      for (int i = 0; i < 4 && e4 + i < experts; ++i) {
        const float s = k3::sigmoid_f32(l.v[i]);
        scores[e4 + i] = s;
        sel[e4 + i] = s + (bias != nullptr ? bias[(e4 + i) * bs0] : 0.0f);
      }
    }
    // Rolled: unrolled, its trip-count masks stay live across the token loop (gfx950 parked 6
    // SGPRs in VGPR lanes for them, 2 rolled).
    K3_NO_UNROLL
    for (int e = tid; e < experts; e += nthreads) blocked[e] = n_group > 1 ? 1 : 0;
    k3::sync_threads();

    // 4. group masking: score = sum of the group's top-2 selection scores; keep topk_group.
    if (n_group > 1) {
      for (int g = tid; g < n_group; g += nthreads) {
        const float* gs = sel + g * group_size;
        float k1 = 0.0f, k2 = 0.0f;
        int i1 = -1, i2 = -1;
        for (int i = 0; i < group_size; ++i) {
          const float k = router_key(gs[i]);
          if (router_better(k, i, k1, i1)) {
            k2 = k1;
            i2 = i1;
            k1 = k;
            i1 = i;
          } else if (router_better(k, i, k2, i2)) {
            k2 = k;
            i2 = i;
          }
        }
        // As the reference: an f32 sum from 0 of the (unmapped) top-1 and top-2 values.
        float sum = 0.0f + gs[i1];
        if (i2 >= 0) sum = sum + gs[i2];
        gscore[g] = sum;
        gblocked[g] = 0;
      }
      k3::sync_threads();
      for (int j = 0; j < topk_group; ++j) {
        const int g = router_block_argmax(gscore, gblocked, n_group, warp_key, warp_idx, parity);
        parity ^= 1;
        if (g < 0) break;  // uniform: every thread saw the same result
        for (int i = tid; i < group_size; i += nthreads) blocked[g * group_size + i] = 0;
        if (tid == g % nthreads) gblocked[g] = 1;
        k3::sync_threads();  // the group's experts are unflagged by other threads than their owners
      }
    }

    // 5. top-k by repeated block argmax (the plan guarantees enough unmasked experts), one
    // barrier per pick: the owners flag the picked expert and record pick j, and every thread
    // sums the picked unbiased scores in selection order (the reference's sequential f32 sum).
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int e = router_block_argmax(sel, blocked, experts, warp_key, warp_idx, parity);
      parity ^= 1;
      if (tid == j % nthreads) chosen[j] = e;
      if (e >= 0 && tid == e % nthreads) blocked[e] = 1;
      sum += e >= 0 ? scores[e] : 0.0f;
    }

    // 6. weights from the unbiased scores; thread j % nthreads reads the pick it recorded.
    const float denom = renormalize ? sum + 1e-20f : 1.0f;
    for (int j = tid; j < top_k; j += nthreads) {
      const int e = chosen[j];
      const float s = e >= 0 ? scores[e] : 0.0f;
      topk_ids[t * is0 + j * is1] = e;
      topk_weights[t * ows0 + j * ows1] = s / denom * scaling;
    }
    k3::sync_threads();  // shared arrays are rewritten by the next token
  }
}
K3_EXPORT(moe_router_topk);
