// Tensor-core variant of the absorbed-MLA attention core (mla_attend.cuh) for bf16 queries, and
// for f32 ones as bf16 hi + lo planes (kSplitQ, "f32 queries" below): the same row tiles (16
// (query, head) rows = one MMA M tile) over 16-token KV tiles, with
// QK^T and PV as k3::mma bf16 products accumulating in f32 (mma.sync m16n8k16 at warp 32,
// MFMA 16x16x16 at warp 64; the fragment maps of k3/mma_layout.h make the code shape-generic).
//
// - Staging (`*_mma` at warp 32): a pipeline of Cache::kv_stages stages (2 to kMaxKvStages,
//   the host's choice by row size and the device's shared memory; kRawStaging): the cache rows
//   as stored, copied by k3::AsyncCopy (cp.async 16 B on CUDA) up to seven tiles ahead of the
//   one being multiplied, at a bank-conflict-free pitch raw_pitch
//   (mla_kv_load.cuh); the K and V fragment loads decode them (fp8 pairs by the packed
//   hardware converts, the tile scales read from the staged row). Per tile: one barrier for
//   "previous tile consumed" (then the next copies are issued), a wait for this tile's group,
//   one barrier for "tile visible".
// - Staging (`*_mma` at warp 64, AMD, whose copies are synchronous: the next tile's raw rows
//   prefetched into registers under this tile's products, fetch_tile / decode_tile below;
//   `*_mma_unaligned`: load_tile, bytewise if it must): the KV tile as raw bf16 (exact for
//   every format, see mla_attend.cuh) in rows of `wpad` = pad16(latent) + pad16(rope) columns
//   at pitch kv_pitch(wpad), rope from column pad16(latent), zero padding, per-(token,
//   128-tile) multipliers for the tile-scaled format.
// - QK^T: the 36 (K3) k-steps of 16 dims are dealt round-robin to the warps, each warp holding
//   its queries' A fragments in registers for the whole item; a k-step lies in one scale tile,
//   so tile-scaled caches scale each k-step's product per token column. Warp partials of S
//   [16 x 16] meet in shared memory and 256 threads (one per score) sum them.
// - Softmax: online, f32, one thread per (row, token), width-16 shuffles per row.
// - PV: each warp owns kPvCols adjacent latent output columns as kPvTiles n-tiles (f32 C
//   fragments in registers), interleaved so that a lane's slots of all its n-tiles are adjacent
//   columns: V comes in one 8-byte (fp8) or 16-byte (bf16) shared load per token and lane, and
//   the output goes out in 16-byte stores (see kPvCols). P is split into bf16 hi + lo parts (two
//   MMAs; split_bf16x2), so the product keeps ~16 bits of P: f32-grade output from bf16
//   operands. A warp's columns lie in one scale tile: V's multiplier is folded into P once per
//   KV tile.
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
constexpr int kMaxRowUnits = 2 * kMaxWidth / 16;                 // 16-byte units of the widest raw row (bf16)
constexpr int kQUnits = (kRows * kMaxWidth / 8 + kBlock - 1) / kBlock;  // 16-byte query units per thread (5)
static_assert(kRows * kMmaTile == kBlock, "one thread per score");
static_assert(kRows == Shape::M, "a row tile is one MMA M tile");

K3_HOST_DEVICE constexpr int pad16(int x) { return (x + 15) / 16 * 16; }

// The pipeline's wait (attend_mma) names every count of tiles ahead up to kMaxKvStages - 1.
static_assert(kMaxKvStages <= 8, "attend_mma's wait covers at most seven tiles ahead");

// Copies one thread has in flight in the pipeline (k3::AsyncCopy's capacity): its share of a
// tile's 16-byte units, per stage.
constexpr int kCopySlots = kMaxKvStages * ((kMmaTile + kWarps - 1) / kWarps) * ((kMaxRowUnits + k3::kWarpSize - 1) / k3::kWarpSize);

// Dynamic shared memory of the MMA core (the host sizes it: kernels/src/ops/mla_decode.rs,
// `core`): 8 warps' partial scores [8][16][16] f32, P [16][16], alpha [16], l [16], multipliers
// [16][kMultSlots], then the KV area: the bf16 tile [16][kv_pitch(wpad)], or (raw pipeline) the
// larger of that and Cache::kv_stages stages of [16][raw_pitch(row_bytes)] bytes, which also
// hold the bf16 query rows while their fragments are read.

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
// The scale tile of a warp's i-th k-step (warp + i x kWarps) below the rope, the same for every
// warp: the kWarps steps of one i lie in one tile.
K3_HOST_DEVICE constexpr int step_tile(int i) { return kWarps * 16 * i / kScaleTile; }
static_assert(kScaleTile % (kWarps * 16) == 0, "the warps' k-steps of one i lie in one scale tile");

// A raw staged KV tile (kRaw) as the fragment loads read it: token t's row at rows + t * pitch;
// padded column `col` < fp8_cols is the e4m3 code at byte col (decoded here), any other column
// the bf16 at byte bf16_off + 2 * col. Multipliers (tile-scaled format only): the f32 scales stored in
// the raw row at scale_byte.
struct KvStage {
  const uint8_t* rows;
  int pitch;
  int fp8_cols;
  int bf16_off;
  int scale_byte;
  bool fnuz;
};

K3_DEVICE float stage_mult(const KvStage& s, int t, int slot) {
  return slot < kMultSlots - 1 ? *reinterpret_cast<const float*>(s.rows + t * s.pitch + s.scale_byte + 4 * slot) : 1.0f;
}

