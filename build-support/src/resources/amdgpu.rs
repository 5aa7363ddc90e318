//! AMD code objects: the AMDGPU metadata (`amdhsa.kernels` YAML, from `llvm-readelf --notes` of
//! a code object or the `.amdgpu_metadata` block of `clang -S` output) and the instruction
//! listing (`llvm-objdump -d` of a code object, or the assembly itself). Both listing formats
//! name every function; a call (`s_getpc_b64` + `s_add_u32`/`s_addc_u32` + `s_swappc_b64`) is
//! resolved to its callee from the relocation symbol (assembly) or by computing the target
//! address (disassembly).

use super::{mnemonic_and_operands, with_callees, CodeStats, Function, KernelResources, Vendor};
use std::collections::BTreeMap;

/// The figures of one `amdhsa.kernels` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelMeta {
    pub name: String,
    /// Unified VGPRs per lane: architected (rounded up to 4 when AGPRs follow) plus AGPRs.
    pub vgpr_count: u32,
    pub agpr_count: u32,
    pub sgpr_count: u32,
    pub vgpr_spill_count: u32,
    pub sgpr_spill_count: u32,
    /// Scratch bytes per work-item (spills, private arrays, call stack).
    pub private_segment_fixed_size: u64,
    /// Static LDS bytes per workgroup.
    pub group_segment_fixed_size: u64,
    pub max_flat_workgroup_size: u32,
    pub wavefront_size: u32,
}

/// Parses the `amdhsa.kernels` list of AMDGPU metadata YAML (the layout LLVM writes: one
/// `- ` item per kernel, its keys one level deeper, nested `.args` items deeper still).
pub fn parse_metadata(text: &str) -> Vec<KernelMeta> {
    let mut out = Vec::new();
    let mut lines = text.lines().skip_while(|l| l.trim() != "amdhsa.kernels:");
    if lines.next().is_none() {
        return out;
    }
    let mut item_indent: Option<usize> = None;
    let mut current: Option<KernelMeta> = None;
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let item_start = t.starts_with("- ");
        let level = *item_indent.get_or_insert(indent);
        if indent < level || (indent == level && !item_start) {
            break; // the next top-level key (`amdhsa.target:`)
        }
        let key_value = if indent == level && item_start {
            out.extend(current.take());
            current = Some(KernelMeta::default());
            &t[2..]
        } else if indent == level + 2 {
            t
        } else {
            continue; // nested (`.args` entries)
        };
        let (Some(m), Some((k, v))) = (current.as_mut(), key_value.split_once(':')) else { continue };
        let v = v.trim();
        let num = || v.parse::<u64>().unwrap_or(0);
        let small = || u32::try_from(num()).unwrap_or(u32::MAX);
        match k.trim() {
            ".name" => m.name = v.to_string(),
            ".vgpr_count" => m.vgpr_count = small(),
            ".agpr_count" => m.agpr_count = small(),
            ".sgpr_count" => m.sgpr_count = small(),
            ".vgpr_spill_count" => m.vgpr_spill_count = small(),
            ".sgpr_spill_count" => m.sgpr_spill_count = small(),
            ".private_segment_fixed_size" => m.private_segment_fixed_size = num(),
            ".group_segment_fixed_size" => m.group_segment_fixed_size = num(),
            ".max_flat_workgroup_size" => m.max_flat_workgroup_size = small(),
            ".wavefront_size" => m.wavefront_size = small(),
            _ => {}
        }
    }
    out.extend(current);
    out
}

/// Access width in bytes of a vector-memory load suffix (`dwordx4` 16, `ushort` 2, `b128` 16).
fn load_width(suffix: &str) -> u32 {
    match suffix {
        "dwordx4" | "b128" | "format_xyzw" => 16,
        "dwordx3" | "b96" | "format_xyz" => 12,
        "dwordx2" | "b64" | "format_xy" => 8,
        "ubyte" | "sbyte" | "ubyte_d16" | "ubyte_d16_hi" | "sbyte_d16" | "sbyte_d16_hi" | "u8" | "i8" | "d16_u8"
        | "d16_i8" | "d16_hi_u8" | "d16_hi_i8" => 1,
        "ushort" | "sshort" | "short_d16" | "short_d16_hi" | "u16" | "i16" | "d16_b16" | "d16_hi_b16" => 2,
        _ => 4, // dword, b32, format_x
    }
}

