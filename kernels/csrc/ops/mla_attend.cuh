// The attention core shared by every absorbed-MLA kernel (decode asm/Gluon, ragged prefill):
// up to 16 (query, head) rows of one sequence and head group, attending to a key range of the
// paged latent cache with an online softmax in f32. SIMT path (no tensor cores), 256 threads.
//
// Per KV tile of kTile = 16 tokens the block stages the tokens in shared memory as bf16 *raw*
// values plus one f32 multiplier per (token, 128-tile):
//   bf16 cache   raw = the stored bf16, multiplier 1;
//   flat fp8     raw = the fp8 value (exact in bf16), multiplier 1; the per-tensor kv_scale is
//                folded into the softmax temperature and into the output (AITER Gluon);
//   tiled fp8    raw = the fp8 value, multiplier = the token's pow-2 tile scale (latent), 1 (rope).
// This is the operand layout an MMA path would consume; the SIMT path multiplies in f32.
//
// Rows are spread over warps (kRowsPerWarp each). A warp keeps its rows' queries in registers,
// lane l holding dims l, l + W, ... (W = warp size): QK^T per token is a lane-partial dot,
// and the warp turns its 32 per-token partials into full scores with a shuffle reduce-scatter,
// after which lane l holds token l / kDup. Max and sum are warp reductions; rows go through
// them in pairs, two floats per 8-byte shuffle. The probabilities go through a per-warp shared
// row, and PV accumulates lane-owned latent dims in registers. Two block barriers per KV tile;
// everything else is warp-synchronous.
#ifndef K3_OPS_MLA_ATTEND_CUH
#define K3_OPS_MLA_ATTEND_CUH

#include "mla_kv_load.cuh"

namespace mla {

constexpr int kBlock = 256;
// Tokens per shared-memory KV tile. It sizes the per-lane score tile part[kRowsPerWarp][kTile]
// (4 x 16 floats at warp 64): at 32 tokens the inlined core needed 470-500 VGPRs + AGPRs on
// gfx942 with 170-190 spills; at 16 it fits (no scratch on any target; sm_90a keeps <= 255).
constexpr int kTile = 16;
constexpr int kRows = 16;                 // (query, head) rows per row tile: one MMA M tile
constexpr int kMaxLatent = 512;           // the SIMT path's register budget (K3: 512 + 64)
constexpr int kMaxWidth = 576;
constexpr int kWarps = kBlock / k3::kWarpSize;
constexpr int kRowsPerWarp = kRows / kWarps;
constexpr int kQRegs = kMaxWidth / k3::kWarpSize;
constexpr int kAccRegs = kMaxLatent / k3::kWarpSize;
constexpr int kLogTile = kTile == 16 ? 4 : 5;  // log2 kTile
static_assert(1 << kLogTile == kTile, "kTile is 16 or 32");
constexpr int kDup = k3::kWarpSize / kTile;  // lanes holding the same token after the scatter
constexpr int kReduceThreads = 64;          // mla_decode_reduce: 4 latent dims per thread
constexpr int kReduceDims = 4 * kReduceThreads;

// Floats between the rows of a partial slot's out (MlaDecodePlan::partial_row_pitch): latent
// rounded up to 4, so the reduce reads every row in 16-byte loads for any latent.
K3_HOST_DEVICE constexpr int partial_pitch(int latent) { return (latent + 3) & ~3; }

// Dynamic shared bytes of the core for a cache row of `width` values.
K3_HOST_DEVICE constexpr int shared_bytes(int width) {
  return 4 * kRows * kTile + 4 * kTile * kMultSlots + 2 * kTile * kv_pitch(width);
}

// Where a row tile's results go: out[off + i*st + (head_base + k)*sh + d], lse likewise (may be
// null). Direct output: head_base = first head of the group; workspace slot: head_base = 0.
struct Dest {
  void* out;
  int out_dt;
  int64_t off, st, sh;
  float* lse;
  int64_t loff, lst, lsh;
  int head_base;
};

// The query block: q[off + i*st + h*sh + d].
struct Query {
  const void* q;
  int dt;
  int64_t off, st, sh;
};

// One row tile: rows rho in [rho0, rho0 + kRows) of the item's q_rows x gh rows, row rho being
// query i = rho / gh, head k = rho % gh of the group (first head head0). Query i sees keys below
// causal ? first_pos + i + 1 : n_keys, intersected with [kv_start, kv_end).
struct Rows {
  int rho0;
  int q_rows;
  int gh;
  int head0;
  int causal;
  int first_pos;
  int n_keys;
  int kv_start;
  int kv_end;
};

// Two floats moved by one 8-byte shuffle: the warp's rows are processed in pairs, which halves
// the shuffle count of every reduction (on GPUs an 8-byte shuffle is two 4-byte ones anyway).
struct F2 {
  float a, b;
};

K3_DEVICE F2 shfl_xor2(float a, float b, int offset) {
  const F2 v = {a, b};
  return k3::shfl_xor(v, offset);
}

// Sums v[rr][0..kTile) over the warp for every row rr so that lane l ends with the full sum of
// token l / kDup of each row (returned in v[rr][0]).
K3_DEVICE void reduce_scatter(float (&v)[kRowsPerWarp][kTile]) {
  const int lane = static_cast<int>(k3::lane_id());
  // Halving steps (log2 kTile) with constant trip counts, so that every loop unrolls and v
  // stays in registers (a loop over h /= 2 was left rolled by nvcc, indexing v dynamically).
  K3_UNROLL
  for (int step = 0; step < kLogTile; ++step) {
    const int h = kTile >> (step + 1);
    const int offset = k3::kWarpSize >> (step + 1);
    const bool upper = (lane & offset) != 0;
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; rr += 2) {
      K3_UNROLL
      for (int k = 0; k < kTile / 2; ++k) {  // constant trip count: unrolled before the step loop
        if (k >= h) break;
        const float a0 = v[rr][k], a1 = v[rr][k + h], b0 = v[rr + 1][k], b1 = v[rr + 1][k + h];
        const F2 got = shfl_xor2(upper ? a0 : a1, upper ? b0 : b1, offset);
        v[rr][k] = (upper ? a1 : a0) + got.a;
        v[rr + 1][k] = (upper ? b1 : b0) + got.b;
      }
    }
  }
  K3_UNROLL
  for (int offset = k3::kWarpSize >> (kLogTile + 1); offset >= 1; offset /= 2) {
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; rr += 2) {
      const F2 got = shfl_xor2(v[rr][0], v[rr + 1][0], offset);
      v[rr][0] += got.a;
      v[rr + 1][0] += got.b;
    }
  }
}

