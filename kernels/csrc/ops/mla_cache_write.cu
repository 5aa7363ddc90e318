// MLA cache write: quantise one latent row per token and scatter it into the paged latent cache
// (kernel-api ops/mla_cache_write.rs is the spec; the bytes must equal kv_cache::encode_token).
//
// One block per token (grid-stride over tokens), 128 threads. Threads stride over the row's
// values with coalesced loads and stores. The tile-scaled format gives each 128-value latent
// tile to one warp: the warp reduces the tile's amax with shuffles, derives the power-of-two
// scale and encodes the tile, so the kernel needs no block barrier at all.
#include "k3/compat.h"
#include "mla_common.cuh"

namespace {


// Tile amax over the warp, ignoring NaN like Rust's f32::max fold starting at 0.
K3_DEVICE float warp_amax(float v) {
  for (int o = k3::kWarpSize / 2; o > 0; o >>= 1) v = k3::max_f32(v, k3::shfl_xor(v, o));
  return v;
}

K3_DEVICE void store_bf16(uint8_t* dst, float v) {
  const uint16_t bits = k3::f32_to_bf16(v).bits;
  dst[0] = static_cast<uint8_t>(bits & 0xffu);
  dst[1] = static_cast<uint8_t>(bits >> 8);
}

}  // namespace

// kv: [num_tokens, latent + rope] (row stride kv_st elements, unit inner stride), dtype kv_dt.
// slots: [num_tokens] i32/i64. cache: byte address of element (0, 0, 0); page / row strides in
// bytes. kind: mla::kFormatBf16 / kFormatFlat / kFormatTiled; fnuz: fp8 flavour. inv_scale is
// the host's f32 `1 / kv_scale` (flat fp8 only). Negative slots are padding (the spec); a slot
// past the cache (num_pages * page_size slots) is reported through err and its token skipped.
// Two tokens with one slot race (the plan rejects that on the host; the kernel does not look).
K3_KERNEL void mla_cache_write(const void* kv, int kv_dt, int64_t kv_st, const void* slots, int slot_dt,
                               uint8_t* cache, int64_t page_stride, int64_t row_stride, int page_size,
                               int num_pages, int num_tokens, int kind, int fnuz, int latent, int rope, float inv_scale,
                               k3::ErrorRecord* err) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  const int width = latent + rope;
  for (int tok = static_cast<int>(k3::block_idx_x()); tok < num_tokens; tok += static_cast<int>(k3::grid_dim_x())) {
    const int64_t slot = k3::load_index(slots, slot_dt, tok);
    if (slot < 0) continue;  // padding token (block-uniform)
    if (!k3::index_ok(err, k3::kCheckMlaCacheWriteSlot, tok, slot, 0, static_cast<int64_t>(num_pages) * page_size)) continue;
    uint8_t* row = cache + (slot / page_size) * page_stride + (slot % page_size) * row_stride;
    const int64_t src = static_cast<int64_t>(tok) * kv_st;
    if (kind == mla::kFormatBf16) {
      for (int e = tid; e < width; e += nthreads) store_bf16(row + 2 * e, k3::load_f32(kv, kv_dt, src + e));
    } else if (kind == mla::kFormatFlat) {
      for (int e = tid; e < width; e += nthreads) {
        row[e] = mla::encode_fp8(k3::load_f32(kv, kv_dt, src + e) * inv_scale, fnuz);
      }
    } else {
      const int tiles = (latent + mla::kScaleTile - 1) / mla::kScaleTile;
      const int warps = nthreads / k3::kWarpSize;
      const int warp = tid / k3::kWarpSize;
      const int lane = static_cast<int>(k3::lane_id());
      const float fp8_max = fnuz ? 240.0f : 448.0f;
      for (int t = warp; t < tiles; t += warps) {  // warp-uniform loop
        const int lo = t * mla::kScaleTile;
        const int hi = lo + mla::kScaleTile < latent ? lo + mla::kScaleTile : latent;
        float amax = 0.0f;
        for (int e = lo + lane; e < hi; e += k3::kWarpSize) amax = k3::max_f32(amax, k3::abs_f32(k3::load_f32(kv, kv_dt, src + e)));
        amax = warp_amax(amax);
        const float scale = mla::tile_scale(amax / fp8_max);
        for (int e = lo + lane; e < hi; e += k3::kWarpSize) row[e] = mla::encode_fp8(k3::load_f32(kv, kv_dt, src + e) / scale, fnuz);
        if (lane < 4) row[latent + 4 * t + lane] = static_cast<uint8_t>(k3::float_as_uint(scale) >> (8 * lane));
      }
      uint8_t* rope_dst = row + latent + 4 * tiles;
      for (int j = tid; j < rope; j += nthreads) store_bf16(rope_dst + 2 * j, k3::load_f32(kv, kv_dt, src + latent + j));
    }
  }
}
K3_EXPORT(mla_cache_write);
