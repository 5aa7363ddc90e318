//! Decode schedules: how the (sequence, head group, kv range) work is cut into items, where the
//! partial results go, and how they are reduced. GPU backends launch from these fields; the CPU
//! reference executes them.

/// The asm partition never cuts a (sequence, head group) into chunks shorter than this many
/// tokens because of balancing alone (a shorter chunk only appears as the tail of a sequence or
/// of a compute unit's quota): below it a split costs more in partial traffic than it saves.
pub const ASM_MIN_CHUNK_TOKENS: usize = 16;
/// The automatic Gluon split count keeps at least this many tokens per split of the longest
/// sequence.
pub const GLUON_MIN_SPLIT_TOKENS: usize = 64;

/// One unit of work: attention of all `q_len` rows of the heads of one head group of one
/// sequence over the keys `kv_start..kv_end` (before the causal mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaWorkItem {
    pub batch: u32,
    pub head_group: u32,
    pub kv_start: u32,
    pub kv_end: u32,
    /// Workspace slot of the partial result, or `None` when the item covers the whole sequence
    /// and writes `out`/`lse` directly.
    pub partial: Option<u32>,
}

/// One merge of the reduce step: the partial slots `partials` (in kv order) of one (sequence,
/// head group) are combined by LSE into `out`/`lse`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaReduceEntry {
    pub batch: u32,
    pub head_group: u32,
    pub partials: std::ops::Range<u32>,
}

/// The launch schedule of a decode plan.
///
/// AsmStyle (persistent): the total work `Σ_b seq_lens[b] · head_groups` key-tokens is divided
/// into a quota `max(ceil(total / compute_units), ASM_MIN_CHUNK_TOKENS)` per compute unit;
/// (sequence, head group) pairs are walked in order and cut wherever a unit's quota is used
/// up. Unit c runs `items[cu_indptr[c]..cu_indptr[c + 1]]` in order.
///
/// GluonStyle (grid): `num_splits` kv splits per sequence of `ceil(seq_len / num_splits)`
/// tokens (trailing splits may be empty: their partial has lse = -inf), items in (sequence,
/// head group, split) order, `cu_indptr` empty. With one split every item writes directly.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MlaSchedule {
    pub items: Vec<MlaWorkItem>,
    /// Asm: `compute_units + 1` offsets into `items`; Gluon: empty.
    pub cu_indptr: Vec<u32>,
    /// Gluon: kv splits per sequence; Asm: 0 (chunks vary per sequence).
    pub num_splits: usize,
    pub reduce: Vec<MlaReduceEntry>,
    /// Workspace slots used by the items (`0..num_partials`).
    pub num_partials: usize,
    /// Asm: key-tokens of work per compute unit (the cut points are its multiples, which is
    /// what lets a device kernel rebuild this partition from `seq_lens`); Gluon: 0.
    pub quota: u64,
}

impl MlaSchedule {
    /// The persistent asm-style partition over `cus` compute units.
    pub(crate) fn asm(seq_lens: &[u32], head_groups: usize, cus: u32) -> Self {
        let cus = cus.max(1) as u64;
        let total: u64 = seq_lens.iter().map(|&l| l as u64 * head_groups as u64).sum();
        let quota = total.div_ceil(cus).max(ASM_MIN_CHUNK_TOKENS as u64);
        let mut s = MlaSchedule { cu_indptr: vec![0], quota, ..Self::default() };
        let mut room = quota;
        for (b, &len) in seq_lens.iter().enumerate() {
            for g in 0..head_groups {
                let first = s.items.len();
                let mut kv = 0u32;
                while kv < len {
                    let take = (len - kv).min(room.min(u32::MAX as u64) as u32);
                    s.items.push(MlaWorkItem { batch: b as u32, head_group: g as u32, kv_start: kv, kv_end: kv + take, partial: None });
                    kv += take;
                    room -= take as u64;
                    if room == 0 {
                        room = quota;
                        // The last unit absorbs any rounding remainder (quota · cus >= total, so
                        // there is none in practice).
                        if (s.cu_indptr.len() as u64) < cus {
                            s.cu_indptr.push(s.items.len() as u32);
                        }
                    }
                }
                s.assign_partials(first, b, g);
            }
        }
        while (s.cu_indptr.len() as u64) < cus + 1 {
            s.cu_indptr.push(s.items.len() as u32);
        }
        s
    }