// ---- QK^T's columns ----
// Within a k-step, the query's A and K's B fragments read logical k at physical column
// k3::mma::k_perm<Shape>(k) (k3/mma.h: a permutation that puts a lane's four B slots on four
// adjacent columns; the identity on MFMA): a K fragment is one 4-byte (fp8 codes) or 8-byte
// (bf16) shared load, where the slot pairs of m16n8k16 took two. A k-step keeps its 16 columns,
// so it stays in one scale tile.
K3_HOST_DEVICE constexpr int k_col(int k) { return k3::mma::k_perm<Shape>(k); }

// B = K^T over tokens t0 .. t0 + N and the k-step at col0, from a raw stage.
K3_DEVICE void load_k_frag(k3::mma::FragB<Shape>& f, const KvStage& s, int t0, int col0) {
  const k3::layout::RC rc = k3::mma::b_coord<Shape>(0);
  const uint8_t* row = s.rows + (t0 + rc.col) * s.pitch;
  const int col = col0 + k_col(rc.row);
  uint32_t w[2];
  if (col < s.fp8_cols) {
    const uint32_t codes = *reinterpret_cast<const uint32_t*>(row + col);
    w[0] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(codes & 0xffffu), s.fnuz);
    w[1] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(codes >> 16), s.fnuz);
  } else {
    const k3::u32x2 v = k3::load_8b(row + s.bf16_off + 2 * col);
    w[0] = v.v[0];
    w[1] = v.v[1];
  }
  K3_UNROLL
  for (int i = 0; i < Shape::kBSlots; ++i) f.x[i] = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
}

// ---- PV's columns ----
// Warp w owns the kPvCols latent columns from w x kPvCols, and column n of its n-tile u is latent
// column w x kPvCols + n x kPvTiles + u. A lane's B slots all hold one column n (both fragment
// layouts), so across the kPvTiles n-tiles they hold kPvTiles adjacent columns of each of the
// slots' tokens: one 8-byte (fp8 codes) or 16-byte (bf16) shared load per token (a "run") feeds
// every n-tile, where per-slot loads took kPvTiles x kBSlots 1- or 2-byte loads; fp8 slot pairs
// then decode through one packed convert. A lane's C slots likewise hold kPvTiles adjacent output
// columns each (16-byte stores).
constexpr int kPvCols = kPvTiles * Shape::N;
static_assert(kPvTiles == 8, "a run is 8 values: 8 bytes of fp8 codes, 16 of bf16");
static_assert(kPvCols * kWarps == kMaxLatent, "the warps' columns tile the widest latent");
static_assert(kScaleTile % kPvCols == 0, "a warp's PV columns lie in one scale tile");

K3_HOST_DEVICE constexpr bool b_one_col_per_lane() {
  for (int lane = 0; lane < Shape::kWarp; ++lane) {
    for (int i = 0; i < Shape::kBSlots; ++i) {
      if (Shape::b(lane, i).col != Shape::b(lane, 0).col) return false;
    }
  }
  return true;
}
static_assert(b_one_col_per_lane() && Shape::kBSlots % 2 == 0, "V runs: one column per lane, slots in pairs");

// This lane's V runs of a tile: per B slot, the kPvTiles values of the slot's token from the
// lane's first column (pv0 + n x kPvTiles), as stored: fp8 codes in r[i].v[0..1] (kFp8) or bf16
// in r[i].v[0..3]. Runs at or past `latent` read as zero (whole runs: on the staged paths latent
// is a multiple of 16, and the bf16 tile of load_tile is zero from latent to pad16(latent)).
struct VRuns {
  k3::u32x4 r[Shape::kBSlots];
};

template <bool kFp8>
K3_DEVICE void load_v_runs(VRuns& v, const KvStage& s, int pv0, int latent) {
  const int col = pv0 + k3::mma::b_coord<Shape>(0).col * kPvTiles;
  const bool live = col < latent;
  K3_UNROLL
  for (int i = 0; i < Shape::kBSlots; ++i) {
    const uint8_t* row = s.rows + k3::mma::b_coord<Shape>(i).row * s.pitch;
    k3::u32x4 x = {{0u, 0u, 0u, 0u}};
    if (kFp8 && live) {
      const k3::u32x2 h = k3::load_8b(row + col);
      x.v[0] = h.v[0];
      x.v[1] = h.v[1];
    } else if (live) {
      x = k3::load_16b(row + s.bf16_off + 2 * col);
    }
    v.r[i] = x;
  }
}

// B = V of n-tile u from the runs.
template <bool kFp8>
K3_DEVICE void v_frag(k3::mma::FragB<Shape>& f, const VRuns& v, int u, bool fnuz) {
  K3_UNROLL
  for (int i = 0; i < Shape::kBSlots; i += 2) {
    uint32_t w;
    if (kFp8) {
      const uint32_t lo = (v.r[i].v[u / 4] >> (8 * (u % 4))) & 0xffu;
      const uint32_t hi = (v.r[i + 1].v[u / 4] >> (8 * (u % 4))) & 0xffu;
      w = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(lo | hi << 8), fnuz);
    } else {
      const uint32_t lo = (v.r[i].v[u / 2] >> (16 * (u % 2))) & 0xffffu;
      const uint32_t hi = (v.r[i + 1].v[u / 2] >> (16 * (u % 2))) & 0xffffu;
      w = lo | hi << 16;
    }
    f.x[i] = static_cast<uint16_t>(w & 0xffffu);
    f.x[i + 1] = static_cast<uint16_t>(w >> 16);
  }
}

