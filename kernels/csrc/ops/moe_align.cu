// MoE align/sort by expert (kernel-api ops/moe_align.rs is the spec; vLLM
// moe_align_block_size). One block does the whole job so that its phases can be separated by
// block barriers instead of extra launches (the pair count of one step is small next to the
// GEMMs that follow):
//   1. sentinel-fill sorted_token_ids, zero the per-expert counters (workspace),
//   2. count pairs per local expert (shared-nothing atomics on the workspace counters),
//   3. block-wide exclusive scan of the block-padded counts (each thread owns a contiguous run
//      of experts; warp shuffle scan of the thread totals, then a pass over the warp totals),
//      writing each expert's start into the workspace, its blocks into expert_ids, the total
//      into workspace[E] and num_tokens_post_padded; -1 for the tail blocks,
//   4. a stable scatter: pairs are taken in chunks of blockDim in ascending pair order; a pair's
//      rank among the chunk's pairs of its expert comes from the chunk's expert list in shared
//      memory, its slot is cursor[e] + rank, then the cursors advance by the chunk's counts.
//      Pairs no local expert serves take the pseudo-expert E, whose cursor starts at the padded
//      total (workspace[E]): they are listed after the served runs, so the GEMMs can write their
//      rows as zeros (the served runs plus these pairs fit: P + E_local*(M-1) <= max_padded).
// Pairs whose id is outside [0, E) (or whose map entry is outside -1..E_local) are invalid input
// (the CPU reference reports them): phase 2 reports the first one through err (k3/checks.h), and
// they are listed like unmapped pairs, so no write ever goes out of bounds.
#include "k3/compat.h"

namespace {

constexpr int kAlignMaxWarps = 32;

// Local expert of pair p, or -1 when it is dropped (unmapped or invalid). Invalid ids and map
// entries are reported through err (null: not reported).
K3_DEVICE int align_local_expert(const int* ids, int64_t ids_s0, int64_t ids_s1, int top_k, const int* map,
                                 int64_t map_s0, int global_experts, int local_experts, int p, k3::ErrorRecord* err) {
  const int id = ids[(p / top_k) * ids_s0 + (p % top_k) * ids_s1];
  const int bound = map == nullptr ? local_experts : global_experts;
  if (id < 0 || id >= bound) {
    k3::record_violation(err, k3::kCheckMoeAlignTopkIds, k3::kCheckRange, p, -1, id, 0, bound);
    return -1;
  }
  if (map == nullptr) return id;
  const int e = map[id * map_s0];
  if (e < -1 || e >= local_experts) {
    k3::record_violation(err, k3::kCheckMoeAlignExpertMap, k3::kCheckRange, id, -1, e, -1, local_experts);
    return -1;
  }
  return e;
}

}  // namespace

// ws: int[E + 1] (counters, then starts / cursors; ws[E] = padded total, then the cursor of the
// pairs no expert serves).
// Dynamic shared memory: int[blockDim] (the chunk's experts).
K3_KERNEL void moe_align_block_size(const int* topk_ids, int64_t ids_s0, int64_t ids_s1, const int* expert_map,
                                    int64_t map_s0, int* sorted, int64_t sorted_s0, int* expert_ids, int64_t eid_s0,
                                    int* num_post_padded, int* ws, int tokens, int top_k, int global_experts,
                                    int experts, int block_m, int max_padded, k3::ErrorRecord* err) {
  K3_SHARED(int, warp_total, [kAlignMaxWarps]);
  int* chunk_expert = k3::dynamic_shared<int>();
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int nthreads = static_cast<int>(k3::block_dim_x());
  const int lane = static_cast<int>(k3::lane_id());
  const int warp = tid / k3::kWarpSize;
  const int warps = nthreads / k3::kWarpSize;
  const int pairs = tokens * top_k;

  // 1.
  for (int i = tid; i < max_padded; i += nthreads) sorted[i * sorted_s0] = pairs;
  for (int e = tid; e <= experts; e += nthreads) ws[e] = 0;
  k3::sync_threads();

  // 2.
  for (int p = tid; p < pairs; p += nthreads) {
    const int e = align_local_expert(topk_ids, ids_s0, ids_s1, top_k, expert_map, map_s0, global_experts, experts, p, err);
    if (e >= 0) k3::atomic_add(&ws[e], 1);
  }
  k3::sync_threads();

  // 3. Thread tid owns experts [lo, hi).
  const int per_thread = (experts + nthreads - 1) / nthreads;
  const int lo = tid * per_thread < experts ? tid * per_thread : experts;
  const int hi = lo + per_thread < experts ? lo + per_thread : experts;
  int own = 0;
  for (int e = lo; e < hi; ++e) own += (ws[e] + block_m - 1) / block_m * block_m;
  int incl = own;  // inclusive scan within the warp
  for (int off = 1; off < k3::kWarpSize; off <<= 1) {
    const int v = k3::shfl_up(incl, static_cast<unsigned>(off));
    if (lane >= off) incl += v;
  }
  if (lane == k3::kWarpSize - 1) warp_total[warp] = incl;
  k3::sync_threads();
  int start = incl - own;
  for (int w = 0; w < warp; ++w) start += warp_total[w];
  int total = 0;
  for (int w = 0; w < warps; ++w) total += warp_total[w];
  k3::sync_threads();  // every count is read (into `own`) before the starts overwrite it
  for (int e = lo; e < hi; ++e) {
    const int run = (ws[e] + block_m - 1) / block_m * block_m;
    ws[e] = start;
    for (int b = start / block_m; b < (start + run) / block_m; ++b) expert_ids[b * eid_s0] = e;
    start += run;
  }
  if (tid == 0) {
    ws[experts] = total;
    *num_post_padded = total;
  }
  for (int b = total / block_m + tid; b < max_padded / block_m; b += nthreads) expert_ids[b * eid_s0] = -1;
  k3::sync_threads();

  // 4. Stable scatter, chunk by chunk in ascending pair order; e = experts: served by none.
  for (int base = 0; base < pairs; base += nthreads) {
    const int p = base + tid;
    int e = -1;
    if (p < pairs) {
      e = align_local_expert(topk_ids, ids_s0, ids_s1, top_k, expert_map, map_s0, global_experts, experts, p, nullptr);
      if (e < 0) e = experts;
    }
    chunk_expert[tid] = e;
    k3::sync_threads();
    int rank = 0;
    if (e >= 0) {
      for (int j = 0; j < tid; ++j) rank += chunk_expert[j] == e ? 1 : 0;
      sorted[(ws[e] + rank) * sorted_s0] = p;
    }
    k3::sync_threads();  // every slot is computed from the cursors before they advance
    if (e >= 0) k3::atomic_add(&ws[e], 1);
    k3::sync_threads();
  }
}
K3_EXPORT(moe_align_block_size);
