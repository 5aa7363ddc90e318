//! The report as Markdown (for people) and JSON (for tools and gates). Both are functions of the
//! figures only: no dates, paths or timings, so identical inputs give identical files.

use crate::cases::Case;
use k3_build_support::resources::collect::TargetResources;
use k3_build_support::resources::occupancy::{occupancy, Occupancy, TargetLimits, Unit};
use k3_build_support::resources::{KernelResources, Vendor};
use k3_kernels::Dim3;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The command that writes the report (quoted in both files and in the staleness message).
pub const COMMAND: &str = "cargo run -p k3-benches --bin k3-kernel-report -- --write";

/// One target: its limits, how it was read, its kernels and the launches at K3 shapes.
pub struct TargetReport {
    pub limits: &'static TargetLimits,
    pub read: TargetResources,
    pub kernels: Vec<KernelResources>,
    pub cases: Vec<Case>,
}

/// One recorded launch with its occupancy.
pub struct LaunchRow<'a> {
    pub op: &'static str,
    pub shape: &'a str,
    pub kernel: &'a str,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared: u32,
    /// `None` when the launched kernel is not in the images (an error the caller reports).
    pub occupancy: Option<Occupancy>,
}

impl TargetReport {
    pub fn launches(&self) -> Vec<LaunchRow<'_>> {
        let mut out = Vec::new();
        for c in &self.cases {
            for l in &c.launches {
                let k = self.kernels.iter().find(|k| k.kernel == l.kernel);
                let threads = l.config.block.count().min(u128::from(u32::MAX)) as u32;
                out.push(LaunchRow {
                    op: c.op,
                    shape: &c.shape,
                    kernel: &l.kernel,
                    grid: l.config.grid,
                    block: l.config.block,
                    shared: l.config.shared_bytes,
                    occupancy: k.map(|k| occupancy(self.limits, k, threads, u64::from(l.config.shared_bytes))),
                });
            }
        }
        out
    }
}

/// Waves of the grid over the whole GPU: grid blocks / (resident blocks per unit x units).
fn waves(grid: Dim3, o: &Occupancy, units: u32) -> Option<f64> {
    let capacity = u128::from(o.blocks) * u128::from(units);
    (capacity > 0).then(|| grid.count() as f64 / capacity as f64)
}

fn unit_name(l: &TargetLimits) -> &'static str {
    match l.unit {
        Unit::Sm(_) => "SM",
        Unit::Cu(_) => "CU",
    }
}

fn dash_if_zero(v: u64, s: String) -> String {
    if v == 0 {
        "–".into()
    } else {
        s
    }
}

fn regs_cell(k: &KernelResources) -> String {
    match k.vendor {
        Vendor::Nvidia => k.regs.to_string(),
        Vendor::Amd => format!("v{} a{} s{}", k.regs, k.agprs.unwrap_or(0), k.sgprs.unwrap_or(0)),
    }
}