/// Scalar registers `s5` (5, 5) or `s[4:5]` (4, 5).
fn sreg_range(op: &str) -> Option<(u32, u32)> {
    let op = op.trim();
    if let Some(r) = op.strip_prefix("s[") {
        let (a, b) = r.strip_suffix(']')?.split_once(':')?;
        return Some((a.parse().ok()?, b.parse().ok()?));
    }
    let n = op.strip_prefix('s')?.parse().ok()?;
    Some((n, n))
}

/// Scalar-register number of `s5` or the first of `s[4:5]`.
fn sreg(op: &str) -> Option<u32> {
    sreg_range(op).map(|(a, _)| a)
}

fn literal(op: &str) -> Option<u64> {
    let op = op.trim();
    match op.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => op.parse::<i64>().ok().map(|v| v as u64),
    }
}

/// How a called address is being built up in a scalar register pair.
#[derive(Clone, Debug, Default)]
struct PendingTarget {
    /// `s_getpc_b64` result: the address of the next instruction (disassembly only).
    pc: Option<u64>,
    lo: Option<u64>,
    hi: Option<u64>,
    symbol: Option<String>,
}

/// One listing function being read, with the call targets being assembled in its registers.
struct Reader {
    function: Function,
    pending: BTreeMap<u32, PendingTarget>,
}

impl Reader {
    fn new(name: &str) -> Self {
        Reader { function: Function { name: name.to_string(), ..Default::default() }, pending: BTreeMap::new() }
    }

    fn instruction(&mut self, mnemonic: &str, operands: &str, address: Option<u64>, by_address: &BTreeMap<u64, String>) {
        let ops: Vec<&str> = operands.split(',').map(str::trim).collect();
        let tracked = matches!(mnemonic, "s_getpc_b64" | "s_add_u32" | "s_addc_u32" | "s_swappc_b64" | "s_setpc_b64");
        if !tracked && (mnemonic.starts_with("s_") || mnemonic.starts_with("v_read")) {
            // Any other write to a register pair that held a call target in the making (the
            // return address restored into s[30:31], a table address reused) ends it.
            if let Some((lo, hi)) = ops.first().and_then(|o| sreg_range(o)) {
                self.pending.retain(|&k, _| k + 1 < lo || k > hi);
            }
        }
        let s: &mut CodeStats = &mut self.function.stats;
        if mnemonic.starts_with("v_mfma") {
            s.matrix_op("mfma", mnemonic);
        } else if mnemonic.starts_with("v_smfmac") {
            s.matrix_op("smfmac", mnemonic);
        } else if let Some((kind, suffix)) = ["global_load_", "buffer_load_", "flat_load_"]
            .iter()
            .find_map(|p| mnemonic.strip_prefix(p).map(|rest| (*p, rest)))
        {
            let (suffix, to_lds) = match suffix.strip_prefix("lds_") {
                Some(rest) => (rest, true),
                None => (suffix, kind == "buffer_load_" && operands.split_whitespace().any(|w| w == "lds")),
            };
            if to_lds {
                s.async_load(load_width(suffix));
            } else {
                s.global_load(load_width(suffix), kind == "flat_load_");
            }
        } else if mnemonic.starts_with("scratch_load") {
            s.scratch_loads += 1;
        } else if mnemonic.starts_with("scratch_store") {
            s.scratch_stores += 1;
        } else if mnemonic == "s_getpc_b64" {
            if let Some(r) = ops.first().and_then(|o| sreg(o)) {
                self.pending.insert(r, PendingTarget { pc: address.map(|a| a + 4), ..Default::default() });
            }
        } else if mnemonic == "s_add_u32" || mnemonic == "s_addc_u32" {
            let (Some(dst), Some(src)) = (ops.first().and_then(|o| sreg(o)), ops.get(2)) else { return };
            let key = if mnemonic == "s_add_u32" { dst } else { dst.wrapping_sub(1) };
            let Some(p) = self.pending.get_mut(&key) else { return };
            if let Some((sym, _)) = src.split_once("@rel32@") {
                p.symbol = Some(sym.to_string());
            } else if mnemonic == "s_add_u32" {
                p.lo = literal(src);
            } else {
                p.hi = literal(src);
            }
        } else if mnemonic == "s_swappc_b64" || mnemonic == "s_setpc_b64" {
            let swap = mnemonic == "s_swappc_b64";
            let target_reg = if swap { ops.get(1) } else { ops.first() };
            // (name, whether it names a function entry)
            let target = target_reg.and_then(|o| sreg(o)).and_then(|r| self.pending.get(&r)).and_then(|p| {
                match &p.symbol {
                    Some(sym) => Some((sym.clone(), !sym.starts_with(".L"))),
                    None => {
                        let addr = p.pc?.wrapping_add(p.lo? & 0xffff_ffff).wrapping_add(p.hi.unwrap_or(0) << 32);
                        Some(by_address.get(&addr).map_or_else(|| (format!("{addr:#x}"), false), |n| (n.clone(), true)))
                    }
                }
            });
            // `s_setpc_b64 s[30:31]` returns, and an `s_setpc_b64` to a built-up address that is
            // no function entry is a long branch (gfx942 emits them past a 16-bit branch
            // offset); only a function entry makes it a tail call. An `s_swappc_b64` is a call
            // whatever its target.
            match target {
                Some((name, entry)) if swap || entry => {
                    s.calls += 1;
                    self.function.callees.push(name);
                }
                None if swap => {
                    s.calls += 1;
                    self.function.callees.push("?".into());
                }
                _ => {}
            }
        }
    }
}

