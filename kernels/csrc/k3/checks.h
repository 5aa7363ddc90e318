// Checked index data: the device error record and the bound checks of the dialect.
//
// THE RULE. A kernel never trusts an index it read from device memory (block tables, slot
// mappings, sequence lengths, cu_seqlens, state indices, expert ids, sorted token ids, padded
// counts, embedding ids, ...). It checks every such value against the bounds it was launched
// with (plan-time sizes passed as kernel arguments) with k3::index_ok before using it, skips the
// work the value would address, and never touches memory outside the tensors it was given. The
// first violation lands in a small per-stream ErrorRecord that the host turns into a typed error
// (kernel_api::Error::InvalidInput naming the tensor, the entry, the value and the bound) at
// the next synchronising call.
//
// How to use it in a new kernel:
//   - take `k3::ErrorRecord* err` as the kernel's LAST parameter; the launcher passes
//     GpuBackend::push_checks (null when the engine opted out: K3_DEVICE_CHECKS=off);
//   - check each index once where it is read (once per page, row or sequence, never inside an
//     inner loop over the data it addresses), e.g.
//         const int64_t slot = k3::load_index(slots, slot_dt, tok);
//         if (!k3::index_ok(err, k3::kCheckMlaCacheWriteSlot, tok, slot, 0, num_slots)) continue;
//     with a new CheckSite below (and its line in kernels/src/device_checks.rs: the name of the
//     op and of the tensor the host reports);
//   - where a whole block must agree (work guarded by barriers), combine the per-thread answers
//     with k3::block_all(err, ok): every thread of the block calls it (the asm MLA schedule
//     checks the seq_lens this way);
//   - an index read in a hot loop that must not branch to the recorder there (MLA's block-table
//     entries, read per KV tile for the row addresses): clamp it into range where it is read,
//     remember that it was out, and record it after the loop (mla::checked_page);
//   - counts a kernel derives from device data and that the plan sized (a schedule's items,
//     chunks) go through k3::count_ok; slots two entries must not share, through
//     k3::block_unique;
//   - with err == nullptr every check answers true without comparing: an engine that validates
//     upstream pays nothing, and out-of-range data is then undefined behaviour as in any
//     unchecked kernel.
//
// "First" is decided by an atomic compare-and-swap on ErrorRecord::flag: the first thread to
// flip it from 0 to 1 writes the other fields; later violations (of any kernel on the stream,
// until the host reads and clears the record) are dropped. Which of several violations inside
// one launch wins is unspecified (blocks run concurrently on GPUs and on the emulator).
// Included by k3/compat.h.
#ifndef K3_CHECKS_H
#define K3_CHECKS_H

K3_BEGIN

// One stream's first violation. 64-byte slots on the device; the layout is read by
// kernels/src/device_checks.rs (little-endian, these offsets).
struct ErrorRecord {
  int flag;       // 0: no violation; set once by the first violation
  int site;       // CheckSite: which op and tensor
  int kind;       // CheckKind: how to read the fields below
  int reserved;
  int64_t row;    // the entry (row of a 2-D table)
  int64_t col;    // column of a 2-D table, else -1
  int64_t value;  // the offending value
  int64_t lo;     // kCheckRange: [lo, hi) is the bound; kCheckDuplicate: the other entry;
  int64_t hi;     // kCheckMismatch: lo is what the plan holds; kCheckMultiple: lo is the step
};

enum CheckKind : int {
  kCheckRange = 0,      // value outside [lo, hi)
  kCheckDuplicate = 1,  // value also held by entry lo (a write race)
  kCheckMismatch = 2,   // a count derived from the device data is value, the plan's is lo
  kCheckMultiple = 3,   // value is not a multiple of lo
};

// Op and tensor of a check. The numbers are the host's (kernels/src/device_checks.rs SITES;
// a test keeps the two lists equal). Append only.
enum CheckSite : int {
  kCheckMlaCacheWriteSlot = 1,
  kCheckMlaDecodeSeqLens = 2,
  kCheckMlaDecodeBlockTable = 3,
  kCheckMlaDecodeTokens = 4,
  kCheckMlaDecodeItems = 5,
  kCheckMlaDecodeSplits = 6,
  kCheckMlaPrefillAbsorbedSeqLens = 7,
  kCheckMlaPrefillAbsorbedBlockTable = 8,
  kCheckMlaPrefillAbsorbedCuQ = 9,
  kCheckMlaPrefillCuQ = 10,
  kCheckMlaPrefillCuK = 11,
  kCheckKdaPrefillCuSeqlens = 12,
  kCheckKdaPrefillCheckpoints = 13,
  kCheckKdaPrefillStateIndices = 14,
  kCheckKdaDecodeStateIndices = 15,
  kCheckConv1dCuSeqlens = 16,
  kCheckConv1dStateIndices = 17,
  kCheckMoeAlignTopkIds = 18,
  kCheckMoeAlignExpertMap = 19,
  kCheckMoeGemmExpertIds = 20,
  kCheckMoeGemmSortedTokenIds = 21,
  kCheckMoeGemmPostPadded = 22,
  kCheckEmbeddingIds = 23,
  kCheckMlaDecodeCuIndptr = 24,
  kCheckMlaDecodeScheduleItems = 25,
  kCheckMlaDecodeReduceMap = 26,
};

