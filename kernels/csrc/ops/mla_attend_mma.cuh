// Tensor-core variant of the absorbed-MLA attention core (mla_attend.cuh) for bf16 queries:
// the same row tiles (16 (query, head) rows = one MMA M tile) over 16-token KV tiles, with
// QK^T and PV as k3::mma bf16 products accumulating in f32 (mma.sync m16n8k16 at warp 32,
// MFMA 16x16x16 at warp 64; the fragment maps of k3/mma_layout.h make the code shape-generic).
//
// - Staging: the KV tile as raw bf16 (exact for every format, see mla_attend.cuh) in rows of
//   `wpad` = pad16(latent) + pad16(rope) columns at the bank-conflict-free pitch kv_pitch(wpad)
//   (mla_kv_load.cuh), rope from column pad16(latent), zero padding;
//   per-(token, 128-tile) multipliers for the tile-scaled format.
// - QK^T: the 36 (K3) k-steps of 16 dims are dealt round-robin to the warps, each warp holding
//   its queries' A fragments in registers for the whole item; a k-step lies in one scale tile,
//   so tile-scaled caches scale each k-step's product per token column. Warp partials of S
//   [16 x 16] meet in shared memory and 256 threads (one per score) sum them.
// - Softmax: online, f32, one thread per (row, token), width-16 shuffles per row.
// - PV: each warp owns n-tiles of the latent output (f32 C fragments in registers). P is split
//   into bf16 hi + lo parts (two MMAs), so the product keeps ~16 bits of P: f32-grade output
//   from bf16 operands. V's multiplier is folded into P per output n-tile.
#ifndef K3_OPS_MLA_ATTEND_MMA_CUH
#define K3_OPS_MLA_ATTEND_MMA_CUH

#include "mla_attend.cuh"