    /// The Gluon grid with `num_splits` splits per sequence.
    pub(crate) fn gluon(seq_lens: &[u32], head_groups: usize, num_splits: usize) -> Self {
        let mut s = MlaSchedule { num_splits, ..Self::default() };
        for (b, &len) in seq_lens.iter().enumerate() {
            let chunk = (len as usize).div_ceil(num_splits);
            for g in 0..head_groups {
                let first = s.items.len();
                for k in 0..num_splits {
                    let start = (k * chunk).min(len as usize) as u32;
                    let end = ((k + 1) * chunk).min(len as usize) as u32;
                    s.items.push(MlaWorkItem { batch: b as u32, head_group: g as u32, kv_start: start, kv_end: end, partial: None });
                }
                s.assign_partials(first, b, g);
            }
        }
        s
    }

    /// Splits that fill `slots` concurrent blocks when `batch · head_groups` tiles do not: the
    /// most whose blocks all run at once (`slots / tiles`), keeping at least
    /// [`GLUON_MIN_SPLIT_TOKENS`] per split of the longest sequence and at most
    /// [`MLA_MAX_SPLITS`](super::MLA_MAX_SPLITS) (256: a cap of 64 left batch 1 at 12 heads on
    /// 64 of an H200's 132 SMs). One split more would start a second wave whose blocks take as
    /// long as the first's: 256 tiles on 608 slots (MI300X, 2 blocks per CU) take 2 splits (512
    /// blocks, one wave), not 3 (768: two waves of a third of the keys each, the second on 160
    /// blocks).
    pub(crate) fn gluon_auto_splits(seq_lens: &[u32], head_groups: usize, slots: u32) -> usize {
        let tiles = (seq_lens.len() * head_groups).max(1);
        let longest = seq_lens.iter().copied().max().unwrap_or(0) as usize;
        (slots as usize / tiles).min(longest / GLUON_MIN_SPLIT_TOKENS).clamp(1, super::MLA_MAX_SPLITS)
    }

    /// Gives the items `first..` of one (sequence, head group) partial slots and a reduce entry
    /// when there is more than one of them.
    fn assign_partials(&mut self, first: usize, b: usize, g: usize) {
        let n = self.items.len() - first;
        if n <= 1 {
            return;
        }
        let start = self.num_partials as u32;
        for (k, item) in self.items[first..].iter_mut().enumerate() {
            item.partial = Some(start + k as u32);
        }
        self.num_partials += n;
        self.reduce.push(MlaReduceEntry { batch: b as u32, head_group: g as u32, partials: start..start + n as u32 });
    }
}

#[cfg(test)]
mod tests {
    use super::MlaSchedule;

    /// (sequences, head groups, slots, sequence length) -> auto splits.
    #[test]
    fn gluon_auto_splits_fill_whole_waves() {
        let splits = |seqs: usize, groups: usize, slots: u32, len: u32| MlaSchedule::gluon_auto_splits(&vec![len; seqs], groups, slots);
        // Batch 1, 12 heads (one group), 64k keys: one block per SM of an H200 / per slot of an
        // MI300X (2 per CU), capped at MLA_MAX_SPLITS.
        assert_eq!(splits(1, 1, 132, 65536), 132);
        assert_eq!(splits(1, 1, 608, 65536), 256);
        // Short sequences keep GLUON_MIN_SPLIT_TOKENS (64) per split: 1000 / 64 = 15.
        assert_eq!(splits(1, 1, 132, 1000), 15);
        // Exact fits: 3 tiles x 44 = 132.
        assert_eq!(splits(3, 1, 132, 65536), 44);
        // 256 tiles on 608 slots: 2 splits (512 blocks, one wave), not 3 (768: 1.26 waves).
        assert_eq!(splits(256, 1, 608, 65536), 2);
        // 128 tiles on 608 slots: 4 (512 blocks) over 5 (640 blocks, a second wave of 32).
        assert_eq!(splits(128, 1, 608, 65536), 4);
        // 10 tiles on 132: 13 (130 blocks) over 14 (140: a second wave of 8).
        assert_eq!(splits(10, 1, 132, 65536), 13);
        // 100 tiles on 132: 1 split (one wave, 100 blocks) over 2 (two waves of half the keys).
        assert_eq!(splits(100, 1, 132, 65536), 1);
        // More tiles than slots: no split.
        assert_eq!(splits(400, 1, 132, 65536), 1);
    }
}
