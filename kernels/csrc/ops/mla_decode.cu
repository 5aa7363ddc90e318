// Absorbed MLA over the paged latent cache (kernel-api ops/mla_decode.rs is the spec): the
// Gluon-style split-KV decode, the asm-style persistent decode with its device-side work
// partition, the LSE reduce of both, and the ragged absorbed prefill. All share one attention
// core per path: `*_mma` kernels (bf16 queries) and `*_mma_f32q` (16-byte aligned f32 queries,
// as bf16 hi + lo planes) run the tensor-core core of mla_attend_mma.cuh, the others the f32
// SIMT core of mla_attend.cuh (256 threads and 16-row tiles in both).
//
// Workspace (floats / ints, byte offsets from the plan): partial outs [slot][q_len][16][latent],
// partial LSEs [slot][q_len][16]; asm plans then hold the schedule the metadata kernel writes:
// items [n_items][4] = (batch * head_groups + head_group, kv_start, kv_end, slot or -1), one
// 16-byte load each, cu_indptr [cus + 1], reduce entries [n_reduce][4] = (batch, head_group,
// first slot, count) from a 16-byte boundary.
//
// Device metadata is checked (k3/checks.h): seq_lens[b] in [q_len, bt_cols * page_size] once
// per work item before any thread reads the cache (a failing item is skipped whole), and each
// block-table entry in [0, num_pages) where a KV tile reads it for its rows' addresses (an entry
// out of range reads page 0 instead, in bounds, and the launch fails: mla::checked_page; a
// separate pass over the entries before the first tile put a dependent load and a barrier in
// front of every item's first KV bytes). The asm schedule also checks that
// the device seq_lens give the plan's counts (tokens, items, split pairs); otherwise it writes an
// empty schedule, so no unit runs an item and the reduce refuses every (zeroed) entry. The
// schedule itself is workspace data a prepared schedule keeps across calls: the asm kernels and
// the reduce check each entry they read against the plan's bounds.
#include "k3/compat.h"
#include "mla_attend_mma.cuh"

