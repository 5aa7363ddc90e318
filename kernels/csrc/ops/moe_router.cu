// MoE router (kernel-api ops/moe_router.rs is the spec): one block per token (grid-stride over
// tokens). Warps compute the f32 logits of strided experts (lanes stride over hidden, a warp
// reduction sums), then sigmoid and the bias-corrected selection score go to shared memory.
// Group masking and the top-k are repeated block-level argmax selections over shared memory
// (thread-local best over strided candidates, warp shuffle reduction, one pass over the warps'
// winners), with the total order "larger key first, lower index on ties, NaN like -inf", so
// the result does not depend on the reduction order. Weights come from the unbiased scores.
//
// Dynamic shared memory (launcher): scores[E] f32, sel[E] f32, blocked[E] i32, gscore[G] f32,
// gblocked[G] i32, chosen[top_k] i32.
#include "k3/compat.h"

namespace {

constexpr int kRouterMaxWarps = 32;

K3_DEVICE float router_key(float v) { return v != v ? k3::uint_as_float(0xff800000u) : v; }

// Whether candidate (ka, ia) ranks before (kb, ib); an index < 0 is "no candidate".
K3_DEVICE bool router_better(float ka, int ia, float kb, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  if (ka != kb) return ka > kb;
  return ia < ib;
}

// Index of the best entry of vals[0..n) whose blocked flag is 0 (keys via router_key), the
// same on every thread of the block; -1 when none is left. Contains barriers: every thread of
// the block must call it with the same arguments.
K3_DEVICE int router_block_argmax(const float* vals, const int* blocked, int n, float* warp_key, int* warp_idx,
                                  int* result) {
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
  const int warp = tid / k3::kWarpSize;
  if (k3::lane_id() == 0) {
    warp_key[warp] = best_k;
    warp_idx[warp] = best_i;
  }
  k3::sync_threads();
  if (tid == 0) {
    const int warps = (nthreads + k3::kWarpSize - 1) / k3::kWarpSize;
    float bk = warp_key[0];
    int bi = warp_idx[0];
    for (int w = 1; w < warps; ++w) {
      if (router_better(warp_key[w], warp_idx[w], bk, bi)) {
        bk = warp_key[w];
        bi = warp_idx[w];
      }
    }
    *result = bi;
  }
  k3::sync_threads();
  const int r = *result;
  k3::sync_threads();  // everyone has read the result before the next call overwrites it
  return r;
}

}  // namespace

// x [T, H] (x_dt, strides xs0/xs1), w [E, H] (w_dt, ws0/ws1), bias [E] f32 (stride bs0) or null,
// topk_ids [T, K] i32 and topk_weights [T, K] f32 (strides), renormalize 0/1.
K3_KERNEL void moe_router_topk(const void* x, int x_dt, int64_t xs0, int64_t xs1, const void* w, int w_dt, int64_t ws0,
                               int64_t ws1, const float* bias, int64_t bs0, int* topk_ids, int64_t is0, int64_t is1,
                               float* topk_weights, int64_t ows0, int64_t ows1, int tokens, int hidden, int experts,
                               int top_k, int n_group, int topk_group, int renormalize, float scaling) {
  K3_SHARED(float, warp_key, [kRouterMaxWarps]);
  K3_SHARED(int, warp_idx, [kRouterMaxWarps]);
  K3_SHARED(int, pick, [1]);
  K3_SHARED(float, denom, [1]);
  float* scores = k3::dynamic_shared<float>();
  float* sel = scores + experts;
  int* blocked = reinterpret_cast<int*>(sel + experts);
  float* gscore = reinterpret_cast<float*>(blocked + experts);
  int* gblocked = reinterpret_cast<int*>(gscore + n_group);
  int* chosen = gblocked + n_group;

  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  const int warp = tid / k3::kWarpSize;
  const int warps = nthreads / k3::kWarpSize;
  const int lane = static_cast<int>(k3::lane_id());
  const int group_size = experts / n_group;

  for (int t = static_cast<int>(k3::block_idx_x()); t < tokens; t += static_cast<int>(k3::grid_dim_x())) {
    // 1-3. logits (f32 sums), sigmoid scores and selection scores.
    for (int e = warp; e < experts; e += warps) {
      float acc = 0.0f;
      for (int i = lane; i < hidden; i += k3::kWarpSize) {
        acc += k3::load_f32(x, x_dt, t * xs0 + i * xs1) * k3::load_f32(w, w_dt, e * ws0 + i * ws1);
      }
      acc = k3::warp_reduce_sum(acc);
      if (lane == 0) {
        const float s = k3::sigmoid_f32(acc);
        scores[e] = s;
        sel[e] = s + (bias != nullptr ? bias[e * bs0] : 0.0f);
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
        const int g = router_block_argmax(gscore, gblocked, n_group, warp_key, warp_idx, pick);
        if (g < 0) break;  // uniform: every thread saw the same result
        for (int i = tid; i < group_size; i += nthreads) blocked[g * group_size + i] = 0;
        if (tid == 0) gblocked[g] = 1;
        k3::sync_threads();
      }
    }

    // 5. top-k by repeated block argmax (the plan guarantees enough unmasked experts).
    for (int j = 0; j < top_k; ++j) {
      const int e = router_block_argmax(sel, blocked, experts, warp_key, warp_idx, pick);
      if (tid == 0) {
        chosen[j] = e;
        if (e >= 0) blocked[e] = 1;
      }
      k3::sync_threads();
    }

    // 6. weights from the unbiased scores, sequential f32 sum in selection order.
    if (tid == 0) {
      float sum = 0.0f;
      for (int j = 0; j < top_k; ++j) sum += chosen[j] >= 0 ? scores[chosen[j]] : 0.0f;
      denom[0] = renormalize ? sum + 1e-20f : 1.0f;
    }
    k3::sync_threads();
    for (int j = tid; j < top_k; j += nthreads) {
      const int e = chosen[j];
      const float s = e >= 0 ? scores[e] : 0.0f;
      topk_ids[t * is0 + j * is1] = e;
      topk_weights[t * ows0 + j * ows1] = s / denom[0] * scaling;
    }
    k3::sync_threads();  // shared arrays are rewritten by the next token
  }
}
K3_EXPORT(moe_router_topk);