// oacc[u] += P V for n-tile u of the warp's columns: the alpha rescale, then the hi and lo MMAs.
template <bool kFp8>
K3_AMD_INLINE K3_DEVICE void pv_products(k3::mma::FragC<Shape> (&oacc)[kPvTiles], const k3::mma::FragA<Shape>& hi,
                           const k3::mma::FragA<Shape>& lo, const float (&alpha)[Shape::kCSlots], const KvStage& s,
                           int pv0, int latent) {
  VRuns v;
  load_v_runs<kFp8>(v, s, pv0, latent);
  K3_UNROLL
  for (int u = 0; u < kPvTiles; ++u) {
    K3_UNROLL
    for (int e = 0; e < Shape::kCSlots; ++e) oacc[u].x[e] *= alpha[e];
    k3::mma::FragB<Shape> vb;
    v_frag<kFp8>(vb, v, u, s.fnuz);
    k3::mma::mma_sync(oacc[u], hi, vb, oacc[u]);
    k3::mma::mma_sync(oacc[u], lo, vb, oacc[u]);
  }
}

// ---- Register prefetch of the next two KV tiles (`*_mma` at warp 64: AMD) ----
// There k3::AsyncCopy is a synchronous register copy (k3/async_copy.h) and one decoded bf16 tile
// is staged (kRawStaging is off), so the tile's loads would sit in front of its products. Instead
// the raw 16-byte units of tile i + 2 are loaded into registers right after tile i becomes
// visible, and decoded into the staged layout (as load_tile's fast path writes it) after tile
// i + 1's products: two tiles' loads run under the MFMAs (kPrefetchTiles). Estimated, not measured:
// one fp8 tile per block is 608 blocks x 10.5 KB = 6.4 MB in flight on MI300X, and 5.3 TB/s at
// 1-2 us of loaded latency asks for 5-11 MB. The compiler's wait for a tile at its decode (s_waitcnt
// vmcnt(N)) leaves the next one in flight. Thread tid holds units u0 + 16 k of token tid / 16 (u0
// = tid % 16): 16 threads per token, 256 contiguous bytes per token and slot, no division and no
// shuffle; its row offset comes from one block-table read, issued a tile earlier (tile_page,
// checked as read). kPrefetchSlots = 3 slots cover K3's fp8
// rows (36 units flat, 41 tile-scaled); a bf16 row (72 units) loads its units from 48 on at decode
// time, keeping the registers held across the products at 2 x (12 + 2) + 1 VGPRs.
constexpr int kTokenThreads = kBlock / kMmaTile;                                       // 16
constexpr int kPrefetchTiles = 2;
constexpr int kPrefetchSlots = 3;
constexpr int kDecodeSlots = (kMaxRowUnits + kTokenThreads - 1) / kTokenThreads;      // 5
static_assert(kTokenThreads * kMmaTile == kBlock, "whole tokens per thread group");

struct TileUnits {
  k3::u32x4 v[kPrefetchSlots];
  int64_t row;  // byte offset of the token row the units came from
};

// This thread's token in the tile at s0; a token at or past kv_hi (dead) stands in for token
// kv_hi - 1 (callers run only for items with kv_start < kv_hi), so dead tokens read a live row
// and drop it.
K3_DEVICE int tile_token(int s0, int kv_hi) {
  const int s = s0 + static_cast<int>(k3::thread_idx_x_unhoisted()) / kTokenThreads;
  return s < kv_hi ? s : kv_hi - 1;
}

// The block-table entry of this thread's token in the tile at s0. attend_mma reads it one tile
// before the tile's units: the units' loads then depend on a value that arrived long ago, and
// the compiler's wait for it does not also wait for the other tile's loads in flight (waits
// count loads in issue order, and a read issued just before them would be the newest).
K3_DEVICE int tile_page(const Cache& c, int s0, int kv_hi) {
  const int s = tile_token(s0, kv_hi);
  return static_cast<int>(checked_page(c, s / c.page_size));
}

// Raw 16-byte units of the tile at s0 (its block-table entry `page`, from tile_page) for this
// thread: slot k = unit u0 + 16 k of its token (past the row: its last unit, never decoded); a
// dead token's are a live row's (decode_tile writes zeros for it). Every thread issues the same
// loads whatever s0, the row width or the live tokens: with no branch around them the compiler's
// wait at decode_tile counts only the loads issued before this fetch (s_waitcnt vmcnt(N) with the
// later tiles' loads left in flight; a load under a branch makes it wait for all of them).
K3_DEVICE void fetch_tile(const Cache& c, int s0, int kv_hi, int page, int units, TileUnits& f) {
  const int s = tile_token(s0, kv_hi);
  f.row = static_cast<int64_t>(page) * c.page_stride + static_cast<int64_t>(s % c.page_size) * c.row_stride;
  const uint8_t* row = c.base + f.row;
  const int u0 = static_cast<int>(k3::thread_idx_x_unhoisted()) % kTokenThreads;
  K3_UNROLL
  for (int k = 0; k < kPrefetchSlots; ++k) {
    const int u = u0 + k * kTokenThreads;
    f.v[k] = k3::load_16b(row + 16 * (u < units ? u : units - 1));
  }
}