namespace {

// The cache of sequence b (bt_row: its block-table row), its entries checked against
// num_pages as they are read and reported at `site` (mla::checked_page).
K3_DEVICE mla::Cache make_cache(const uint8_t* cache, int64_t page_stride, int64_t row_stride, int page_size, int kind,
                                int fnuz, int latent, int rope, int kv_stages, const int* bt_row, int64_t bt_sp,
                                int num_pages, k3::ErrorRecord* err, int site, int b) {
  mla::Cache c;
  c.base = cache;
  c.page_stride = page_stride;
  c.row_stride = row_stride;
  c.block_table = bt_row;
  c.bt_col_stride = bt_sp;
  c.page_size = page_size;
  c.kind = kind;
  c.fnuz = fnuz;
  c.latent = latent;
  c.rope = rope;
  c.kv_stages = kv_stages;
  c.num_pages = num_pages;
  c.err = err;
  c.err_site = site;
  c.err_row = b;
  c.bad_page = false;
  return c;
}

struct Smem {
  float* pbuf;
  float* mult;
  uint16_t* raw;
};

K3_DEVICE Smem carve_shared() {
  uint8_t* s = k3::dynamic_shared<uint8_t>();
  Smem m;
  m.pbuf = reinterpret_cast<float*>(s);
  m.mult = reinterpret_cast<float*>(s + 4 * mla::kRows * mla::kTile);
  m.raw = reinterpret_cast<uint16_t*>(s + 4 * mla::kRows * mla::kTile + 4 * mla::kTile * mla::kMultSlots);
  return m;
}

// seq_lens[b] is usable: in [min_len, bt_cols * page_size] (the keys the block-table row can
// address). The same answer in every thread of a block (all read the same value).
K3_DEVICE bool seq_len_ok(k3::ErrorRecord* err, int site, int b, int seq_len, int min_len, int bt_cols, int page_size) {
  return k3::index_ok(err, site, b, seq_len, min_len, static_cast<int64_t>(bt_cols) * page_size + 1);
}

// Destination of one decode item of sequence b, head group g: the output tensors, or partial
// slot `slot` of the workspace.
K3_DEVICE mla::Dest decode_dest(int b, int g, int slot, int q_len, int latent, void* out, int out_dt, int64_t o_sb,
                                int64_t o_st, int64_t o_sh, float* lse, int64_t l_sb, int64_t l_st, int64_t l_sh,
                                float* ws, int64_t ws_lse_off) {
  mla::Dest d;
  if (slot < 0) {
    d.out = out;
    d.out_dt = out_dt;
    d.off = b * o_sb;
    d.st = o_st;
    d.sh = o_sh;
    d.lse = lse;
    d.loff = b * l_sb;
    d.lst = l_st;
    d.lsh = l_sh;
    d.head_base = g * mla::kRows;
  } else {
    d.out = ws;
    d.out_dt = k3::kF32;
    const int pitch = mla::partial_pitch(latent);
    d.off = static_cast<int64_t>(slot) * q_len * mla::kRows * pitch;
    d.st = mla::kRows * pitch;
    d.sh = pitch;
    d.lse = ws;
    d.loff = ws_lse_off + static_cast<int64_t>(slot) * q_len * mla::kRows;
    d.lst = mla::kRows;
    d.lsh = 1;
    d.head_base = 0;
  }
  return d;
}

// A kernel's attention core: the f32 SIMT one (mla_attend.cuh) or the MMA one
// (mla_attend_mma.cuh) for any bf16 input, for 16-byte aligned bf16 queries and cache rows, or
// for 16-byte aligned f32 queries (split into bf16 hi + lo planes).
enum class Core { kSimt, kMmaUnaligned, kMma, kMmaF32Q };

// One row tile on the chosen core.
template <Core C>
K3_AMD_INLINE K3_DEVICE void attend_tile(const mla::Cache& c, const mla::Query& q, const mla::Rows& r, float score_scale,
                           float out_scale, const mla::Dest& dst) {
  if constexpr (C != Core::kSimt) {
    mla::attend_mma<C != Core::kMmaUnaligned, C == Core::kMmaF32Q>(c, q, r, score_scale, out_scale, dst, k3::dynamic_shared<uint8_t>());
  } else {
    const Smem sm = carve_shared();
    mla::attend(c, q, r, score_scale, out_scale, dst, sm.raw, sm.mult, sm.pbuf);
  }
}

// Runs every row tile of one decode item (all q_len queries x the group's heads).
template <Core C>
K3_AMD_INLINE K3_DEVICE void decode_item(const mla::Cache& c, const mla::Query& q, int heads, int q_len, int seq_len, int g,
                           int kv_start, int kv_end, int rt_begin, int rt_step, float score_scale, float out_scale,
                           const mla::Dest& dst) {
  const int gh = heads - g * mla::kRows < mla::kRows ? heads - g * mla::kRows : mla::kRows;
  const int tiles = (q_len * gh + mla::kRows - 1) / mla::kRows;
  for (int rt = rt_begin; rt < tiles; rt += rt_step) {
    mla::Rows r;
    r.rho0 = rt * mla::kRows;
    r.q_rows = q_len;
    r.gh = gh;
    r.head0 = g * mla::kRows;
    r.causal = 1;
    r.first_pos = seq_len - q_len;
    r.n_keys = seq_len;
    r.kv_start = kv_start;
    r.kv_end = kv_end;
    attend_tile<C>(c, q, r, score_scale, out_scale, dst);
  }
  // Here, not in the attention core: after the item nothing is live across the recorder call.
  mla::report_bad_page(c, kv_start, kv_end);
}

// Kernel parameters shared by the Gluon and asm decode kernels (and their arguments).
#define MLA_DECODE_PARAMS                                                                                       \
  const void *q, int q_dt, int64_t q_sb, int64_t q_st, int64_t q_sh, const uint8_t *cache, int64_t page_stride, \
      int64_t row_stride, int page_size, int kind, int fnuz, int latent, int rope, int kv_stages,             \
      const int *block_table, int64_t bt_sb, int64_t bt_sp, const int *seq_lens, int64_t sl_s, int num_pages,  \
      int bt_cols, void *out, int out_dt, int64_t o_sb, int64_t o_st, int64_t o_sh, float *lse, int64_t l_sb,  \
      int64_t l_st, int64_t l_sh, float *ws, int64_t ws_lse_off, int heads, int q_len
#define MLA_DECODE_ARGS                                                                                      \
  q, q_dt, q_sb, q_st, q_sh, cache, page_stride, row_stride, page_size, kind, fnuz, latent, rope, kv_stages, \
      block_table, bt_sb, bt_sp, seq_lens, sl_s, num_pages, bt_cols, out, out_dt, o_sb, o_st, o_sh, lse, l_sb, \
      l_st, l_sh, ws, ws_lse_off, heads, q_len
// The asm kernels' schedule (in the workspace), its plan-time sizes, and the rest.
#define MLA_ASM_PARAMS                                                                                   \
  const int *items, const int *cu_indptr, int n_items, int batch, int num_partials, float score_scale, \
      float out_scale, k3::ErrorRecord *err
#define MLA_ASM_ARGS items, cu_indptr, n_items, batch, num_partials, score_scale, out_scale, err

template <Core C>
K3_AMD_INLINE K3_DEVICE void gluon_body(MLA_DECODE_PARAMS, int num_splits, float score_scale, float out_scale, k3::ErrorRecord* err) {
  const int b = static_cast<int>(k3::block_idx_x());
  const int g = static_cast<int>(k3::block_idx_y()) / q_len;
  const int rt = static_cast<int>(k3::block_idx_y()) % q_len;
  const int split = static_cast<int>(k3::block_idx_z());
  const int head_groups = (heads + mla::kRows - 1) / mla::kRows;
  const int dev_len = seq_lens[b * sl_s];
  const bool len_ok = seq_len_ok(err, k3::kCheckMlaDecodeSeqLens, b, dev_len, q_len, bt_cols, page_size);
  const int seq_len = len_ok ? dev_len : 0;
  const int chunk = (seq_len + num_splits - 1) / num_splits;
  const int kv_start = split * chunk < seq_len ? split * chunk : seq_len;
  const int kv_end = kv_start + chunk < seq_len ? kv_start + chunk : seq_len;
  const int slot = num_splits > 1 ? (b * head_groups + g) * num_splits + split : -1;
  const mla::Cache c =
      make_cache(cache, page_stride, row_stride, page_size, kind, fnuz, latent, rope, kv_stages, block_table + b * bt_sb, bt_sp,
                 num_pages, err, k3::kCheckMlaDecodeBlockTable, b);
  if (!len_ok) return;  // block-uniform
  const mla::Query qq = {q, q_dt, b * q_sb, q_st, q_sh};
  const mla::Dest d = decode_dest(b, g, slot, q_len, latent, out, out_dt, o_sb, o_st, o_sh, lse, l_sb, l_st, l_sh, ws, ws_lse_off);
  decode_item<C>(c, qq, heads, q_len, seq_len, g, kv_start, kv_end, rt, q_len, score_scale, out_scale, d);
}

// Items come from mla_decode_asm_schedule, which checked the seq_lens they were cut from (and
// wrote an empty schedule otherwise), either just before (`run`) or in an earlier call
// (`run_prepared`), after which the caller may have overwritten the workspace: every cu_indptr
// and item entry is checked against the plan's bounds (n_items, batch, head groups, the block
// table's keys, the partial slots) before use, and the block-table entries per item.
template <Core C>
K3_AMD_INLINE K3_DEVICE void asm_body(MLA_DECODE_PARAMS, MLA_ASM_PARAMS) {
  const int unit = static_cast<int>(k3::block_idx_x());
  const int head_groups = (heads + mla::kRows - 1) / mla::kRows;
  const int64_t keys = static_cast<int64_t>(bt_cols) * page_size;
  const int64_t range[2] = {cu_indptr[unit], cu_indptr[unit + 1]};
  const int64_t range_lo[2] = {0, 0}, range_hi[2] = {n_items + 1, n_items + 1};
  if (!k3::entry_ok(err, k3::kCheckMlaDecodeCuIndptr, unit, range, range_lo, range_hi)) return;  // block-uniform
  for (int w = static_cast<int>(range[0]); w < range[1]; ++w) {
    const k3::u32x4 it = k3::load_16b(items + 4 * static_cast<int64_t>(w));  // the whole item, one load
    const int pair = static_cast<int>(it.v[0]), kv_start = static_cast<int>(it.v[1]);
    const int kv_end = static_cast<int>(it.v[2]), slot = static_cast<int>(it.v[3]);
    const int64_t v[4] = {pair, kv_start, kv_end, slot};
    const int64_t lo[4] = {0, 0, kv_start, -1};
    const int64_t hi[4] = {static_cast<int64_t>(batch) * head_groups, keys + 1, keys + 1, num_partials};
    if (!k3::entry_ok(err, k3::kCheckMlaDecodeScheduleItems, w, v, lo, hi)) continue;  // block-uniform
    const int b = pair / head_groups, g = pair % head_groups;
    const int seq_len = seq_lens[b * sl_s];  // run_prepared's seq_lens are not the ones the schedule checked
    if (!seq_len_ok(err, k3::kCheckMlaDecodeSeqLens, b, seq_len, q_len, bt_cols, page_size)) continue;  // block-uniform
    const mla::Cache c =
        make_cache(cache, page_stride, row_stride, page_size, kind, fnuz, latent, rope, kv_stages, block_table + b * bt_sb, bt_sp,
                   num_pages, err, k3::kCheckMlaDecodeBlockTable, b);
    const mla::Query qq = {q, q_dt, b * q_sb, q_st, q_sh};
    const mla::Dest d = decode_dest(b, g, slot, q_len, latent, out, out_dt, o_sb, o_st, o_sh, lse, l_sb, l_st, l_sh, ws, ws_lse_off);
    decode_item<C>(c, qq, heads, q_len, seq_len, g, kv_start, kv_end, 0, 1, score_scale, out_scale, d);
  }
}

}  // namespace

