// Fused KDA decode (kernel-api ops/kda_decode.rs is the spec), after vLLM's fused_kda_decode:
// one block per (row, head), kda_decode_fused::kThreads threads, f32 math throughout.
//
//  1. short conv + SiLU of the head's own channels (q: h·K+i, k: H·K+h·K+i, v: 2·H·K+h·V+j),
//     shifting those channels of the conv-state slot in place. Head blocks own disjoint
//     channels, so each channel of a row's slot is shifted exactly once, by one thread that
//     reads its history before writing it;
//  2. decay gate α_i = exp(g_i) and write strength β;
//  3. q/k L2 norms as block reductions (warp butterflies, then a fixed-order sum of the warp
//     partials: the result does not depend on the schedule);
//  4. the delta rule over the head's K×V state, streamed through shared memory in chunks of
//     kChunk value columns: a coalesced load (along whichever of k or v is contiguous in
//     memory) that applies the decay, then kGroup lanes per column reduce kᵀS and qᵀS over k
//     with xor shuffles, then a coalesced store rounded once to the pool dtype;
//  5. the gated per-head RMSNorm epilogue (another block reduction).
// Slot 0 is the null slot: the block writes a zero output row and touches neither pool. The
// device slot is checked (k3/checks.h): outside [0, slots) it is reported and the block touches
// neither pool (its output row is left as it was); the head-0 block of a row also looks for its
// slot in the other rows (two rows on one slot race) and reports a repeat.
#include "k3/compat.h"

namespace kda_decode_fused {
constexpr int kThreads = 128;
constexpr int kGroup = 4;                    // lanes per value column (a power of two <= any warp)
constexpr int kChunk = kThreads / kGroup;    // value columns per shared-memory tile
constexpr int kTileStride = kChunk + 1;      // padded tile row: column reads hit distinct banks
constexpr int kMaxWidth = 8;                 // conv taps held in registers
constexpr int kWarps = kThreads / k3::kWarpSize;
constexpr int kGateLowerBound = 0, kGateSoftplus = 1;  // else: precomputed
}  // namespace kda_decode_fused

// Sum over the block; every thread gets the same value. `red` holds kWarps floats and must not
// be reused by another reduction of the same block.
K3_DEVICE float kda_decode_block_sum(float v, float* red) {
  v = k3::warp_reduce_sum(v);
  if (k3::lane_id() == 0) red[k3::warp_id()] = v;
  k3::sync_threads();
  float s = 0.0f;
  for (int w = 0; w < kda_decode_fused::kWarps; ++w) s += red[w];
  return s;
}

// Sum over the kGroup aligned lanes that share a value column (all lanes must call it).
K3_DEVICE float kda_decode_group_sum(float v) {
  for (int off = kda_decode_fused::kGroup / 2; off > 0; off >>= 1) v += k3::shfl_xor(v, off);
  return v;
}

// softplus(x) = ln(1 + e^x) without overflow; ln(1 + e) through the log1p identity
// ln(u)·e/(u − 1), u = 1 + e, which keeps full relative precision for tiny e.
K3_DEVICE float kda_decode_softplus(float x) {
  if (x > 20.0f) return x;
  const float e = k3::exp_f32(x);
  const float u = 1.0f + e;
  return u == 1.0f ? e : k3::log_f32(u) * (e / (u - 1.0f));
}

