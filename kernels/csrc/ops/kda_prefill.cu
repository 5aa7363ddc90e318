// KDA chunked prefill (kernel-api ops/kda_prefill.rs is the spec), in three launches:
//
//   kda_prefill_schedule     1 block: the chunk list of the batch from the device cu_seqlens and
//                            checkpoint offsets (chunk_size tokens from each sequence start,
//                            restarting at every checkpoint offset), written to the workspace.
//                            It checks the device metadata (k3/checks.h): cu_seqlens starts at 0,
//                            never decreases and ends at the plan's T; used checkpoint offsets
//                            increase within 1..=len; the chunk count is the plan's. Otherwise it
//                            writes an empty schedule (zero-length chunks, seq_base[N] = -1) that
//                            K1 and K2 run as no work at all (K2 leaves every state alone).
//   kda_prefill_prepare      K1, grid (chunks, H), token-parallel: gate, q/k L2 norm, β, the
//                            cumulative log-decay G inside the chunk, the intra-chunk matrices
//                            L = β_i·Σ_d k_i k_j e^{G_i−G_j} (j < i) and A_qk = Σ_d q_i k_j
//                            e^{G_i−G_j} (j ≤ i) (tensor-core tiles off the diagonal), X = (I + L)^-1 Diag(β) by forward substitution,
//                            w = X (e^G ⊙ k), u = X v, and the decayed q and k that K2 applies.
//   kda_prefill_recurrence   K2, grid (V splits, H, N): the chunk-to-chunk recurrence with the
//                            state slice in shared memory; outputs, checkpoints, final state.
//
// Workspace rows per (token, head), f32 (kernel-api KdaPrefillWorkspace):
//   [0, K)        q̂ (normalised, scaled); after K1: q̂ ⊙ e^{G_i}
//   [K, 2K)       k̂ (normalised);         after K1: k̂ ⊙ e^{G_last − G_i}
//   [2K, 3K)      g, then G (cumulative within the chunk)
//   [3K, 4K)      w
//   [4K, 4K+V)    u
//   [4K+V, +C)    A_qk row (entries j ≤ i)
// Only exponentials of G_i − G_j with i ≥ j, or of G_i ≤ 0, are ever taken.
#include "k3/compat.h"
#include "kda_gate.cuh"

// The largest chunk (kernel-api KDA_CHUNK_SIZES); K1 keeps one column of a chunk in registers.
#define KDA_MAX_CHUNK 64

// The target's bf16 MMA tile (16x8x16 mma.sync at warp 32, 16x16x16 MFMA at warp 64).
typedef k3::mma::Bf16Shape KdaMma;

// x ≈ hi + lo in bf16 bit patterns, |x − hi − lo| ≲ 2^-17·|x|.
K3_DEVICE void kda_split_bf16(float x, uint16_t& hi, uint16_t& lo) {
  const k3::bf16 h = k3::f32_to_bf16(x);
  hi = h.bits;
  lo = k3::f32_to_bf16(x - k3::bf16_to_f32(h)).bits;
}

// Chunks of sequence n (tokens t0 .. t0+len); with `desc` also writes their descriptors
// (first token, length, checkpoint entry or −1, n) from index `base`. Mirrors
// KdaPrefillPlan::chunks on the host. Returns -1 (recording the entry) when a used checkpoint
// offset does not increase within 1..=len.
K3_DEVICE int kda_prefill_walk(int n, int t0, int len, const void* ck, int ck_dt, int per_seq, int chunk, int* desc,
                               int base, k3::ErrorRecord* err) {
  int count = 0;
  int start = 0;
  int64_t last = 0;  // the previous used offset
  int final_entry = -1;
  for (int e = 0; e <= per_seq; ++e) {
    int end = len;
    int entry = final_entry;
    if (e < per_seq) {
      const int64_t off = k3::load_index(ck, ck_dt, static_cast<int64_t>(n) * per_seq + e);
      if (off == -1) continue;  // unused entry
      if (!k3::index_ok_2d(err, k3::kCheckKdaPrefillCheckpoints, n, e, off, last + 1, static_cast<int64_t>(len) + 1)) return -1;
      if (off <= last || off > len) continue;  // checks off: skip what the spec rejects
      last = off;
      if (off == len) {  // a checkpoint at the sequence end marks its last chunk
        final_entry = n * per_seq + e;
        continue;
      }
      end = static_cast<int>(off);
      entry = n * per_seq + e;
    }
    for (int a = start; a < end; a += chunk) {
      const int b = a + chunk < end ? a + chunk : end;
      if (desc != nullptr) {
        int* d = desc + 4 * (base + count);
        d[0] = t0 + a;
        d[1] = b - a;
        d[2] = b == end ? entry : -1;
        d[3] = n;
      }
      ++count;
    }
    start = end;
  }
  return count;
}