namespace mla {

typedef k3::mma::Bf16Shape Shape;
constexpr int kMmaTile = 16;                                     // tokens per KV tile
constexpr int kSTiles = kMmaTile / Shape::N;                     // n-tiles of S
constexpr int kMaxKSteps = kMaxWidth / 16;                       // k-steps of QK^T
constexpr int kQSteps = (kMaxKSteps + kWarps - 1) / kWarps;      // per warp
constexpr int kPvTiles = kMaxLatent / Shape::N / kWarps;         // output n-tiles per warp
constexpr int kMaxWarps = kBlock / 32;                           // shared layout for any warp size
static_assert(kRows * kMmaTile == kBlock, "one thread per score");
static_assert(kRows == Shape::M, "a row tile is one MMA M tile");

K3_HOST_DEVICE constexpr int pad16(int x) { return (x + 15) / 16 * 16; }

// Dynamic shared bytes of the MMA core for padded row width `wpad`.
K3_HOST_DEVICE constexpr int mma_shared_bytes(int wpad) {
  return 4 * kMaxWarps * kRows * kMmaTile + 4 * kRows * kMmaTile + 4 * kRows * 2 + 4 * kMmaTile * kMultSlots +
         2 * kMmaTile * kv_pitch(wpad);
}

struct MmaSmem {
  float* spart;  // [warps][16][16] partial scores
  float* p;      // [16][16] probabilities
  float* alpha;  // [16] rescale of the current tile
  float* l;      // [16] softmax denominators at the end
  float* mult;   // [16][kMultSlots]
  uint16_t* raw; // [16][kv_pitch(wpad)]
};

K3_DEVICE MmaSmem carve_mma(uint8_t* s) {
  MmaSmem m;
  m.spart = reinterpret_cast<float*>(s);
  m.p = m.spart + kMaxWarps * kRows * kMmaTile;
  m.alpha = m.p + kRows * kMmaTile;
  m.l = m.alpha + kRows;
  m.mult = m.l + kRows;
  m.raw = reinterpret_cast<uint16_t*>(m.mult + kMmaTile * kMultSlots);
  return m;
}

// The multiplier slot of padded column `col`.
K3_DEVICE int mult_slot(int col, int lp) { return col < lp ? col / kScaleTile : kMultSlots - 1; }

// As mla::attend, for bf16 queries (q.dt == kBF16) and pad16(latent) + pad16(rope) <= 576.
// kVec (the host's choice, vector_kernel in kernels/src/ops/mla_decode.rs): the cache takes
// load_tile's 16-byte path (vector_path(c)), and the query rows are 16-byte aligned (q.q, q.off,
// q.st, q.sh multiples of 8 elements); the row tile's queries are then staged through the KV
// buffer in 16-byte loads and the fragments read from shared memory. Otherwise each fragment
// slot is one 2-byte global load and the cache may go bytewise.
template <bool kVec>
K3_AMD_INLINE K3_DEVICE void attend_mma(const Cache& c, const Query& q, const Rows& r, float score_scale, float out_scale,
                          const Dest& dst, uint8_t* shared) {
  const MmaSmem sm = carve_mma(shared);
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int warp = tid / k3::kWarpSize;
  const int lp = pad16(c.latent);
  const int wpad = lp + pad16(c.rope);
  const int nks = wpad / 16;
  const int pitch = kv_pitch(wpad);
  const bool tiled = c.kind == kFormatTiled;
  const float neg_inf = k3::uint_as_float(0xff800000u);
  const int total_rows = r.q_rows * r.gh;
  const int last = (r.rho0 + kRows < total_rows ? r.rho0 + kRows : total_rows) - 1;
  int kv_hi = r.causal ? r.first_pos + last / r.gh + 1 : r.n_keys;
  kv_hi = kv_hi < r.kv_end ? kv_hi : r.kv_end;

  // This warp's query fragments: k-steps warp, warp + kWarps, ...
  k3::mma::FragA<Shape> qa[kQSteps];
  const uint16_t* qbits = static_cast<const uint16_t*>(q.q);
  if constexpr (kVec) {
    // Rows of wpad = latent + rope values, 8 per 16-byte unit, into the (not yet used) KV
    // buffer at its pitch; rows past the item are zero. The KV loop's first barrier orders the
    // fragment reads below before the first tile overwrites the buffer.
    const int units = wpad / 8;
    for (int i = tid; i < kRows * units; i += kBlock) {
      const int row = i / units, u = i - row * units;
      const int rho = r.rho0 + row;
      k3::u32x4 v = {{0u, 0u, 0u, 0u}};
      if (rho < total_rows) v = k3::load_16b(qbits + q.off + (rho / r.gh) * q.st + (r.head0 + rho % r.gh) * q.sh + 8 * u);
      k3::store_16b(sm.raw + row * pitch + 8 * u, v);
    }
    k3::sync_threads();
  }
  K3_UNROLL
  for (int i = 0; i < kQSteps; ++i) {
    const int ks = warp + i * kWarps;
    K3_UNROLL
    for (int s = 0; s < Shape::kASlots; ++s) {
      const k3::layout::RC rc = k3::mma::a_coord<Shape>(s);
      const int rho = r.rho0 + rc.row;
      const int col = ks * 16 + rc.col;
      uint16_t v = 0;
      if constexpr (kVec) {
        if (ks < nks) v = sm.raw[rc.row * pitch + col];
      } else {
        const int e = col < c.latent ? col : (col >= lp && col - lp < c.rope ? c.latent + col - lp : -1);
        if (ks < nks && rho < total_rows && e >= 0) v = qbits[q.off + (rho / r.gh) * q.st + (r.head0 + rho % r.gh) * q.sh + e];
      }
      qa[i].x[s] = v;
    }
  }

  // The softmax state of row `srow` lives in the 16 threads (srow, 0..15).
  const int srow = tid / kMmaTile, scol = tid % kMmaTile;
  const int rho = r.rho0 + srow;
  const int qi = rho / r.gh;
  int limit = r.causal ? r.first_pos + qi + 1 : r.n_keys;
  limit = rho >= total_rows ? 0 : (limit < r.kv_end ? limit : r.kv_end);
  float m = neg_inf, l = 0.0f;

  k3::mma::FragC<Shape> oacc[kPvTiles];
  K3_UNROLL
  for (int u = 0; u < kPvTiles; ++u) k3::mma::fill(oacc[u], 0.0f);

  for (int s0 = r.kv_start; s0 < kv_hi; s0 += kMmaTile) {
    const int n = kv_hi - s0 < kMmaTile ? kv_hi - s0 : kMmaTile;
    k3::sync_threads();  // the previous tile is consumed
    load_tile<kVec>(c, s0, n, kMmaTile, wpad, lp, sm.raw, sm.mult);
    k3::sync_threads();

    // S partials of this warp's k-steps.
    K3_UNROLL
    for (int nt = 0; nt < kSTiles; ++nt) {
      k3::mma::FragC<Shape> sacc;
      k3::mma::fill(sacc, 0.0f);
      K3_UNROLL
      for (int i = 0; i < kQSteps; ++i) {
        const int ks = warp + i * kWarps;
        if (ks >= nks) continue;  // warp-uniform
        k3::mma::FragB<Shape> kb;
        k3::mma::load_b_transposed(kb, reinterpret_cast<const k3::bf16*>(sm.raw + nt * Shape::N * pitch + ks * 16), pitch);
        if (tiled) {
          k3::mma::FragC<Shape> t;
          k3::mma::fill(t, 0.0f);
          k3::mma::mma_sync(t, qa[i], kb, t);
          const int slot = mult_slot(ks * 16, lp);
          K3_UNROLL
          for (int e = 0; e < Shape::kCSlots; ++e) {
            const k3::layout::RC rc = k3::mma::c_coord<Shape>(e);
            sacc.x[e] += t.x[e] * sm.mult[(nt * Shape::N + rc.col) * kMultSlots + slot];
          }
        } else {
          k3::mma::mma_sync(sacc, qa[i], kb, sacc);
        }
      }
      k3::mma::store_c(sacc, sm.spart + warp * kRows * kMmaTile + nt * Shape::N, kMmaTile);
    }
    k3::sync_threads();

    // Online softmax, one thread per score.
    float sc = 0.0f;
    for (int w = 0; w < kWarps; ++w) sc += sm.spart[(w * kRows + srow) * kMmaTile + scol];
    sc = scol < n && s0 + scol < limit ? sc * score_scale : neg_inf;
    float tmax = sc;
    for (int o = kMmaTile / 2; o > 0; o >>= 1) tmax = k3::max_f32(tmax, k3::shfl_xor(tmax, o, kMmaTile));
    const float m_new = k3::max_f32(m, tmax);
    const bool live = m_new != neg_inf;
    const float alpha = live ? k3::exp_f32(m - m_new) : 1.0f;
    const float p = live ? k3::exp_f32(sc - m_new) : 0.0f;
    sm.p[srow * kMmaTile + scol] = p;
    float psum = p;
    for (int o = kMmaTile / 2; o > 0; o >>= 1) psum += k3::shfl_xor(psum, o, kMmaTile);
    l = l * alpha + psum;
    m = m_new;
    if (scol == 0) sm.alpha[srow] = alpha;
    k3::sync_threads();

    // PV into this warp's output n-tiles.
    K3_UNROLL
    for (int u = 0; u < kPvTiles; ++u) {
      const int col0 = (warp + u * kWarps) * Shape::N;
      if (col0 >= c.latent) continue;  // warp-uniform
      const int slot = mult_slot(col0, lp);
      k3::mma::FragA<Shape> hi, lo;
      K3_UNROLL
      for (int e = 0; e < Shape::kASlots; ++e) {
        const k3::layout::RC rc = k3::mma::a_coord<Shape>(e);
        float pv = sm.p[rc.row * kMmaTile + rc.col];
        if (tiled) pv *= sm.mult[rc.col * kMultSlots + slot];
        const k3::bf16 h = k3::f32_to_bf16(pv);
        hi.x[e] = h.bits;
        lo.x[e] = k3::f32_to_bf16(pv - k3::bf16_to_f32(h)).bits;
      }
      K3_UNROLL
      for (int e = 0; e < Shape::kCSlots; ++e) oacc[u].x[e] *= sm.alpha[k3::mma::c_coord<Shape>(e).row];
      k3::mma::FragB<Shape> vb;
      k3::mma::load_b(vb, reinterpret_cast<const k3::bf16*>(sm.raw + col0), pitch);
      k3::mma::mma_sync(oacc[u], hi, vb, oacc[u]);
      k3::mma::mma_sync(oacc[u], lo, vb, oacc[u]);
    }
  }

  if (scol == 0) sm.l[srow] = l;
  if (scol == 0 && rho < total_rows && dst.lse != nullptr) {
    dst.lse[dst.loff + qi * dst.lst + (dst.head_base + rho % r.gh) * dst.lsh] = l > 0.0f ? m + k3::log_f32(l) : neg_inf;
  }
  k3::sync_threads();
  K3_UNROLL
  for (int u = 0; u < kPvTiles; ++u) {
    const int col0 = (warp + u * kWarps) * Shape::N;
    if (col0 >= c.latent) continue;
    K3_UNROLL
    for (int e = 0; e < Shape::kCSlots; ++e) {
      const k3::layout::RC rc = k3::mma::c_coord<Shape>(e);
      const int orho = r.rho0 + rc.row;
      const int d = col0 + rc.col;
      if (orho >= total_rows || d >= c.latent) continue;
      const float den = sm.l[rc.row];
      const float v = den > 0.0f ? oacc[u].x[e] * (out_scale / den) : 0.0f;
      k3::store_f32(dst.out, dst.out_dt, dst.off + (orho / r.gh) * dst.st + (dst.head_base + orho % r.gh) * dst.sh + d, v);
    }
  }
}

}  // namespace mla

#endif  // K3_OPS_MLA_ATTEND_MMA_CUH