K3_KERNEL void kda_decode_fused_step(
    const void* x, int x_dt, int64_t x_s0,                                   // [B, D], unit channel stride
    const float* conv_w, int64_t cw_s0, int64_t cw_s1,                       // [D, W]
    void* conv_state, int cs_dt, int64_t cs_s0, int64_t cs_s1, int64_t cs_s2,  // [slots, D, W-1]
    const void* g_raw, int g_dt, int64_t g_s0, int64_t g_s1,                 // [B, H, K], unit inner
    const void* beta_in, int beta_dt, int64_t be_s0, int64_t be_s1,          // [B, H]
    const float* a_log, int64_t al_s0,                                       // [A] or null
    const float* dt_bias, int64_t db_s0,                                     // [H·K] or null
    const int32_t* state_indices, int64_t si_s0,                             // [B]
    void* state, int st_dt, int64_t st_slot, int64_t st_head, int64_t st_k, int64_t st_v, int k_fast,
    const void* out_gate, int og_dt, int64_t og_s0, int64_t og_s1,           // [B, H, V] or null
    const float* norm_w, int64_t nw_s0,                                      // [V] or null
    void* out, int out_dt, int64_t out_s0, int64_t out_s1,                   // [B, H, V]
    int heads, int head_k, int head_v, int width, int slots, int gate_mode, float lower_bound,
    int beta_sigmoid, int qk_l2norm, float scale, int gated_norm, float norm_eps, int batch, k3::ErrorRecord* err) {
  using namespace kda_decode_fused;
  const int row = static_cast<int>(k3::block_idx_x());
  const int b = row / heads;
  const int h = row % heads;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int K = head_k, V = head_v, HK = heads * head_k, hist = width - 1;
  const int64_t out_row = b * out_s0 + h * out_s1;

  const int slot = state_indices[b * si_s0];
  // Block-uniform from here to the end of the checks: every thread reads the same slot.
  if (!k3::index_ok(err, k3::kCheckKdaDecodeStateIndices, b, slot, 0, slots)) return;
  if (slot == 0) {  // null slot (padded graph row): zeros out, pools untouched
    for (int j = tid; j < V; j += kThreads) k3::store_f32(out, out_dt, out_row + j, 0.0f);
    return;
  }
  if (h == 0) k3::block_unique(err, k3::kCheckKdaDecodeStateIndices, state_indices, k3::kI32, si_s0, batch, b, slot, 0);

  float* u = k3::dynamic_shared<float>();  // [2K + V]: q | k | v of this head after conv + SiLU
  float* alpha = u + 2 * K + V;            // [K] decay factors
  float* o = alpha + K;                    // [V] o = Sᵀq
  float* tile = o + V;                     // [K][kTileStride] one chunk of the state
  K3_SHARED(float, red, [3][kWarps]);

  // 1. Conv + SiLU over the head's channels, shifting their conv state.
  for (int e = tid; e < 2 * K + V; e += kThreads) {
    const int c = e < K ? h * K + e : (e < 2 * K ? HK + h * K + (e - K) : 2 * HK + h * V + (e - 2 * K));
    const int64_t cs = slot * cs_s0 + c * cs_s1;
    float win[kMaxWidth];
    for (int j = 0; j < kMaxWidth - 1; ++j) win[j] = j < hist ? k3::load_f32(conv_state, cs_dt, cs + j * cs_s2) : 0.0f;
    const float xv = k3::load_f32(x, x_dt, b * x_s0 + c);
    float acc = 0.0f;
    for (int j = 0; j < kMaxWidth - 1; ++j) {
      if (j < hist) acc += conv_w[c * cw_s0 + j * cw_s1] * win[j];
    }
    acc += conv_w[c * cw_s0 + hist * cw_s1] * xv;
    u[e] = acc * k3::sigmoid_f32(acc);
    for (int j = 0; j < kMaxWidth - 1; ++j) {
      if (j < hist) k3::store_f32(conv_state, cs_dt, cs + j * cs_s2, j + 1 < hist ? win[j + 1] : xv);
    }
  }
  // 2. Decay gate.
  const float a_exp = gate_mode == kGateLowerBound || gate_mode == kGateSoftplus ? k3::exp_f32(a_log[h * al_s0]) : 0.0f;
  for (int i = tid; i < K; i += kThreads) {
    const float f = k3::load_f32(g_raw, g_dt, b * g_s0 + h * g_s1 + i);
    const float z = f + (dt_bias != nullptr ? dt_bias[(h * K + i) * db_s0] : 0.0f);
    float g = f;
    if (gate_mode == kGateLowerBound) g = lower_bound * k3::sigmoid_f32(a_exp * z);
    if (gate_mode == kGateSoftplus) g = -a_exp * kda_decode_softplus(z);
    alpha[i] = k3::exp_f32(g);
  }
  const float bv = k3::load_f32(beta_in, beta_dt, b * be_s0 + h * be_s1);
  const float beta = beta_sigmoid ? k3::sigmoid_f32(bv) : bv;
  k3::sync_threads();

  // 3. q/k L2 norms (scale folded into q's factor).
  float q_mul = scale, k_mul = 1.0f;
  if (qk_l2norm) {
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < K; i += kThreads) {
      sq += u[i] * u[i];
      sk += u[K + i] * u[K + i];
    }
    sq = kda_decode_block_sum(sq, red[0]);
    sk = kda_decode_block_sum(sk, red[1]);
    q_mul = scale / k3::sqrt_f32(sq + 1e-6f);
    k_mul = 1.0f / k3::sqrt_f32(sk + 1e-6f);
  }

  // 4. Delta rule, kChunk value columns at a time.
  const int64_t s_base = slot * st_slot + h * st_head;
  const int jj = tid / kGroup;  // this thread's column in the tile
  const int lane_k = tid % kGroup;
  const int tile_elems = K * kChunk;
  for (int j0 = 0; j0 < V; j0 += kChunk) {
    // Coalesced load with the decay applied: consecutive threads walk the contiguous dim.
    for (int e = tid; e < tile_elems; e += kThreads) {
      const int i = k_fast ? e % K : e / kChunk;
      const int c = k_fast ? e / K : e % kChunk;
      if (j0 + c < V) tile[i * kTileStride + c] = alpha[i] * k3::load_f32(state, st_dt, s_base + i * st_k + (j0 + c) * st_v);
    }
    k3::sync_threads();
    const int j = j0 + jj;
    const bool live = j < V;
    float ks = 0.0f;
    if (live) {
      for (int i = lane_k; i < K; i += kGroup) ks += u[K + i] * k_mul * tile[i * kTileStride + jj];
    }
    ks = kda_decode_group_sum(ks);
    const float r = live ? u[2 * K + j] - ks : 0.0f;
    float qs = 0.0f;
    if (live) {
      for (int i = lane_k; i < K; i += kGroup) {
        const float s = tile[i * kTileStride + jj] + beta * (u[K + i] * k_mul) * r;
        tile[i * kTileStride + jj] = s;
        qs += u[i] * q_mul * s;
      }
    }
    qs = kda_decode_group_sum(qs);
    if (live && lane_k == 0) o[j] = qs;
    k3::sync_threads();
    for (int e = tid; e < tile_elems; e += kThreads) {
      const int i = k_fast ? e % K : e / kChunk;
      const int c = k_fast ? e / K : e % kChunk;
      if (j0 + c < V) k3::store_f32(state, st_dt, s_base + i * st_k + (j0 + c) * st_v, tile[i * kTileStride + c]);
    }
    k3::sync_threads();  // the next chunk overwrites the tile
  }

  // 5. Output, optionally through the gated RMSNorm.
  float inv_rms = 1.0f;
  if (gated_norm) {
    float ss = 0.0f;
    for (int jv = tid; jv < V; jv += kThreads) ss += o[jv] * o[jv];
    ss = kda_decode_block_sum(ss, red[2]);
    inv_rms = 1.0f / k3::sqrt_f32(ss / static_cast<float>(V) + norm_eps);
  }
  for (int jv = tid; jv < V; jv += kThreads) {
    float y = o[jv];
    if (gated_norm) {
      const float gate = k3::load_f32(out_gate, og_dt, b * og_s0 + h * og_s1 + jv);
      y = norm_w[jv * nw_s0] * y * inv_rms * k3::sigmoid_f32(gate);
    }
    k3::store_f32(out, out_dt, out_row + jv, y);
  }
}
K3_EXPORT(kda_decode_fused_step);
