// Staging of one KV tile of the paged latent cache into shared memory, shared by both attention
// cores (mla_attend.cuh, mla_attend_mma.cuh). The staged form (see mla_attend.cuh): per token a
// row of bf16 *raw* values at pitch kv_pitch(row_width) plus kMultSlots f32 multipliers.
//
// Addressing: lane j of every warp computes the byte offset of token s0 + j's cache row once per
// tile (one block-table read and one division per token, not per value); a warp then stages
// whole tokens, taking the token's row offset from lane t by a shuffle. Each entry is
// bound-checked where it is read (checked_page).
//
// Fast path (block-uniform: latent and rope multiples of 16, cache base and strides 16-byte
// aligned, and for the tile-scaled format the rope bf16s 16-byte aligned too): the row moves in
// 16-byte vector loads (k3/vec.h), each lane one 16-byte unit at a time. A bf16 unit is 8 values,
// one 16-byte shared store; an fp8 unit is 16 values dequantised in registers to bf16 by the
// packed hardware converts of k3/convert_hw.h (exact), two 16-byte shared stores. Otherwise the
// general path reads the row bytewise (any dims and strides; the tests cover both). The f32-query
// and `*_mma_unaligned` kernels stage through load_tile, choosing the path per launch. The
// `*_mma` kernels (the host runs them only where the fast path applies) copy raw rows
// asynchronously at warp 32 (issue_tile below) and prefetch them into registers at warp 64
// (AMD: fetch_tile / decode_tile, mla_attend_mma.cuh).
//
// Pitch: kv_pitch rounds the row up to 8 mod 64 bf16s, so rows start 16-byte aligned and 4
// banks apart. An mma.sync B fragment (8 token rows x 4 words) then covers the 32 banks once, an
// MFMA 16x16x16 one (16 rows x 8 bytes per 32 lanes) twice, the minimum for 64 words; a pitch of
// 576 bf16s (1152 B = 0 mod 128 B) put every row on the same banks (8-way / 16-way conflicts).
#ifndef K3_OPS_MLA_KV_LOAD_CUH
#define K3_OPS_MLA_KV_LOAD_CUH

#include "mla_common.cuh"