// Gluon style: grid (batch, head_groups x q_len row tiles, num_splits). Split k of sequence b
// covers keys [k*chunk, (k+1)*chunk) with chunk = ceil(seq_len / num_splits); with one split the
// block writes out/lse, else partial slot (b*head_groups + g)*num_splits + k.
//
// The `*_mma` kernels need 16-byte aligned query rows and the cache's 16-byte path (the host
// checks, kernels/src/ops/mla_decode.rs vector_kernel); `*_mma_unaligned` take any bf16 input.
K3_KERNEL void MLA_MAX_THREADS(256) mla_decode_gluon(MLA_DECODE_PARAMS, int num_splits, float score_scale, float out_scale,
                                                     k3::ErrorRecord* err) {
  gluon_body<Core::kSimt>(MLA_DECODE_ARGS, num_splits, score_scale, out_scale, err);
}
K3_EXPORT(mla_decode_gluon);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_gluon_mma(MLA_DECODE_PARAMS, int num_splits, float score_scale, float out_scale,
                                                         k3::ErrorRecord* err) {
  gluon_body<Core::kMma>(MLA_DECODE_ARGS, num_splits, score_scale, out_scale, err);
}
K3_EXPORT(mla_decode_gluon_mma);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_gluon_mma_unaligned(MLA_DECODE_PARAMS, int num_splits,
                                                                                     float score_scale, float out_scale, k3::ErrorRecord* err) {
  gluon_body<Core::kMmaUnaligned>(MLA_DECODE_ARGS, num_splits, score_scale, out_scale, err);
}
K3_EXPORT(mla_decode_gluon_mma_unaligned);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_gluon_mma_f32q(MLA_DECODE_PARAMS, int num_splits, float score_scale,
                                                                             float out_scale, k3::ErrorRecord* err) {
  gluon_body<Core::kMmaF32Q>(MLA_DECODE_ARGS, num_splits, score_scale, out_scale, err);
}
K3_EXPORT(mla_decode_gluon_mma_f32q);

