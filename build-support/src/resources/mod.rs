//! Per-kernel resource figures read from compiled images, without a GPU: registers, spills and
//! scratch, static shared memory, and static instruction counts (matrix instructions, global-load
//! widths, async and bulk copies, out-of-line calls) from the disassembly.
//!
//! - [`sass`]: NVIDIA cubins (`cuobjdump -res-usage`, `nvdisasm -c`);
//! - [`amdgpu`]: AMD code objects (`llvm-readelf --notes`, `llvm-objdump -d`) or `clang -S`
//!   assembly (its `.amdgpu_metadata` block carries the same figures);
//! - [`occupancy`]: resident blocks per SM / CU and what limits them, per target;
//! - [`gate`]: conditions on these figures that a CI step can enforce;
//! - [`collect`]: runs the tools over the images `compile_cuda` / `compile_hip` produced.
//!
//! Every count is **static**: instructions in the binary, each counted once whatever the loop
//! trip counts, so a load in a loop body weighs as much as one in the prologue. What a kernel
//! executes needs a profiler on the hardware.

pub mod amdgpu;
pub mod collect;
pub mod gate;
pub mod occupancy;
pub mod sass;

use std::collections::{BTreeMap, BTreeSet};

/// Which vendor's binary a figure was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// Static instruction counts of one function (or of a kernel and everything it calls).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    /// Matrix instructions per class: `mma.sync` (HMMA/IMMA/QMMA/DMMA), `wgmma` (HGMMA...),
    /// `tcgen05` (UTC*MMA), `mfma` (v_mfma*), `smfmac` (v_smfmac*).
    pub matrix: BTreeMap<String, u64>,
    /// Matrix instructions per exact mnemonic (`HMMA.16816.F32.BF16`, `v_mfma_f32_16x16x16_bf16`).
    pub matrix_forms: BTreeMap<String, u64>,
    /// Synchronous global loads (NVIDIA `LDG` and generic `LD`; AMD `global_load`, `buffer_load`,
    /// `flat_load`) per access width in bytes.
    pub global_loads: BTreeMap<u32, u64>,
    /// Of those, generic/flat loads (NVIDIA `LD`, AMD `flat_load`): the compiler could not prove
    /// the pointer global.
    pub flat_loads: u64,
    /// Asynchronous global-to-shared copies per width (NVIDIA `LDGSTS`, AMD `global_load_lds_*`
    /// and `buffer_load ... lds`).
    pub async_loads: BTreeMap<u32, u64>,
    /// Bulk / tensor-memory-accelerator copies (NVIDIA `UTMALDG`, `UTMASTG`, `UBLKCP`, ...).
    pub tma: u64,
    /// Local (NVIDIA `LDL`) / scratch (AMD `scratch_load*`) loads: spills and private arrays.
    pub scratch_loads: u64,
    /// Local (NVIDIA `STL`) / scratch (AMD `scratch_store*`) stores.
    pub scratch_stores: u64,
    /// Call sites (NVIDIA `CALL`, AMD `s_swappc_b64` and tail-call `s_setpc_b64`).
    pub calls: u64,
}

impl CodeStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &CodeStats) {
        for (k, v) in &other.matrix {
            *self.matrix.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.matrix_forms {
            *self.matrix_forms.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.global_loads {
            *self.global_loads.entry(*k).or_default() += v;
        }
        for (k, v) in &other.async_loads {
            *self.async_loads.entry(*k).or_default() += v;
        }
        self.flat_loads += other.flat_loads;
        self.tma += other.tma;
        self.scratch_loads += other.scratch_loads;
        self.scratch_stores += other.scratch_stores;
        self.calls += other.calls;
    }

    pub(crate) fn matrix_op(&mut self, class: &str, form: &str) {
        *self.matrix.entry(class.to_string()).or_default() += 1;
        *self.matrix_forms.entry(form.to_string()).or_default() += 1;
    }

    pub(crate) fn global_load(&mut self, width: u32, flat: bool) {
        *self.global_loads.entry(width).or_default() += 1;
        self.flat_loads += u64::from(flat);
    }

    pub(crate) fn async_load(&mut self, width: u32) {
        *self.async_loads.entry(width).or_default() += 1;
    }

    pub fn matrix_total(&self) -> u64 {
        self.matrix.values().sum()
    }

    /// Bytes of global loads (synchronous and asynchronous), each instruction weighted by its
    /// width, and those issued by instructions of at least 16 bytes.
    pub fn load_bytes(&self) -> (u64, u64) {
        let mut total = 0;
        let mut wide = 0;
        for (w, n) in self.global_loads.iter().chain(&self.async_loads) {
            let bytes = u64::from(*w) * n;
            total += bytes;
            if *w >= 16 {
                wide += bytes;
            }
        }
        (total, wide)
    }
}

/// One function of a disassembly: its own instructions and the functions it calls (one entry
/// per call site; unresolved targets are named `?`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub stats: CodeStats,
    pub callees: Vec<String>,
}

