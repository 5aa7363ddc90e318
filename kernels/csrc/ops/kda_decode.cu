// Fused KDA decode (kernel-api ops/kda_decode.rs is the spec), after vLLM's fused_kda_decode,
// f32 math throughout. Per (row, head):
//
//  1. short conv + SiLU of the head's own channels (q: h·K+i, k: H·K+h·K+i, v: 2·H·K+h·V+j),
//     shifting those channels of the conv-state slot in place. Head blocks own disjoint
//     channels, so each channel of a row's slot is shifted exactly once, by one thread that
//     reads its history before writing it;
//  2. decay gate α_i = exp(g_i) and write strength β;
//  3. q/k L2 norms as block reductions (warp butterflies, then a fixed-order sum of the warp
//     partials: the result does not depend on the schedule);
//  4. the delta rule over the head's K×V state: S ← α⊙S, r = v − kᵀS, S ← S + β·k·rᵀ, o = Sᵀq;
//  5. the gated per-head RMSNorm epilogue (another block reduction).
//
// Two schedules, chosen by the launcher (kernels/src/ops/kda_decode.rs):
//
//  - V-split (f32 state with unit stride along v, K ≤ kSplitLanes·kSplitRows = 128, K and V
//    multiples of 4, 16-byte aligned state rows): two launches (three for a gated norm off the
//    16-byte path) sharing a workspace row per (row, head).
//    kda_decode_prepare (one block per (row, head)) runs steps 1–3 and writes q̂ = q·scale/‖q‖,
//    k̂ = k/‖k‖, α, v and β to the row; kda_decode_fused_step runs step 4 on a grid of
//    (row·head, V / (4·vecs)) blocks, each holding a K × 4·vecs slice of the state in registers
//    (read and written once, in 16-byte vectors); step 5 runs from o and the per-column-vector
//    sums of squares the split blocks left in the row (a fixed-order sum: the result does not
//    depend on the schedule), in the row's last split block to finish (a ticket in the row's
//    header, kNormFold: no third launch) when the output gate, norm weight and out take the
//    16-byte path, else in kda_decode_norm_unaligned launched after the split. Without the norm
//    the split blocks write the output themselves.
//  - kda_decode_generic_step (every other layout and dtype): one block per (row, head) runs all
//    five steps, streaming the state through shared memory in chunks of kChunk value columns.
//
// prepare, the norm and generic each come in a 16-byte form (kda_decode_prepare, the norm folded
// into kda_decode_fused_step, kda_decode_generic_step: head inputs, conv history, output gate,
// norm weight, outputs and generic's state move as 16-byte vectors of 8 elements) and an
// *_unaligned form, element by element, for any layout the contract allows; the launcher picks
// the 16-byte form for K, V multiples of 8 and packed, aligned tensors.
//
// Slot 0 is the null slot: the output row is zeros and neither pool is touched. The device slot
// is checked (k3/checks.h): outside [0, slots) it is reported and neither pool is touched (the
// output row is left as it was); the head-0 block of a row also looks for its slot in the other
// rows (two rows on one slot race) and reports a repeat. The prepare kernel hands the split and
// norm kernels slot 0 for a null or rejected row, so they skip it; the split kernel checks the
// slot it reads from the workspace again before addressing the state with it.
#include "k3/compat.h"

namespace kda_decode_fused {
constexpr int kThreads = 128;
constexpr int kGroup = 4;                    // lanes per value column (a power of two <= any warp)
constexpr int kChunk = kThreads / kGroup;    // value columns per shared-memory tile
constexpr int kTileStride = kChunk + 1;      // padded tile row: column reads hit distinct banks
constexpr int kWarps = kThreads / k3::kWarpSize;
constexpr int kGateLowerBound = 0, kGateSoftplus = 1;  // else: precomputed
// V-split: each thread holds kSplitRows rows (k = kl, kl + kSplitLanes) of one 4-column vector.
constexpr int kSplitLanes = 64;                         // k lanes per column vector
constexpr int kSplitRows = 2;                           // rows per lane
constexpr int kSplitMaxVecs = 4;                        // column vectors per block (256 threads)
constexpr int kSplitMaxWarps = kSplitLanes * kSplitMaxVecs / k3::kWarpSize;
// Workspace row (f32): header [slot bits, β, split blocks done (u32 ticket), unused] | q̂ [K] |
// k̂ [K] | α [K] | v [V] | o [V] | Σo² per column vector [V/4], padded to a multiple of 4 (every
// part starts 16-byte aligned).
constexpr int kWsHeader = 4;
constexpr int kWsTicket = 2;
// kda_decode_fused_step's output modes (the launcher's `norm_mode`).
constexpr int kNormNone = 0;      // no norm: the split blocks write out
constexpr int kNormLaunched = 1;  // o and Σo² to the workspace, kda_decode_norm_unaligned follows
constexpr int kNormFold = 2;      // ... and the row's last split block runs the 16-byte norm
}  // namespace kda_decode_fused