namespace {

constexpr int kScheduleThreads = 256;

// Exclusive prefix of v over the block (every thread must call it); *total gets the block sum.
K3_DEVICE int64_t block_exclusive_scan(int64_t v, int64_t* warp_sums, int64_t* total) {
  const int lane = static_cast<int>(k3::lane_id());
  const int warp = static_cast<int>(k3::thread_idx_x()) / k3::kWarpSize;
  const int warps = static_cast<int>(k3::block_dim_x()) / k3::kWarpSize;
  int64_t x = v;
  for (int o = 1; o < k3::kWarpSize; o *= 2) {
    const int64_t y = k3::shfl_up(x, static_cast<unsigned>(o));
    if (lane >= o) x += y;
  }
  if (lane == k3::kWarpSize - 1) warp_sums[warp] = x;
  k3::sync_threads();
  int64_t before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    const int64_t s = warp_sums[w];
    if (w < warp) before += s;
    all += s;
  }
  k3::sync_threads();  // warp_sums is reused by the next scan
  *total = all;
  return before + x - v;
}

K3_DEVICE int64_t floor_div(int64_t a, int64_t b) { return a / b; }  // a >= 0, b > 0

}  // namespace

// The asm partition (kernel-api MlaSchedule::asm) computed on the device from seq_lens, one
// block. The (sequence, head group) pairs, each seq_len key-tokens long, are laid end to end and
// cut at every multiple of `quota`; unit u runs the items starting in [u*quota, (u+1)*quota).
// Pairs cut into several items get consecutive partial slots and one reduce entry, in pair order.
// Writes are bounded by the plan's counts. Checked: every seq_len in [min_len, max_len] (an
// unusable one counts as 0 tokens) and the totals (tokens, items, reduce entries) equal the
// plan's; otherwise the schedule is emptied (no unit runs an item, every reduce entry is zero,
// which the reduce refuses), so a wrong device seq_lens never drives a read past the workspace.
K3_KERNEL void mla_decode_asm_schedule(const int* seq_lens, int64_t sl_s, int batch, int head_groups, int64_t quota,
                                       int cus, int n_items, int n_reduce, int* items, int* cu_indptr, int* reduce,
                                       int min_len, int64_t max_len, int64_t plan_tokens, k3::ErrorRecord* err) {
  K3_SHARED(int64_t, warp_sums, [kScheduleThreads / k3::kWarpSize]);
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int64_t pairs = static_cast<int64_t>(batch) * head_groups;
  int64_t carry_tokens = 0, carry_items = 0, carry_slots = 0, carry_reduce = 0;
  bool lens_ok = true;
  for (int64_t base = 0; base < pairs; base += kScheduleThreads) {
    const int64_t p = base + tid;
    const bool valid = p < pairs;
    const int b = valid ? static_cast<int>(p / head_groups) : 0;
    const int g = valid ? static_cast<int>(p % head_groups) : 0;
    int64_t len = valid ? seq_lens[b * sl_s] : 0;
    if (valid && g == 0 && !k3::index_ok(err, k3::kCheckMlaDecodeSeqLens, b, len, min_len, max_len + 1)) {
      lens_ok = false;
    }
    if (len < min_len || len > max_len) len = 0;  // unusable: no items (the schedule is emptied below)
    int64_t sum;
    const int64_t off = carry_tokens + block_exclusive_scan(len, warp_sums, &sum);
    carry_tokens += sum;
    const int64_t n = len > 0 ? 1 + floor_div(off + len - 1, quota) - floor_div(off, quota) : 0;
    const int64_t item0 = carry_items + block_exclusive_scan(n, warp_sums, &sum);
    carry_items += sum;
    const int64_t slot0 = carry_slots + block_exclusive_scan(n > 1 ? n : 0, warp_sums, &sum);
    carry_slots += sum;
    const int64_t entry = carry_reduce + block_exclusive_scan(n > 1 ? 1 : 0, warp_sums, &sum);
    carry_reduce += sum;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t gs = k == 0 ? off : (floor_div(off, quota) + k) * quota;
      const int64_t next = (floor_div(off, quota) + k + 1) * quota;
      const int64_t ge = next < off + len ? next : off + len;
      const int64_t idx = item0 + k;
      if (idx < n_items) {
        const k3::u32x4 it = {{static_cast<uint32_t>(p), static_cast<uint32_t>(gs - off), static_cast<uint32_t>(ge - off),
                               static_cast<uint32_t>(n > 1 ? slot0 + k : -1)}};
        k3::store_16b(items + 4 * idx, it);
        if (gs % quota == 0 && gs / quota < cus) cu_indptr[gs / quota] = static_cast<int>(idx);
      }
    }
    if (n > 1 && entry < n_reduce) {
      int* e = reduce + 4 * entry;
      e[0] = b;
      e[1] = g;
      e[2] = static_cast<int>(slot0);
      e[3] = static_cast<int>(n);
    }
  }
  // The totals are block-uniform; each check records at most once (the first CAS wins).
  const bool ok = k3::block_all(err, lens_ok) && k3::count_ok(err, k3::kCheckMlaDecodeTokens, carry_tokens / head_groups, plan_tokens) &&
                  k3::count_ok(err, k3::kCheckMlaDecodeItems, carry_items, n_items) &&
                  k3::count_ok(err, k3::kCheckMlaDecodeSplits, carry_reduce, n_reduce);
  if (!ok) {
    for (int64_t u = tid; u <= cus; u += kScheduleThreads) cu_indptr[u] = 0;
    for (int64_t e = tid; e < n_reduce; e += kScheduleThreads) {
      int* r = reduce + 4 * e;
      r[0] = r[1] = r[2] = r[3] = 0;
    }
    return;
  }
  // Units past the work (and the end marker) point at the end of the item list.
  const int64_t used = (carry_tokens + quota - 1) / quota;
  for (int64_t u = used + tid; u <= cus; u += kScheduleThreads) cu_indptr[u] = static_cast<int>(carry_items);
}
K3_EXPORT(mla_decode_asm_schedule);