/// A kernel's counts with everything it calls (each reachable function once), the scratch
/// loads/stores inside those callees, and the callees' names.
pub fn with_callees(functions: &[Function], kernel: &str) -> Option<(CodeStats, u64, Vec<String>)> {
    let root = functions.iter().find(|f| f.name == kernel)?;
    let mut stats = root.stats.clone();
    let mut callee_scratch = 0;
    let mut seen: BTreeSet<&str> = BTreeSet::from([kernel]);
    let mut stack: Vec<&str> = root.callees.iter().map(String::as_str).collect();
    let mut names = BTreeSet::new();
    while let Some(name) = stack.pop() {
        if !seen.insert(name) {
            continue;
        }
        names.insert(name.to_string());
        if let Some(f) = functions.iter().find(|f| f.name == name) {
            stats.add(&f.stats);
            callee_scratch += f.stats.scratch_loads + f.stats.scratch_stores;
            stack.extend(f.callees.iter().map(String::as_str));
        }
    }
    Some((stats, callee_scratch, names.into_iter().collect()))
}

/// Everything the report says about one kernel on one target.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelResources {
    pub kernel: String,
    /// The translation unit (`ops/mla_decode.cu`).
    pub source: String,
    /// `sm_90a`, `gfx942`, ...
    pub target: String,
    pub vendor: Vendor,
    /// NVIDIA: registers per thread. AMD: architected VGPRs per lane (rounded up to 4 when the
    /// kernel also uses AGPRs, as the unified register file allocates them).
    pub regs: u32,
    /// AMD: accumulation VGPRs (AGPRs) per lane.
    pub agprs: Option<u32>,
    /// AMD: scalar registers per wave (with VCC and the other reserved ones).
    pub sgprs: Option<u32>,
    /// AMD: registers the compiler spilled to scratch memory (`.vgpr_spill_count`).
    pub vgpr_spills: Option<u32>,
    /// AMD: scalar registers spilled (to VGPR lanes, or to scratch when those run out).
    pub sgpr_spills: Option<u32>,
    /// AMD: the largest workgroup the code object accepts (`.max_flat_workgroup_size`).
    pub max_block_threads: Option<u32>,
    /// Static shared memory / LDS per block (NVIDIA: without the driver's 1 KiB reservation).
    pub static_shared_bytes: u64,
    /// Per-thread stack + local memory (NVIDIA) or private segment (AMD) in bytes.
    pub scratch_bytes: u64,
    /// The kernel's instructions plus those of every function it calls.
    pub code: CodeStats,
    /// Local/scratch loads and stores inside the called functions.
    pub callee_scratch_ops: u64,
    /// Functions the kernel calls, directly or not.
    pub callees: Vec<String>,
}

impl KernelResources {
    /// Names of the numeric figures [`KernelResources::metric`] answers (gates use them).
    pub const METRICS: &'static [&'static str] = &[
        "regs",
        "agprs",
        "unified_vgprs",
        "sgprs",
        "vgpr_spills",
        "sgpr_spills",
        "static_shared_bytes",
        "scratch_bytes",
        "scratch_loads",
        "scratch_stores",
        "calls",
        "callee_scratch_ops",
        "matrix_total",
        "async_loads",
        "tma",
        "global_loads",
        "flat_loads",
        "global_load_bytes",
        "wide_load_bytes",
        "wide_load_share",
    ];

    /// A numeric figure by name; `None` when it does not apply to this vendor (AGPRs on NVIDIA)
    /// or has no value (the 16-byte share of a kernel without global loads).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let c = &self.code;
        let (bytes, wide) = c.load_bytes();
        let v = match name {
            "regs" => u64::from(self.regs),
            "agprs" => u64::from(self.agprs?),
            "unified_vgprs" => u64::from(self.regs) + u64::from(self.agprs?),
            "sgprs" => u64::from(self.sgprs?),
            "vgpr_spills" => u64::from(self.vgpr_spills?),
            "sgpr_spills" => u64::from(self.sgpr_spills?),
            "static_shared_bytes" => self.static_shared_bytes,
            "scratch_bytes" => self.scratch_bytes,
            "scratch_loads" => c.scratch_loads,
            "scratch_stores" => c.scratch_stores,
            "calls" => c.calls,
            "callee_scratch_ops" => self.callee_scratch_ops,
            "matrix_total" => c.matrix_total(),
            "async_loads" => c.async_loads.values().sum(),
            "tma" => c.tma,
            "global_loads" => c.global_loads.values().sum(),
            "flat_loads" => c.flat_loads,
            "global_load_bytes" => bytes,
            "wide_load_bytes" => wide,
            "wide_load_share" => return (bytes > 0).then(|| wide as f64 / bytes as f64),
            _ => return None,
        };
        Some(v as f64)
    }
}