// One block: per-sequence chunk counts, an exclusive scan in tiles of blockDim sequences, then
// each sequence writes its descriptors. seq_base[n] = first chunk of n; seq_base[N] = total, or
// -1 when the device metadata failed a check (then every planned descriptor is a 0-length chunk).
K3_KERNEL void kda_prefill_schedule(const void* cu, int cu_dt, const void* ck, int ck_dt, int per_seq, int num_seqs,
                                    int chunk, int* desc, int* seq_base, int64_t tokens, int planned_chunks,
                                    k3::ErrorRecord* err) {
  K3_SHARED(int, counts, [1024]);
  K3_SHARED(int, carry, [1]);
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nt = static_cast<int>(k3::block_dim_x());
  if (tid == 0) carry[0] = 0;
  k3::sync_threads();
  bool ok = true;
  for (int n0 = 0; n0 < num_seqs; n0 += nt) {
    const int n = n0 + tid;
    int t0 = 0, len = 0, cnt = 0;
    if (n < num_seqs) {
      const int64_t a = k3::load_index(cu, cu_dt, n);
      const int64_t b = k3::load_index(cu, cu_dt, n + 1);
      // Entry n is checked by sequence n (entry 0 must be 0); entry N must also be T.
      const bool seq_ok = k3::index_ok(err, k3::kCheckKdaPrefillCuSeqlens, n, a, 0, n == 0 ? 1 : tokens + 1) &&
                          k3::index_ok(err, k3::kCheckKdaPrefillCuSeqlens, n + 1, b, n + 1 == num_seqs ? tokens : a,
                                       tokens + 1);
      if (seq_ok && a >= 0 && b >= a && b <= tokens) {
        t0 = static_cast<int>(a);
        len = static_cast<int>(b - a);
        cnt = kda_prefill_walk(n, t0, len, ck, ck_dt, per_seq, chunk, nullptr, 0, err);
      }
      if (!seq_ok || cnt < 0) {
        ok = false;
        len = 0;
        cnt = 0;
      }
    }
    counts[tid] = cnt;
    k3::sync_threads();
    if (tid == 0) {
      int run = carry[0];
      for (int i = 0; i < nt; ++i) {
        const int c = counts[i];
        counts[i] = run;
        run += c;
      }
      carry[0] = run;
    }
    k3::sync_threads();
    // Descriptors past the plan's count are never written (the count check below fails).
    if (n < num_seqs && counts[tid] + cnt <= planned_chunks) {
      seq_base[n] = counts[tid];
      kda_prefill_walk(n, t0, len, ck, ck_dt, per_seq, chunk, desc, counts[tid], nullptr);
    }
    k3::sync_threads();
  }
  const bool all_ok = k3::block_all(err, ok) &&
                      k3::count_ok(err, per_seq > 0 ? k3::kCheckKdaPrefillCheckpoints : k3::kCheckKdaPrefillCuSeqlens,
                                   carry[0], planned_chunks);
  if (!all_ok) {
    for (int c = tid; c < planned_chunks; c += nt) {
      int* d = desc + 4 * c;
      d[0] = 0;
      d[1] = 0;
      d[2] = -1;
      d[3] = 0;
    }
    for (int n = tid; n < num_seqs; n += nt) seq_base[n] = 0;
    if (tid == 0) seq_base[num_seqs] = -1;
    return;
  }
  if (tid == 0) seq_base[num_seqs] = carry[0];
}
K3_EXPORT(kda_prefill_schedule);