// Asm style, persistent: one block per compute unit walks its items (from the schedule in the
// workspace), each over all of its row tiles. `*_mma` / `*_mma_unaligned` as for Gluon.
K3_KERNEL void MLA_MAX_THREADS(256) mla_decode_asm(MLA_DECODE_PARAMS, MLA_ASM_PARAMS) {
  asm_body<Core::kSimt>(MLA_DECODE_ARGS, MLA_ASM_ARGS);
}
K3_EXPORT(mla_decode_asm);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_asm_mma(MLA_DECODE_PARAMS, MLA_ASM_PARAMS) {
  asm_body<Core::kMma>(MLA_DECODE_ARGS, MLA_ASM_ARGS);
}
K3_EXPORT(mla_decode_asm_mma);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_asm_mma_unaligned(MLA_DECODE_PARAMS, MLA_ASM_PARAMS) {
  asm_body<Core::kMmaUnaligned>(MLA_DECODE_ARGS, MLA_ASM_ARGS);
}
K3_EXPORT(mla_decode_asm_mma_unaligned);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_decode_asm_mma_f32q(MLA_DECODE_PARAMS, MLA_ASM_PARAMS) {
  asm_body<Core::kMmaF32Q>(MLA_DECODE_ARGS, MLA_ASM_ARGS);
}
K3_EXPORT(mla_decode_asm_mma_f32q);