// x, g, β, the conv and recurrent states and out are f32 or bf16 (KdaDecodePlan::check_args):
// the generic and prepare kernels load and store them two ways instead of through
// k3::load_f32's switch over every dtype, whose extra paths held enough uniform values to spill
// SGPRs into VGPR lanes on gfx942/gfx950. (kda_decode_norm_unaligned keeps k3::load_f32: nvcc
// unrolled its loop with the two-way form, 48 registers instead of 32.) bf16 widens by a shift
// and narrows through the hardware conversion of k3/convert_hw.h (the low half of a packed
// pair), not the software rounding of k3/convert.h (same results; NaN bits are the target's).
K3_DEVICE float kda_decode_load(const void* p, int dt, int64_t i) {
  return dt == k3::kBF16 ? k3::uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16)
                         : static_cast<const float*>(p)[i];
}
K3_DEVICE void kda_decode_store(void* p, int dt, int64_t i, float v) {
  if (dt == k3::kBF16) {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(k3::pack_bf16x2_rn(v, 0.0f));
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// Eight consecutive values of an f32 or bf16 tensor from element i, which the launcher checked
// to be 16-byte aligned (the 16-byte kernels): one 16-byte load for bf16, two for f32. bf16
// widens to f32 exactly by a shift (no conversion instruction exists or is needed).
struct KdaDecodeF32x8 {
  k3::f32x4 q[2];
  K3_DEVICE float& operator[](int t) { return q[t >> 2].v[t & 3]; }
  K3_DEVICE float operator[](int t) const { return q[t >> 2].v[t & 3]; }
};
K3_DEVICE KdaDecodeF32x8 kda_decode_load8(const void* p, int dt, int64_t i) {
  KdaDecodeF32x8 r;
  if (dt == k3::kBF16) {
    const k3::u32x4 w = k3::load_16b(static_cast<const uint16_t*>(p) + i);
    for (int c = 0; c < 4; ++c) {
      r[2 * c] = k3::uint_as_float(w.v[c] << 16);
      r[2 * c + 1] = k3::uint_as_float(w.v[c] & 0xffff0000u);
    }
  } else {
    r.q[0] = k3::load_f32x4(static_cast<const float*>(p) + i);
    r.q[1] = k3::load_f32x4(static_cast<const float*>(p) + i + 4);
  }
  return r;
}
// Eight values to element i (16-byte aligned): bf16 packed in pairs by the hardware conversion
// (k3/convert_hw.h) into one 16-byte store, f32 as two.
K3_DEVICE void kda_decode_store8(void* p, int dt, int64_t i, const KdaDecodeF32x8& x) {
  if (dt == k3::kBF16) {
    k3::u32x4 w;
    for (int c = 0; c < 4; ++c) w.v[c] = k3::pack_bf16x2_rn(x[2 * c], x[2 * c + 1]);
    k3::store_16b(static_cast<uint16_t*>(p) + i, w);
  } else {
    k3::store_f32x4(static_cast<float*>(p) + i, x.q[0]);
    k3::store_f32x4(static_cast<float*>(p) + i + 4, x.q[1]);
  }
}
// n (a multiple of 8) consecutive values from element i of an f32/bf16 tensor into the block's
// shared f32 array dst (16-byte aligned), and back; every thread of the block calls them.
K3_DEVICE void kda_decode_stage(float* dst, const void* src, int dt, int64_t i, int n) {
  for (int e = 8 * static_cast<int>(k3::thread_idx_x()); e < n; e += 8 * kda_decode_fused::kThreads) {
    const KdaDecodeF32x8 x = kda_decode_load8(src, dt, i + e);
    k3::store_f32x4(dst + e, x.q[0]);
    k3::store_f32x4(dst + e + 4, x.q[1]);
  }
}
K3_DEVICE void kda_decode_unstage(void* dst, int dt, int64_t i, const float* src, int n) {
  for (int e = 8 * static_cast<int>(k3::thread_idx_x()); e < n; e += 8 * kda_decode_fused::kThreads) {
    kda_decode_store8(dst, dt, i + e, KdaDecodeF32x8{{k3::load_f32x4(src + e), k3::load_f32x4(src + e + 4)}});
  }
}

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

// Decay factor α = exp(g) of one key channel from its raw gate input f and dt bias.
K3_DEVICE float kda_decode_decay(float f, float bias, int gate_mode, float lower_bound, float a_exp) {
  const float z = f + bias;
  float g = f;
  if (gate_mode == kda_decode_fused::kGateLowerBound) g = lower_bound * k3::sigmoid_f32(a_exp * z);
  if (gate_mode == kda_decode_fused::kGateSoftplus) g = -a_exp * kda_decode_softplus(z);
  return k3::exp_f32(g);
}

// Conv tap j of one channel whose W-1 history values `he` sit in shared memory: taps 0..W-2
// read the history (each value moved one place down right after it is read), tap W-1 the new
// input xe, which becomes the newest history value.
K3_DEVICE void kda_decode_tap(float* he, int j, int hist, float xe, float wj, float* acc) {
  if (j < hist) {
    const float hj = he[j];
    *acc += wj * hj;
    if (j > 0) he[j - 1] = hj;
  } else {
    *acc += wj * xe;
    if (hist > 0) he[hist - 1] = xe;
  }
}

// What steps 1–3 leave besides u (q | k | v after conv + SiLU) and α in shared memory.
struct KdaDecodeHeadScalars {
  float beta, q_mul, k_mul;
};

// Steps 1-3's inputs (conv, decay gate, beta) and their options, in the order the launcher
// passes them to kda_decode_generic_step and kda_decode_prepare; kda_decode_head_inputs takes
// them the same way.
#define KDA_DECODE_INPUT_PARAMS                                                                                   \
  const void *x, int x_dt, int64_t x_s0,                                        /* [B, D], unit channel stride */ \
      const float *conv_w, int64_t cw_s0, int64_t cw_s1,                        /* [D, W] */                      \
      void *conv_state, int cs_dt, int64_t cs_s0, int64_t cs_s1, int64_t cs_s2, /* [slots, D, W-1] */             \
      const void *g_raw, int g_dt, int64_t g_s0, int64_t g_s1,                  /* [B, H, K], unit inner */       \
      const void *beta_in, int beta_dt, int64_t be_s0, int64_t be_s1,           /* [B, H] */                      \
      const float *a_log, int64_t al_s0,                                        /* [A] or null */                 \
      const float *dt_bias, int64_t db_s0                                       /* [H·K] or null */
#define KDA_DECODE_INPUT_ARGS                                                                                     \
  x, x_dt, x_s0, conv_w, cw_s0, cw_s1, conv_state, cs_dt, cs_s0, cs_s1, cs_s2, g_raw, g_dt, g_s0, g_s1, beta_in, \
      beta_dt, be_s0, be_s1, a_log, al_s0, dt_bias, db_s0
#define KDA_DECODE_GATE_PARAMS int gate_mode, float lower_bound, int beta_sigmoid, int qk_l2norm, float scale
#define KDA_DECODE_GATE_ARGS gate_mode, lower_bound, beta_sigmoid, qk_l2norm, scale

// Helpers with two callers are K3_AMD_INLINE: as calls (clang's choice) they went through a
// scratch stack (kda_decode_head_inputs on gfx942: 264 B, 126 scratch loads/stores, 54 AGPRs).

// Steps 1–3 for the head of one block (all threads call it; it ends behind a barrier).
// kVec (the 16-byte kernels; the launcher checks the conditions, kda_vector_inputs in
// kernels/src/ops/kda_decode.rs): K and V multiples of 8; x, g_raw, the conv pool, the conv weights and dt_bias
// 16-byte aligned with every head's run of channels starting on a 16-byte boundary (row strides
// multiples of 8 elements, conv weights [D, W] and the pool's [D, W-1] packed, dt_bias unit
// stride). The head's x and conv history then move through `stage` (shared, (2K+V)·W floats)
// in 16-byte vectors, and the shifted history goes back the same way.
template <bool kVec>
K3_AMD_INLINE K3_DEVICE KdaDecodeHeadScalars kda_decode_head_inputs(
    KDA_DECODE_INPUT_PARAMS, int b, int h, int slot, int heads, int K, int V, int width, KDA_DECODE_GATE_PARAMS,
    float* u, float* alpha, float* red /* [2][kWarps] */, float* stage) {
  using namespace kda_decode_fused;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int HK = heads * K, hist = width - 1;
  // 1. Conv + SiLU over the head's channels, shifting their conv state.
  if constexpr (kVec) {
    const int C = 2 * K + V;
    float* hs_sh = stage;            // [C][W-1]
    float* x_sh = hs_sh + C * hist;  // [C]
    // The head's channels are three runs (its q, k and v channels), each contiguous in x and
    // the pool.
K3_NO_UNROLL
    for (int r = 0; r < 3; ++r) {
      const int e0 = r * K, n = r == 2 ? V : K, c0 = r * HK + h * (r == 2 ? V : K);
      kda_decode_stage(hs_sh + e0 * hist, conv_state, cs_dt, slot * cs_s0 + c0 * cs_s1, n * hist);
      kda_decode_stage(x_sh + e0, x, x_dt, b * x_s0 + c0, n);
    }
    k3::sync_threads();
    for (int e = tid; e < C; e += kThreads) {
      const int c = e < K ? h * K + e : (e < 2 * K ? HK + h * K + (e - K) : 2 * HK + h * V + (e - 2 * K));
      // The channel's W weights (a packed [D, W] row) straight from global memory, 16 bytes at a
      // time when W is a multiple of 4 (every row 16-byte aligned): they are the same for every
      // row of the batch, so L2 serves them, and staging them too would take 2 KiB more shared
      // per 128 channels (gfx942: 4 blocks per CU instead of 7).
      const float* we = conv_w + c * cw_s0;
      float* he = hs_sh + e * hist;
      const float xe = x_sh[e];
      float acc = 0.0f;
      if (width % 4 == 0) {
K3_NO_UNROLL
        for (int j0 = 0; j0 < width; j0 += 4) {
          const k3::f32x4 w4 = k3::load_f32x4(we + j0);
          for (int t = 0; t < 4; ++t) kda_decode_tap(he, j0 + t, hist, xe, w4.v[t], &acc);
        }
      } else {
K3_NO_UNROLL
        for (int j = 0; j < width; ++j) kda_decode_tap(he, j, hist, xe, we[j], &acc);
      }
      u[e] = acc * k3::sigmoid_f32(acc);
    }
    k3::sync_threads();
K3_NO_UNROLL
    for (int r = 0; r < 3; ++r) {
      const int e0 = r * K, n = r == 2 ? V : K, c0 = r * HK + h * (r == 2 ? V : K);
      kda_decode_unstage(conv_state, cs_dt, slot * cs_s0 + c0 * cs_s1, hs_sh + e0 * hist, n * hist);
    }
  } else {
    for (int e = tid; e < 2 * K + V; e += kThreads) {
      const int c = e < K ? h * K + e : (e < 2 * K ? HK + h * K + (e - K) : 2 * HK + h * V + (e - 2 * K));
      const int64_t cs = slot * cs_s0 + c * cs_s1;
      // One tap at a time, each history value moved one place down right after it is read (a
      // rolled loop: the register window of an unrolled one spilled SGPRs on AMD, and nvcc's
      // unrolling took sm_100a to 64-72 registers instead of 48).
      float acc = 0.0f;
K3_NO_UNROLL
      for (int j = 0; j < hist; ++j) {
        const float hj = kda_decode_load(conv_state, cs_dt, cs + j * cs_s2);
        acc += conv_w[c * cw_s0 + j * cw_s1] * hj;
        if (j > 0) kda_decode_store(conv_state, cs_dt, cs + (j - 1) * cs_s2, hj);
      }
      const float xv = kda_decode_load(x, x_dt, b * x_s0 + c);
      acc += conv_w[c * cw_s0 + hist * cw_s1] * xv;
      if (hist > 0) kda_decode_store(conv_state, cs_dt, cs + (hist - 1) * cs_s2, xv);
      u[e] = acc * k3::sigmoid_f32(acc);
    }
  }
  // 2. Decay gate.
  const float a_exp = gate_mode == kGateLowerBound || gate_mode == kGateSoftplus ? k3::exp_f32(a_log[h * al_s0]) : 0.0f;
  if constexpr (kVec) {
    for (int i = 8 * tid; i < K; i += 8 * kThreads) {
      const KdaDecodeF32x8 f = kda_decode_load8(g_raw, g_dt, b * g_s0 + h * g_s1 + i);
      const k3::f32x4 zero = {{0.0f, 0.0f, 0.0f, 0.0f}};
      const KdaDecodeF32x8 bias = dt_bias != nullptr ? kda_decode_load8(dt_bias, k3::kF32, h * K + i) : KdaDecodeF32x8{{zero, zero}};
      for (int c = 0; c < 8; ++c) alpha[i + c] = kda_decode_decay(f[c], bias[c], gate_mode, lower_bound, a_exp);
    }
  } else {
    for (int i = tid; i < K; i += kThreads) {
      const float f = kda_decode_load(g_raw, g_dt, b * g_s0 + h * g_s1 + i);
      alpha[i] = kda_decode_decay(f, dt_bias != nullptr ? dt_bias[(h * K + i) * db_s0] : 0.0f, gate_mode, lower_bound, a_exp);
    }
  }
  const float bv = kda_decode_load(beta_in, beta_dt, b * be_s0 + h * be_s1);
  KdaDecodeHeadScalars r{beta_sigmoid ? k3::sigmoid_f32(bv) : bv, scale, 1.0f};
  k3::sync_threads();

  // 3. q/k L2 norms (scale folded into q's factor).
  if (qk_l2norm) {
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < K; i += kThreads) {
      sq += u[i] * u[i];
      sk += u[K + i] * u[K + i];
    }
    sq = kda_decode_block_sum(sq, red);
    sk = kda_decode_block_sum(sk, red + kWarps);
    r.q_mul = scale / k3::sqrt_f32(sq + 1e-6f);
    r.k_mul = 1.0f / k3::sqrt_f32(sk + 1e-6f);
  }
  return r;
}

// The slot of a row, checked (block-uniform); false for a slot outside [0, slots), reported.
// The null slot 0 (a padded graph row: zeros out, pools untouched) passes; the caller skips it.
K3_DEVICE bool kda_decode_claim_slot(const int32_t* state_indices, int64_t si_s0, int b, int h, int slots, int batch,
                                     k3::ErrorRecord* err, int* slot_out) {
  const int slot = state_indices[b * si_s0];
  *slot_out = slot;
  if (!k3::index_ok(err, k3::kCheckKdaDecodeStateIndices, b, slot, 0, slots)) return false;
  if (h == 0) k3::block_unique(err, k3::kCheckKdaDecodeStateIndices, state_indices, k3::kI32, si_s0, batch, b, slot, 0);
  return true;
}

// One block per (row, head), all five steps. kda_decode_generic_step (kVec) moves the head
// inputs as kda_decode_prepare does, the state 8 elements at a time along its unit-stride dim
// and the output gate, norm weight and outputs 8 columns at a time, all in 16-byte vectors (the
// launcher checks K, V multiples of 8, the state's fast dim unit-stride, its other strides
// multiples of 8 elements, and the inputs' and outputs' conditions);
// kda_decode_generic_step_unaligned takes any layout the contract allows, element by element.
#define KDA_DECODE_GENERIC_PARAMS                                                                                 \
  KDA_DECODE_INPUT_PARAMS, const int32_t *state_indices, int64_t si_s0, /* [B] */                                 \
      void *state, int st_dt, int64_t st_slot, int64_t st_head, int64_t st_k, int64_t st_v, int k_fast,          \
      const void *out_gate, int og_dt, int64_t og_s0, int64_t og_s1, /* [B, H, V] or null */                      \
      const float *norm_w, int64_t nw_s0,                            /* [V] or null */                            \
      void *out, int out_dt, int64_t out_s0, int64_t out_s1,         /* [B, H, V] */                              \
      int heads, int head_k, int head_v, int width, int slots, KDA_DECODE_GATE_PARAMS, int gated_norm, float norm_eps, \
      int batch, k3::ErrorRecord *err
#define KDA_DECODE_GENERIC_ARGS                                                                                      \
  KDA_DECODE_INPUT_ARGS, state_indices, si_s0, state, st_dt, st_slot, st_head, st_k, st_v, k_fast, out_gate, og_dt, \
      og_s0, og_s1, norm_w, nw_s0, out, out_dt, out_s0, out_s1, heads, head_k, head_v, width, slots,               \
      KDA_DECODE_GATE_ARGS, gated_norm, norm_eps, batch, err
template <bool kVec>
K3_AMD_INLINE K3_DEVICE void kda_decode_generic_body(KDA_DECODE_GENERIC_PARAMS) {
  using namespace kda_decode_fused;
  const int row = static_cast<int>(k3::block_idx_x());
  const int b = row / heads;
  const int h = row % heads;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int K = head_k, V = head_v;
  int slot = 0;
  if (!kda_decode_claim_slot(state_indices, si_s0, b, h, slots, batch, err, &slot)) return;
  // Steps 1-4 only for a real slot; a null row reaches the output stage with zeros. (Zeroing it
  // here instead kept the output arguments live in SGPRs across the whole kernel: spills on AMD.)
  const bool live_row = slot != 0;

  float* u = k3::dynamic_shared<float>();  // [2K + V]: q | k | v of this head after conv + SiLU
  float* alpha = u + 2 * K + V;            // [K] decay factors
  float* o = alpha + K;                    // [V] o = Sᵀq
  float* tile = o + V;                     // [K][kTileStride] one chunk of the state
  float* stage = tile + K * kTileStride;   // kVec: [(2K + V)·W] conv history and x
  K3_SHARED(float, red, [3][kWarps]);

  KdaDecodeHeadScalars hs{0.0f, 0.0f, 0.0f};
  if (live_row) hs = kda_decode_head_inputs<kVec>(
      KDA_DECODE_INPUT_ARGS, b, h, slot, heads, K, V, width, KDA_DECODE_GATE_ARGS, u, alpha, red[0], stage);
  const float beta = hs.beta, q_mul = hs.q_mul, k_mul = hs.k_mul;

  // 4. Delta rule, kChunk value columns at a time.
  const int64_t s_base = slot * st_slot + h * st_head;
  const int jj = tid / kGroup;  // this thread's column in the tile
  const int lane_k = tid % kGroup;
  const int tile_elems = K * kChunk;
  // Tile element e = tid + n·kThreads is (fast, slow) = (e % fast, e / fast), fast along the
  // state's closer-to-contiguous dim; both advance by constant steps, so the tile loops divide
  // once per kernel, not per element. They stay rolled: unrolled, nvcc used 95 registers (48).
  // kVec: a thread's element is the first of 8 consecutive ones along the fast dim.
  const int fast = k_fast ? K : kChunk;
  constexpr int kRun = kVec ? 8 : 1;
  const int d_fast = kRun * kThreads % fast, d_slow = kRun * kThreads / fast;
  const int f0 = kRun * tid % fast, s0 = kRun * tid / fast;
  for (int j0 = 0; live_row && j0 < V; j0 += kChunk) {
    // Coalesced load with the decay applied: consecutive threads walk the contiguous dim.
K3_NO_UNROLL
    for (int e = kRun * tid, f = f0, sl = s0; e < tile_elems; e += kRun * kThreads) {
      const int i = k_fast ? f : sl, c = k_fast ? sl : f;
      const int64_t at = s_base + i * st_k + (j0 + c) * st_v;
      if constexpr (kVec) {
        // V is a multiple of 8: a run along v is live or dead as a whole.
        if (j0 + c < V) {
          const KdaDecodeF32x8 x = kda_decode_load8(state, st_dt, at);
          for (int t = 0; t < 8; ++t) {
            if (k_fast) tile[(i + t) * kTileStride + c] = alpha[i + t] * x[t];
            else tile[i * kTileStride + c + t] = alpha[i] * x[t];
          }
        }
      } else {
        if (j0 + c < V) tile[i * kTileStride + c] = alpha[i] * kda_decode_load(state, st_dt, at);
      }
      f += d_fast;
      sl += d_slow + (f >= fast);
      f -= f >= fast ? fast : 0;
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
K3_NO_UNROLL
    for (int e = kRun * tid, f = f0, sl = s0; e < tile_elems; e += kRun * kThreads) {
      const int i = k_fast ? f : sl, c = k_fast ? sl : f;
      const int64_t at = s_base + i * st_k + (j0 + c) * st_v;
      if constexpr (kVec) {
        if (j0 + c < V) {
          KdaDecodeF32x8 x;
          for (int t = 0; t < 8; ++t) x[t] = k_fast ? tile[(i + t) * kTileStride + c] : tile[i * kTileStride + c + t];
          kda_decode_store8(state, st_dt, at, x);
        }
      } else {
        if (j0 + c < V) kda_decode_store(state, st_dt, at, tile[i * kTileStride + c]);
      }
      f += d_fast;
      sl += d_slow + (f >= fast);
      f -= f >= fast ? fast : 0;
    }
    k3::sync_threads();  // the next chunk overwrites the tile
  }

  // 5. Output, optionally through the gated RMSNorm.
  float inv_rms = 1.0f;
  if (gated_norm && live_row) {
    float ss = 0.0f;
    for (int jv = tid; jv < V; jv += kThreads) ss += o[jv] * o[jv];
    ss = kda_decode_block_sum(ss, red[2]);
    inv_rms = 1.0f / k3::sqrt_f32(ss / static_cast<float>(V) + norm_eps);
  }
  const int64_t out_row = b * out_s0 + h * out_s1, og_row = b * og_s0 + h * og_s1;
  if constexpr (kVec) {
    for (int jv = 8 * tid; jv < V; jv += 8 * kThreads) {
      KdaDecodeF32x8 y;
      for (int t = 0; t < 8; ++t) y[t] = live_row ? o[jv + t] : 0.0f;
      if (gated_norm && live_row) {
        const KdaDecodeF32x8 gate = kda_decode_load8(out_gate, og_dt, og_row + jv);
        const KdaDecodeF32x8 nw = kda_decode_load8(norm_w, k3::kF32, jv);
        for (int t = 0; t < 8; ++t) y[t] = nw[t] * y[t] * inv_rms * k3::sigmoid_f32(gate[t]);
      }
      kda_decode_store8(out, out_dt, out_row + jv, y);
    }
  } else {
    for (int jv = tid; jv < V; jv += kThreads) {
      float y = live_row ? o[jv] : 0.0f;
      if (gated_norm && live_row) {
        const float gate = kda_decode_load(out_gate, og_dt, og_row + jv);
        y = norm_w[jv * nw_s0] * y * inv_rms * k3::sigmoid_f32(gate);
      }
      kda_decode_store(out, out_dt, out_row + jv, y);
    }
  }
}
K3_KERNEL void kda_decode_generic_step(KDA_DECODE_GENERIC_PARAMS) { kda_decode_generic_body<true>(KDA_DECODE_GENERIC_ARGS); }
K3_EXPORT(kda_decode_generic_step);
K3_KERNEL void kda_decode_generic_step_unaligned(KDA_DECODE_GENERIC_PARAMS) {
  kda_decode_generic_body<false>(KDA_DECODE_GENERIC_ARGS);
}
K3_EXPORT(kda_decode_generic_step_unaligned);

// V-split, launch 1: steps 1–3 of one (row, head) into its workspace row `ws + row·ws_row`.
// kda_decode_prepare moves the head's inputs, conv history and (null rows) outputs in 16-byte
// vectors (kda_decode_head_inputs<true>; `out` 16-byte aligned with row strides multiples of 8
// elements); kda_decode_prepare_unaligned takes any layout the contract allows.
#define KDA_DECODE_PREPARE_PARAMS                                                                   \
  KDA_DECODE_INPUT_PARAMS, const int32_t *state_indices, int64_t si_s0, /* [B] */                   \
      float *ws, int64_t ws_row,                                        /* [B·H, ws_row] */         \
      void *out, int out_dt, int64_t out_s0, int64_t out_s1, /* [B, H, V]: null rows only */        \
      int heads, int head_k, int head_v, int width, int slots, KDA_DECODE_GATE_PARAMS, int batch, \
      k3::ErrorRecord *err
#define KDA_DECODE_PREPARE_ARGS                                                                                   \
  KDA_DECODE_INPUT_ARGS, state_indices, si_s0, ws, ws_row, out, out_dt, out_s0, out_s1, heads, head_k, head_v, \
      width, slots, KDA_DECODE_GATE_ARGS, batch, err
template <bool kVec>
K3_AMD_INLINE K3_DEVICE void kda_decode_prepare_body(KDA_DECODE_PREPARE_PARAMS) {
  using namespace kda_decode_fused;
  const int row = static_cast<int>(k3::block_idx_x());
  const int b = row / heads;
  const int h = row % heads;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int K = head_k, V = head_v;
  float* w = ws + row * ws_row;
  int slot = 0;
  const bool ok = kda_decode_claim_slot(state_indices, si_s0, b, h, slots, batch, err, &slot);
  if (!ok || slot == 0) {
    if (tid == 0) w[0] = k3::uint_as_float(0u);  // tells the split and norm kernels to skip the row
    if (ok) {  // the null slot: zeros out
      const int64_t o = b * out_s0 + h * out_s1;
      if constexpr (kVec) {
        const k3::f32x4 zero = {{0.0f, 0.0f, 0.0f, 0.0f}};
        for (int j = 8 * tid; j < V; j += 8 * kThreads) kda_decode_store8(out, out_dt, o + j, KdaDecodeF32x8{{zero, zero}});
      } else {
        for (int j = tid; j < V; j += kThreads) kda_decode_store(out, out_dt, o + j, 0.0f);
      }
    }
    return;
  }
  float* u = k3::dynamic_shared<float>();  // [2K + V]: q | k | v of this head after conv + SiLU
  float* alpha = u + 2 * K + V;            // [K] decay factors
  float* stage = alpha + K;                // kVec: [(2K + V)·W] conv history and x
  K3_SHARED(float, red, [2][kWarps]);
  const KdaDecodeHeadScalars hs = kda_decode_head_inputs<kVec>(
      KDA_DECODE_INPUT_ARGS, b, h, slot, heads, K, V, width, KDA_DECODE_GATE_ARGS, u, alpha, red[0], stage);
  // q̂ | k̂ | α | v, every part a multiple of 4 floats (split_shapes) and 16-byte aligned.
  float* vecs = w + kWsHeader;
  for (int e = tid; e < (3 * K + V) / 4; e += kThreads) {
    const int i = 4 * e;
    k3::f32x4 y = k3::load_f32x4(i < 2 * K ? u + i : (i < 3 * K ? alpha + (i - 2 * K) : u + (i - K)));
    const float m = i < K ? hs.q_mul : (i < 2 * K ? hs.k_mul : 1.0f);
    for (int c = 0; c < 4; ++c) y.v[c] *= m;
    k3::store_f32x4(vecs + i, y);
  }
  // The Σo² padding is summed by kda_decode_norm's vector loads: keep it zero.
  const int used = kWsHeader + 3 * K + 2 * V + V / 4;
  for (int e = used + tid; e < ws_row; e += kThreads) w[e] = 0.0f;
  if (tid == 0) {
    w[0] = k3::uint_as_float(static_cast<uint32_t>(slot));
    w[1] = hs.beta;
    w[kWsTicket] = k3::uint_as_float(0u);  // no split block of this step has finished the row
  }
}
K3_KERNEL void kda_decode_prepare(KDA_DECODE_PREPARE_PARAMS) { kda_decode_prepare_body<true>(KDA_DECODE_PREPARE_ARGS); }
K3_EXPORT(kda_decode_prepare);
K3_KERNEL void kda_decode_prepare_unaligned(KDA_DECODE_PREPARE_PARAMS) {
  kda_decode_prepare_body<false>(KDA_DECODE_PREPARE_ARGS);
}
K3_EXPORT(kda_decode_prepare_unaligned);

// Four consecutive outputs from element i of `out`; bf16 pairs go through the hardware pack
// (k3/convert_hw.h) as 32-bit stores when the address allows it, other cases element by element.
K3_AMD_INLINE K3_DEVICE void kda_decode_store4(void* out, int out_dt, int64_t i, k3::f32x4 y) {
  if (out_dt == k3::kBF16) {
    uint16_t* p = static_cast<uint16_t*>(out) + i;
    if ((reinterpret_cast<uint64_t>(p) & 3u) == 0) {
      uint32_t* q = reinterpret_cast<uint32_t*>(p);
      q[0] = k3::pack_bf16x2_rn(y.v[0], y.v[1]);
      q[1] = k3::pack_bf16x2_rn(y.v[2], y.v[3]);
      return;
    }
  }
  // (k3::store_f32 here, not kda_decode_store: with the latter nvcc took kda_decode_norm_unaligned
  // from 32 to 52 registers on sm_90a.)
  for (int c = 0; c < 4; ++c) k3::store_f32(out, out_dt, i + c, y.v[c]);
}

// Sum of one 4-column vector's partials over the kSplitLanes k lanes that share it (all threads
// call it): xor butterflies inside the warp, then a fixed-order sum of the warps' partials.
// `red` holds kSplitMaxWarps × cv vectors and must not be reused by another sum of the block.
K3_DEVICE k3::f32x4 kda_decode_split_sum(k3::f32x4 v, k3::f32x4* red, int cv, int vecs) {
  for (int off = vecs; off < k3::kWarpSize; off <<= 1) {
    for (int c = 0; c < 4; ++c) v.v[c] += k3::shfl_xor(v.v[c], off);
  }
  const int tid = static_cast<int>(k3::thread_idx_x());
  if (static_cast<int>(k3::lane_id()) < vecs) red[(tid / k3::kWarpSize) * vecs + cv] = v;
  k3::sync_threads();
  k3::f32x4 s = {{0.0f, 0.0f, 0.0f, 0.0f}};
  const int warps = kda_decode_fused::kSplitLanes * vecs / k3::kWarpSize;
  for (int w = 0; w < warps; ++w) {
    for (int c = 0; c < 4; ++c) s.v[c] += red[w * vecs + cv].v[c];
  }
  return s;
}

// Step 5 of one (row, head) from o and the Σo² partials of its workspace row `w`, summed in a
// fixed order, by `threads` threads (thread `tid`): kda_decode_norm_unaligned's block, or the
// row's last split block in kda_decode_fused_step. Same sums in the same order either way, so the output
// does not depend on which. kVec moves 8 columns per thread in 16-byte vectors (V a multiple of
// 8; the output gate and `out` 16-byte aligned with row strides multiples of 8 elements, the
// norm weight unit-stride and aligned); otherwise any layout the contract allows.
#define KDA_DECODE_NORM_OUT_PARAMS                                                               \
  const void *out_gate, int og_dt, int64_t og_s0, int64_t og_s1, /* [B, H, V], unit inner */     \
      const float *norm_w, int64_t nw_s0,                        /* [V] */                       \
      void *out, int out_dt, int64_t out_s0, int64_t out_s1      /* [B, H, V], unit inner */
#define KDA_DECODE_NORM_OUT_ARGS out_gate, og_dt, og_s0, og_s1, norm_w, nw_s0, out, out_dt, out_s0, out_s1
template <bool kVec>
K3_AMD_INLINE K3_DEVICE void kda_decode_norm_row(const float* w, KDA_DECODE_NORM_OUT_PARAMS, int b, int h, int K, int V,
                                                 float norm_eps, int tid, int threads) {
  using namespace kda_decode_fused;
  const float* o = w + kWsHeader + 3 * K + V;
  const float* part = o + V;  // V/4 partials, zero-padded to a multiple of 4
  float ss = 0.0f;
  for (int e = 0; e < (V / 4 + 3) / 4; ++e) {
    const k3::f32x4 p = k3::load_f32x4(part + 4 * e);
    ss += (p.v[0] + p.v[1]) + (p.v[2] + p.v[3]);
  }
  const float inv_rms = 1.0f / k3::sqrt_f32(ss / static_cast<float>(V) + norm_eps);
  const int64_t og = b * og_s0 + h * og_s1, ob = b * out_s0 + h * out_s1;
  if constexpr (kVec) {
    for (int j = 8 * tid; j < V; j += 8 * threads) {
      KdaDecodeF32x8 y{{k3::load_f32x4(o + j), k3::load_f32x4(o + j + 4)}};
      const KdaDecodeF32x8 gate = kda_decode_load8(out_gate, og_dt, og + j);
      const KdaDecodeF32x8 nw = kda_decode_load8(norm_w, k3::kF32, j);
      for (int c = 0; c < 8; ++c) {
        y[c] = nw[c] * y[c] * inv_rms * k3::sigmoid_f32(gate[c]);
      }
      kda_decode_store8(out, out_dt, ob + j, y);
    }
  } else {
    for (int e = tid; e < V / 4; e += threads) {
      k3::f32x4 y = k3::load_f32x4(o + 4 * e);
      for (int c = 0; c < 4; ++c) {
        const int jv = 4 * e + c;
        const float gate = k3::load_f32(out_gate, og_dt, og + jv);
        y.v[c] = norm_w[jv * nw_s0] * y.v[c] * inv_rms * k3::sigmoid_f32(gate);
      }
      kda_decode_store4(out, out_dt, ob + 4 * e, y);
    }
  }
}

// V-split, launch 2: step 4 for the columns [4·vecs·y, 4·vecs·(y+1)) of one (row, head),
// kSplitLanes·vecs threads. Thread t holds column vector cv = t % vecs, rows kl = t / vecs and
// kl + kSplitLanes. The state is f32 with unit stride along v; every offset is a multiple of 4
// floats (the launcher checks it), so each row of the slice moves as one 16-byte vector.
// At most kSplitLanes·kSplitMaxVecs = 256 threads; on NVIDIA at least 6 such blocks per SM:
// ptxas then fits 40 registers (48 without: 5 blocks, 40 of 64 warps resident; 6 blocks give
// 48 warps). Asking for 8 blocks (32 registers) put 16 B on the stack.
// With norm_mode kNormFold the row's last block to finish runs step 5 (kda_decode_norm_row):
// every block stores its o columns and Σo² partials, fences them device-wide, and takes a
// ticket from the row's header (zeroed by kda_decode_prepare each step); the block that takes
// the last one fences again and reads every block's values. This saves the third launch and its
// dependent round trip per KDA layer (BENCHMARKS.md, KDA decode round 4).
#if K3_TARGET_CUDA
#define KDA_DECODE_SPLIT_BOUNDS __launch_bounds__(kda_decode_fused::kSplitLanes * kda_decode_fused::kSplitMaxVecs, 6)
#else
#define KDA_DECODE_SPLIT_BOUNDS
#endif
K3_KERNEL KDA_DECODE_SPLIT_BOUNDS void kda_decode_fused_step(
    float* ws, int64_t ws_row,                                         // [B·H, ws_row]
    float* state, int64_t st_slot, int64_t st_head, int64_t st_k,            // v stride 1
    KDA_DECODE_NORM_OUT_PARAMS,                                              // gate, weight: kNormFold only
    int heads, int head_k, int head_v, int slots, int vecs, int norm_mode, float norm_eps, k3::ErrorRecord* err) {
  using namespace kda_decode_fused;
  const int row = static_cast<int>(k3::block_idx_x());
  const int b = row / heads;
  const int h = row % heads;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int threads = kSplitLanes * vecs;
  const int K = head_k, V = head_v;
  float* w = ws + row * ws_row;
  const k3::f32x4 hd = k3::load_f32x4(w);
  const int slot = static_cast<int>(k3::float_as_uint(hd.v[0]));
  if (slot == 0) return;  // null or rejected row: kda_decode_prepare dealt with it
  if (!k3::index_ok(err, k3::kCheckKdaDecodeStateIndices, b, slot, 0, slots)) return;
  const float beta = hd.v[1];

  float* vecs_sh = k3::dynamic_shared<float>();  // [3K]: q̂ | k̂ | α
  K3_SHARED(k3::f32x4, red, [2][kSplitMaxWarps * kSplitMaxVecs]);
  K3_SHARED(int, last_block, [1]);
  for (int e = tid; e < 3 * K / 4; e += threads) k3::store_f32x4(vecs_sh + 4 * e, k3::load_f32x4(w + kWsHeader + 4 * e));

  const int cv = tid % vecs;
  const int kl = tid / vecs;
  const int j = (static_cast<int>(k3::block_idx_y()) * vecs + cv) * 4;
  const bool live = j < V;
  const k3::f32x4 zero = {{0.0f, 0.0f, 0.0f, 0.0f}};
  const k3::f32x4 v = live ? k3::load_f32x4(w + kWsHeader + 3 * K + j) : zero;
  const int64_t base = slot * st_slot + h * st_head + j;
  k3::f32x4 s[kSplitRows];
  for (int n = 0; n < kSplitRows; ++n) {
    const int k = kl + n * kSplitLanes;
    s[n] = live && k < K ? k3::load_f32x4(state + base + k * st_k) : zero;
  }
  k3::sync_threads();  // q̂ | k̂ | α in shared

  k3::f32x4 ks = zero;
  for (int n = 0; n < kSplitRows; ++n) {
    const int k = kl + n * kSplitLanes;
    const float a = k < K ? vecs_sh[2 * K + k] : 0.0f, kk = k < K ? vecs_sh[K + k] : 0.0f;
    for (int c = 0; c < 4; ++c) {
      s[n].v[c] *= a;
      ks.v[c] += kk * s[n].v[c];
    }
  }
  ks = kda_decode_split_sum(ks, red[0], cv, vecs);
  k3::f32x4 qs = zero;
  for (int n = 0; n < kSplitRows; ++n) {
    const int k = kl + n * kSplitLanes;
    const float kk = k < K ? vecs_sh[K + k] : 0.0f, qq = k < K ? vecs_sh[k] : 0.0f;
    for (int c = 0; c < 4; ++c) {
      s[n].v[c] += beta * kk * (v.v[c] - ks.v[c]);
      qs.v[c] += qq * s[n].v[c];
    }
    if (live && k < K) k3::store_f32x4(state + base + k * st_k, s[n]);
  }
  qs = kda_decode_split_sum(qs, red[1], cv, vecs);
  if (live && kl == 0) {
    if (norm_mode == kNormNone) {
      kda_decode_store4(out, out_dt, b * out_s0 + h * out_s1 + j, qs);
    } else {
      float* wo = w + kWsHeader + 3 * K + V;
      k3::store_f32x4(wo + j, qs);
      wo[V + j / 4] = qs.v[0] * qs.v[0] + qs.v[1] * qs.v[1] + qs.v[2] * qs.v[2] + qs.v[3] * qs.v[3];
    }
  }
  if (norm_mode != kNormFold) return;
  k3::thread_fence();  // this thread's o and Σo² stores, visible device-wide before the ticket
  k3::sync_threads();
  if (tid == 0) {
    unsigned* ticket = reinterpret_cast<unsigned*>(w + kWsTicket);
    last_block[0] = k3::atomic_add(ticket, 1u) + 1u == k3::grid_dim_y();
  }
  k3::sync_threads();
  if (last_block[0] == 0) return;
  k3::thread_fence();  // every other block's o and Σo², which their tickets published
  kda_decode_norm_row<true>(w, KDA_DECODE_NORM_OUT_ARGS, b, h, K, V, norm_eps, tid, threads);
}
K3_EXPORT(kda_decode_fused_step);

// V-split, launch 3 (the gated norm where kNormFold does not apply: an output gate, norm weight
// or `out` off the 16-byte path): step 5 of one (row, head), kThreads threads.
K3_KERNEL void kda_decode_norm_unaligned(const float* ws, int64_t ws_row,  // [B·H, ws_row]
                                         KDA_DECODE_NORM_OUT_PARAMS, int heads, int head_k, int head_v, float norm_eps) {
  using namespace kda_decode_fused;
  const int row = static_cast<int>(k3::block_idx_x());
  const float* w = ws + row * ws_row;
  if (k3::float_as_uint(k3::load_f32x4(w).v[0]) == 0u) return;  // null or rejected row
  kda_decode_norm_row<false>(w, KDA_DECODE_NORM_OUT_ARGS, row / heads, row % heads, head_k, head_v, norm_eps,
                             static_cast<int>(k3::thread_idx_x()), kThreads);
}
K3_EXPORT(kda_decode_norm_unaligned);
