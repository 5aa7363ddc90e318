// Full-warp conveniences and warp reductions, written once on top of the target's *_sync
// collectives. Included by k3/compat.h.
#ifndef K3_WARP_H
#define K3_WARP_H

K3_BEGIN

template <class T>
K3_DEVICE T shfl(T v, int src_lane, int width = kWarpSize K3_SITE_PARAMS) {
  return shfl_sync(kFullMask, v, src_lane, width K3_SITE_ARGS);
}
template <class T>
K3_DEVICE T shfl_up(T v, unsigned delta, int width = kWarpSize K3_SITE_PARAMS) {
  return shfl_up_sync(kFullMask, v, delta, width K3_SITE_ARGS);
}
template <class T>
K3_DEVICE T shfl_down(T v, unsigned delta, int width = kWarpSize K3_SITE_PARAMS) {
  return shfl_down_sync(kFullMask, v, delta, width K3_SITE_ARGS);
}
template <class T>
K3_DEVICE T shfl_xor(T v, int lane_mask, int width = kWarpSize K3_SITE_PARAMS) {
  return shfl_xor_sync(kFullMask, v, lane_mask, width K3_SITE_ARGS);
}
K3_DEVICE lane_mask_t ballot(bool pred K3_SITE_PARAMS) { return ballot_sync(kFullMask, pred K3_SITE_ARGS); }
K3_DEVICE bool any(bool pred K3_SITE_PARAMS) { return ballot_sync(kFullMask, pred K3_SITE_ARGS) != 0; }
K3_DEVICE bool all(bool pred K3_SITE_PARAMS) { return ballot_sync(kFullMask, pred K3_SITE_ARGS) == kFullMask; }

// Butterfly reductions: every lane ends with the same value (each step adds the same two
// operands in both partner lanes, and + and max are commutative).
template <class T>
K3_DEVICE T warp_reduce_sum(T v K3_SITE_PARAMS) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += shfl_xor_sync(kFullMask, v, offset, kWarpSize K3_SITE_ARGS);
  return v;
}
template <class T>
K3_DEVICE T warp_reduce_max(T v K3_SITE_PARAMS) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    T o = shfl_xor_sync(kFullMask, v, offset, kWarpSize K3_SITE_ARGS);
    v = o > v ? o : v;
  }
  return v;
}

K3_END

#endif  // K3_WARP_H
