//! Checked launches: how index data in device memory is validated on GPUs.
//!
//! Plans validate the host copies of batch metadata, but kernels read the device copies (run
//! never uploads), and those may differ. Every kernel that dereferences index data from device
//! memory checks each index against the bounds it was launched with (`csrc/k3/checks.h`), skips
//! the work the index would address, and records the first violation in a small per-stream
//! [`ErrorRecord`](self) in device memory. [`GpuBackend`](crate::GpuBackend) turns the record
//! into [`Error::InvalidInput`] (field = the tensor, as the CPU reference names it; the reason
//! names the op, the entry, the value and the bound) at the next synchronising call
//! (`Backend::synchronize`, `Backend::download`), and clears it.
//!
//! Where the records live: one pool of [`RECORD_SLOTS`] 64-byte records per backend, allocated
//! and zeroed when the backend is made (so `run` never allocates, and a graph capture sees no
//! allocation). A stream takes the next free slot the first time it launches a checked kernel
//! (keyed by [`Runtime::stream_key`](crate::Runtime::stream_key)); streams past the last slot
//! share it. Each checked launch passes its stream's record as the kernel's last argument (a
//! replayed graph writes to the record of the stream it was captured on). `synchronize(stream)`
//! reads that stream's record (one 64-byte device-to-host copy); `download` waits for every
//! stream and reads every record in one copy.
//!
//! After a reported violation the outputs and states the op writes are unspecified (the
//! offending work was skipped, or, for MLA block-table entries checked as the KV tiles read
//! them, ran on page 0 in place of the bad page); memory outside the op's tensors is never
//! touched.
//!
//! [`DeviceChecks::Off`] (`K3_DEVICE_CHECKS=off`, or `GpuBackend::set_device_checks`) passes a
//! null record: kernels then compare nothing and trust the data, for engines that validate it
//! upstream. Out-of-range data is then undefined behaviour, as in any unchecked kernel.

use crate::runtime::{DevicePtr, Runtime};
use kernel_api::{Error, Result};
use std::sync::Mutex;

/// Bytes of one record slot (`k3::ErrorRecord` is 56 bytes).
pub const RECORD_BYTES: usize = 64;
/// Record slots per backend: one per stream, the last shared by any further streams.
pub const RECORD_SLOTS: usize = 64;

/// Whether kernels check the index data they read from device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DeviceChecks {
    /// Check every index, report the first violation per stream (the default).
    #[default]
    On,
    /// Trust the data (the engine validates it upstream): no comparisons, no record.
    Off,
}

impl DeviceChecks {
    /// `K3_DEVICE_CHECKS`: `on` (also unset or empty) or `off`; anything else is an error.
    pub fn from_env() -> Result<Self> {
        Self::parse(std::env::var("K3_DEVICE_CHECKS").ok().as_deref())
    }

    /// [`Self::from_env`] for a given value of the variable (`None`: unset).
    pub fn parse(value: Option<&str>) -> Result<Self> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "on" | "1") => Ok(DeviceChecks::On),
            Some("off" | "0") => Ok(DeviceChecks::Off),
            Some(other) => Err(Error::invalid("K3_DEVICE_CHECKS", format!("expected `on` or `off`, got `{other}`"))),
        }
    }
}

/// One check site of `csrc/k3/checks.h` (`enum CheckSite`): its number, its C++ name, the op
/// and the tensor (the field name the CPU reference reports), and what a count mismatch counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckSite {
    pub id: i32,
    pub cpp_name: &'static str,
    pub op: &'static str,
    pub tensor: &'static str,
    pub counts: &'static str,
}

const fn site(id: i32, cpp_name: &'static str, op: &'static str, tensor: &'static str, counts: &'static str) -> CheckSite {
    CheckSite { id, cpp_name, op, tensor, counts }
}