// K1. Dynamic shared memory: L [C][C], X [C][C], β [C] (f32).
K3_KERNEL void kda_prefill_prepare(const void* q, int q_dt, int64_t q_st, int64_t q_sh, const void* k, int k_dt,
                                   int64_t k_st, int64_t k_sh, const void* v, int v_dt, int64_t v_st, int64_t v_sh,
                                   const void* g_raw, int g_dt, int64_t g_st, int64_t g_sh, const void* beta,
                                   int beta_dt, int64_t beta_st, const float* a_log, int64_t a_s,
                                   const float* dt_bias, int64_t d_s, const int* desc, float* rows, int heads, int kd,
                                   int vd, int chunk, int row_len, int gate_mode, float lower_bound, int beta_sigmoid,
                                   int use_l2, float q_scale) {
  float* lmat = k3::dynamic_shared<float>();
  float* xmat = lmat + chunk * chunk;
  float* bsh = xmat + chunk * chunk;
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nt = static_cast<int>(k3::block_dim_x());
  const int c = static_cast<int>(k3::block_idx_x());
  const int h = static_cast<int>(k3::block_idx_y());
  const int t0 = desc[4 * c];
  const int len = desc[4 * c + 1];
  const int gq = 0, gk = kd, gg = 2 * kd, gw = 3 * kd, gu = 4 * kd, ga = 4 * kd + vd;
  // Row of token i of this chunk (head h).
#define KDA_ROW(i) (rows + (static_cast<int64_t>(t0 + (i)) * heads + h) * row_len)

  // A: one warp per token: L2 norms by warp reduction, then q̂, k̂, g and β.
  const int warps = nt / k3::kWarpSize;
  const int wid = tid / k3::kWarpSize;
  const int lane = tid % k3::kWarpSize;
  const float a_h = gate_mode != kKdaGatePrecomputed ? a_log[h * a_s] : 0.0f;
  for (int i = wid; i < len; i += warps) {
    const int64_t t = t0 + i;
    float sq = 0.0f, sk = 0.0f;
    for (int d = lane; d < kd; d += k3::kWarpSize) {
      const float qv = k3::load_f32(q, q_dt, t * q_st + h * q_sh + d);
      const float kv = k3::load_f32(k, k_dt, t * k_st + h * k_sh + d);
      sq += qv * qv;
      sk += kv * kv;
    }
    sq = k3::warp_reduce_sum(sq);
    sk = k3::warp_reduce_sum(sk);
    const float qinv = use_l2 ? 1.0f / k3::sqrt_f32(sq + 1e-6f) : 1.0f;
    const float kinv = use_l2 ? 1.0f / k3::sqrt_f32(sk + 1e-6f) : 1.0f;
    float* row = KDA_ROW(i);
    for (int d = lane; d < kd; d += k3::kWarpSize) {
      row[gq + d] = (k3::load_f32(q, q_dt, t * q_st + h * q_sh + d) * qinv) * q_scale;
      row[gk + d] = k3::load_f32(k, k_dt, t * k_st + h * k_sh + d) * kinv;
      const float bias = gate_mode != kKdaGatePrecomputed ? dt_bias[(static_cast<int64_t>(h) * kd + d) * d_s] : 0.0f;
      row[gg + d] = kda_gate_value(gate_mode, k3::load_f32(g_raw, g_dt, t * g_st + h * g_sh + d), a_h, bias, lower_bound);
    }
    if (lane == 0) {
      const float b = k3::load_f32(beta, beta_dt, t * beta_st + h);
      bsh[i] = beta_sigmoid ? k3::sigmoid_f32(b) : b;
    }
  }
  k3::sync_threads();

  // B: cumulative log-decay per channel.
  for (int d = tid; d < kd; d += nt) {
    float acc = 0.0f;
    for (int i = 0; i < len; ++i) {
      float* gp = KDA_ROW(i) + gg + d;
      acc += *gp;
      *gp = acc;
    }
  }
  k3::sync_threads();

  // C: L (j < i, scaled by β_i) and A_qk (j ≤ i), relative decays only. The chunk is cut into
  // 16-token blocks. Diagonal blocks: one thread per pair, e^{G_i − G_j} per channel (f32).
  const int nblk = (len + 15) / 16;
  for (int p = tid; p < len * 16; p += nt) {
    const int i = p / 16, j = (i / 16) * 16 + p % 16;
    if (j > i) continue;
    const float* ri = KDA_ROW(i);
    const float* rj = KDA_ROW(j);
    float kk = 0.0f, qk = 0.0f;
    for (int d = 0; d < kd; ++d) {
      const float e = k3::exp_f32(ri[gg + d] - rj[gg + d]);
      kk += (ri[gk + d] * rj[gk + d]) * e;
      qk += (ri[gq + d] * rj[gk + d]) * e;
    }
    if (j < i) lmat[i * chunk + j] = bsh[i] * kk;
    KDA_ROW(i)[ga + j] = qk;
  }
  // Blocks below the diagonal (row block I > column block J): tensor-core products. With r the
  // last token of block J, e^{G_i − G_j} = e^{G_i − G_r}·e^{G_r − G_j} and both factors are ≤ 1
  // (i > r ≥ j), so the row operands k̂_i ⊙ e^{G_i − G_r}, q̂_i ⊙ e^{G_i − G_r} and the column
  // operand k̂_j ⊙ e^{G_r − G_j} never overflow. Operands are split into bf16 hi + lo parts and
  // multiplied as hi·hi + (hi·lo + lo·hi) with f32 accumulation (~2^-16 relative per product,
  // the accuracy the f32 contract needs). One warp per block pair.
  for (int pi = wid; pi < nblk * (nblk - 1) / 2; pi += warps) {
    int bi = 1, bj = pi;
    while (bj >= bi) {
      bj -= bi;
      ++bi;
    }
    const float* rr = KDA_ROW(16 * bj + 15);
    for (int nb = 0; nb < 16; nb += KdaMma::N) {
      k3::mma::FragC<KdaMma> kk_hi, kk_lo, qk_hi, qk_lo;
      k3::mma::fill(kk_hi, 0.0f);
      k3::mma::fill(kk_lo, 0.0f);
      k3::mma::fill(qk_hi, 0.0f);
      k3::mma::fill(qk_lo, 0.0f);
      for (int k0 = 0; k0 < kd; k0 += KdaMma::K) {
        k3::mma::FragA<KdaMma> ka_hi, ka_lo, qa_hi, qa_lo;
        k3::mma::FragB<KdaMma> b_hi, b_lo;
        for (int sl = 0; sl < KdaMma::kASlots; ++sl) {
          const k3::mma::RC rc = k3::mma::a_coord<KdaMma>(sl);
          const int i = 16 * bi + rc.row, d = k0 + rc.col;
          float kv = 0.0f, qv = 0.0f;
          if (i < len && d < kd) {
            const float* ri = KDA_ROW(i);
            const float e = k3::exp_f32(ri[gg + d] - rr[gg + d]);
            kv = ri[gk + d] * e;
            qv = ri[gq + d] * e;
          }
          kda_split_bf16(kv, ka_hi.x[sl], ka_lo.x[sl]);
          kda_split_bf16(qv, qa_hi.x[sl], qa_lo.x[sl]);
        }
        for (int sl = 0; sl < KdaMma::kBSlots; ++sl) {
          const k3::mma::RC rc = k3::mma::b_coord<KdaMma>(sl);
          const int d = k0 + rc.row, j = 16 * bj + nb + rc.col;
          float bv = 0.0f;
          if (d < kd) {
            const float* rj = KDA_ROW(j);
            bv = rj[gk + d] * k3::exp_f32(rr[gg + d] - rj[gg + d]);
          }
          kda_split_bf16(bv, b_hi.x[sl], b_lo.x[sl]);
        }
        k3::mma::mma_sync(kk_hi, ka_hi, b_hi, kk_hi);
        k3::mma::mma_sync(kk_lo, ka_hi, b_lo, kk_lo);
        k3::mma::mma_sync(kk_lo, ka_lo, b_hi, kk_lo);
        k3::mma::mma_sync(qk_hi, qa_hi, b_hi, qk_hi);
        k3::mma::mma_sync(qk_lo, qa_hi, b_lo, qk_lo);
        k3::mma::mma_sync(qk_lo, qa_lo, b_hi, qk_lo);
      }
      for (int sl = 0; sl < KdaMma::kCSlots; ++sl) {
        const k3::mma::RC rc = k3::mma::c_coord<KdaMma>(sl);
        const int i = 16 * bi + rc.row, j = 16 * bj + nb + rc.col;
        if (i < len) {
          lmat[i * chunk + j] = bsh[i] * (kk_hi.x[sl] + kk_lo.x[sl]);
          KDA_ROW(i)[ga + j] = qk_hi.x[sl] + qk_lo.x[sl];
        }
      }
    }
  }
  k3::sync_threads();

  // D: X = (I + L)^-1 Diag(β), one column per thread (column m only reads column m).
  for (int m = tid; m < len; m += nt) {
    xmat[m * chunk + m] = bsh[m];
    for (int i = m + 1; i < len; ++i) {
      float acc = 0.0f;
      for (int j = m; j < i; ++j) acc -= lmat[i * chunk + j] * xmat[j * chunk + m];
      xmat[i * chunk + m] = acc;
    }
  }
  k3::sync_threads();

  // E: w = X (e^G ⊙ k̂) (columns d < K) and u = X v (columns K + e), one column per thread with
  // the chunk's column operand in registers.
  for (int col = tid; col < kd + vd; col += nt) {
    float opnd[KDA_MAX_CHUNK];
    const bool is_w = col < kd;
    const int e = col - kd;
    for (int j = 0; j < len; ++j) {
      const float* rj = KDA_ROW(j);
      opnd[j] = is_w ? k3::exp_f32(rj[gg + col]) * rj[gk + col]
                     : k3::load_f32(v, v_dt, static_cast<int64_t>(t0 + j) * v_st + h * v_sh + e);
    }
    for (int i = 0; i < len; ++i) {
      float acc = 0.0f;
      for (int j = 0; j <= i; ++j) acc += xmat[i * chunk + j] * opnd[j];
      KDA_ROW(i)[is_w ? gw + col : gu + e] = acc;
    }
  }
  k3::sync_threads();

  // F: the decays K2 applies: q̂ ⊙ e^{G_i} and k̂ ⊙ e^{G_last − G_i}.
  for (int p = tid; p < len * kd; p += nt) {
    const int i = p / kd, d = p % kd;
    float* ri = KDA_ROW(i);
    const float gi = ri[gg + d];
    const float gl = KDA_ROW(len - 1)[gg + d];
    ri[gq + d] *= k3::exp_f32(gi);
    ri[gk + d] *= k3::exp_f32(gl - gi);
  }
#undef KDA_ROW
}
K3_EXPORT(kda_prefill_prepare);