// Warp-wide max (ignoring NaN) or sum of x[rr] for every row, in place.
K3_DEVICE void warp_max_rows(float (&x)[kRowsPerWarp]) {
  K3_UNROLL
  for (int o = k3::kWarpSize / 2; o > 0; o >>= 1) {
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; rr += 2) {
      const F2 got = shfl_xor2(x[rr], x[rr + 1], o);
      x[rr] = k3::max_f32(x[rr], got.a);
      x[rr + 1] = k3::max_f32(x[rr + 1], got.b);
    }
  }
}
K3_DEVICE void warp_sum_rows(float (&x)[kRowsPerWarp]) {
  K3_UNROLL
  for (int o = k3::kWarpSize / 2; o > 0; o >>= 1) {
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; rr += 2) {
      const F2 got = shfl_xor2(x[rr], x[rr + 1], o);
      x[rr] += got.a;
      x[rr + 1] += got.b;
    }
  }
}

// The multiplier slot of value d of a row (a shift and a select: cheaper to recompute than to
// keep in registers across the KV loop).
K3_DEVICE int value_slot(int d, int latent) { return d < latent ? d / kScaleTile : kMultSlots - 1; }

// The row tile `r` of one work item. score_scale = softmax_scale (x kv_scale for flat fp8),
// out_scale = kv_scale for flat fp8, else 1. Every thread of the block must call it (barriers).
K3_AMD_INLINE K3_DEVICE void attend(const Cache& c, const Query& q, const Rows& r, float score_scale, float out_scale,
                      const Dest& dst, uint16_t* raw, float* mult, float* pbuf) {
  const int lane = static_cast<int>(k3::lane_id());
  const int warp = static_cast<int>(k3::thread_idx_x_unhoisted()) / k3::kWarpSize;
  const int width = c.latent + c.rope;
  const int pitch = kv_pitch(width);
  const float neg_inf = k3::uint_as_float(0xff800000u);
  const int total_rows = r.q_rows * r.gh;

  // Keys the tile as a whole needs: up to the limit of its last query.
  const int last = (r.rho0 + kRows < total_rows ? r.rho0 + kRows : total_rows) - 1;
  int kv_hi = r.causal ? r.first_pos + last / r.gh + 1 : r.n_keys;
  kv_hi = kv_hi < r.kv_end ? kv_hi : r.kv_end;

  float qr[kRowsPerWarp][kQRegs];
  float acc[kRowsPerWarp][kAccRegs];
  float m[kRowsPerWarp], l[kRowsPerWarp];
  int limit[kRowsPerWarp];
  bool valid[kRowsPerWarp];
  K3_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int rho = r.rho0 + warp + rr * kWarps;
    valid[rr] = rho < total_rows;
    const int i = valid[rr] ? rho / r.gh : 0;
    const int k = valid[rr] ? rho % r.gh : 0;
    const int lim = r.causal ? r.first_pos + i + 1 : r.n_keys;
    limit[rr] = !valid[rr] ? 0 : (lim < r.kv_end ? lim : r.kv_end);
    m[rr] = neg_inf;
    l[rr] = 0.0f;
    K3_UNROLL
    for (int j = 0; j < kAccRegs; ++j) acc[rr][j] = 0.0f;
    K3_UNROLL
    for (int j = 0; j < kQRegs; ++j) {
      const int d = lane + j * k3::kWarpSize;
      qr[rr][j] = valid[rr] && d < width ? k3::load_f32(q.q, q.dt, q.off + i * q.st + (r.head0 + k) * q.sh + d) : 0.0f;
    }
  }

  const int tok = lane / kDup;
  const bool owner = lane % kDup == 0;
  for (int s0 = r.kv_start; s0 < kv_hi; s0 += kTile) {
    const int n = kv_hi - s0 < kTile ? kv_hi - s0 : kTile;
    k3::sync_threads();  // the previous tile is consumed
    load_tile(c, s0, n, kTile, width, c.latent, raw, mult);
    k3::sync_threads();
    // QK^T: lane-partial dots of every row with every token, then the reduce-scatter.
    float part[kRowsPerWarp][kTile];
    K3_UNROLL
    for (int t = 0; t < kTile; ++t) {
      const uint16_t* kr = raw + t * pitch;
      const float* mt = mult + t * kMultSlots;
      float kv[kQRegs];
      K3_UNROLL
      for (int j = 0; j < kQRegs; ++j) {
        const int d = lane + j * k3::kWarpSize;
        kv[j] = d < width ? k3::bf16_to_f32(k3::bf16{kr[d]}) * mt[value_slot(d, c.latent)] : 0.0f;
      }
      K3_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        float s = 0.0f;
        K3_UNROLL
        for (int j = 0; j < kQRegs; ++j) s += qr[rr][j] * kv[j];
        part[rr][t] = s;
      }
    }
    reduce_scatter(part);
    // Online softmax; lane `tok` holds this tile's score of token s0 + tok for every row.
    float score[kRowsPerWarp], m_new[kRowsPerWarp], p[kRowsPerWarp];
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      score[rr] = tok < n && s0 + tok < limit[rr] ? part[rr][0] * score_scale : neg_inf;
      m_new[rr] = score[rr];
    }
    warp_max_rows(m_new);
    float alpha[kRowsPerWarp];
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      m_new[rr] = k3::max_f32(m[rr], m_new[rr]);
      const bool live = m_new[rr] != neg_inf;  // some key of this row is visible so far
      alpha[rr] = live ? k3::exp_f32(m[rr] - m_new[rr]) : 1.0f;
      p[rr] = live && owner ? k3::exp_f32(score[rr] - m_new[rr]) : 0.0f;
      if (owner) pbuf[(warp + rr * kWarps) * kTile + tok] = p[rr];
    }
    warp_sum_rows(p);
    K3_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      l[rr] = l[rr] * alpha[rr] + p[rr];
      m[rr] = m_new[rr];
    }
    k3::sync_warp();  // the warp's probability rows are written
    // PV: lane-owned latent dims of every row.
    K3_UNROLL
    for (int j = 0; j < kAccRegs; ++j) {
      const int d = lane + j * k3::kWarpSize;
      if (d >= c.latent) break;
      K3_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) acc[rr][j] *= alpha[rr];
      for (int t = 0; t < n; ++t) {
        const float v = k3::bf16_to_f32(k3::bf16{raw[t * pitch + d]}) * mult[t * kMultSlots + value_slot(d, c.latent)];
        K3_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) acc[rr][j] += pbuf[(warp + rr * kWarps) * kTile + t] * v;
      }
    }
  }

  K3_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (!valid[rr]) continue;
    const int rho = r.rho0 + warp + rr * kWarps;
    const int i = rho / r.gh, k = rho % r.gh;
    const bool any = l[rr] > 0.0f;
    const float inv = any ? out_scale / l[rr] : 0.0f;
    const int64_t base = dst.off + i * dst.st + (dst.head_base + k) * dst.sh;
    K3_UNROLL
    for (int j = 0; j < kAccRegs; ++j) {
      const int d = lane + j * k3::kWarpSize;
      if (d < c.latent) k3::store_f32(dst.out, dst.out_dt, base + d, acc[rr][j] * inv);
    }
    if (dst.lse != nullptr && lane == 0) {
      dst.lse[dst.loff + i * dst.lst + (dst.head_base + k) * dst.lsh] = any ? m[rr] + k3::log_f32(l[rr]) : neg_inf;
    }
  }
}

}  // namespace mla

#endif  // K3_OPS_MLA_ATTEND_CUH
