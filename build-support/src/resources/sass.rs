//! NVIDIA cubins: `cuobjdump -res-usage` (registers, stack, shared, local per kernel) and the
//! SASS listing of `nvdisasm -c` (one `.text.<kernel>` section per kernel, with the out-of-line
//! subroutines ptxas placed in it, e.g. the IEEE `div`/`rcp`/`sqrt` slow paths, as named labels
//! that `CALL.REL` targets).

use super::{mnemonic_and_operands, with_callees, Function, KernelResources, Vendor};
#[cfg(test)]
use super::CodeStats;
use std::collections::BTreeMap;

/// The 1 KiB per block that the CUDA driver reserves in shared memory from sm_80 on. sm_90+
/// cubins fold it into every shared-memory-using kernel's `.nv.shared.<kernel>` section, so
/// `-res-usage` reports it in `SHARED` (kda_decode_fused_step: ptxas `48 bytes smem`, section and
/// `SHARED` 1072).
pub const DRIVER_RESERVED_SHARED: u64 = 1024;

/// One `Function NAME:` entry of `cuobjdump -res-usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResUsage {
    pub regs: u32,
    /// Stack frame bytes per thread.
    pub stack: u64,
    /// `.nv.shared.<kernel>`: static shared bytes, with the driver reservation on sm_90+.
    pub shared: u64,
    /// Local memory bytes per thread outside the stack frame.
    pub local: u64,
}

impl ResUsage {
    /// The kernel's own static shared memory: `SHARED` without [`DRIVER_RESERVED_SHARED`].
    pub fn own_static_shared(&self) -> u64 {
        if self.shared >= DRIVER_RESERVED_SHARED {
            self.shared - DRIVER_RESERVED_SHARED
        } else {
            self.shared
        }
    }
}

/// Parses `cuobjdump -res-usage` output: kernel name -> figures.
pub fn parse_res_usage(text: &str) -> BTreeMap<String, ResUsage> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("Function ").and_then(|r| r.strip_suffix(':')) {
            current = Some(name.to_string());
            continue;
        }
        let Some(name) = current.take() else { continue };
        let mut r = ResUsage::default();
        for field in t.split_whitespace() {
            let Some((k, v)) = field.split_once(':') else { continue };
            let Ok(v) = v.parse::<u64>() else { continue };
            match k {
                "REG" => r.regs = u32::try_from(v).unwrap_or(u32::MAX),
                "STACK" => r.stack = v,
                "SHARED" => r.shared = v,
                "LOCAL" => r.local = v,
                _ => {}
            }
        }
        out.insert(name, r);
    }
    out
}

/// Parses an `nvdisasm -c` listing: kernel name -> the kernel and the subroutines in its
/// section (subroutine names are local to a section: every kernel has its own copies).
pub fn parse_listing(text: &str) -> BTreeMap<String, Vec<Function>> {
    let mut out: BTreeMap<String, Vec<Function>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with(".section") {
            section = t
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.split(',').next())
                .and_then(|s| s.strip_prefix(".text."))
                .map(str::to_string);
            if let Some(k) = &section {
                out.entry(k.clone()).or_default().push(Function { name: k.clone(), ..Default::default() });
            }
            continue;
        }
        let Some(kernel) = &section else { continue };
        let Some(functions) = out.get_mut(kernel) else { continue };
        if let Some(label) = t.strip_suffix(':') {
            // `.L_x_12:` branch targets and `.text.k:` section labels stay in the function.
            if !label.starts_with('.') && !label.contains(char::is_whitespace) && label != kernel {
                functions.push(Function { name: label.to_string(), ..Default::default() });
            }
            continue;
        }
        let Some(body) = t.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, b)| b) else { continue };
        let Some((mnemonic, operands)) = mnemonic_and_operands(body) else { continue };
        if let Some(f) = functions.last_mut() {
            classify(f, mnemonic, operands);
        }
    }
    out
}

/// Access width in bytes from a load's modifiers (`LDG.E.128` 16, `.64` 8, `.U16`/`.S16` 2,
/// `.U8`/`.S8` 1, `.256` 32, none: 4).
fn width(modifiers: &[&str]) -> u32 {
    for m in modifiers {
        match *m {
            "U8" | "S8" => return 1,
            "U16" | "S16" => return 2,
            "64" => return 8,
            "128" => return 16,
            "256" => return 32,
            _ => {}
        }
    }
    4
}

