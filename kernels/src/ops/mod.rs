//! Launchers: one file per op family, each implementing the family's `kernel-api` trait for
//! [`crate::GpuBackend`] over any runtime. `run` re-checks the arguments against the plan (no
//! device data is read), then launches from the plan's metadata only.

mod causal_conv1d;
mod dense_elementwise;
mod dense_gemm;
mod dense_norm;
mod kda;
mod kda_decode;
mod lse_merge;
mod mla_cache_write;
mod mla_decode;
mod mla_format;
mod mla_prefill;
mod moe_align;
mod moe_gemm;
mod moe_router;
mod tensor_ops;

/// The resident blocks per SM / CU that the committed resource report
/// (benches/kernel-resources.json, regenerated from the binaries by `k3-kernel-report --write`)
/// gives `kernel` at its K3 launches: (target, resident blocks), one entry per launch. Tests of
/// the launchers' per-target occupancy tables compare against it.
#[cfg(test)]
pub(crate) fn report_resident_blocks(kernel: &str) -> Vec<(String, usize)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/kernel-resources.json");
    let report = std::fs::read_to_string(path).expect("benches/kernel-resources.json");
    let field = |line: &str, key: &str| -> Option<String> {
        let rest = &line[line.find(&format!("\"{key}\":"))? + key.len() + 3..];
        Some(rest[..rest.find([',', '}'])?].trim_matches('"').to_string())
    };
    let tag = format!("\"kernel\":\"{kernel}\"");
    report
        .lines()
        .filter(|l| l.contains(&tag))
        .filter_map(|l| Some((field(l, "target")?, field(l, "resident_blocks")?.parse().ok()?)))
        .collect()
}