/// Splits an instruction line's text into mnemonic and operands, skipping a predicate guard
/// (`@P0`, `@!UP1`) in front of the mnemonic.
pub(crate) fn mnemonic_and_operands(body: &str) -> Option<(&str, &str)> {
    let mut rest = body.trim_start();
    if rest.starts_with('@') {
        let end = rest.find(char::is_whitespace)?;
        rest = rest[end..].trim_start();
    }
    let end = rest.find(|c: char| c.is_whitespace() || c == ';').unwrap_or(rest.len());
    let (m, ops) = rest.split_at(end);
    (!m.is_empty()).then_some((m, ops.trim().trim_end_matches(';').trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, scratch: u64, mfma: u64, callees: &[&str]) -> Function {
        let mut stats = CodeStats { scratch_stores: scratch, calls: callees.len() as u64, ..Default::default() };
        for _ in 0..mfma {
            stats.matrix_op("mfma", "v_mfma_f32_16x16x16_bf16");
        }
        Function { name: name.into(), stats, callees: callees.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn callees_are_counted_once_and_transitively() {
        // k calls a twice and b; a calls c; c calls a (a cycle); b is not in the listing.
        let fs = [f("k", 0, 1, &["a", "a", "b"]), f("a", 2, 3, &["c"]), f("c", 5, 0, &["a"]), f("other", 7, 9, &[])];
        let (stats, callee_scratch, names) = with_callees(&fs, "k").expect("k is listed");
        assert_eq!(stats.matrix_total(), 4, "k's own MFMA plus a's");
        assert_eq!(callee_scratch, 7, "a and c, each once");
        assert_eq!(stats.calls, 3 + 1 + 1);
        assert_eq!(names, ["a", "b", "c"]);
        assert!(with_callees(&fs, "missing").is_none());
    }

    #[test]
    fn wide_share_weighs_instructions_by_width() {
        let mut c = CodeStats::default();
        c.global_load(16, false);
        c.global_load(4, true);
        c.global_load(4, false);
        c.async_load(16);
        assert_eq!(c.load_bytes(), (40, 32));
        let r = KernelResources {
            kernel: "k".into(),
            source: "s.cu".into(),
            target: "sm_90a".into(),
            vendor: Vendor::Nvidia,
            regs: 32,
            agprs: None,
            sgprs: None,
            vgpr_spills: None,
            sgpr_spills: None,
            max_block_threads: None,
            static_shared_bytes: 0,
            scratch_bytes: 0,
            code: c,
            callee_scratch_ops: 0,
            callees: Vec::new(),
        };
        assert_eq!(r.metric("wide_load_share"), Some(0.8));
        assert_eq!(r.metric("flat_loads"), Some(1.0));
        assert_eq!(r.metric("agprs"), None, "not an NVIDIA figure");
        assert_eq!(r.metric("unified_vgprs"), None, "not an NVIDIA figure");
        for m in KernelResources::METRICS {
            assert!(r.metric(m).is_some() || ["agprs", "unified_vgprs", "sgprs", "vgpr_spills", "sgpr_spills"].contains(m), "{m}");
        }
        assert_eq!(r.metric("no_such_metric"), None);
        let amd = KernelResources { target: "gfx942".into(), vendor: Vendor::Amd, regs: 200, agprs: Some(40), ..r };
        assert_eq!(amd.metric("unified_vgprs"), Some(240.0));
    }

    #[test]
    fn predicates_are_skipped() {
        assert_eq!(mnemonic_and_operands("  @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;"), Some(("LDG.E.128", "R4, desc[UR4][R2.64]")));
        assert_eq!(mnemonic_and_operands("EXIT ;"), Some(("EXIT", "")));
        assert_eq!(mnemonic_and_operands("\tv_mfma_f32_16x16x16_bf16 v[0:3], v[4:5]"), Some(("v_mfma_f32_16x16x16_bf16", "v[0:3], v[4:5]")));
        assert_eq!(mnemonic_and_operands("   "), None);
    }
}
