// Warp shuffles, ballots and reductions at the compiled warp size, with partial widths and
// partial masks. One int result per (probe, thread); see the probe numbers below.
#include "k3/compat.h"

// out[p * n + t] for probe p and thread t (n = block_dim_x()), with v = in[t]:
//   0 shfl(v, src, width)       1 shfl_up(v, delta, width)   2 shfl_down(v, delta, width)
//   3 shfl_xor(v, xmask, width) 4/5 ballot(v odd) low/high 32 bits
//   6/7 ballot_sync over the own half-warp (lanes below / from kWarpSize/2) of v > 0, low/high
//   8 warp_reduce_sum(v)        9 warp_reduce_max(v)         10 lane_id()   11 warp_id()
//   12 2 * shfl_xor((double)v / 2, 1)  (a 64-bit value)
//   13 half-warp masked shfl whose source lane lies outside the mask (poison 0xDEADBEEF)
//   14 shfl of a float bit pattern: float_as_uint(shfl(uint_as_float(v), src, width))
K3_KERNEL void warp_semantics(const int* in, int* out, int src, int delta, int xmask, int width) {
  const unsigned t = k3::thread_idx_x();
  const unsigned n = k3::block_dim_x();
  const int v = in[t];
  out[0 * n + t] = k3::shfl(v, src, width);
  out[1 * n + t] = k3::shfl_up(v, static_cast<unsigned>(delta), width);
  out[2 * n + t] = k3::shfl_down(v, static_cast<unsigned>(delta), width);
  out[3 * n + t] = k3::shfl_xor(v, xmask, width);
  const unsigned long long b = k3::ballot((v & 1) != 0);
  out[4 * n + t] = static_cast<int>(b & 0xffffffffu);
  out[5 * n + t] = static_cast<int>(b >> 32);

  const unsigned half = k3::kWarpSize / 2;
  const k3::lane_mask_t lower = (static_cast<k3::lane_mask_t>(1) << half) - 1;
  const bool in_lower = k3::lane_id() < half;
  const k3::lane_mask_t mine = in_lower ? lower : static_cast<k3::lane_mask_t>(~lower);
  const unsigned long long hb = k3::ballot_sync(mine, v > 0);
  out[6 * n + t] = static_cast<int>(hb & 0xffffffffu);
  out[7 * n + t] = static_cast<int>(hb >> 32);

  out[8 * n + t] = k3::warp_reduce_sum(v);
  out[9 * n + t] = k3::warp_reduce_max(v);
  out[10 * n + t] = static_cast<int>(k3::lane_id());
  out[11 * n + t] = static_cast<int>(k3::warp_id());
  out[12 * n + t] = static_cast<int>(2.0 * k3::shfl_xor(static_cast<double>(v) / 2.0, 1));
  // Each half reads a lane of the other half: undefined on GPUs, poison in the emulator.
  out[13 * n + t] = k3::shfl_sync(mine, v, in_lower ? static_cast<int>(half) : 0);
  out[14 * n + t] = static_cast<int>(k3::float_as_uint(k3::shfl(k3::uint_as_float(static_cast<uint32_t>(v)), src, width)));
}
K3_EXPORT(warp_semantics);

// Indices of a 3-D launch: out[(linear block * threads + linear thread) * 8 + k] for
// k = thread x, y, z, block x, y, z, lane, warp; dims[0..6) = block dims and grid dims.
K3_KERNEL void index_probe(unsigned* out, unsigned* dims) {
  const unsigned threads = k3::block_dim_x() * k3::block_dim_y() * k3::block_dim_z();
  const unsigned tl = (k3::thread_idx_z() * k3::block_dim_y() + k3::thread_idx_y()) * k3::block_dim_x() + k3::thread_idx_x();
  const unsigned bl = (k3::block_idx_z() * k3::grid_dim_y() + k3::block_idx_y()) * k3::grid_dim_x() + k3::block_idx_x();
  unsigned* o = out + (bl * threads + tl) * 8;
  o[0] = k3::thread_idx_x();
  o[1] = k3::thread_idx_y();
  o[2] = k3::thread_idx_z();
  o[3] = k3::block_idx_x();
  o[4] = k3::block_idx_y();
  o[5] = k3::block_idx_z();
  o[6] = k3::lane_id();
  o[7] = k3::warp_id();
  if (bl == 0 && tl == 0) {
    dims[0] = k3::block_dim_x();
    dims[1] = k3::block_dim_y();
    dims[2] = k3::block_dim_z();
    dims[3] = k3::grid_dim_x();
    dims[4] = k3::grid_dim_y();
    dims[5] = k3::grid_dim_z();
  }
}
K3_EXPORT(index_probe);

// Does nothing: measures launch overhead.
K3_KERNEL void empty_kernel() {}
K3_EXPORT(empty_kernel);