// Merges partial slots by LSE into out/lse, parallel over (entry, row, latent chunk): grid
// (entries, q_len x min(heads, kRows), ceil(latent / kReduceDims)), kReduceThreads threads of 4
// dims each.
// Entries come from the asm schedule's reduce map (`reduce` non-null: one 16-byte entry, checked
// against the plan's batch, head groups and partial slots, since a prepared schedule sits in the
// caller's workspace) or, for Gluon, are entry e = b*head_groups + g with slots
// e*num_splits .. +num_splits. Row blocks past a partial last group's heads return at once.
// One pass over the splits reads each split's LSE once per block (below). The partial outputs
// move in 16-byte loads, four splits in flight per thread, for any latent: the plan lays out
// 16-byte aligned slots with rows padded to 4 floats (mla::partial_pitch); a thread's 4 outputs
// go out in one store when the output rows allow it.
K3_KERNEL void mla_decode_reduce(const float* ws, int64_t ws_lse_off, const int* reduce, int num_splits, int batch, int num_partials,
                                 int heads, int q_len, int latent, void* out, int out_dt, int64_t o_sb, int64_t o_st, int64_t o_sh,
                                 float* lse, int64_t l_sb, int64_t l_st, int64_t l_sh, k3::ErrorRecord* err) {
  constexpr int kThreads = mla::kReduceThreads;
  constexpr int kWarps = kThreads / k3::kWarpSize;
  K3_SHARED(float, weight, [kThreads]);
  K3_SHARED(float, warp_m, [kWarps]);
  const int tid = static_cast<int>(k3::thread_idx_x());
  const int e = static_cast<int>(k3::block_idx_x());
  const int group_rows = heads < mla::kRows ? heads : mla::kRows;
  const int i = static_cast<int>(k3::block_idx_y()) / group_rows, k = static_cast<int>(k3::block_idx_y()) % group_rows;
  const int srow = i * mla::kRows + k;  // the row in a partial slot
  const int d0 = static_cast<int>(k3::block_idx_z()) * mla::kReduceDims + 4 * tid;
  const int head_groups = (heads + mla::kRows - 1) / mla::kRows;
  int b, g, first, count;
  if (reduce != nullptr) {
    const k3::u32x4 r = k3::load_16b(reduce + 4 * static_cast<int64_t>(e));
    b = static_cast<int>(r.v[0]);
    g = static_cast<int>(r.v[1]);
    first = static_cast<int>(r.v[2]);
    count = static_cast<int>(r.v[3]);
    const int64_t v[4] = {b, g, first, count};
    const int64_t lo[4] = {0, 0, 0, 1};
    const int64_t hi[4] = {batch, head_groups, num_partials, static_cast<int64_t>(num_partials) - first + 1};
    if (!k3::entry_ok(err, k3::kCheckMlaDecodeReduceMap, e, v, lo, hi)) return;  // block-uniform
  } else {
    b = e / head_groups;
    g = e % head_groups;
    first = e * num_splits;
    count = num_splits;
  }
  const int gh = heads - g * mla::kRows < mla::kRows ? heads - g * mla::kRows : mla::kRows;
  if (k >= gh) return;  // block-uniform: the last group's missing heads
  const float neg_inf = k3::uint_as_float(0xff800000u);
  const int64_t pitch = mla::partial_pitch(latent);
  const int64_t slot_out = static_cast<int64_t>(q_len) * mla::kRows * pitch;
  const int64_t slot_lse = static_cast<int64_t>(q_len) * mla::kRows;
  const float* part_lse = ws + ws_lse_off + first * slot_lse + srow;

  // One pass over the splits, kThreads at a time, each split's LSE read once: the chunk's largest
  // LSE (warp butterfly, then the warps in the same order in every thread) raises the running
  // max m; what was summed so far is rescaled by exp(m_old - m), and the chunk's weights
  // exp(lse - m) go to shared memory, where every thread adds them to the running total in split
  // order while it weighs its 16-byte loads of the partial outputs (four splits in flight).
  float m = neg_inf, total = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // lanes past latent read pad floats and are never stored
  const bool live = d0 < latent;
  for (int c0 = 0; c0 < count; c0 += kThreads) {  // the same trip count in every thread
    const int n = count - c0 < kThreads ? count - c0 : kThreads;
    const float x = tid < n ? part_lse[(c0 + tid) * slot_lse] : neg_inf;
    float cm = x;
    for (int o = k3::kWarpSize / 2; o > 0; o >>= 1) cm = k3::max_f32(cm, k3::shfl_xor(cm, o));
    if (k3::lane_id() == 0) warp_m[k3::warp_id()] = cm;
    k3::sync_threads();
    float m_new = m;
    for (int w = 0; w < kWarps; ++w) m_new = k3::max_f32(m_new, warp_m[w]);
    weight[tid] = x == neg_inf ? 0.0f : k3::exp_f32(x - m_new);
    const float rescale = m == neg_inf ? 0.0f : k3::exp_f32(m - m_new);
    m = m_new;
    k3::sync_threads();
    if (live && m != neg_inf) {  // m: block-uniform
      total *= rescale;
      K3_UNROLL
      for (int q = 0; q < 4; ++q) acc[q] *= rescale;
      const float* src = ws + (first + c0) * slot_out + srow * pitch + d0;
      int j = 0;
      for (; j + 4 <= n; j += 4) {
        k3::f32x4 v[4];
        K3_UNROLL
        for (int u = 0; u < 4; ++u) v[u] = k3::load_f32x4(src + (j + u) * slot_out);
        K3_UNROLL
        for (int u = 0; u < 4; ++u) {
          const float w = weight[j + u];
          total += w;
          K3_UNROLL
          for (int q = 0; q < 4; ++q) acc[q] += w * v[u].v[q];
        }
      }
      K3_NO_UNROLL
      for (; j < n; ++j) {
        const k3::f32x4 v = k3::load_f32x4(src + j * slot_out);
        const float w = weight[j];
        total += w;
        K3_UNROLL
        for (int q = 0; q < 4; ++q) acc[q] += w * v.v[q];
      }
    }
    k3::sync_threads();  // the next chunk rewrites warp_m and the weights
  }
  // Thread 0 is live (d0 = blockIdx.z * kReduceDims < latent) and has the total.
  const int h = g * mla::kRows + k;
  if (lse != nullptr && tid == 0 && k3::block_idx_z() == 0) {
    lse[b * l_sb + i * l_st + h * l_sh] = m == neg_inf ? neg_inf : m + k3::log_f32(total);
  }
  if (!live) return;
  const float inv = m == neg_inf ? 0.0f : 1.0f / total;  // no key in any split: zeros
  K3_UNROLL
  for (int q = 0; q < 4; ++q) acc[q] *= inv;
  const int64_t o = b * o_sb + i * o_st + h * o_sh + d0;
  if (d0 + 4 <= latent && (o_sb | o_st | o_sh) % 4 == 0 && k3::aligned16(out)) {
    k3::store_f32x4(out, out_dt, o, k3::f32x4{{acc[0], acc[1], acc[2], acc[3]}});  // one 16 / 8-byte store
  } else {
    for (int q = 0; q < 4 && d0 + q < latent; ++q) k3::store_f32(out, out_dt, o + q, acc[q]);
  }
}
K3_EXPORT(mla_decode_reduce);

