// MLA prefill: ragged causal multi-head attention with qk_dim != v_dim (kernel-api
// ops/mla_prefill.rs is the spec). Flash-attention style, SIMT f32 path.
//
// Grid (query tiles of 16 rows, heads, sequences); 256 threads = 16 rows x 16 columns. Per
// 16-key tile the block stages K (padded rows: no bank conflicts) and V in shared memory; thread
// (r, c) scores query r against key c, the 16 threads of a row (one aligned group of lanes)
// reduce max and sum with width-16 shuffles, write their probabilities to a shared row, and
// accumulate output dims c, c + 16, ... in registers (online softmax, f32). The causal mask is
// bottom-right aligned; key tiles past a query tile's last visible key are never loaded.
#include "k3/compat.h"
#include "mla_common.cuh"

namespace {

constexpr int kPrefillRows = 16;
constexpr int kPrefillKeys = 16;
constexpr int kPrefillThreads = kPrefillRows * kPrefillKeys;
constexpr int kPrefillMaxV = 256;
constexpr int kPrefillAcc = kPrefillMaxV / kPrefillKeys;

}  // namespace

// q [*, heads, dqk], k [*, heads, dqk], v [*, heads, dv] (row / head strides in elements, unit
// inner stride, one dtype); cu_q / cu_k offsets (cu_k null: self-attention); out [*, heads, dv];
// lse [*, heads] or null. The device offsets are checked per block: sequence b's queries lie in
// [0, total_q] and number at most max_q (the grid's rows), its keys lie in [0, total_k] and
// number at least its queries when causal.
K3_KERNEL void MLA_MAX_THREADS(256) mla_prefill(const void* q, const void* k, const void* v, int in_dt, int64_t q_st, int64_t q_sh,
                           int64_t k_st, int64_t k_sh, int64_t v_st, int64_t v_sh, const void* cu_q, int cu_q_dt,
                           const void* cu_k, int cu_k_dt, int64_t total_q, int64_t total_k, int64_t max_q, void* out,
                           int out_dt, int64_t o_st, int64_t o_sh, float* lse, int64_t l_st, int64_t l_sh, int dqk, int dv,
                           int causal, float scale, k3::ErrorRecord* err) {
  const int tile = static_cast<int>(k3::block_idx_x());
  const int h = static_cast<int>(k3::block_idx_y());
  const int b = static_cast<int>(k3::block_idx_z());
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int r = tid / kPrefillKeys;
  const int c = tid % kPrefillKeys;
  const int64_t q0 = k3::load_index(cu_q, cu_q_dt, b);
  const int64_t q1 = k3::load_index(cu_q, cu_q_dt, b + 1);
  // Block-uniform (every thread reads the same offsets).
  if (!k3::index_ok(err, k3::kCheckMlaPrefillCuQ, b, q0, 0, total_q + 1) ||
      !k3::index_ok(err, k3::kCheckMlaPrefillCuQ, b + 1, q1, q0, (total_q - q0 < max_q ? total_q : q0 + max_q) + 1)) {
    return;
  }
  const int64_t lq = q1 - q0;
  int64_t k0 = q0, lk = lq;
  if (cu_k != nullptr) {
    k0 = k3::load_index(cu_k, cu_k_dt, b);
    const int64_t k1 = k3::load_index(cu_k, cu_k_dt, b + 1);
    if (!k3::index_ok(err, k3::kCheckMlaPrefillCuK, b, k0, 0, total_k + 1) ||
        !k3::index_ok(err, k3::kCheckMlaPrefillCuK, b + 1, k1, causal ? k0 + lq : k0, total_k + 1)) {
      return;
    }
    lk = k1 - k0;
  }
  const int64_t i0 = static_cast<int64_t>(tile) * kPrefillRows;
  if (i0 >= lq) return;  // block-uniform
  const int64_t rows = lq - i0 < kPrefillRows ? lq - i0 : kPrefillRows;
  const int64_t shift = lk - lq;  // causal: query i sees keys j <= i + shift

  float* qs = k3::dynamic_shared<float>();            // [16][dqk]
  float* ks = qs + kPrefillRows * dqk;                 // [16][dqk + 1]
  float* vs = ks + kPrefillKeys * (dqk + 1);           // [16][dv]
  float* ps = vs + kPrefillKeys * dv;                  // [16][16]

  for (int e = tid; e < kPrefillRows * dqk; e += kPrefillThreads) {
    const int rr = e / dqk, d = e % dqk;
    qs[e] = rr < rows ? k3::load_f32(q, in_dt, (q0 + i0 + rr) * q_st + h * q_sh + d) : 0.0f;
  }
  // Keys this tile needs: up to the last row's causal limit.
  int64_t kv_hi = causal ? i0 + rows + shift : lk;
  kv_hi = kv_hi < lk ? kv_hi : lk;

  const float neg_inf = k3::uint_as_float(0xff800000u);
  const int64_t i = i0 + r;
  const bool row_valid = r < rows;
  int64_t limit = causal ? i + shift + 1 : lk;  // keys below this are visible to row r
  limit = !row_valid ? 0 : (limit < lk ? limit : lk);
  float m = neg_inf, l = 0.0f;
  float acc[kPrefillAcc];
  for (int j = 0; j < kPrefillAcc; ++j) acc[j] = 0.0f;

  for (int64_t j0 = 0; j0 < kv_hi; j0 += kPrefillKeys) {
    const int64_t n = kv_hi - j0 < kPrefillKeys ? kv_hi - j0 : kPrefillKeys;
    k3::sync_threads();  // the previous tile is consumed (and q is staged)
    for (int e = tid; e < kPrefillKeys * dqk; e += kPrefillThreads) {
      const int t = e / dqk, d = e % dqk;
      ks[t * (dqk + 1) + d] = t < n ? k3::load_f32(k, in_dt, (k0 + j0 + t) * k_st + h * k_sh + d) : 0.0f;
    }
    for (int e = tid; e < kPrefillKeys * dv; e += kPrefillThreads) {
      const int t = e / dv, d = e % dv;
      vs[e] = t < n ? k3::load_f32(v, in_dt, (k0 + j0 + t) * v_st + h * v_sh + d) : 0.0f;
    }
    k3::sync_threads();
    float dot = 0.0f;
    for (int d = 0; d < dqk; ++d) dot += qs[r * dqk + d] * ks[c * (dqk + 1) + d];
    const float s = c < n && j0 + c < limit ? dot * scale : neg_inf;
    float tmax = s;
    for (int o = kPrefillKeys / 2; o > 0; o >>= 1) tmax = k3::max_f32(tmax, k3::shfl_xor(tmax, o, kPrefillKeys));
    const float m_new = k3::max_f32(m, tmax);
    const bool live = m_new != neg_inf;
    const float alpha = live ? k3::exp_f32(m - m_new) : 1.0f;
    const float p = live ? k3::exp_f32(s - m_new) : 0.0f;
    ps[r * kPrefillKeys + c] = p;
    float psum = p;
    for (int o = kPrefillKeys / 2; o > 0; o >>= 1) psum += k3::shfl_xor(psum, o, kPrefillKeys);
    l = l * alpha + psum;
    m = m_new;
    k3::sync_warp();  // the row's probabilities are written (a row's 16 threads share a warp)
    for (int j = 0; j < kPrefillAcc; ++j) {
      const int d = c + j * kPrefillKeys;
      if (d >= dv) break;
      float a = acc[j] * alpha;
      for (int t = 0; t < n; ++t) a += ps[r * kPrefillKeys + t] * vs[t * dv + d];
      acc[j] = a;
    }
  }

  if (!row_valid) return;
  const bool any = l > 0.0f;
  const float inv = any ? 1.0f / l : 0.0f;
  for (int j = 0; j < kPrefillAcc; ++j) {
    const int d = c + j * kPrefillKeys;
    if (d >= dv) break;
    k3::store_f32(out, out_dt, (q0 + i) * o_st + h * o_sh + d, acc[j] * inv);
  }
  if (lse != nullptr && c == 0) lse[(q0 + i) * l_st + h * l_sh] = any ? m + k3::log_f32(l) : neg_inf;
}
K3_EXPORT(mla_prefill);