/// An `llvm-objdump -d` function label: `0000000000001a00 <name>:`.
fn objdump_label(line: &str) -> Option<(u64, &str)> {
    let (addr, rest) = line.split_once(" <")?;
    let name = rest.strip_suffix(">:")?;
    Some((u64::from_str_radix(addr, 16).ok()?, name))
}

/// Parses `llvm-objdump -d` output or `clang -S` assembly into its functions.
pub fn parse_listing(text: &str) -> Vec<Function> {
    let by_address: BTreeMap<u64, String> =
        text.lines().filter_map(objdump_label).map(|(a, n)| (a, n.to_string())).collect();
    let mut declared: Vec<&str> = Vec::new(); // `.type name,@function` (assembly)
    let mut out = Vec::new();
    let mut current: Option<Reader> = None;
    for line in text.lines() {
        if let Some((_, name)) = objdump_label(line) {
            out.extend(current.take().map(|r| r.function));
            current = Some(Reader::new(name));
            continue;
        }
        let t = line.trim();
        if let Some(decl) = t.strip_prefix(".type").map(str::trim) {
            if let Some(name) = decl.strip_suffix(",@function") {
                declared.push(name.trim());
            }
            continue;
        }
        // Assembly labels: a declared function starts, `.Lfunc_end` ends one.
        let code = t.split(';').next().unwrap_or("").trim();
        if let Some(label) = code.strip_suffix(':') {
            if declared.contains(&label) {
                out.extend(current.take().map(|r| r.function));
                current = Some(Reader::new(label));
            } else if label.starts_with(".Lfunc_end") {
                out.extend(current.take().map(|r| r.function));
            }
            continue;
        }
        let Some(reader) = current.as_mut() else { continue };
        if code.starts_with('.') || !code.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        // Disassembly: `\ts_getpc_b64 s[0:1]   // 000000007AC8: BE801C00`.
        let (code, address) = match code.split_once("//") {
            Some((c, comment)) => {
                (c.trim(), comment.trim().split(':').next().and_then(|a| u64::from_str_radix(a.trim(), 16).ok()))
            }
            None => (code, None),
        };
        if let Some((mnemonic, operands)) = mnemonic_and_operands(code) {
            reader.instruction(mnemonic, operands, address, &by_address);
        }
    }
    out.extend(current.map(|r| r.function));
    out
}