// Writes the fetched tile at s0 into `raw` (pitch kv_pitch(latent + rope), rope from column
// latent) and `mult` as load_tile's 16-byte path would: fp8 units as 16 bf16s, bf16 units as they are, the
// tile scales of a live token into its multipliers (1 elsewhere); dead tokens are zero rows.
K3_DEVICE void decode_tile(const Cache& c, int s0, int n, int units, const TileUnits& f, uint16_t* raw, float* mult) {
  const int tid = static_cast<int>(k3::thread_idx_x_unhoisted());
  const int t = tid / kTokenThreads, u0 = tid % kTokenThreads;
  const bool tiled = c.kind == kFormatTiled;
  const int fp8_units = c.kind == kFormatFlat ? units : (tiled ? c.latent / 16 : 0);
  const int bf16_col0 = c.kind == kFormatBf16 ? 0 : c.latent;  // staged column of the first bf16 unit
  const int bf16_unit0 = tiled ? fp8_units + 1 : fp8_units;    // its unit in the raw row
  const bool fnuz = c.fnuz != 0;
  const bool live = t < n;
  uint16_t* dst = raw + t * kv_pitch(c.latent + c.rope);
  float* m = mult + t * kMultSlots;
  // Every unit is taken (a dead token's dropped) before any branch on the lane: the compiler's
  // wait for a load lands at its first use, and one inside a lane-dependent branch leaves the
  // load pending on the other path, which then costs a wait for every load in flight (the next
  // tiles' too) at the next reuse of its registers.
  const k3::u32x4 zero = {{0u, 0u, 0u, 0u}};
  k3::u32x4 vs[kDecodeSlots] = {};
  K3_UNROLL
  for (int k = 0; k < kPrefetchSlots; ++k) vs[k] = live ? f.v[k] : zero;
  if (units > kPrefetchSlots * kTokenThreads) {  // bf16 rows (block-uniform): the tail loads now
    K3_UNROLL
    for (int k = kPrefetchSlots; k < kDecodeSlots; ++k) {
      const int u = u0 + k * kTokenThreads;
      const k3::u32x4 v = k3::load_16b(c.base + f.row + 16 * (u < units ? u : units - 1));
      vs[k] = live ? v : zero;
    }
  }
  K3_UNROLL
  for (int k = 0; k < kDecodeSlots; ++k) {
    const int u = u0 + k * kTokenThreads;
    if (u >= units) break;
    const k3::u32x4 v = vs[k];
    if (u < fp8_units) {
      k3::u32x4 lo, hi;
      fp8x8_to_bf16(v.v[0], v.v[1], fnuz, lo.v);
      fp8x8_to_bf16(v.v[2], v.v[3], fnuz, hi.v);
      k3::store_16b(dst + 16 * u, lo);
      k3::store_16b(dst + 16 * u + 8, hi);
    } else if (tiled && u == fp8_units) {  // the four tile scales (vector_path: tiles == 4)
      K3_UNROLL
      for (int j = 0; j < 4; ++j) m[j] = live ? k3::uint_as_float(v.v[j]) : 1.0f;
      m[kMultSlots - 1] = 1.0f;
    } else {
      k3::store_16b(dst + bf16_col0 + 8 * (u - bf16_unit0), v);
    }
  }
  if (!tiled && u0 < kMultSlots) m[u0] = 1.0f;
}

// ---- f32 operands as two bf16 planes (P in PV; f32 queries, kSplitQ) ----
// x = hi + lo + e with hi = bf16(x) and lo = bf16(x - hi), both rounded to nearest even (x - hi
// is exact in f32): |e| <= 2^-16 |x|, so two bf16 MMAs keep ~16 bits of x. An infinity stays in
// hi (lo = 0), a finite x that rounds to an infinity is truncated instead (hi finite, the
// remainder in lo), a NaN stays a NaN.

// bf16(x) rounded to nearest even, or truncated where that rounds a finite x to an infinity.
K3_DEVICE float bf16_hi(float x, uint32_t rounded_half) {
  const float h = k3::uint_as_float(rounded_half << 16);
  const bool overflow = (k3::float_as_uint(h) & 0x7fffffffu) == 0x7f800000u && (k3::float_as_uint(x) & 0x7fffffffu) < 0x7f800000u;
  return overflow ? k3::uint_as_float(k3::float_as_uint(x) & 0xffff0000u) : h;
}

// The planes of (a, b), packed as fragment registers hold them (a in the low half).
K3_DEVICE void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const uint32_t r = k3::pack_bf16x2_rn(a, b);
  const float ha = bf16_hi(a, r & 0xffffu), hb = bf16_hi(b, r >> 16);
  const bool ia = (k3::float_as_uint(ha) & 0x7fffffffu) == 0x7f800000u, ib = (k3::float_as_uint(hb) & 0x7fffffffu) == 0x7f800000u;
  hi = k3::byte_perm(k3::float_as_uint(ha), k3::float_as_uint(hb), 0x7632);
  lo = k3::pack_bf16x2_rn(ia ? 0.0f : a - ha, ib ? 0.0f : b - hb);
}

// An f32 query goes to the matrix units as these two planes, read straight into the warp's A
// fragments with no staging: a lane's A slots lie in groups of four on one row at four adjacent
// k_perm columns (k3::mma::a_group_slot), so each group of a k-step is one 16-byte f32 load, and
// the warp's k-steps read each query value once per block.
constexpr int kAGroups = k3::mma::a_groups<Shape>();
K3_HOST_DEVICE constexpr int a_group_slot(int g, int i) { return k3::mma::a_group_slot<Shape>(g, i); }