// Position of state element (key d, value column col) inside one head's state.
K3_DEVICE int64_t kda_state_pos(int v_major, int d, int col, int64_t row_stride) {
  return v_major ? col * row_stride + d : d * row_stride + col;
}

// K2. Block (split s, head h, sequence n) owns value columns [s·vb, s·vb + vb) of the state;
// columns are independent, so splits need no reduction. Dynamic shared memory: S [K][vb + 1]
// (padded rows), v' [C][vb], e^{G_last} [K] (f32). The element loops map consecutive threads to
// consecutive addresses of the pool's layout (d innermost for V-major, the column innermost for
// K-major).
K3_KERNEL void kda_prefill_recurrence(const int* desc, const int* seq_base, const float* rows, void* pool,
                                      int pool_dt, int64_t p_ss, int64_t p_sh, int64_t p_sr, const void* slots,
                                      int slots_dt, float* ck_state, int64_t c_sn, int64_t c_sc, int64_t c_sh,
                                      int64_t c_sr, int per_seq, void* out, int out_dt, int64_t o_st, int64_t o_sh,
                                      int heads, int kd, int vd, int vb, int chunk, int row_len, int v_major,
                                      int read_initial, int write_final, int state_slots, k3::ErrorRecord* err) {
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nt = static_cast<int>(k3::block_dim_x());
  const int v0 = static_cast<int>(k3::block_idx_x()) * vb;
  const int h = static_cast<int>(k3::block_idx_y());
  const int n = static_cast<int>(k3::block_idx_z());
  const int cols = vd - v0 < vb ? vd - v0 : vb;
  if (cols <= 0) return;
  // S rows are padded by one float so that V-major element loops (d innermost) hit distinct banks.
  const int ld = vb + 1;
  float* s = k3::dynamic_shared<float>();
  float* vn = s + kd * ld;
  float* gam = vn + chunk * vb;
  const int gq = 0, gk = kd, gg = 2 * kd, gw = 3 * kd, gu = 4 * kd, ga = 4 * kd + vd;
  if (seq_base[k3::grid_dim_z()] < 0) return;  // the schedule failed its checks: no work at all
  const bool has_pool = pool != nullptr;
  const int64_t slot = slots != nullptr ? k3::load_index(slots, slots_dt, n) : n;
  if (has_pool && slots != nullptr) {
    // Block-uniform. One block per sequence also looks for the slot elsewhere in the batch (two
    // sequences on one slot race); the others trust that scan.
    if (!k3::index_ok(err, k3::kCheckKdaPrefillStateIndices, n, slot, 0, state_slots)) return;
    if (k3::block_idx_x() == 0 && h == 0) {
      k3::block_unique(err, k3::kCheckKdaPrefillStateIndices, slots, slots_dt, 1, k3::grid_dim_z(), n, slot, -1);
    }
  }
  const int64_t head_base = slot * p_ss + h * p_sh;
  const int elems = kd * cols;
  // Element e of this block's slice: (key d, local column j).
#define KDA_ELEM(e, d, j)                 \
  const int d = v_major ? (e) % kd : (e) / cols; \
  const int j = v_major ? (e) / kd : (e) % cols;

  for (int e = tid; e < elems; e += nt) {
    KDA_ELEM(e, d, j)
    s[d * ld + j] = read_initial && has_pool
                        ? k3::load_f32(pool, pool_dt, head_base + kda_state_pos(v_major, d, v0 + j, p_sr))
                        : 0.0f;
  }
  k3::sync_threads();

  const int c_end = seq_base[n + 1];
  for (int c = seq_base[n]; c < c_end; ++c) {
    const int t0 = desc[4 * c];
    const int len = desc[4 * c + 1];
    const int entry = desc[4 * c + 2];
#define KDA_ROW(i) (rows + (static_cast<int64_t>(t0 + (i)) * heads + h) * row_len)
    // v'_i = u_i − w_i S (S as it stood at the chunk start).
    for (int p = tid; p < len * cols; p += nt) {
      const int i = p / cols, j = p % cols;
      const float* ri = KDA_ROW(i);
      float acc = ri[gu + v0 + j];
      for (int d = 0; d < kd; ++d) acc -= ri[gw + d] * s[d * ld + j];
      vn[i * vb + j] = acc;
    }
    for (int d = tid; d < kd; d += nt) gam[d] = k3::exp_f32(KDA_ROW(len - 1)[gg + d]);
    k3::sync_threads();
    // o_i = (q̂_i ⊙ e^{G_i}) S + Σ_{m ≤ i} A_qk[i][m] v'_m.
    for (int p = tid; p < len * cols; p += nt) {
      const int i = p / cols, j = p % cols;
      const float* ri = KDA_ROW(i);
      float acc = 0.0f;
      for (int d = 0; d < kd; ++d) acc += ri[gq + d] * s[d * ld + j];
      for (int m = 0; m <= i; ++m) acc += ri[ga + m] * vn[m * vb + j];
      k3::store_f32(out, out_dt, static_cast<int64_t>(t0 + i) * o_st + h * o_sh + v0 + j, acc);
    }
    k3::sync_threads();
    // S ← Diag(e^{G_last}) S + Σ_m (k̂_m ⊙ e^{G_last − G_m}) v'_mᵀ; checkpoint at the chunk end.
    for (int e = tid; e < elems; e += nt) {
      KDA_ELEM(e, d, j)
      float acc = s[d * ld + j] * gam[d];
      for (int m = 0; m < len; ++m) acc += KDA_ROW(m)[gk + d] * vn[m * vb + j];
      s[d * ld + j] = acc;
      if (entry >= 0) {
        const int64_t base = (entry / per_seq) * c_sn + (entry % per_seq) * c_sc + h * c_sh;
        ck_state[base + kda_state_pos(v_major, d, v0 + j, c_sr)] = acc;
      }
    }
    k3::sync_threads();
#undef KDA_ROW
  }

  if (write_final && has_pool) {
    for (int e = tid; e < elems; e += nt) {
      KDA_ELEM(e, d, j)
      k3::store_f32(pool, pool_dt, head_base + kda_state_pos(v_major, d, v0 + j, p_sr), s[d * ld + j]);
    }
  }
#undef KDA_ELEM
}
K3_EXPORT(kda_prefill_recurrence);