/// Joins metadata and listing of one code object (or one assembly file) into per-kernel
/// resources. A kernel in the metadata but not in the listing is an error.
pub fn kernels(source: &str, target: &str, metadata: &str, listing: &str) -> Result<Vec<KernelResources>, String> {
    let functions = parse_listing(listing);
    let mut out = Vec::new();
    for m in parse_metadata(metadata) {
        let (code, callee_scratch_ops, callees) = with_callees(&functions, &m.name)
            .ok_or_else(|| format!("{source} {target}: kernel {} is in the metadata but not in the listing", m.name))?;
        out.push(KernelResources {
            kernel: m.name.clone(),
            source: source.to_string(),
            target: target.to_string(),
            vendor: Vendor::Amd,
            regs: m.vgpr_count.saturating_sub(m.agpr_count),
            agprs: Some(m.agpr_count),
            sgprs: Some(m.sgpr_count),
            vgpr_spills: Some(m.vgpr_spill_count),
            sgpr_spills: Some(m.sgpr_spill_count),
            max_block_threads: Some(m.max_flat_workgroup_size),
            static_shared_bytes: m.group_segment_fixed_size,
            scratch_bytes: m.private_segment_fixed_size,
            code,
            callee_scratch_ops,
            callees,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTES_942: &str = include_str!("../../tests/fixtures/gfx942.probe.notes.txt");
    const DIS_942: &str = include_str!("../../tests/fixtures/gfx942.probe.objdump.txt");
    const ASM_950: &str = include_str!("../../tests/fixtures/gfx950.probe.s");
    const MOE_942: &str = include_str!("../../tests/fixtures/gfx942.moe_gemm.objdump.txt");

    #[test]
    fn metadata_from_notes_and_assembly() {
        let m = parse_metadata(NOTES_942);
        assert_eq!(m.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["probe_loads", "probe_mfma"]);
        let l = &m[0];
        assert_eq!((l.vgpr_count, l.agpr_count, l.sgpr_count), (16, 0, 39));
        assert_eq!((l.group_segment_fixed_size, l.private_segment_fixed_size), (4096, 0));
        assert_eq!((l.max_flat_workgroup_size, l.wavefront_size), (1024, 64));
        // The same YAML inside `clang -S` output, where nested `.args` items carry `.offset`,
        // `.size` and `.address_space` keys that must not leak into the kernel's figures.
        let a = parse_metadata(ASM_950);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].name.as_str(), a[0].vgpr_count, a[0].group_segment_fixed_size), ("probe_loads", 16, 4096));
        assert_eq!((a[1].name.as_str(), a[1].sgpr_count), ("probe_mfma", 14));
        assert!(parse_metadata("no metadata here").is_empty());
    }

    #[test]
    fn objdump_listing_resolves_calls_by_address() {
        let fs = parse_listing(DIS_942);
        let names: Vec<&str> = fs.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["_Z8scratchyPKfi", "probe_loads", "probe_mfma"]);
        let loads = &fs[1];
        assert_eq!(loads.callees, ["_Z8scratchyPKfi"], "s_getpc 0x1B74 + 4 + 0xfffffe88 - 2^32 = 0x1A00");
        assert_eq!(loads.stats.global_loads, BTreeMap::from([(4, 1), (8, 1), (16, 1)]));
        assert_eq!(fs[0].stats.flat_loads, 1, "the callee's pointer argument is generic");
        assert_eq!(fs[0].stats.calls, 0, "s_setpc_b64 s[30:31] is a return");
        assert_eq!(fs[2].stats.matrix_forms, BTreeMap::from([("v_mfma_f32_16x16x16_bf16".to_string(), 1)]));
        let (with, callee_scratch, callees) = with_callees(&fs, "probe_loads").expect("listed");
        assert_eq!(with.flat_loads, 1, "the callee's loads count for the kernel");
        assert_eq!((callee_scratch, callees), (0, vec!["_Z8scratchyPKfi".to_string()]));
    }

    #[test]
    fn assembly_listing_resolves_calls_by_symbol() {
        let fs = parse_listing(ASM_950);
        let names: Vec<&str> = fs.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["_Z8scratchyPKfi", "probe_loads", "probe_mfma"], "__hip_cuid_* is an object, not a function");
        let loads = &fs[1];
        assert_eq!(loads.callees, ["_Z8scratchyPKfi"]);
        assert_eq!(loads.stats.async_loads, BTreeMap::from([(16, 1)]), "global_load_lds_dwordx4");
        assert_eq!(loads.stats.global_loads.get(&16), Some(&1));
        assert_eq!(fs[2].stats.matrix["mfma"], 1);
    }

    #[test]
    fn out_of_line_callees_carry_scratch_and_matrix_work() {
        let fs = parse_listing(MOE_942);
        let k = fs.iter().find(|f| f.name == "moe_gemm_grouped_mma").expect("kernel listed");
        assert_eq!(k.stats.calls, 2);
        let block = "_ZN12_GLOBAL__N_118moe_gemm_mma_blockIN2k36layout9M16N16K16ELb1EEEvPKvllS5_lllPKhlllPKilS9_lS9_PKfllPvilliiiiiiiffi";
        assert_eq!(k.callees[0], block, "0x7ACC + 0x328 = 0x7DF4");
        assert!(k.callees[1].ends_with("Lb0EEEvPKvllS5_lllPKhlllPKilS9_lS9_PKfllPvilliiiiiiiffi"), "0x7DCC + 0xCB48 = 0x14914");
        assert!(k.stats.scratch_stores > 0, "arguments passed on the stack");
        assert_eq!(k.stats.matrix_total(), 0, "the MFMAs live in the callees");
        let (with, callee_scratch, callees) = with_callees(&fs, "moe_gemm_grouped_mma").expect("listed");
        assert_eq!(callees.len(), 2);
        assert!(with.matrix_total() > 0 && callee_scratch > 0);
    }

    #[test]
    fn a_restored_return_address_is_not_a_call_target() {
        // `attend` on gfx942 builds a table address in s[30:31] with s_getpc_b64 and later
        // restores its return address there; the final `s_setpc_b64 s[30:31]` is a return.
        let text = "0000000000001000 <f>:\n\
            \ts_getpc_b64 s[30:31]      // 000000001000: BE9E1C00\n\
            \ts_add_u32 s30, s30, 0x40  // 000000001004: 801EFF1E 00000040\n\
            \ts_addc_u32 s31, s31, 0    // 00000000100C: 821FFF1F 00000000\n\
            \tv_readlane_b32 s30, v40, 0 // 000000001014: D2890 01E\n\
            \tv_readlane_b32 s31, v40, 1 // 00000000101C: D2890 01F\n\
            \ts_setpc_b64 s[30:31]      // 000000001024: BE801D1E\n";
        let fs = parse_listing(text);
        assert_eq!((fs[0].stats.calls, fs[0].callees.len()), (0, 0), "{:?}", fs[0]);
        assert_eq!(sreg_range("s[30:31]"), Some((30, 31)));
        assert_eq!(sreg_range("s7"), Some((7, 7)));
        assert_eq!(sreg_range("v7"), None);
    }

    #[test]
    fn a_long_branch_is_not_a_call() {
        // Past the reach of s_branch's 16-bit offset gfx942 jumps with s_getpc_b64 +
        // s_add/s_addc + s_setpc_b64 to a block of the same function; a tail call's target is
        // a function entry.
        let text = "0000000000001000 <f>:\n\
            \ts_getpc_b64 s[4:5]        // 000000001000: BE841C00\n\
            \ts_add_u32 s4, s4, 0x10    // 000000001004: 8004FF04 00000010\n\
            \ts_addc_u32 s5, s5, 0      // 00000000100C: 82058005\n\
            \ts_setpc_b64 s[4:5]        // 000000001010: BE801D04\n\
            \ts_getpc_b64 s[6:7]        // 000000001014: BE861C00\n\
            \ts_add_u32 s6, s6, 0xfe8   // 000000001018: 8006FF06 00000FE8\n\
            \ts_addc_u32 s7, s7, 0      // 000000001020: 82078007\n\
            \ts_setpc_b64 s[6:7]        // 000000001024: BE801D06\n\
            \ts_endpgm                  // 000000001028: BF810000\n\
            0000000000002000 <g>:\n\
            \ts_setpc_b64 s[30:31]      // 000000002000: BE801D1E\n";
        let fs = parse_listing(text);
        assert_eq!(fs[0].callees, ["g"], "0x1018 + 0xfe8 = 0x2000 is g's entry; 0x1004 + 0x10 is inside f");
        assert_eq!(fs[0].stats.calls, 1);
        // The same branch in `clang -S` form names a local label.
        let mut r = Reader::new("f");
        for (m, ops) in [("s_getpc_b64", "s[4:5]"), ("s_add_u32", "s4, s4, (.LBB0_7-.Lpost_getpc0)&4294967295"), ("s_addc_u32", "s5, s5, (.LBB0_7-.Lpost_getpc0)>>32"), ("s_setpc_b64", "s[4:5]")] {
            r.instruction(m, ops, None, &BTreeMap::new());
        }
        assert_eq!((r.function.stats.calls, r.function.callees.len()), (0, 0));
    }

    #[test]
    fn load_forms() {
        let one = |line: &str| {
            let mut r = Reader::new("f");
            let (m, ops) = mnemonic_and_operands(line).expect("instruction");
            r.instruction(m, ops, None, &BTreeMap::new());
            r.function.stats
        };
        assert_eq!(one("buffer_load_dwordx4 v[0:3], v4, s[8:11], 0 offen").global_loads, BTreeMap::from([(16, 1)]));
        assert_eq!(one("buffer_load_dword v1, s[8:11], 0 offen lds").async_loads, BTreeMap::from([(4, 1)]));
        assert_eq!(one("global_load_lds_dwordx4 v1, s[16:17]").async_loads, BTreeMap::from([(16, 1)]));
        assert_eq!(one("global_load_short_d16_hi v1, v[2:3], off").global_loads, BTreeMap::from([(2, 1)]));
        assert_eq!(one("global_load_b128 v[0:3], v4, s[0:1]").global_loads, BTreeMap::from([(16, 1)]));
        let flat = one("flat_load_ubyte v1, v[2:3]");
        assert_eq!((flat.global_loads, flat.flat_loads), (BTreeMap::from([(1, 1)]), 1));
        assert_eq!(one("scratch_store_dwordx4 off, v[0:3], s0").scratch_stores, 1);
        assert_eq!(one("v_smfmac_f32_16x16x32_bf16 v[0:3], v[4:5], v[6:9], v10").matrix["smfmac"], 1);
        for other in ["s_load_dwordx2 s[0:1], s[4:5], 0x0", "ds_read_b128 v[0:3], v4", "global_store_dwordx4 v0, v[1:4], s[0:1]"] {
            assert_eq!(one(other), CodeStats::default(), "{other}");
        }
    }

    #[test]
    fn kernels_join_metadata_and_listing() {
        let ks = kernels("probe.hip", "gfx942", NOTES_942, DIS_942).expect("consistent");
        assert_eq!(ks.len(), 2);
        let l = &ks[0];
        assert_eq!((l.regs, l.agprs, l.sgprs, l.static_shared_bytes), (16, Some(0), Some(39), 4096));
        assert_eq!((l.code.calls, l.callees.len()), (1, 1));
        let err = kernels("probe.hip", "gfx942", NOTES_942, MOE_942).expect_err("probe kernels not in that listing");
        assert!(err.contains("probe_loads"), "{err}");
    }
}