// Ragged absorbed prefill: grid (row tiles, head groups, batch). Sequence b's queries are rows
// cu_q[b] .. cu_q[b+1] of q; its block (row tile rt of q_len_b x gh rows) attends to all of the
// sequence's seq_len keys, causally from position seq_len - q_len_b when `causal`. Checked per
// block: cu_q[b] in [0, total_q], cu_q[b+1] in [cu_q[b], min(total_q, cu_q[b] + max_q)] (the
// grid covers max_q queries), seq_len in [causal ? q_len_b : 0, bt_cols * page_size] and the
// block-table entries of its keys.
#define MLA_PREFILL_ABSORBED_PARAMS                                                                              \
  const void *q, int q_dt, int64_t q_st, int64_t q_sh, const uint8_t *cache, int64_t page_stride,              \
      int64_t row_stride, int page_size, int kind, int fnuz, int latent, int rope, int kv_stages,              \
      const int *block_table, int64_t bt_sb, int64_t bt_sp, const int *seq_lens, int64_t sl_s, int num_pages,   \
      int bt_cols, const int *cu_q, int64_t cu_s, int total_q, int max_q, void *out, int out_dt, int64_t o_st,  \
      int64_t o_sh, float *lse, int64_t l_st, int64_t l_sh, int heads, int causal, float score_scale,           \
      float out_scale, k3::ErrorRecord *err
#define MLA_PREFILL_ABSORBED_ARGS                                                                               \
  q, q_dt, q_st, q_sh, cache, page_stride, row_stride, page_size, kind, fnuz, latent, rope, kv_stages,          \
      block_table, bt_sb, bt_sp, seq_lens, sl_s, num_pages, bt_cols, cu_q, cu_s, total_q, max_q, out, out_dt,   \
      o_st, o_sh, lse, l_st, l_sh, heads, causal, score_scale, out_scale, err