// One 16-byte group of four f32 query values into the hi and lo slots of its A fragments.
K3_DEVICE void split_q_group(const k3::u32x4& x, int g, k3::mma::FragA<Shape>& hi, k3::mma::FragA<Shape>& lo) {
  K3_UNROLL
  for (int p = 0; p < 2; ++p) {
    uint32_t h, l;
    split_bf16x2(k3::uint_as_float(x.v[2 * p]), k3::uint_as_float(x.v[2 * p + 1]), h, l);
    hi.x[a_group_slot(g, 2 * p)] = static_cast<uint16_t>(h & 0xffffu);
    hi.x[a_group_slot(g, 2 * p + 1)] = static_cast<uint16_t>(h >> 16);
    lo.x[a_group_slot(g, 2 * p)] = static_cast<uint16_t>(l & 0xffffu);
    lo.x[a_group_slot(g, 2 * p + 1)] = static_cast<uint16_t>(l >> 16);
  }
}

// cp.wait<ahead>() for a run-time `ahead` in 1 .. kMaxKvStages - 1 (the wait's count is an
// immediate in cp.async.wait_group).
template <class Copy>
K3_DEVICE void wait_ahead(Copy& cp, int ahead) {
  switch (ahead) {
    case 1: cp.template wait<1>(); break;
    case 2: cp.template wait<2>(); break;
    case 3: cp.template wait<3>(); break;
    case 4: cp.template wait<4>(); break;
    case 5: cp.template wait<5>(); break;
    case 6: cp.template wait<6>(); break;
    default: cp.template wait<7>(); break;
  }
}