/// Every check site, as `csrc/k3/checks.h` numbers them (a test keeps the lists equal).
pub const SITES: &[CheckSite] = &[
    site(1, "kCheckMlaCacheWriteSlot", "mla_cache_write", "slot_mapping", ""),
    site(2, "kCheckMlaDecodeSeqLens", "mla_decode", "seq_lens", ""),
    site(3, "kCheckMlaDecodeBlockTable", "mla_decode", "block_table", ""),
    site(4, "kCheckMlaDecodeTokens", "mla_decode", "seq_lens", "tokens in the batch"),
    site(5, "kCheckMlaDecodeItems", "mla_decode", "seq_lens", "asm work items"),
    site(6, "kCheckMlaDecodeSplits", "mla_decode", "seq_lens", "split (sequence, head group) pairs"),
    site(7, "kCheckMlaPrefillAbsorbedSeqLens", "mla_prefill_absorbed", "seq_lens", ""),
    site(8, "kCheckMlaPrefillAbsorbedBlockTable", "mla_prefill_absorbed", "block_table", ""),
    site(9, "kCheckMlaPrefillAbsorbedCuQ", "mla_prefill_absorbed", "cu_seqlens_q", ""),
    site(10, "kCheckMlaPrefillCuQ", "mla_prefill", "cu_seqlens", ""),
    site(11, "kCheckMlaPrefillCuK", "mla_prefill", "cu_seqlens_k", ""),
    site(12, "kCheckKdaPrefillCuSeqlens", "kda_prefill", "cu_seqlens", "chunks"),
    site(13, "kCheckKdaPrefillCheckpoints", "kda_prefill", "checkpoint_offsets", "chunks"),
    site(14, "kCheckKdaPrefillStateIndices", "kda_prefill", "state_indices", ""),
    site(15, "kCheckKdaDecodeStateIndices", "kda_decode", "state_indices", ""),
    site(16, "kCheckConv1dCuSeqlens", "causal_conv1d", "cu_seqlens", ""),
    site(17, "kCheckConv1dStateIndices", "causal_conv1d", "state_indices", ""),
    site(18, "kCheckMoeAlignTopkIds", "moe_align", "topk_ids", ""),
    site(19, "kCheckMoeAlignExpertMap", "moe_align", "expert_map", ""),
    site(20, "kCheckMoeGemmExpertIds", "moe_grouped_gemm", "expert_ids", ""),
    site(21, "kCheckMoeGemmSortedTokenIds", "moe_grouped_gemm", "sorted_token_ids", ""),
    site(22, "kCheckMoeGemmPostPadded", "moe_grouped_gemm", "num_tokens_post_padded", ""),
    site(23, "kCheckEmbeddingIds", "embedding_gather", "ids", ""),
    site(24, "kCheckMlaDecodeCuIndptr", "mla_decode (asm schedule: cu_indptr)", "workspace", ""),
    site(25, "kCheckMlaDecodeScheduleItems", "mla_decode (asm schedule: items)", "workspace", ""),
    site(26, "kCheckMlaDecodeReduceMap", "mla_decode (asm schedule: reduce map)", "workspace", ""),
];

/// A decoded `k3::ErrorRecord`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceViolation {
    pub site: i32,
    pub kind: i32,
    pub row: i64,
    pub col: i64,
    pub value: i64,
    pub lo: i64,
    pub hi: i64,
}

impl DeviceViolation {
    /// The record in `bytes` (one slot), or `None` when its flag is clear.
    pub fn decode(bytes: &[u8; RECORD_BYTES]) -> Option<Self> {
        let i32_at = |o: usize| i32::from_le_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
        let i64_at = |o: usize| i64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
        (i32_at(0) != 0).then(|| DeviceViolation {
            site: i32_at(4),
            kind: i32_at(8),
            row: i64_at(16),
            col: i64_at(24),
            value: i64_at(32),
            lo: i64_at(40),
            hi: i64_at(48),
        })
    }

    /// The typed error: `InvalidInput` with the tensor as the field and the op, entry, value and
    /// bound in the reason.
    pub fn to_error(&self) -> Error {
        let Some(s) = SITES.iter().find(|s| s.id == self.site) else {
            return Error::Driver { call: "device check".into(), why: format!("unknown check site {} in {self:?}", self.site) };
        };
        let entry = if self.col >= 0 { format!("[{}][{}]", self.row, self.col) } else { self.row.to_string() };
        let what = match self.kind {
            0 => format!("entry {entry} is {}, outside [{}, {})", self.value, self.lo, self.hi),
            1 => format!("entries {} and {entry} both hold {} (a write race)", self.lo, self.value),
            2 => format!("the device values give {} {}, the plan was made for {}", self.value, s.counts, self.lo),
            3 => format!("entry {entry} is {}, not a multiple of {}", self.value, self.lo),
            k => format!("unknown violation kind {k}: {self:?}"),
        };
        Error::invalid(s.tensor, format!("{what} (found by the `{}` kernel on the device)", s.op))
    }
}

/// The per-stream records of one backend (see the module docs).
#[derive(Debug)]
pub(crate) struct CheckRecords<B> {
    pool: Mutex<B>,
    base: DevicePtr,
    /// Stream key of each taken slot, in slot order.
    keys: Mutex<Vec<u64>>,
}

impl<B> CheckRecords<B> {
    /// Allocates and zeroes the pool on `rt`'s default stream, and waits for it.
    pub(crate) fn new<R: Runtime<Buffer = B>>(rt: &R) -> Result<Self> {
        let mut pool = rt.alloc(RECORD_BYTES * RECORD_SLOTS)?;
        rt.memset(&mut pool, 0, rt.default_stream())?;
        rt.synchronize_stream(rt.default_stream())?;
        let base = rt.device_ptr(&pool);
        Ok(CheckRecords { pool: Mutex::new(pool), base, keys: Mutex::new(Vec::new()) })
    }

