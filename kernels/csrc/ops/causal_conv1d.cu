// Causal depthwise conv1d prefill over variable-length sequences (kernel-api ops/conv1d.rs is
// the spec), channel-last like causal-conv1d's channellast path.
//
// Grid: x = sequence · chunks + time chunk (chunks of `chunk_len` tokens), y = tiles of
// block_dim channels. One thread per (channel, sequence, time chunk): it loads its W taps and
// the W-1 inputs before the chunk (from x, or from the history at the sequence start) into
// registers and slides over the chunk's tokens; consecutive threads read consecutive channels
// of a token, so every load and store is coalesced. No shared memory, no barriers.
//
// State: the history is read only by threads whose window reaches before position 0, which
// happens only in chunk 0 (the launcher keeps chunk_len >= W-1), and the final state is written
// by the same chunk-0 thread after it has read the history, so a slot is never read by one
// block while another writes it.
//
// Device metadata is checked per block (k3/checks.h): cu_seqlens starts at 0, never decreases,
// ends at total_tokens, and no sequence is longer than the grid's chunks cover; a state slot lies
// in [0, slots), and the (sequence, chunk 0, channel tile 0) block looks for its slot in the other
// sequences (two sequences on one slot race). A failing sequence is skipped.
#include "k3/compat.h"

namespace causal_conv1d_varlen {
constexpr int kMaxWidth = 8;  // taps held in registers
}  // namespace causal_conv1d_varlen

K3_KERNEL void causal_conv1d_varlen_fwd(
    const void* x, int x_dt, int64_t x_s0,                          // [T, D], unit channel stride
    const float* weight, int64_t w_s0, int64_t w_s1,                // [D, W]
    const void* cu_seqlens, int cu_dt, int64_t cu_s0,               // [N+1]
    const int32_t* state_indices, int64_t si_s0,                    // [N] or null (slot = n)
    void* conv_state, int cs_dt, int64_t cs_s0, int64_t cs_s1, int64_t cs_s2,  // [slots, D, W-1] or null
    void* out, int out_dt, int64_t out_s0,                          // [T, D], unit channel stride
    int dim, int width, int silu, int read_state, int write_state, int slots, int64_t total_tokens,
    int chunk_len, int chunks, int num_seqs, k3::ErrorRecord* err) {
  using namespace causal_conv1d_varlen;
  const int n = static_cast<int>(k3::block_idx_x()) / chunks;
  const int chunk = static_cast<int>(k3::block_idx_x()) % chunks;
  const int c = static_cast<int>(k3::block_idx_y() * k3::block_dim_x() + k3::thread_idx_x());
  // Checks first (block-uniform: every thread reads the same entries), then the channel guard.
  const int64_t start = k3::load_index(cu_seqlens, cu_dt, n * cu_s0);
  const int64_t end = k3::load_index(cu_seqlens, cu_dt, (n + 1) * cu_s0);
  if (!k3::index_ok(err, k3::kCheckConv1dCuSeqlens, n, start, 0, n == 0 ? 1 : total_tokens + 1) ||
      !k3::index_ok(err, k3::kCheckConv1dCuSeqlens, n + 1, end, n + 1 == num_seqs ? total_tokens : start,
                    (total_tokens - start < static_cast<int64_t>(chunks) * chunk_len ? total_tokens
                                                                                    : start + static_cast<int64_t>(chunks) * chunk_len) + 1)) {
    return;
  }
  const bool uses_state = (read_state || write_state) && chunk == 0;
  int slot = n;
  if (uses_state && state_indices != nullptr) {
    slot = state_indices[n * si_s0];
    if (!k3::index_ok(err, k3::kCheckConv1dStateIndices, n, slot, 0, slots)) return;
    if (k3::block_idx_y() == 0) {
      k3::block_unique(err, k3::kCheckConv1dStateIndices, state_indices, k3::kI32, si_s0, num_seqs, n, slot, -1);
    }
  }
  if (c >= dim) return;
  const int64_t len = end - start;
  const int64_t t0 = static_cast<int64_t>(chunk) * chunk_len;
  if (t0 >= len) return;  // past this sequence's end (or an empty sequence)
  const int64_t t1 = t0 + chunk_len < len ? t0 + chunk_len : len;
  const int hist = width - 1;
  const int64_t cs = uses_state ? slot * cs_s0 + c * cs_s1 : 0;
  float taps[kMaxWidth];
  for (int j = 0; j < kMaxWidth - 1; ++j) taps[j] = j < hist ? weight[c * w_s0 + j * w_s1] : 0.0f;
  const float tap_now = weight[c * w_s0 + hist * w_s1];
  // win[j] = input at position t - hist + j for the current token t: in chunk 0 the history
  // (zeros unless read_state), otherwise the inputs just before the chunk (chunk_len >= hist).
  float win[kMaxWidth];
  for (int j = 0; j < kMaxWidth - 1; ++j) {
    float v = 0.0f;
    if (j < hist) {
      if (chunk != 0) v = k3::load_f32(x, x_dt, (start + t0 - hist + j) * x_s0 + c);
      else if (read_state) v = k3::load_f32(conv_state, cs_dt, cs + j * cs_s2);
    }
    win[j] = v;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float xv = k3::load_f32(x, x_dt, (start + t) * x_s0 + c);
    float acc = 0.0f;
    for (int j = 0; j < kMaxWidth - 1; ++j) {
      if (j < hist) acc += taps[j] * win[j];
    }
    acc += tap_now * xv;
    k3::store_f32(out, out_dt, (start + t) * out_s0 + c, silu ? acc * k3::sigmoid_f32(acc) : acc);
    for (int j = 0; j < kMaxWidth - 2; ++j) win[j] = j + 1 < hist ? win[j + 1] : xv;
    if (hist == kMaxWidth - 1) win[kMaxWidth - 2] = xv;
  }
  if (chunk == 0 && write_state) {
    // The last W-1 entries of [history, x_0 .. x_{len-1}]: the window itself when this chunk
    // reached the end of the sequence, else (len > chunk_len >= hist) inputs only.
    const bool done = t1 == len;
    for (int j = 0; j < kMaxWidth - 1; ++j) {
      if (j < hist) {
        const float v = done ? win[j] : k3::load_f32(x, x_dt, (start + len - hist + j) * x_s0 + c);
        k3::store_f32(conv_state, cs_dt, cs + j * cs_s2, v);
      }
    }
  }
}
K3_EXPORT(causal_conv1d_varlen_fwd);