fn scratch_cell(k: &KernelResources) -> String {
    let c = &k.code;
    let mut parts = Vec::new();
    if k.scratch_bytes > 0 {
        parts.push(format!("{} B", k.scratch_bytes));
    }
    let spills = u64::from(k.vgpr_spills.unwrap_or(0)) + u64::from(k.sgpr_spills.unwrap_or(0));
    if spills > 0 {
        parts.push(format!("spill v{} s{}", k.vgpr_spills.unwrap_or(0), k.sgpr_spills.unwrap_or(0)));
    }
    if c.scratch_loads + c.scratch_stores > 0 {
        parts.push(format!("{} ld / {} st", c.scratch_loads, c.scratch_stores));
    }
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

fn matrix_cell(k: &KernelResources) -> String {
    let parts: Vec<String> = k.code.matrix.iter().map(|(c, n)| format!("{c} {n}")).collect();
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

/// ptxas's out-of-line IEEE `div`/`rcp`/`sqrt` paths, taken only for special operands
/// (denormals, infinities), unlike e.g. the 64-bit integer division subroutines.
fn is_slow_path(callee: &str) -> bool {
    callee.starts_with("$__internal_") && callee.ends_with("_slowpath")
}

/// A readable callee name: `$__internal_0_$__cuda_sm20_div_s64` -> `div_s64`, an Itanium-mangled
/// `_ZN3mla6attendE...` -> `mla::attend` (anonymous namespaces dropped), anything else as is.
fn short_callee(name: &str) -> String {
    if let Some((_, rest)) = name.strip_prefix("$__internal_").and_then(|r| r.split_once("$__cuda_")) {
        return rest.split_once('_').map_or(rest, |(_, op)| op).to_string();
    }
    let demangled = (|| {
        let mut s = name.strip_prefix("_Z")?;
        s = s.strip_prefix('L').unwrap_or(s);
        let nested = s.starts_with('N');
        if nested {
            s = &s[1..];
        }
        let mut parts = Vec::new();
        loop {
            let digits = s.bytes().take_while(u8::is_ascii_digit).count();
            let Ok(n) = s[..digits].parse::<usize>() else { break };
            let part = s.get(digits..digits + n)?;
            s = &s[digits + n..];
            if part != "_GLOBAL__N_1" {
                parts.push(part);
            }
            if !nested {
                break;
            }
        }
        (!parts.is_empty()).then(|| parts.join("::"))
    })();
    demangled.unwrap_or_else(|| name.to_string())
}

fn calls_cell(k: &KernelResources) -> String {
    let c = k.code.calls;
    if c == 0 {
        return "–".into();
    }
    let mut slow: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for callee in &k.callees {
        let short = short_callee(callee);
        if is_slow_path(callee) {
            let op = short.split('_').next().unwrap_or(&short).to_string();
            if !slow.contains(&op) {
                slow.push(op);
            }
        } else if !names.contains(&short) {
            names.push(short);
        }
    }
    if !slow.is_empty() {
        names.push(format!("{} slow path", slow.join("/")));
    }
    let mut s = format!("{c} → {}", names.join(", "));
    if k.callee_scratch_ops > 0 {
        let _ = write!(s, "; {} scratch ld/st inside", k.callee_scratch_ops);
    }
    s
}

fn async_cell(k: &KernelResources) -> String {
    let a: u64 = k.code.async_loads.values().sum();
    let mut parts = Vec::new();
    if a > 0 {
        parts.push(format!("async {a}"));
    }
    if k.code.tma > 0 {
        parts.push(format!("bulk/TMA {}", k.code.tma));
    }
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

fn loads_cell(k: &KernelResources) -> String {
    let n: u64 = k.code.global_loads.values().sum();
    let widths: Vec<String> = k.code.global_loads.iter().rev().map(|(w, c)| format!("{c}×{w}B")).collect();
    let mut s = dash_if_zero(n, widths.join(" "));
    if k.code.flat_loads > 0 {
        let _ = write!(s, " ({} flat)", k.code.flat_loads);
    }
    s
}

fn share_cell(k: &KernelResources) -> String {
    k.metric("wide_load_share").map_or("–".into(), |s| format!("{:.0}%", 100.0 * s))
}

fn kb(bytes: u64) -> String {
    if bytes == 0 {
        "0".into()
    } else if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn dim(d: Dim3) -> String {
    match (d.y, d.z) {
        (1, 1) => d.x.to_string(),
        (_, 1) => format!("{}×{}", d.x, d.y),
        _ => format!("{}×{}×{}", d.x, d.y, d.z),
    }
}

/// Kernels that a summary line names, per target: `sm_90a: a, b; gfx942: c`.
fn by_target(reports: &[TargetReport], pick: impl Fn(&KernelResources) -> Option<String>) -> String {
    let parts: Vec<String> = reports
        .iter()
        .filter_map(|r| {
            let names: Vec<String> = r.kernels.iter().filter_map(&pick).collect();
            (!names.is_empty()).then(|| format!("**{}**: {}", r.limits.target, names.join(", ")))
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join("; ")
    }
}

pub fn markdown(reports: &[TargetReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Kernel resources, read from the binaries\n");
    let _ = writeln!(
        s,
        "Generated by `{COMMAND}`; CI regenerates it and fails when it is stale. **Static figures read from \
         the compiled images, not measured on hardware**: instruction counts are per instruction in the binary, \
         whatever the loop trip counts. Columns, per-arch limits and their sources: `build-support/README.md` \
         (\"Kernel resource report\"). Machine-readable: `kernel-resources.json`.\n"
    );
    let _ = writeln!(s, "| target | modelled as | compiler | read with |\n|---|---|---|---|");
    for r in reports {
        let l = r.limits;
        let _ = writeln!(
            s,
            "| {} | {} ({} {}s) | {} | {} |",
            l.target,
            l.product,
            l.units,
            unit_name(l),
            r.read.compiler.as_deref().unwrap_or("?"),
            r.read.read_with
        );
    }

    let _ = writeln!(s, "\n## Summary\n");
    let _ = writeln!(
        s,
        "- Local memory / scratch (stack or private bytes, spills, or local/scratch loads and stores): {}",
        by_target(reports, |k| {
            let c = &k.code;
            let any = k.scratch_bytes > 0
                || c.scratch_loads + c.scratch_stores > 0
                || k.vgpr_spills.unwrap_or(0) > 0;
            any.then(|| format!("{} ({})", k.kernel, scratch_cell(k)))
        })
    );
    let _ = writeln!(
        s,
        "- Out-of-line calls (beyond ptxas's IEEE div/rcp/sqrt slow paths, which only special operands take): {}",
        by_target(reports, |k| k.callees.iter().any(|c| !is_slow_path(c)).then(|| format!("{} ({})", k.kernel, calls_cell(k))))
    );
    let _ = writeln!(
        s,
        "- Calls to the IEEE slow paths only: {}",
        by_target(reports, |k| {
            (!k.callees.is_empty() && k.callees.iter().all(|c| is_slow_path(c))).then(|| k.kernel.clone())
        })
    );
    let _ = writeln!(
        s,
        "- Matrix instructions: {}",
        by_target(reports, |k| (k.code.matrix_total() > 0).then(|| format!("{} ({})", k.kernel, matrix_cell(k))))
    );
    let _ = writeln!(
        s,
        "- Kernels with any 16-byte (or wider) global load: {}",
        by_target(reports, |k| k.metric("wide_load_bytes").filter(|&b| b > 0.0).map(|_| format!("{} ({})", k.kernel, share_cell(k))))
    );
    let _ = writeln!(
        s,
        "- Async copies or bulk/TMA: {}",
        by_target(reports, |k| (k.code.tma + k.code.async_loads.values().sum::<u64>() > 0).then(|| k.kernel.clone()))
    );

    let _ = writeln!(s, "\n## Per kernel\n");
    let _ = writeln!(
        s,
        "regs: registers per thread (NVIDIA) or VGPRs `v`, AGPRs `a`, SGPRs `s` (AMD). scratch: stack/local or private \
         bytes per thread, AMD spill counts, local/scratch load and store instructions. smem: static shared memory / LDS \
         per block. calls: call sites (with the kernel's callees) and scratch traffic inside the callees. global loads: \
         instructions by access width (callees included). 16-B share: bytes of global loads issued by instructions of 16 \
         bytes or more, each instruction weighted once by its width.\n"
    );
    let _ = writeln!(
        s,
        "| kernel | target | regs | scratch | smem | matrix | calls | async / bulk | global loads | 16-B share |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    let mut rows: Vec<(&str, &str, usize, &KernelResources)> = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        for k in &r.kernels {
            rows.push((&k.source, &k.kernel, i, k));
        }
    }
    rows.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    for (_, _, _, k) in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.kernel,
            k.target,
            regs_cell(k),
            scratch_cell(k),
            kb(k.static_shared_bytes),
            matrix_cell(k),
            calls_cell(k),
            async_cell(k),
            loads_cell(k),
            share_cell(k)
        );
    }

    let _ = writeln!(s, "\n## Occupancy at K3 shapes\n");
    let _ = writeln!(
        s,
        "Launches recorded from each op's `plan`/`run` at the shapes of `k3-device-bench` (KDA prefill 1×8192 and \
         8×1024, KDA decode batch 1/64/1024, MLA decode batch 1/16/64 at 8k/64k, each at 12 and 96 heads; MoE at \
         1/64/1024 tokens; the dense projections at 1/64/1024 rows) and of the other ops of a K3 layer at K3's dims \
         (norms, AttnRes mix, KDA gate and short conv, MLA prefill and cache write, SiTU-GLU, sigmoid gate, embedding \
         gather: `benches/src/bin/k3-kernel-report/cases.rs`), through a runtime that runs nothing and describes itself \
         as the product above. The dense GEMM rows are the dialect's kernel (on CUDA, bf16 GEMMs go to cuBLASLt \
         by default). Resident: blocks per SM / CU with the limiting resources; occupancy: resident warps / waves over \
         the unit's maximum; waves: grid blocks over (resident blocks × units), below 1 the GPU is not filled.\n"
    );
    let _ = writeln!(
        s,
        "| kernel | target | block | dyn smem | resident | occupancy | limiter | launches | grid blocks | waves |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    struct Group {
        launches: usize,
        cases: Vec<String>,
        grid: (u128, u128),
        waves: (f64, f64),
        occ: Option<Occupancy>,
    }
    for r in reports {
        let mut groups: BTreeMap<(String, String, u32), Group> = BTreeMap::new();
        for l in r.launches() {
            let key = (l.kernel.to_string(), dim(l.block), l.shared);
            let n = l.grid.count();
            let w = l.occupancy.as_ref().and_then(|o| waves(l.grid, o, r.limits.units)).unwrap_or(0.0);
            let g = groups.entry(key).or_insert(Group {
                launches: 0,
                cases: Vec::new(),
                grid: (n, n),
                waves: (w, w),
                occ: l.occupancy.clone(),
            });
            g.launches += 1;
            let case = format!("{} {}", l.op, l.shape);
            if !g.cases.contains(&case) {
                g.cases.push(case);
            }
            g.grid = (g.grid.0.min(n), g.grid.1.max(n));
            g.waves = (g.waves.0.min(w), g.waves.1.max(w));
        }
        for ((kernel, block, shared), g) in groups {
            let (resident, occ, limiter) = match &g.occ {
                Some(o) => (format!("{}", o.blocks), format!("{:.0}%", 100.0 * o.fraction()), o.limiter_names()),
                None => ("?".into(), "?".into(), "kernel not in the image".into()),
            };
            let range = |a: String, b: String| if a == b { a } else { format!("{a}–{b}") };
            let _ = writeln!(
                s,
                "| {kernel} | {} | {block} | {} | {resident} | {occ} | {limiter} | {} | {} | {} |",
                r.limits.target,
                kb(u64::from(shared)),
                g.launches,
                range(g.grid.0.to_string(), g.grid.1.to_string()),
                range(format!("{:.2}", g.waves.0), format!("{:.2}", g.waves.1)),
            );
        }
    }
    let launched: Vec<&str> = reports.iter().flat_map(|r| r.cases.iter().flat_map(|c| c.launches.iter().map(|l| l.kernel.as_str()))).collect();
    let mut idle: Vec<&str> = reports.iter().flat_map(|r| r.kernels.iter().map(|k| k.kernel.as_str())).filter(|k| !launched.contains(k)).collect();
    idle.sort();
    idle.dedup();
    let _ = writeln!(s, "\nNot launched at these shapes (other dtypes, ops or paths): {}.", idle.join(", "));
    s
}

/// An integer-valued figure as a JSON integer, anything else as a float, absent as null.
fn number(v: Option<f64>) -> Value {
    match v {
        Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => json!(x as i64),
        Some(x) => json!(x),
        None => Value::Null,
    }
}

fn widths(m: &BTreeMap<u32, u64>) -> Value {
    Value::Object(m.iter().map(|(w, n)| (w.to_string(), json!(n))).collect())
}

fn kernel_json(k: &KernelResources) -> Value {
    let mut o = Map::new();
    o.insert("kernel".into(), json!(k.kernel));
    o.insert("source".into(), json!(k.source));
    o.insert("target".into(), json!(k.target));
    for m in KernelResources::METRICS {
        o.insert((*m).into(), number(k.metric(m)));
    }
    o.insert("matrix".into(), json!(k.code.matrix));
    o.insert("matrix_forms".into(), json!(k.code.matrix_forms));
    o.insert("global_loads_by_width".into(), widths(&k.code.global_loads));
    o.insert("async_loads_by_width".into(), widths(&k.code.async_loads));
    o.insert("callees".into(), json!(k.callees));
    o.insert("max_block_threads".into(), json!(k.max_block_threads));
    Value::Object(o)
}

fn limits_json(l: &TargetLimits) -> Value {
    let unit = match l.unit {
        Unit::Sm(sm) => json!({
            "regs_per_sm": sm.regs, "reg_alloc_unit_per_warp": sm.reg_granule, "sub_partitions": sm.sub_partitions,
            "max_regs_per_thread": sm.max_regs_per_thread, "max_warps_per_sm": sm.max_warps, "max_blocks_per_sm": sm.max_blocks,
            "shared_per_sm": sm.shared, "shared_per_block": sm.shared_per_block, "shared_alloc_unit": sm.shared_granule,
            "reserved_shared_per_block": sm.reserved_shared_per_block,
        }),
        Unit::Cu(cu) => json!({
            "simds_per_cu": cu.simds, "max_waves_per_simd": cu.waves_per_simd, "vgprs_per_lane": cu.vgprs_per_lane,
            "vgpr_alloc_unit": cu.vgpr_granule, "lds_per_cu": cu.lds, "lds_per_block": cu.lds_per_block,
            "lds_alloc_unit": cu.lds_granule, "max_multiwave_blocks_per_cu": cu.max_blocks,
        }),
    };
    json!({"warp_size": l.warp_size, "max_block_threads": l.max_block_threads, "unit": unit})
}

/// The JSON report, one record per line inside each list (so that a kernel change shows as a
/// one-line diff): `{"schema", "command", "note", "targets": [..], "kernels": [..], "launches": [..]}`.
pub fn json(reports: &[TargetReport]) -> String {
    let targets: Vec<Value> = reports
        .iter()
        .map(|r| {
            json!({
                "target": r.limits.target, "product": r.limits.product, "units": r.limits.units,
                "compiler": r.read.compiler, "read_with": r.read.read_with, "limits": limits_json(r.limits),
            })
        })
        .collect();
    let kernels: Vec<Value> = reports.iter().flat_map(|r| r.kernels.iter().map(kernel_json)).collect();
    let mut launches = Vec::new();
    for r in reports {
        for l in r.launches() {
            let (blocks, occ, limiter, w) = match &l.occupancy {
                Some(o) => (json!(o.blocks), json!(o.fraction()), json!(o.limiter_names()), json!(waves(l.grid, o, r.limits.units))),
                None => (Value::Null, Value::Null, Value::Null, Value::Null),
            };
            launches.push(json!({
                "target": r.limits.target, "op": l.op, "shape": l.shape, "kernel": l.kernel,
                "grid": [l.grid.x, l.grid.y, l.grid.z], "block": [l.block.x, l.block.y, l.block.z],
                "dynamic_shared_bytes": l.shared, "resident_blocks": blocks, "occupancy": occ,
                "limiter": limiter, "waves": w,
            }));
        }
    }
    // One object per line, the identifying keys first (serde_json sorts the others).
    let list = |items: &[Value], first: &[&str]| -> String {
        let rows: Vec<String> = items
            .iter()
            .map(|v| {
                let Some(o) = v.as_object() else { return format!("    {v}") };
                let fields: Vec<String> = first
                    .iter()
                    .filter_map(|k| o.get(*k).map(|x| format!("{}:{x}", json!(k))))
                    .chain(o.iter().filter(|(k, _)| !first.contains(&k.as_str())).map(|(k, x)| format!("{}:{x}", json!(k))))
                    .collect();
                format!("    {{{}}}", fields.join(","))
            })
            .collect();
        format!("[\n{}\n  ]", rows.join(",\n"))
    };
    format!(
        "{{\n  \"schema\": \"k3-kernel-resources/1\",\n  \"command\": {},\n  \"note\": \"static figures read from the compiled \
         images, not measured on hardware\",\n  \"targets\": {},\n  \"kernels\": {},\n  \"launches\": {}\n}}\n",
        json!(COMMAND),
        list(&targets, &["target", "product"]),
        list(&kernels, &["kernel", "target", "source"]),
        list(&launches, &["kernel", "target", "op", "shape"])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_one_record_per_line_and_valid() {
        let text = json(&[]);
        let v: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["schema"], "k3-kernel-resources/1");
        assert!(v["kernels"].as_array().is_some_and(Vec::is_empty));
    }

    #[test]
    fn callee_names() {
        assert_eq!(short_callee("$__internal_3_$__cuda_sm20_rcp_rn_f32_slowpath"), "rcp_rn_f32_slowpath");
        assert_eq!(short_callee("$__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath"), "div_rn_noftz_f32_slowpath");
        assert_eq!(short_callee("$__internal_1_$__cuda_sm20_div_u64"), "div_u64");
        assert_eq!(short_callee("_ZN3mla6attendERKNS_5CacheERKNS_5QueryE"), "mla::attend");
        assert_eq!(short_callee("_ZN12_GLOBAL__N_118moe_gemm_mma_blockIN2k36layout9M16N16K16ELb1EEEvPKv"), "moe_gemm_mma_block");
        assert_eq!(short_callee("_Z20dense_gemm_mma_blockIN2k36layoutEEv"), "dense_gemm_mma_block");
        assert_eq!(short_callee("_Z8scratchyPKfi"), "scratchy");
        assert_eq!(short_callee("0x57b00"), "0x57b00");
        assert!(is_slow_path("$__internal_0_$__cuda_sm20_rcp_rn_f32_slowpath") && !is_slow_path("$__internal_1_$__cuda_sm20_div_u64"));
    }
}