// As mla::attend, for bf16 queries (q.dt == kBF16; f32 with kSplitQ) and pad16(latent) +
// pad16(rope) <= 576.
// kVec (the host's choice, vector_kernel in kernels/src/ops/mla_decode.rs): the cache rows are
// 16-byte copyable (vector_path(c)), and the query rows are 16-byte aligned (q.q, q.off, q.st,
// q.sh multiples of 8 elements); the row tile's queries are then staged through the KV area in
// 16-byte loads and the fragments read from shared memory, and the KV tiles run through the
// copy pipeline. Otherwise each query fragment slot is one 2-byte global load and the cache
// goes through load_tile (bytewise if it must).
// kSplitQ (with kVec): f32 queries (q.dt == kF32, rows 16-byte aligned), read straight into hi
// and lo A fragments (split_q_group) and multiplied twice per k-step; nothing of them is staged,
// so every first tile's copies go out right behind the query loads.
template <bool kVec, bool kSplitQ = false>
K3_AMD_INLINE K3_DEVICE void attend_mma(const Cache& c, const Query& q, const Rows& r, float score_scale, float out_scale,
                          const Dest& dst, uint8_t* shared) {
  const MmaSmem sm = carve_mma(shared);
  const int tid = static_cast<int>(k3::thread_idx_x_unhoisted());
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

  // The KV staging: the raw pipeline (kRaw: kVec at warp 32), the register prefetch (kPrefetch:
  // kVec at warp 64), or load_tile (!kVec).
  constexpr bool kRaw = kVec && kRawStaging;
  constexpr bool kPrefetch = kVec && !kRawStaging;
  // kPrefetch: the raw units of the next kRing tiles, tile i's in pre[i % kRing] (the loop below
  // runs rounds of kRing tiles so the index is a constant); the first ones run under the query
  // staging.
  constexpr int kRing = kPrefetch ? kPrefetchTiles : 1;
  TileUnits pre[kRing];
  int page_ahead = 0;  // kPrefetch: the block-table entry of the next tile to fetch (tile_page)
  if constexpr (kPrefetch) {
    if (r.kv_start < kv_hi) {  // block-uniform
      const int units = raw_row_bytes(c.kind, c.latent, c.rope) / 16;
      K3_UNROLL
      for (int a = 0; a < kRing; ++a) fetch_tile(c, r.kv_start + a * kMmaTile, kv_hi, tile_page(c, r.kv_start + a * kMmaTile, kv_hi), units, pre[a]);
      page_ahead = tile_page(c, r.kv_start + kRing * kMmaTile, kv_hi);
    }
  }

  // The KV stages (kRaw): raw cache rows (see mla_kv_load.cuh, "Raw staging"), tile i in stage
  // i % n_stages (`stage`, `fill` below), the copies of tiles i + 1 .. i + ahead in flight while
  // tile i is multiplied. Otherwise one tile staged as bf16 (decode_tile, load_tile),
  // multipliers in sm.mult.
  const int row_bytes = raw_row_bytes(c.kind, c.latent, c.rope);
  const int rpitch = raw_pitch(row_bytes);
  KvStage st;
  st.rows = reinterpret_cast<const uint8_t*>(sm.raw);
  st.pitch = rpitch;
  st.fp8_cols = c.kind == kFormatFlat ? wpad : (tiled ? c.latent : 0);
  st.bf16_off = tiled ? c.latent + 4 * ((c.latent + kScaleTile - 1) / kScaleTile) - 2 * c.latent : 0;
  st.scale_byte = c.latent;
  st.fnuz = c.fnuz != 0;
  // The single bf16 tile (!kRaw) read as a stage of bf16 columns.
  KvStage tile = st;
  tile.pitch = 2 * pitch;
  tile.fp8_cols = 0;
  tile.bf16_off = 0;
  uint8_t* const stages = reinterpret_cast<uint8_t*>(sm.raw);
  // Clamped to what the wait below names (a value outside 2 .. kMaxKvStages is a host bug).
  const int n_stages = !kRaw ? 1 : (c.kv_stages < 2 ? 2 : (c.kv_stages > kMaxKvStages ? kMaxKvStages : c.kv_stages));
  const int ahead = n_stages - 1;  // tiles in flight beyond the one being multiplied
  int stage = 0, fill = ahead;     // the stages of the tile at s0 and of the one `ahead` later
  k3::AsyncCopy<kCopySlots> cp;
  // The first `ahead` tiles, one commit group each. kRaw: tiles [0, early) go out before the
  // query rows are loaded, into the stages below the rows' place at the end of the KV area
  // (q_off), so their block-table reads and copies are in flight with the query loads rather
  // than behind them (one dependent round trip less before an item's first KV bytes); the rest
  // follow once the query fragments are in registers.
  auto issue_first = [&](int a0, int a1) K3_AMD_INLINE {
    for (int a = a0; a < a1; ++a) {
      const int sa = r.kv_start + a * kMmaTile;
      if (sa < kv_hi) issue_tile(cp, c, sa, kv_hi - sa < kMmaTile ? kv_hi - sa : kMmaTile, kMmaTile, row_bytes, rpitch, stages + a * kMmaTile * rpitch);
      cp.commit();
    }
  };
  const int stage_bytes = kMmaTile * rpitch;
  const int q_bytes = 2 * kRows * pitch;
  const int q_off = kRaw && n_stages * stage_bytes > q_bytes ? n_stages * stage_bytes - q_bytes : 0;  // 16-B multiples
  const int early = q_off / stage_bytes < ahead ? q_off / stage_bytes : ahead;
  uint16_t* const q_rows = reinterpret_cast<uint16_t*>(stages + q_off);

  // This warp's query fragments: k-steps warp, warp + kWarps, ... (kSplitQ: qa the hi plane).
  static_assert(kVec || !kSplitQ, "f32 queries take the 16-byte path");
  k3::mma::FragA<Shape> qa[kQSteps];
  k3::mma::FragA<Shape> qlo[kSplitQ ? kQSteps : 1];
  const uint16_t* qbits = static_cast<const uint16_t*>(q.q);
  if constexpr (kSplitQ) {
    // Every group's load is issued (a dead one reads a live address and is dropped) before any
    // is used, then the first tiles' copies, then the split. A group's row is the same in every
    // k-step: its address (a division by the group's heads) is computed once.
    const float* qf = static_cast<const float*>(q.q);
    const k3::u32x4 zero = {{0u, 0u, 0u, 0u}};
    const float* grow[kAGroups];
    int gcol[kAGroups];
    bool glive[kAGroups];
    K3_UNROLL
    for (int g = 0; g < kAGroups; ++g) {
      const k3::layout::RC rc = k3::mma::a_coord<Shape>(a_group_slot(g, 0));
      const int rho = r.rho0 + rc.row;
      glive[g] = rho < total_rows;
      const int rl = glive[g] ? rho : r.rho0;
      grow[g] = qf + q.off + (rl / r.gh) * q.st + (r.head0 + rl % r.gh) * q.sh;
      gcol[g] = k_col(rc.col);
    }
    k3::u32x4 qv[kQSteps][kAGroups];
    K3_UNROLL
    for (int i = 0; i < kQSteps; ++i) {
      const int ks = warp + i * kWarps;
      const bool step = ks < nks;  // warp-uniform
      K3_UNROLL
      for (int g = 0; g < kAGroups; ++g) {
        const k3::u32x4 v = k3::load_16b(grow[g] + (step ? ks * 16 + gcol[g] : 0));  // lp == latent on this path
        qv[i][g] = step && glive[g] ? v : zero;
      }
    }
    if constexpr (kRaw) issue_first(0, ahead);
    K3_UNROLL
    for (int i = 0; i < kQSteps; ++i) {
      K3_UNROLL
      for (int g = 0; g < kAGroups; ++g) split_q_group(qv[i][g], g, qa[i], qlo[i]);
    }
  } else if constexpr (kVec) {
    // Rows of wpad = latent + rope values, 8 per 16-byte unit, into the KV area at q_off (no
    // stage in flight is there) at its pitch; rows past the item are zero. kRaw: all of a
    // thread's units are loaded before the early tiles go out and stored after, so the tiles'
    // block-table reads and the query loads are in flight together. At warp 64 two units per
    // round (all five held on top of the two prefetched tiles cost gfx942 6-11 VGPR spills; one
    // per round put 5 round trips in a row, the first also waiting for the prefetched tiles,
    // since waits count loads in issue order). The barrier after the fragment reads below (kRaw), or the
    // KV loop's first one, orders them before a tile overwrites the rows.
    const int units = wpad / 8;
    auto q_unit = [&](int i) K3_AMD_INLINE {
      const int row = i / units, u = i - row * units;
      const int rho = r.rho0 + row;
      return rho < total_rows ? k3::load_16b(qbits + q.off + (rho / r.gh) * q.st + (r.head0 + rho % r.gh) * q.sh + 8 * u)
                              : k3::u32x4{{0u, 0u, 0u, 0u}};
    };
    auto q_store = [&](int i, const k3::u32x4& v) K3_AMD_INLINE {
      const int row = i / units, u = i - row * units;
      k3::store_16b(q_rows + row * pitch + 8 * u, v);
    };
    if constexpr (kRaw) {
      k3::u32x4 qv[kQUnits];
      K3_UNROLL
      for (int k = 0; k < kQUnits; ++k) {
        if (tid + k * kBlock < kRows * units) qv[k] = q_unit(tid + k * kBlock);
      }
      issue_first(0, early);
      K3_UNROLL
      for (int k = 0; k < kQUnits; ++k) {
        if (tid + k * kBlock < kRows * units) q_store(tid + k * kBlock, qv[k]);
      }
    } else {
      for (int i = tid; i < kRows * units; i += 2 * kBlock) {  // two units in flight
        const bool two = i + kBlock < kRows * units;
        const k3::u32x4 a = q_unit(i), b = two ? q_unit(i + kBlock) : k3::u32x4{{0u, 0u, 0u, 0u}};
        q_store(i, a);
        if (two) q_store(i + kBlock, b);
      }
    }
    k3::sync_threads();
  }
  K3_UNROLL
  for (int i = 0; i < (kSplitQ ? 0 : kQSteps); ++i) {
    const int ks = warp + i * kWarps;
    if constexpr (kVec) {
      if (ks < nks) {  // warp-uniform
        k3::mma::load_a_kperm(qa[i], reinterpret_cast<const k3::bf16*>(q_rows + ks * 16), pitch);
      } else {
        K3_UNROLL
        for (int s = 0; s < Shape::kASlots; ++s) qa[i].x[s] = 0;
      }
    } else {
      K3_UNROLL
      for (int s = 0; s < Shape::kASlots; ++s) {
        const k3::layout::RC rc = k3::mma::a_coord<Shape>(s);
        const int rho = r.rho0 + rc.row;
        const int col = ks * 16 + k_col(rc.col);
        const int e = col < c.latent ? col : (col >= lp && col - lp < c.rope ? c.latent + col - lp : -1);
        uint16_t v = 0;
        if (ks < nks && rho < total_rows && e >= 0) v = qbits[q.off + (rho / r.gh) * q.st + (r.head0 + rho % r.gh) * q.sh + e];
        qa[i].x[s] = v;
      }
    }
  }

  if constexpr (kRaw && !kSplitQ) {
    k3::sync_threads();  // the query rows are read; their stages may be overwritten
    issue_first(early, ahead);
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

  // One KV tile at s0; `ahead` (kPrefetch) holds its raw units and takes those of the tile
  // kRing tiles later.
  auto tile_step = [&](int s0, TileUnits& ahead_units) K3_AMD_INLINE {
    const int n = kv_hi - s0 < kMmaTile ? kv_hi - s0 : kMmaTile;
    k3::sync_threads();  // the previous tile is consumed (its stage is refilled below)
    if constexpr (kRaw) {
      const int sa = s0 + ahead * kMmaTile;
      if (sa < kv_hi) {
        issue_tile(cp, c, sa, kv_hi - sa < kMmaTile ? kv_hi - sa : kMmaTile, kMmaTile, row_bytes, rpitch,
                   stages + fill * kMmaTile * rpitch);
      }
      cp.commit();
      // This thread's copies of the tile at s0 landed (`ahead` younger groups may be pending).
      wait_ahead(cp, ahead);
      st.rows = stages + stage * kMmaTile * rpitch;
      stage = stage + 1 == n_stages ? 0 : stage + 1;
      fill = fill + 1 == n_stages ? 0 : fill + 1;
    } else if constexpr (kPrefetch) {
      decode_tile(c, s0, n, row_bytes / 16, ahead_units, sm.raw, sm.mult);
    } else {
      load_tile(c, s0, n, kMmaTile, wpad, lp, sm.raw, sm.mult);
    }
    k3::sync_threads();  // ... and everyone's
    if constexpr (kPrefetch) {
      const int page_next = tile_page(c, s0 + (kRing + 1) * kMmaTile, kv_hi);  // issued ahead of the units
      fetch_tile(c, s0 + kRing * kMmaTile, kv_hi, page_ahead, row_bytes / 16, ahead_units);
      page_ahead = page_next;
    }

    // The tile scales of this lane's C-slot tokens (kRaw, tile-scaled: there the raw row holds
    // exactly four, from a 16-byte aligned byte), one 16-byte load per token; the k-step loop
    // below picks them in an order fixed at compile time (step_tile).
    k3::f32x4 tsc[kSTiles][Shape::kCSlots];
    if (kRaw && tiled) {
      K3_UNROLL
      for (int nt = 0; nt < kSTiles; ++nt) {
        K3_UNROLL
        for (int e = 0; e < Shape::kCSlots; ++e) {
          tsc[nt][e] = k3::load_f32x4(reinterpret_cast<const float*>(st.rows + (nt * Shape::N + k3::mma::c_coord<Shape>(e).col) * st.pitch + st.scale_byte));
        }
      }
    }
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
        if constexpr (kRaw) {
          load_k_frag(kb, st, nt * Shape::N, ks * 16);
        } else {
          k3::mma::load_b_transposed_kperm(kb, reinterpret_cast<const k3::bf16*>(sm.raw + nt * Shape::N * pitch + ks * 16), pitch);
        }
        if (tiled) {
          k3::mma::FragC<Shape> t;
          k3::mma::fill(t, 0.0f);
          k3::mma::mma_sync(t, qa[i], kb, t);
          if constexpr (kSplitQ) k3::mma::mma_sync(t, qlo[i], kb, t);
          const int slot = mult_slot(ks * 16, lp);
          // = slot outside the rope, and known at compile time (at most 3: the staged rows hold 4).
          const int slot_i = step_tile(i) < kMultSlots - 1 ? step_tile(i) : 0;
          const bool rope = ks * 16 >= lp;
          K3_UNROLL
          for (int e = 0; e < Shape::kCSlots; ++e) {
            const k3::layout::RC rc = k3::mma::c_coord<Shape>(e);
            float mul;
            if constexpr (kRaw) {
              mul = rope ? 1.0f : tsc[nt][e].v[slot_i];
            } else {
              mul = sm.mult[(nt * Shape::N + rc.col) * kMultSlots + slot];
            }
            sacc.x[e] += t.x[e] * mul;
          }
        } else {
          k3::mma::mma_sync(sacc, qa[i], kb, sacc);
          if constexpr (kSplitQ) k3::mma::mma_sync(sacc, qlo[i], kb, sacc);
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

    // PV into this warp's output columns (kPvCols).
    const int pv0 = warp * kPvCols;
    if (pv0 < c.latent) {  // warp-uniform
      const int slot = mult_slot(pv0, lp);
      k3::mma::FragA<Shape> hi, lo;
      float pv[Shape::kASlots];
      K3_UNROLL
      for (int e = 0; e < Shape::kASlots; ++e) {
        const k3::layout::RC rc = k3::mma::a_coord<Shape>(e);
        pv[e] = sm.p[rc.row * kMmaTile + rc.col];
        if (tiled) pv[e] *= kRaw ? stage_mult(st, rc.col, slot) : sm.mult[rc.col * kMultSlots + slot];
      }
      K3_UNROLL
      for (int e = 0; e < Shape::kASlots; e += 2) {
        uint32_t h, l;
        split_bf16x2(pv[e], pv[e + 1], h, l);
        hi.x[e] = static_cast<uint16_t>(h & 0xffffu);
        hi.x[e + 1] = static_cast<uint16_t>(h >> 16);
        lo.x[e] = static_cast<uint16_t>(l & 0xffffu);
        lo.x[e + 1] = static_cast<uint16_t>(l >> 16);
      }
      float alpha[Shape::kCSlots];
      K3_UNROLL
      for (int e = 0; e < Shape::kCSlots; ++e) alpha[e] = sm.alpha[k3::mma::c_coord<Shape>(e).row];
      if (kRaw && st.fp8_cols > 0) {
        pv_products<true>(oacc, hi, lo, alpha, st, pv0, c.latent);
      } else {
        pv_products<false>(oacc, hi, lo, alpha, kRaw ? st : tile, pv0, c.latent);
      }
    }
  };
  // kRing == 2: whole rounds of two tiles (pre[0] then pre[1]: constant indices), then the odd
  // tile, so the loop's back edge comes only from the end of a round.
  static_assert(kRing <= 2, "the loop below runs rounds of two tiles");
  int s0 = r.kv_start;
#if K3_TARGET_HIP
  // All prologue loads done before the first round. The query staging above waits for them
  // anyway when it runs; without this, the path that skips it (no staging lane: never taken at
  // run time) reaches the compiler's wait placement with the loads in another order, and its
  // merge makes every round's first decode wait for the second tile too (vmcnt(2) for
  // vmcnt(6)). 0x0f70: vmcnt 0, expcnt and lgkmcnt at their maxima (no wait) in gfx9's encoding.
  __builtin_amdgcn_s_waitcnt(0x0f70);
#endif
  if constexpr (kRing == 2) {
    for (; s0 + kMmaTile < kv_hi; s0 += 2 * kMmaTile) {
      tile_step(s0, pre[0]);
      tile_step(s0 + kMmaTile, pre[1]);
    }
  }
  for (; s0 < kv_hi; s0 += kMmaTile) tile_step(s0, pre[0]);

  if (scol == 0) sm.l[srow] = l;
  if (scol == 0 && rho < total_rows && dst.lse != nullptr) {
    dst.lse[dst.loff + qi * dst.lst + (dst.head_base + rho % r.gh) * dst.lsh] = l > 0.0f ? m + k3::log_f32(l) : neg_inf;
  }
  k3::sync_threads();
  // Each C slot holds kPvTiles adjacent output columns (kPvCols): two 4-element stores where the
  // output rows allow it (decided from the arguments: uniform), else one store per column.
  const int pv0 = warp * kPvCols;
  const bool vec_out = (dst.off | dst.st | dst.sh) % 4 == 0 && k3::aligned16(dst.out);
  if (pv0 < c.latent) {  // warp-uniform
    K3_UNROLL
    for (int e = 0; e < Shape::kCSlots; ++e) {
      const k3::layout::RC rc = k3::mma::c_coord<Shape>(e);
      const int orho = r.rho0 + rc.row;
      const int d0 = pv0 + rc.col * kPvTiles;
      if (orho >= total_rows || d0 >= c.latent) continue;
      const float den = sm.l[rc.row];
      const float f = out_scale / den;
      k3::f32x4 v[2];
      K3_UNROLL
      for (int u = 0; u < kPvTiles; ++u) v[u / 4].v[u % 4] = den > 0.0f ? oacc[u].x[e] * f : 0.0f;
      const int64_t o = dst.off + (orho / r.gh) * dst.st + (dst.head_base + orho % r.gh) * dst.sh + d0;
      if (vec_out && d0 + kPvTiles <= c.latent) {  // d0 is a multiple of 8
        k3::store_f32x4(dst.out, dst.out_dt, o, v[0]);
        k3::store_f32x4(dst.out, dst.out_dt, o + 4, v[1]);
        continue;
      }
      // One column per iteration, the values shifted down: one inlined store_f32 per C slot (an
      // unrolled loop of eight made the slot loop too large for clang to unroll on AMD, whose
      // C slots then went through scratch).
      float w[kPvTiles];
      K3_UNROLL
      for (int u = 0; u < kPvTiles; ++u) w[u] = v[u / 4].v[u % 4];
      K3_NO_UNROLL
      for (int u = 0; u < kPvTiles && d0 + u < c.latent; ++u) {
        k3::store_f32(dst.out, dst.out_dt, o + u, w[0]);
        K3_UNROLL
        for (int j = 0; j + 1 < kPvTiles; ++j) w[j] = w[j + 1];
      }
    }
  }
}

}  // namespace mla

#endif  // K3_OPS_MLA_ATTEND_MMA_CUH