namespace mla {

constexpr int kMultSlots = 5;  // 4 latent scale tiles + one "1.0" slot for rope dims

// Row pitch (bf16 elements) of a staged tile of rows `row_width` wide.
K3_HOST_DEVICE constexpr int kv_pitch(int row_width) { return row_width + ((8 - row_width) % 64 + 64) % 64; }

// The paged cache as the kernels address it.
struct Cache {
  const uint8_t* base;    // byte address of (page 0, row 0)
  int64_t page_stride;    // bytes
  int64_t row_stride;     // bytes
  const int* block_table; // row of the current sequence is set per item
  int64_t bt_col_stride;  // elements
  int page_size;
  int kind;               // kFormat*
  int fnuz;
  int latent;
  int rope;
  int kv_stages;          // stages of the raw pipeline (attend_mma); the launch's shared memory holds them
  // The block-table check (k3/checks.h), made where the entries are read for the rows' addresses
  // rather than in a pass of its own before the first tile: that pass was one more dependent
  // load and a block barrier in front of every item's first KV bytes. An entry outside
  // [0, num_pages) reads page 0 in its place (in bounds; the results are then wrong, and the
  // launch fails) and sets bad_page; the decode kernels report it after the work item
  // (report_bad_page), so no recorder call sits in a hot loop or has the attention core's
  // registers live across it (the absorbed prefill checks its pages before its tiles instead,
  // pages_ok). Mutable: the cores take the cache by const reference, and this
  // is the only state a row read leaves behind.
  int num_pages;
  k3::ErrorRecord* err;   // null: checks off (entries are still clamped, never reported)
  int err_site;           // k3::kCheck*BlockTable of the kernel
  int err_row;            // the sequence, as the record names it
  mutable bool bad_page;  // this thread read such an entry
};

// The page of block-table column `col`, checked (see Cache::bad_page).
K3_DEVICE int64_t checked_page(const Cache& c, int col) {
  const int64_t page = c.block_table[static_cast<int64_t>(col) * c.bt_col_stride];
  const bool ok = page >= 0 && page < c.num_pages;
  c.bad_page = c.bad_page || !ok;
  return ok ? page : 0;
}

// Byte offset of token s's row.
K3_DEVICE int64_t row_offset(const Cache& c, int s) {
  const int col = s / c.page_size;
  return checked_page(c, col) * c.page_stride + static_cast<int64_t>(s - col * c.page_size) * c.row_stride;
}

// Whether every block-table entry of keys [lo, hi) is a page, each one outside recorded (the
// first wins). Block-cooperative: every thread of the block calls it and gets the same answer.
K3_AMD_INLINE K3_DEVICE bool pages_ok(const Cache& c, int lo, int hi) {
  if (c.err == nullptr || hi <= lo) return true;  // block-uniform ((hi - 1) / page_size names column 0 at hi = 0)
  bool ok = true;
  const int nthreads = static_cast<int>(k3::block_dim_x());
  for (int p = lo / c.page_size + static_cast<int>(k3::thread_idx_x_unhoisted()); p <= (hi - 1) / c.page_size; p += nthreads) {
    ok = k3::index_ok_2d(c.err, c.err_site, c.err_row, p, c.block_table[static_cast<int64_t>(p) * c.bt_col_stride], 0,
                         c.num_pages) && ok;
  }
  return k3::block_all(c.err, ok);
}

// The cold end of the check, after the work item that read keys [lo, hi): when a thread saw a
// bad entry (bad_page), the block finds and records it. Every thread of the block calls it (one
// barrier, where no load waits on it).
K3_AMD_INLINE K3_DEVICE void report_bad_page(const Cache& c, int lo, int hi) {
  if (!k3::block_all(c.err, !c.bad_page)) pages_ok(c, lo, hi);  // block-uniform
}

K3_DEVICE bool vector_path(const Cache& c) {
  const int tiles = (c.latent + kScaleTile - 1) / kScaleTile;
  const bool rope_aligned = c.kind != kFormatTiled || ((c.latent + 4 * tiles) & 15) == 0;
  return (c.latent & 15) == 0 && (c.rope & 15) == 0 && rope_aligned && k3::aligned16(c.base) &&
         (c.page_stride & 15) == 0 && (c.row_stride & 15) == 0;
}

// 8 e4m3 codes (two little-endian words) -> 8 bf16 (four words).
K3_DEVICE void fp8x8_to_bf16(uint32_t w0, uint32_t w1, bool fnuz, uint32_t* out) {
  out[0] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(w0 & 0xffffu), fnuz);
  out[1] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(w0 >> 16), fnuz);
  out[2] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(w1 & 0xffffu), fnuz);
  out[3] = k3::e4m3_x2_to_bf16x2(static_cast<uint16_t>(w1 >> 16), fnuz);
}

// bf16 bits of logical value e (0 <= e < latent + rope) of a token row, bytewise.
K3_DEVICE uint16_t raw_value(const Cache& c, const uint8_t* row, int e, int rope_byte) {
  if (c.kind == kFormatBf16) return static_cast<uint16_t>(row[2 * e] | (row[2 * e + 1] << 8));
  if (c.kind == kFormatFlat || e < c.latent) return k3::f32_to_bf16(decode_fp8(row[e], c.fnuz)).bits;
  const uint8_t* r = row + rope_byte + 2 * (e - c.latent);
  return static_cast<uint16_t>(r[0] | (r[1] << 8));
}

