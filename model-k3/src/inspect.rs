//! `k3 inspect DIR`: checks a checkpoint against its config from headers alone and reports
//! every missing, unexpected, mis-shaped or mis-typed tensor, shard/index inconsistencies, and a
//! summary (parameters, bytes, quantised fraction).

use crate::checkpoint::Checkpoint;
use crate::config::{FfnKind, K3Config};
use crate::error::Result;
use crate::inventory::{expected_tensors, ExpertStorage, TensorSpec};
use kernel_api::DType;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The inspector's findings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InspectReport {
    pub deviations: Vec<String>,
    pub tensors: usize,
    pub shards: usize,
    /// Parameters (a packed FP4 byte counts as two).
    pub parameters: u64,
    pub bytes: u64,
    /// Bytes of MXFP4 expert tensors (codes and scales) over all bytes.
    pub quantized_fraction: f64,
    pub experts_mxfp4: bool,
}

impl InspectReport {
    pub fn ok(&self) -> bool {
        self.deviations.is_empty()
    }
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.deviations {
            writeln!(f, "DEVIATION: {d}")?;
        }
        writeln!(
            f,
            "{} tensors in {} shards, {:.3} B parameters, {:.3} GB, {:.1}% quantised bytes, experts {}",
            self.tensors,
            self.shards,
            self.parameters as f64 / 1e9,
            self.bytes as f64 / 1e9,
            100.0 * self.quantized_fraction,
            if self.experts_mxfp4 { "MXFP4" } else { "bf16" }
        )?;
        write!(f, "{}", if self.ok() { "OK: checkpoint matches its config" } else { "FAILED: deviations found" })
    }
}

/// Inspects an opened checkpoint.
pub fn inspect_checkpoint(ck: &Checkpoint) -> InspectReport {
    let cfg: &K3Config = &ck.config;
    let mut r = InspectReport { deviations: ck.problems.clone(), shards: ck.shards.len(), ..Default::default() };
    let packed = ck.has_packed_experts();
    r.experts_mxfp4 = packed;
    let any_moe = cfg.ffns.contains(&FfnKind::LatentMoe);
    let mut expected: BTreeMap<String, TensorSpec> = BTreeMap::new();
    let storage = if packed { ExpertStorage::Mxfp4 } else { ExpertStorage::Bf16 };
    for s in expected_tensors(cfg, storage) {
        expected.insert(s.name.clone(), s);
    }
    if packed && ck.tensors.keys().any(|n| n.contains(".experts.") && n.ends_with(".weight") && !n.ends_with("_packed")) {
        r.deviations.push("checkpoint mixes MXFP4 (weight_packed) and bf16 (weight) routed experts".into());
    }
    for (name, spec) in &expected {
        match ck.tensors.get(name) {
            None => r.deviations.push(format!("missing `{name}` ({:?} {})", spec.shape, spec.dtypes[0])),
            Some(e) => {
                if e.shape != spec.shape {
                    r.deviations.push(format!("`{name}` has shape {:?}, expected {:?}", e.shape, spec.shape));
                }
                if !spec.dtypes.contains(&e.dtype) {
                    let want: Vec<_> = spec.dtypes.iter().map(|d| d.name()).collect();
                    r.deviations.push(format!("`{name}` is {}, expected {}", e.dtype, want.join(" or ")));
                }
            }
        }
    }
    for name in ck.tensors.keys() {
        if !expected.contains_key(name) {
            r.deviations.push(format!("unexpected tensor `{name}`"));
        }
    }
    if any_moe && !packed && !ck.tensors.keys().any(|n| n.contains(".experts.")) {
        r.deviations.push("no routed expert tensors found".into());
    }
    let mut qbytes = 0u64;
    for e in ck.tensors.values() {
        let n: u64 = e.shape.iter().map(|&d| d as u64).product();
        let b = (e.end - e.start) as u64;
        r.bytes += b;
        let is_packed = e.name.ends_with(".weight_packed");
        r.parameters += if is_packed { 2 * n } else if e.name.ends_with(".weight_scale") { 0 } else { n };
        if is_packed || e.name.ends_with(".weight_scale") {
            qbytes += b;
        }
        if e.dtype == DType::U8 && !(is_packed || e.name.ends_with(".weight_scale")) {
            r.deviations.push(format!("`{}` is u8 but is not an MXFP4 expert tensor", e.name));
        }
    }
    r.tensors = ck.tensors.len();
    r.quantized_fraction = if r.bytes > 0 { qbytes as f64 / r.bytes as f64 } else { 0.0 };
    r
}

/// Opens and inspects a directory.
pub fn inspect_dir(dir: &Path) -> Result<InspectReport> {
    let ck = Checkpoint::open(dir)?;
    Ok(inspect_checkpoint(&ck))
}