fn classify(f: &mut Function, mnemonic: &str, operands: &str) {
    let mut parts = mnemonic.split('.');
    let op = parts.next().unwrap_or_default();
    let mods: Vec<&str> = parts.collect();
    let s = &mut f.stats;
    match op {
        "HMMA" | "IMMA" | "QMMA" | "DMMA" | "BMMA" | "OMMA" => s.matrix_op("mma.sync", mnemonic),
        "HGMMA" | "IGMMA" | "QGMMA" | "BGMMA" | "OGMMA" => s.matrix_op("wgmma", mnemonic),
        _ if op.starts_with("UTC") && op.ends_with("MMA") => s.matrix_op("tcgen05", mnemonic),
        "LDG" => s.global_load(width(&mods), false),
        "LD" => s.global_load(width(&mods), true),
        "LDGSTS" => s.async_load(width(&mods)),
        "UTMALDG" | "UTMASTG" | "UTMAREDG" | "UTMAPF" | "UBLKCP" | "UBLKRED" | "UBLKPF" => s.tma += 1,
        "LDL" => s.scratch_loads += 1,
        "STL" => s.scratch_stores += 1,
        "CALL" => {
            s.calls += 1;
            // `CALL.REL.NOINC `($__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath) ;`
            let target = operands.split_once("`(").and_then(|(_, r)| r.split_once(')')).map(|(t, _)| t);
            f.callees.push(target.unwrap_or("?").to_string());
        }
        _ => {}
    }
}

/// Joins the two tool outputs of one cubin into per-kernel resources. A kernel in the listing
/// without a `-res-usage` entry is an error: the two must describe one image.
pub fn kernels(source: &str, target: &str, res_usage: &str, listing: &str) -> Result<Vec<KernelResources>, String> {
    let usage = parse_res_usage(res_usage);
    let listing = parse_listing(listing);
    let mut out = Vec::new();
    for (kernel, functions) in &listing {
        let r = usage.get(kernel).ok_or_else(|| format!("{source} {target}: {kernel} has no -res-usage entry"))?;
        let Some((code, callee_scratch_ops, callees)) = with_callees(functions, kernel) else { continue };
        out.push(KernelResources {
            kernel: kernel.clone(),
            source: source.to_string(),
            target: target.to_string(),
            vendor: Vendor::Nvidia,
            regs: r.regs,
            agprs: None,
            sgprs: None,
            vgpr_spills: None,
            sgpr_spills: None,
            max_block_threads: None,
            static_shared_bytes: r.own_static_shared(),
            scratch_bytes: r.stack + r.local,
            code,
            callee_scratch_ops,
            callees,
        });
    }
    Ok(out)
}

/// The counts of one listing line.
#[cfg(test)]
pub(crate) fn classify_line(line: &str) -> CodeStats {
    let mut f = Function::default();
    if let Some((m, ops)) = mnemonic_and_operands(line) {
        classify(&mut f, m, ops);
    }
    f.stats
}

#[cfg(test)]
mod tests {
    use super::*;

    const KDA_PREFILL: &str = include_str!("../../tests/fixtures/sm_90a.nvdisasm.txt");
    const RES_USAGE: &str = include_str!("../../tests/fixtures/sm_90a.res-usage.txt");
    const PROBE_90: &str = include_str!("../../tests/fixtures/sm_90a.probe.nvdisasm.txt");
    const PROBE_100: &str = include_str!("../../tests/fixtures/sm_100a.probe.nvdisasm.txt");

    #[test]
    fn res_usage_per_kernel() {
        let u = parse_res_usage(RES_USAGE);
        assert_eq!(u.len(), 5);
        let p = u["kda_prefill_prepare"];
        assert_eq!((p.regs, p.stack, p.shared, p.local), (125, 256, 1024, 0));
        assert_eq!(p.own_static_shared(), 0, "only the driver's reservation");
        // 4096 B of float4 + an 8 B mbarrier, plus the 1 KiB reservation.
        assert_eq!(u["probe_async"].own_static_shared(), 4104);
        assert_eq!(u["probe_wgmma"].own_static_shared(), 0, "no shared: no reservation either");
    }