// The f32 multiplier of `slot` of a token row (1 but for the tile scales of the tiled format).
K3_DEVICE float tile_multiplier(const Cache& c, const uint8_t* row, int slot, int tiles, bool word_aligned) {
  if (c.kind != kFormatTiled || slot >= tiles) return 1.0f;
  const uint8_t* p = row + c.latent + 4 * slot;
  if (word_aligned) return k3::uint_as_float(*reinterpret_cast<const uint32_t*>(p));
  return k3::uint_as_float(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

// Stages tokens s0 .. s0 + n (n <= tokens <= warp size) as rows of `row_width` raw bf16 values
// at pitch kv_pitch(row_width), plus multipliers: latent values at columns [0, latent), rope
// values from column `rope_col` (latent for the SIMT core, latent rounded up to 16 for the MMA
// core); every other column up to row_width and every row past n is zero. Every thread of the
// block calls it (warp-uniform loops: the shuffles need whole warps).
K3_DEVICE void load_tile(const Cache& c, int s0, int n, int tokens, int row_width, int rope_col, uint16_t* raw, float* mult) {
  const int lane = static_cast<int>(k3::lane_id());
  const int warp = static_cast<int>(k3::thread_idx_x_unhoisted()) / k3::kWarpSize;
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  const int pitch = kv_pitch(row_width);
  const int tiles = (c.latent + kScaleTile - 1) / kScaleTile;
  const int rope_byte = c.latent + 4 * tiles;  // tiled format: first rope byte
  const int64_t my_row = lane < n ? row_offset(c, s0 + lane) : 0;
  if (vector_path(c) && row_width == c.latent + c.rope && rope_col == c.latent) {
    // 16-byte units of a row: fp8 ones first (16 values each), then bf16 ones (8 values each).
    const int fp8_units = c.kind == kFormatFlat ? (c.latent + c.rope) / 16 : (c.kind == kFormatTiled ? c.latent / 16 : 0);
    const int bf16_units = c.kind == kFormatBf16 ? (c.latent + c.rope) / 8 : (c.kind == kFormatTiled ? c.rope / 8 : 0);
    const int bf16_src = c.kind == kFormatBf16 ? 0 : rope_byte;
    const int units = fp8_units + bf16_units;
    const bool fnuz = c.fnuz != 0;
    for (int t = warp; t < tokens; t += warps) {  // warp-uniform
      const uint8_t* row = c.base + k3::shfl(my_row, t);
      uint16_t* dst = raw + t * pitch;
      const bool live = t < n;
      for (int u = lane; u < units + kMultSlots; u += k3::kWarpSize) {
        if (u >= units) {
          mult[t * kMultSlots + u - units] = live ? tile_multiplier(c, row, u - units, tiles, true) : 1.0f;
        } else if (u < fp8_units) {
          k3::u32x4 lo = {{0u, 0u, 0u, 0u}}, hi = {{0u, 0u, 0u, 0u}};
          if (live) {
            const k3::u32x4 v = k3::load_16b(row + 16 * u);
            fp8x8_to_bf16(v.v[0], v.v[1], fnuz, lo.v);
            fp8x8_to_bf16(v.v[2], v.v[3], fnuz, hi.v);
          }
          k3::store_16b(dst + 16 * u, lo);
          k3::store_16b(dst + 16 * u + 8, hi);
        } else {
          const int b = u - fp8_units;
          const k3::u32x4 zero = {{0u, 0u, 0u, 0u}};
          k3::store_16b(dst + (c.kind == kFormatBf16 ? 0 : c.latent) + 8 * b, live ? k3::load_16b(row + bf16_src + 16 * b) : zero);
        }
      }
    }
    return;
  }
  for (int t = warp; t < tokens; t += warps) {  // warp-uniform
    const uint8_t* row = c.base + k3::shfl(my_row, t);
    const bool live = t < n;
    for (int i = lane; i < row_width + kMultSlots; i += k3::kWarpSize) {
      if (i >= row_width) {
        mult[t * kMultSlots + i - row_width] = live ? tile_multiplier(c, row, i - row_width, tiles, false) : 1.0f;
        continue;
      }
      const int e = i < c.latent ? i : (i >= rope_col && i - rope_col < c.rope ? c.latent + i - rope_col : -1);
      raw[t * pitch + i] = live && e >= 0 ? raw_value(c, row, e, rope_byte) : 0;
    }
  }
}


// ---- Raw staging for the `*_mma` kernels' pipeline (mla_attend_mma.cuh) ----
// There the cache rows land in shared memory as they are stored (bf16, fp8, or tile-scaled fp8
// with its scales and bf16 rope), copied by k3::AsyncCopy, and are decoded at fragment load.
// A copy cannot convert, so decoding at load is what lets the copy be asynchronous; the
// fragment loads convert two fp8 codes per packed hardware instruction (k3/convert_hw.h), and
// each staged value is read by one fragment load per k-step, so no conversion is repeated.
//
// Stages, by warp size (the host knows it; the emulator at warp 64 and the HIP stand-ins then
// size shared memory and stage as AMD does): 2 to kMaxKvStages at warp 32, where the copies are
// asynchronous (cp.async on CUDA; held back until their wait in the emulator, which so checks
// the pipeline's waits), so the next tiles land while tile t is multiplied. The host chooses
// how many (kernels/src/ops/mla_decode.rs, kv_stages: about 64 KiB of tiles in flight where the
// device's shared memory per block allows, Cache::kv_stages) and sizes the launch's shared
// memory for them. 1 at warp 64 (AMD), where k3::AsyncCopy is a synchronous register-staged copy
// (see k3/async_copy.h): a second buffer would not overlap anything and would cost LDS (MI300X
// holds two blocks per CU only under 32 KiB each).
constexpr int kMaxKvStages = k3::kWarpSize == 32 ? 8 : 1;
// With one stage warp 64 stages decoded bf16 (its overlap is the register prefetch of the next
// tile, mla_attend_mma.cuh): decoding at fragment load cost gfx942 56 VGPRs (v200 -> v256, 2 ->
// 1 blocks per CU) and gfx950 32 B of scratch in the prefill kernel.
constexpr bool kRawStaging = kMaxKvStages > 1;

// Bytes of one cache row as stored (the vector path's formats: latent a multiple of 16).
K3_HOST_DEVICE constexpr int raw_row_bytes(int kind, int latent, int rope) {
  return kind == kFormatBf16 ? 2 * (latent + rope)
                             : (kind == kFormatFlat ? latent + rope : latent + 4 * ((latent + kScaleTile - 1) / kScaleTile) + 2 * rope);
}

// Pitch of a raw staged row: rounded up to 16 mod 128 bytes, as kv_pitch (16-byte aligned rows,
// four banks apart).
K3_HOST_DEVICE constexpr int raw_pitch(int row_bytes) { return row_bytes + ((16 - row_bytes) % 128 + 128) % 128; }

// Issues the copies of tokens s0 .. s0 + n (n <= tokens <= warp size) of the cache into `dst`
// (rows at `pitch`); rows n .. tokens are zero-filled (a stale row could hold NaN codes, and P = 0
// times NaN is NaN). Every thread of the block calls it (the shuffles need whole warps); the
// caller commits and waits. Row offsets as in load_tile: one block-table read and division per
// token, by lane j for token s0 + j, each entry checked as it is read (checked_page).
template <class Copy>
K3_DEVICE void issue_tile(Copy& cp, const Cache& c, int s0, int n, int tokens, int row_bytes, int pitch, uint8_t* dst) {
  const int lane = static_cast<int>(k3::lane_id());
  const int warp = static_cast<int>(k3::thread_idx_x_unhoisted()) / k3::kWarpSize;
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  const int units = row_bytes / 16;
  const int64_t my_row = lane < n ? row_offset(c, s0 + lane) : 0;
  for (int t = warp; t < tokens; t += warps) {  // warp-uniform
    const uint8_t* row = c.base + k3::shfl(my_row, t);
    const bool live = t < n;
    for (int u = lane; u < units; u += k3::kWarpSize) cp.copy_16b_or_zero(dst + t * pitch + 16 * u, row + 16 * u, live);
  }
}

}  // namespace mla

#endif  // K3_OPS_MLA_KV_LOAD_CUH
