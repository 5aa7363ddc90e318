// MoE router (kernel-api ops/moe_router.rs is the spec), two kernels:
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
// moe_router_logits_batched (the launcher's choice past one token tile) gives each group 4
// experts, 16 per block, so every x chunk a thread loads serves four weight rows.
// moe_router_logits_unaligned is moe_router_logits' grid for rows that are not 16-byte aligned
// or contiguous (any strides, per-value dtype-dispatched loads).
//
// moe_router_topk: one block per token (grid-stride over tokens) reads its logits row, then the
// sigmoid and the bias-corrected selection score go to shared memory. Group masking and the top-k
// are repeated block-level argmax selections over shared memory (thread-local best over strided
// candidates, warp shuffle reduction, one barrier, then every thread reduces the warps' winners
// itself: K3's top-16 costs 16 barriers, was 64 and a serial pass of thread 0), with the total order
// "larger key first, lower index on ties, NaN like -inf", so the result does not depend on the
// reduction order. Weights come from the unbiased scores.
//
// Dynamic shared memory of moe_router_topk (launcher): scores[E] f32, sel[E] f32, blocked[E] i32,
// gscore[G] f32, gblocked[G] i32, chosen[top_k] i32.
#include "k3/compat.h"

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
// grid (ceil(E / (4 kRouterGroups)), token tiles); the launcher's choice past one token tile.
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

// logits [T, lstride] f32 (moe_router_logits; rows 16-byte aligned, lstride a multiple of 4 and
// >= E), bias [E] f32 (stride bs0) or null, topk_ids [T, K] i32 and topk_weights [T, K] f32
// (strides), renormalize 0/1.
K3_KERNEL void moe_router_topk(const float* logits, int64_t lstride, const float* bias, int64_t bs0, int* topk_ids,
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
      const k3::f32x4 l = k3::load_f32x4(row + e4);
      for (int i = 0; i < 4 && e4 + i < experts; ++i) {
        const float s = k3::sigmoid_f32(l.v[i]);
        scores[e4 + i] = s;
        sel[e4 + i] = s + (bias != nullptr ? bias[(e4 + i) * bs0] : 0.0f);
      }
    }
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