    /// The record a launch on the stream with this key writes to (a new slot for a new stream).
    pub(crate) fn record_for(&self, key: u64) -> Result<DevicePtr> {
        let mut keys = self.keys.lock().map_err(|_| poisoned())?;
        let slot = match keys.iter().position(|&k| k == key) {
            Some(i) => i,
            None if keys.len() < RECORD_SLOTS => {
                keys.push(key);
                keys.len() - 1
            }
            None => RECORD_SLOTS - 1,
        };
        Ok(self.base.offset((slot * RECORD_BYTES) as u64))
    }

    /// Reads the record of the stream with this key (none if it never ran a checked kernel) and
    /// clears it if a violation is there. The caller has synchronised the stream.
    pub(crate) fn take<R: Runtime<Buffer = B>>(&self, rt: &R, key: u64, stream: &R::Stream) -> Result<()> {
        let slot = self.keys.lock().map_err(|_| poisoned())?.iter().position(|&k| k == key);
        match slot {
            Some(slot) => self.take_slots(rt, slot, 1, stream),
            None => Ok(()),
        }
    }

    /// [`Self::take`] for every stream, in one copy; returns the first violation in slot order
    /// and clears every record that held one. The caller has synchronised every stream.
    pub(crate) fn take_all<R: Runtime<Buffer = B>>(&self, rt: &R, stream: &R::Stream) -> Result<()> {
        let used = self.keys.lock().map_err(|_| poisoned())?.len();
        self.take_slots(rt, 0, used, stream)
    }

    fn take_slots<R: Runtime<Buffer = B>>(&self, rt: &R, first: usize, count: usize, stream: &R::Stream) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let mut pool = self.pool.lock().map_err(|_| poisoned())?;
        let mut bytes = vec![0u8; count * RECORD_BYTES];
        rt.copy_d2h(&pool, first * RECORD_BYTES, &mut bytes, stream)?;
        let mut found = None;
        for (i, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
            let rec: &[u8; RECORD_BYTES] = rec.try_into().map_err(|_| poisoned())?;
            if let Some(v) = DeviceViolation::decode(rec) {
                rt.copy_h2d(&[0u8; RECORD_BYTES], &mut pool, (first + i) * RECORD_BYTES, stream)?;
                found.get_or_insert(v);
            }
        }
        match found {
            Some(v) => {
                rt.synchronize_stream(stream)?;
                Err(v.to_error())
            }
            None => Ok(()),
        }
    }
}

fn poisoned() -> Error {
    Error::Driver { call: "device check records".into(), why: "lock poisoned".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's site list is the header's `enum CheckSite`, name for name and number for number.
    #[test]
    fn sites_match_the_header() {
        let header = include_str!("../csrc/k3/checks.h");
        let body = header.split("enum CheckSite : int {").nth(1).and_then(|s| s.split("};").next()).expect("enum CheckSite");
        let cpp: Vec<(String, i32)> = body
            .lines()
            .filter_map(|l| {
                let (name, num) = l.trim().trim_end_matches(',').split_once(" = ")?;
                Some((name.to_string(), num.parse().ok()?))
            })
            .collect();
        let rust: Vec<(String, i32)> = SITES.iter().map(|s| (s.cpp_name.to_string(), s.id)).collect();
        assert_eq!(cpp, rust);
    }

    #[test]
    fn records_decode_to_errors_naming_the_tensor() {
        let mut b = [0u8; RECORD_BYTES];
        assert_eq!(DeviceViolation::decode(&b), None);
        b[0] = 1;
        b[4..8].copy_from_slice(&3i32.to_le_bytes());
        for (o, v) in [(16, 2i64), (24, 5), (32, 100_000), (40, 0), (48, 64)] {
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        let e = DeviceViolation::decode(&b).expect("flag set").to_error();
        assert_eq!(e.field(), Some("block_table"));
        let msg = e.to_string();
        assert!(msg.contains("entry [2][5] is 100000, outside [0, 64)") && msg.contains("mla_decode"), "{msg}");
    }

    #[test]
    fn env_values() {
        assert_eq!(DeviceChecks::parse(None).ok(), Some(DeviceChecks::On));
        assert_eq!(DeviceChecks::parse(Some(" OFF ")).ok(), Some(DeviceChecks::Off));
        assert_eq!(DeviceChecks::parse(Some("on")).ok(), Some(DeviceChecks::On));
        assert_eq!(DeviceChecks::parse(Some("sometimes")).unwrap_err().field(), Some("K3_DEVICE_CHECKS"));
    }
}