namespace {
template <Core C>
K3_AMD_INLINE K3_DEVICE void prefill_absorbed_body(MLA_PREFILL_ABSORBED_PARAMS) {
  const int rt = static_cast<int>(k3::block_idx_x());
  const int g = static_cast<int>(k3::block_idx_y());
  const int b = static_cast<int>(k3::block_idx_z());
  const int dev_q0 = cu_q[b * cu_s];
  const int dev_q1 = cu_q[(b + 1) * cu_s];
  // Block-uniform: every thread reads the same values.
  const bool q_ok = k3::index_ok(err, k3::kCheckMlaPrefillAbsorbedCuQ, b, dev_q0, 0, static_cast<int64_t>(total_q) + 1) &&
                    k3::index_ok(err, k3::kCheckMlaPrefillAbsorbedCuQ, b + 1, dev_q1, dev_q0,
                                 (total_q - dev_q0 < max_q ? total_q : static_cast<int64_t>(dev_q0) + max_q) + 1);
  if (!q_ok) return;
  const int q0 = dev_q0;
  const int q_rows = dev_q1 - dev_q0;
  const int gh = heads - g * mla::kRows < mla::kRows ? heads - g * mla::kRows : mla::kRows;
  if (rt * mla::kRows >= q_rows * gh) return;  // block-uniform
  const int dev_len = seq_lens[b * sl_s];
  const bool len_ok = seq_len_ok(err, k3::kCheckMlaPrefillAbsorbedSeqLens, b, dev_len, causal ? q_rows : 0, bt_cols, page_size);
  const int seq_len = len_ok ? dev_len : 0;
  const mla::Cache c =
      make_cache(cache, page_stride, row_stride, page_size, kind, fnuz, latent, rope, kv_stages, block_table + b * bt_sb, bt_sp,
                 num_pages, err, k3::kCheckMlaPrefillAbsorbedBlockTable, b);
  // The prefill checks its pages before the first tile, in a pass: its prologue is small
  // against a prefill's compute, and the report after the tiles (as the decode kernels do) gave
  // gfx942's *_mma kernel a 32-byte stack frame (registers).
  if (!len_ok || !mla::pages_ok(c, 0, seq_len)) return;  // block-uniform
  const mla::Query qq = {q, q_dt, q0 * q_st, q_st, q_sh};
  mla::Dest d;
  d.out = out;
  d.out_dt = out_dt;
  d.off = q0 * o_st;
  d.st = o_st;
  d.sh = o_sh;
  d.lse = lse;
  d.loff = q0 * l_st;
  d.lst = l_st;
  d.lsh = l_sh;
  d.head_base = g * mla::kRows;
  mla::Rows r;
  r.rho0 = rt * mla::kRows;
  r.q_rows = q_rows;
  r.gh = gh;
  r.head0 = g * mla::kRows;
  r.causal = causal;
  r.first_pos = seq_len - q_rows;
  r.n_keys = seq_len;
  r.kv_start = 0;
  r.kv_end = seq_len;
  attend_tile<C>(c, qq, r, score_scale, out_scale, d);
}
}  // namespace

// `*_mma` / `*_mma_unaligned` as for the decode kernels.
K3_KERNEL void MLA_MAX_THREADS(256) mla_prefill_absorbed(MLA_PREFILL_ABSORBED_PARAMS) { prefill_absorbed_body<Core::kSimt>(MLA_PREFILL_ABSORBED_ARGS); }
K3_EXPORT(mla_prefill_absorbed);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_prefill_absorbed_mma(MLA_PREFILL_ABSORBED_PARAMS) { prefill_absorbed_body<Core::kMma>(MLA_PREFILL_ABSORBED_ARGS); }
K3_EXPORT(mla_prefill_absorbed_mma);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_prefill_absorbed_mma_unaligned(MLA_PREFILL_ABSORBED_PARAMS) {
  prefill_absorbed_body<Core::kMmaUnaligned>(MLA_PREFILL_ABSORBED_ARGS);
}
K3_EXPORT(mla_prefill_absorbed_mma_unaligned);
K3_KERNEL void MLA_MAX_THREADS(256) MLA_MMA_TWO_WAVES mla_prefill_absorbed_mma_f32q(MLA_PREFILL_ABSORBED_PARAMS) {
  prefill_absorbed_body<Core::kMmaF32Q>(MLA_PREFILL_ABSORBED_ARGS);
}
K3_EXPORT(mla_prefill_absorbed_mma_f32q);