    #[test]
    fn listing_splits_kernels_and_their_subroutines() {
        let l = parse_listing(KDA_PREFILL);
        assert_eq!(l.keys().collect::<Vec<_>>(), ["kda_prefill_prepare", "kda_prefill_recurrence", "kda_prefill_schedule"]);
        let prep = &l["kda_prefill_prepare"];
        let names: Vec<&str> = prep.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "kda_prefill_prepare",
                "$__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath",
                "$__internal_1_$__cuda_sm20_sqrt_rn_f32_slowpath",
                "$__internal_2_$__cuda_sm3x_div_rn_noftz_f32_slowpath"
            ]
        );
        let k = &prep[0];
        assert_eq!(k.stats.calls, 2);
        assert_eq!(k.callees, ["$__internal_1_$__cuda_sm20_sqrt_rn_f32_slowpath", "$__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath"]);
        assert_eq!(k.stats.matrix["mma.sync"], 2);
        assert_eq!(k.stats.matrix_forms["HMMA.16816.F32.BF16"], 2);
        assert_eq!((k.stats.scratch_loads, k.stats.scratch_stores), (3, 1), "LDL.128 x3, STL x1");
        let rec = &l["kda_prefill_recurrence"][0].stats;
        // `@P0 LDG.E`, `@!P0 LDG.E.64`, `LDG.E.64`: predicated loads count too.
        assert_eq!(rec.global_loads, BTreeMap::from([(4, 1), (8, 2)]));
        assert_eq!(rec.load_bytes(), (20, 0));
    }

    #[test]
    fn async_bulk_and_matrix_classes() {
        let l90 = parse_listing(PROBE_90);
        let a = &l90["probe_async"][0].stats;
        assert_eq!(a.async_loads, BTreeMap::from([(16, 1)]), "LDGSTS.E.BYPASS.128");
        assert_eq!(a.tma, 2, "UBLKCP.S.G and UTMALDG.2D");
        assert_eq!(a.global_loads, BTreeMap::from([(4, 2)]));
        assert_eq!(a.load_bytes(), (24, 16));
        assert_eq!(l90["probe_wgmma"][0].stats.matrix_forms, BTreeMap::from([("HGMMA.64x8x16.F32.BF16".to_string(), 1)]));
        assert_eq!(l90["probe_wgmma"][0].stats.matrix["wgmma"], 1);
        let l100 = parse_listing(PROBE_100);
        assert_eq!(l100["probe_tcgen05"][0].stats.matrix["tcgen05"], 1, "UTCHMMA");
        assert!(!l100.contains_key("probe_wgmma"), "wgmma is sm_90a only");
    }

    #[test]
    fn load_widths_and_generic_loads() {
        let cases = [
            ("LDG.E.128 R8, desc[UR4][R4.64] ;", 16, 0),
            ("LDG.E.128.CONSTANT R8, desc[UR4][R4.64] ;", 16, 0),
            ("LDG.E.LTC128B.64 R8, desc[UR4][R4.64] ;", 8, 0),
            ("LDG.E.U16 R8, desc[UR4][R4.64] ;", 2, 0),
            ("@!P1 LDG.E.S8 R8, desc[UR4][R4.64] ;", 1, 0),
            ("LDG.E.ENL2.256 R8, R12, desc[UR4][R4.64] ;", 32, 0),
            ("LD.E.64 R8, [R4.64] ;", 8, 1),
        ];
        for (line, w, flat) in cases {
            let s = classify_line(line);
            assert_eq!(s.global_loads, BTreeMap::from([(w, 1)]), "{line}");
            assert_eq!(s.flat_loads, flat, "{line}");
        }
        for line in ["LDS.128 R4, [R2] ;", "LDC.64 R2, c[0x0][0x380] ;", "LDSM.16.M88.4 R4, [R2] ;", "STG.E.128 desc[UR4][R2.64], R8 ;"] {
            assert_eq!(classify_line(line), CodeStats::default(), "{line} is no global load");
        }
    }

    #[test]
    fn kernels_join_both_outputs() {
        let ks = kernels("ops/kda_prefill.cu", "sm_90a", RES_USAGE, KDA_PREFILL).expect("consistent");
        let prep = ks.iter().find(|k| k.kernel == "kda_prefill_prepare").expect("listed");
        assert_eq!((prep.regs, prep.scratch_bytes, prep.static_shared_bytes), (125, 256, 0));
        assert_eq!(prep.code.calls, 2);
        assert_eq!(prep.callees.len(), 2, "the two slow paths it calls (the third is never called)");
        let sched = ks.iter().find(|k| k.kernel == "kda_prefill_schedule").expect("listed");
        assert_eq!(sched.static_shared_bytes, 4112);
        // A listing with a kernel that -res-usage does not know is not silently reported.
        let err = kernels("x.cu", "sm_100a", RES_USAGE, PROBE_100).expect_err("probe_tcgen05 missing");
        assert!(err.contains("probe_tcgen05"), "{err}");
    }
}