// Out of line on the GPUs: recording a violation (the cold path). Inlined, its atomic and stores
// changed the register allocation of hot kernels (sm_90a mla_decode_gluon_mma: 128 registers and
// 220 bytes of spills instead of 182 and none; gfx942 moe_gemm_grouped: 64 VGPRs instead of 54).
// As a call it costs nothing until a violation happens. (block_unique below stays inline: as a
// call with barriers it cost sm_90a causal_conv1d_varlen_fwd 70 registers instead of 45.)
#if K3_TARGET_HIP
#define K3_CHECK_OUT_OF_LINE __attribute__((noinline))
#elif K3_TARGET_CUDA
#define K3_CHECK_OUT_OF_LINE __noinline__
#else
#define K3_CHECK_OUT_OF_LINE
#endif

// Records a violation unless one is already recorded (cold path: only reached on bad data).
K3_CHECK_OUT_OF_LINE K3_DEVICE void record_violation(ErrorRecord* err, int site, int kind, int64_t row, int64_t col, int64_t value,
                                int64_t lo, int64_t hi) {
  if (err == nullptr) return;
  if (*static_cast<volatile int*>(&err->flag) != 0) return;  // already set: skip the atomic
  if (atomic_cas(&err->flag, 0, 1) != 0) return;
  err->site = site;
  err->kind = kind;
  err->row = row;
  err->col = col;
  err->value = value;
  err->lo = lo;
  err->hi = hi;
}

// Whether lo <= value < hi; records the violation when not. With checks off (err null): true.
K3_DEVICE bool index_ok(ErrorRecord* err, int site, int64_t row, int64_t value, int64_t lo, int64_t hi) {
  if (err == nullptr) return true;
  if (value >= lo && value < hi) return true;
  record_violation(err, site, kCheckRange, row, -1, value, lo, hi);
  return false;
}

// index_ok for entry (row, col) of a 2-D table.
K3_DEVICE bool index_ok_2d(ErrorRecord* err, int site, int64_t row, int64_t col, int64_t value, int64_t lo,
                           int64_t hi) {
  if (err == nullptr) return true;
  if (value >= lo && value < hi) return true;
  record_violation(err, site, kCheckRange, row, col, value, lo, hi);
  return false;
}

// index_ok for every column of entry `row` of a table read from device memory: lo[c] <= v[c] <
// hi[c] for c < N; records the first column that is not. One recorder call site for the whole
// entry (each call site is a call on AMD, where the report counts them).
template <int N>
K3_DEVICE bool entry_ok(ErrorRecord* err, int site, int64_t row, const int64_t (&v)[N], const int64_t (&lo)[N],
                        const int64_t (&hi)[N]) {
  if (err == nullptr) return true;
  int bad = -1;
  int64_t bv = 0, blo = 0, bhi = 0;
  K3_UNROLL
  for (int c = N - 1; c >= 0; --c) {  // selects, not an indexed register array
    if (v[c] < lo[c] || v[c] >= hi[c]) {
      bad = c;
      bv = v[c];
      blo = lo[c];
      bhi = hi[c];
    }
  }
  if (bad < 0) return true;
  record_violation(err, site, kCheckRange, row, bad, bv, blo, bhi);
  return false;
}

// Whether a count derived from device data equals the plan's; records the mismatch when not.
K3_DEVICE bool count_ok(ErrorRecord* err, int site, int64_t value, int64_t planned) {
  if (err == nullptr || value == planned) return true;
  record_violation(err, site, kCheckMismatch, -1, -1, value, planned, planned);
  return false;
}

// True in every thread when `ok` holds in every thread of the block. Every thread of the block
// must call it (it contains barriers); with checks off it returns true at once, so that branch
// is uniform too (err is a kernel argument).
K3_DEVICE bool block_all(const ErrorRecord* err, bool ok) {
  if (err == nullptr) return true;
#if K3_TARGET_CUDA
  return __syncthreads_and(ok ? 1 : 0) != 0;  // one barrier
#else
  // A shared flag and three barriers (HIP's __syncthreads_and needs the device libraries, which
  // the -nogpulib builds do not link).
  K3_SHARED(int, k3_block_bad, [1]);
  sync_threads();  // readers of the previous answer are done
  if (thread_idx_x() == 0 && thread_idx_y() == 0 && thread_idx_z() == 0) k3_block_bad[0] = 0;
  sync_threads();
  if (!ok) k3_block_bad[0] = 1;
  sync_threads();
  return k3_block_bad[0] == 0;
#endif
}

// Whether entry `self` (value v) of the i32/i64 index list idx[0..n) (element stride `stride`)
// is the only entry holding v; entries equal to `ignore` (a null slot) are never compared.
// Block-cooperative: every thread of the block calls it with the same arguments, each reads
// n / blockDim entries. Records a kCheckDuplicate naming the other entry.
// n is a batch size (an int: 64-bit trip counts made ptxas call a 64-bit division).
K3_DEVICE bool block_unique(ErrorRecord* err, int site, const void* idx, int dt, int64_t stride, int n, int self, int64_t v,
                            int64_t ignore) {
  if (err == nullptr) return true;
  bool ok = true;
  if (v != ignore) {
    const int nt = static_cast<int>(block_dim_x() * block_dim_y() * block_dim_z());
    const int tid = static_cast<int>((thread_idx_z() * block_dim_y() + thread_idx_y()) * block_dim_x() + thread_idx_x());
    for (int j = tid; j < n; j += nt) {
      if (j != self && load_index(idx, dt, j * stride) == v) {
        record_violation(err, site, kCheckDuplicate, self > j ? self : j, -1, v, self > j ? j : self, 0);
        ok = false;
      }
    }
  }
  return block_all(err, ok);
}

K3_END

#endif  // K3_CHECKS_H
