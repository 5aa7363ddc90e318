//! `k3 doctor`: an environment fingerprint, then staged checks (backend init -> kernel load ->
//! per-op smoke conformance -> tiny model load -> one fixed request). The first failing stage is
//! named; later stages are skipped.

use crate::exec::ModelBackend;
use crate::model::ModelOptions;
use crate::runner::load_model;
use crate::tiny::write_tiny_checkpoint;
use kernel_api::cpu::CpuBackend;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skipped(String),
}

#[derive(Clone, Debug)]
pub struct Stage {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

#[derive(Clone, Debug)]
pub struct BackendStatus {
    pub name: &'static str,
    pub available: bool,
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct DoctorReport {
    pub os: String,
    pub cpu: String,
    pub features: Vec<&'static str>,
    pub backends: Vec<BackendStatus>,
    pub selected: String,
    pub stages: Vec<Stage>,
}

impl DoctorReport {
    pub fn ok(&self) -> bool {
        self.stages.iter().all(|s| !matches!(s.outcome, Outcome::Fail(_)))
    }
    pub fn first_failure(&self) -> Option<&Stage> {
        self.stages.iter().find(|s| matches!(s.outcome, Outcome::Fail(_)))
    }

    pub fn to_json(&self) -> String {
        let stages: Vec<serde_json::Value> = self
            .stages
            .iter()
            .map(|s| {
                let (status, why) = match &s.outcome {
                    Outcome::Pass => ("pass", String::new()),
                    Outcome::Fail(w) => ("fail", w.clone()),
                    Outcome::Skipped(w) => ("skipped", w.clone()),
                };
                serde_json::json!({ "stage": s.name, "status": status, "why": why, "detail": s.detail })
            })
            .collect();
        let backends: Vec<serde_json::Value> = self
            .backends
            .iter()
            .map(|b| serde_json::json!({ "name": b.name, "available": b.available, "reason": b.reason }))
            .collect();
        let v = serde_json::json!({
            "os": self.os, "cpu": self.cpu, "features": self.features, "backends": backends,
            "selected_backend": self.selected, "stages": stages, "ok": self.ok(),
            "first_failing_stage": self.first_failure().map(|s| s.name),
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "os:        {}", self.os)?;
        writeln!(f, "cpu:       {}", self.cpu)?;
        writeln!(f, "features:  {}", if self.features.is_empty() { "(none)".to_string() } else { self.features.join(", ") })?;
        for b in &self.backends {
            writeln!(f, "backend {:<6} {}{}", b.name, if b.available { "available" } else { "unavailable" }, if b.reason.is_empty() { String::new() } else { format!(": {}", b.reason) })?;
        }
        writeln!(f, "checks on backend `{}`:", self.selected)?;
        for (i, s) in self.stages.iter().enumerate() {
            let (tag, why) = match &s.outcome {
                Outcome::Pass => ("PASS", String::new()),
                Outcome::Fail(w) => ("FAIL", format!(": {w}")),
                Outcome::Skipped(w) => ("SKIP", format!(": {w}")),
            };
            writeln!(f, "  [{}] {:<26} {tag}{why}{}", i + 1, s.name, if s.detail.is_empty() { String::new() } else { format!(" ({})", s.detail) })?;
        }
        match self.first_failure() {
            Some(s) => writeln!(f, "first failing stage: {}", s.name),
            None => writeln!(f, "all stages passed"),
        }
    }
}

fn read_first_line(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find(|l| l.starts_with(key)).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string())
}

fn os_string() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    let pretty = read_first_line("/etc/os-release", "PRETTY_NAME").map(|s| s.replace('=', "")).unwrap_or_default();
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| l.trim_start_matches("PRETTY_NAME=").trim_matches('"').to_string()))
        .unwrap_or(pretty);
    format!("{} {} ({}, kernel {kernel})", std::env::consts::OS, pretty, std::env::consts::ARCH)
}

fn cpu_string() -> String {
    let model = read_first_line("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{model}, {threads} threads")
}

fn compiled_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    if cfg!(feature = "rocm") {
        v.push("rocm");
    }
    v
}

fn backend_statuses() -> Vec<BackendStatus> {
    vec![
        BackendStatus { name: "cpu", available: true, reason: "CPU reference, always present".into() },
        simt_status("simt32", 32),
        simt_status("simt64", 64),
        cuda_status(),
        rocm_status(),
    ]
}

fn simt_status(name: &'static str, warp: u32) -> BackendStatus {
    match k3_backend_simt::SimtRuntime::new(warp) {
        Ok(_) => BackendStatus {
            name,
            available: true,
            reason: format!(
                "SIMT emulator, warp {warp}, {} kernels compiled in, {} context switch{}",
                k3_backend_simt::kernels().len(),
                k3_backend_simt::context_backend(),
                if k3_backend_simt::asan_enabled() { ", AddressSanitizer build" } else { "" }
            ),
        },
        Err(e) => BackendStatus { name, available: false, reason: e.to_string() },
    }
}

/// The CUDA runtime's probe (never panics: a missing driver or device is a reason).
fn cuda_status() -> BackendStatus {
    #[cfg(feature = "cuda")]
    let (available, reason) = match k3_backend_cuda::CudaRuntime::new(0) {
        Ok(rt) => (true, format!("CUDA device {}", rt.summary())),
        Err(kernel_api::Error::Unavailable { why }) => (false, why),
        Err(e) => (false, e.to_string()),
    };
    #[cfg(not(feature = "cuda"))]
    let (available, reason) = (false, "built without the `cuda` feature".to_string());
    BackendStatus { name: "cuda", available, reason }
}

/// The ROCm runtime's probe (never panics: a missing runtime or device is a reason). When a
/// device answers, the reason names the library, the target ID, where kernels and dense GEMMs
/// come from (and why the dialect's kernels when hipBLASLt is not used), and the fp8 KV-cache
/// default.
fn rocm_status() -> BackendStatus {
    #[cfg(feature = "rocm")]
    let (available, reason) = match k3_backend_rocm::RocmRuntime::new(0) {
        Ok(rt) => {
            let kv = crate::kv_default::resolve_kv_cache_dtype("fp8", rt.info()).map(|f| f.name()).unwrap_or("?");
            (true, format!("HIP device {}; dense GEMM: {}; fp8 KV cache default: {kv}", rt.summary(), rt.gemm_route_summary()))
        }
        Err(kernel_api::Error::Unavailable { why }) => (false, why),
        Err(e) => (false, e.to_string()),
    };
    #[cfg(not(feature = "rocm"))]
    let (available, reason) = (false, "built without the `rocm` feature".to_string());
    BackendStatus { name: "rocm", available, reason }
}

fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_else(|| "panicked".into())),
    }
}

/// Runs the fingerprint and every stage for the named backend.
pub fn run_doctor(backend: &str) -> DoctorReport {
    let mut r = DoctorReport {
        os: os_string(),
        cpu: cpu_string(),
        features: compiled_features(),
        backends: backend_statuses(),
        selected: backend.to_string(),
        stages: Vec::new(),
    };
    match backend {
        "cpu" => staged_checks(&mut r, || Ok(CpuBackend::new()), || Ok("host code: no kernel binaries to load".into())),
        "simt32" | "simt64" => {
            let warp = if backend == "simt32" { 32 } else { 64 };
            let kernels = || {
                let n = k3_backend_simt::kernels().len();
                if n == 0 {
                    Err("no kernels compiled into the emulator".to_string())
                } else {
                    Ok(format!("{n} kernels registered (kernels/csrc built for the host at warp 32 and 64)"))
                }
            };
            staged_checks(&mut r, move || k3_backend_simt::simt_backend(warp).map_err(|e| e.to_string()), kernels)
        }
        #[cfg(feature = "cuda")]
        "cuda" => staged_checks(
            &mut r,
            || k3_backend_cuda::cuda_backend(0).map_err(|e| e.to_string()),
            || {
                k3_backend_cuda::CudaRuntime::new(0)
                    .map(|rt| format!("op kernels loaded from {}", rt.kernel_availability()))
                    .map_err(|e| e.to_string())
            },
        ),
        #[cfg(feature = "rocm")]
        "rocm" => staged_checks(
            &mut r,
            || k3_backend_rocm::rocm_backend(0).map_err(|e| e.to_string()),
            || {
                k3_backend_rocm::RocmRuntime::new(0)
                    .map(|rt| format!("op kernels loaded from {}", rt.kernel_availability()))
                    .map_err(|e| e.to_string())
            },
        ),
        other => {
            let why = r.backends.iter().find(|b| b.name == other).map(|b| b.reason.clone()).unwrap_or_else(|| format!("unknown backend `{other}`"));
            r.stages.push(Stage { name: "backend init", outcome: Outcome::Fail(why), detail: String::new() });
            for name in ["kernel load", "per-op smoke conformance", "tiny model load", "one fixed request"] {
                r.stages.push(Stage { name, outcome: Outcome::Skipped("an earlier stage failed".into()), detail: String::new() });
            }
        }
    }
    r
}

fn staged_checks<B: ModelBackend + kernel_api::conformance::AllOps>(
    r: &mut DoctorReport,
    make: impl Fn() -> Result<B, String>,
    kernel_load: impl FnOnce() -> Result<String, String>,
) {
    let mut failed = false;
    let push = |r: &mut DoctorReport, name: &'static str, res: Result<String, String>, failed: &mut bool| {
        let (outcome, detail) = if *failed {
            (Outcome::Skipped("an earlier stage failed".into()), String::new())
        } else {
            match res {
                Ok(d) => (Outcome::Pass, d),
                Err(e) => {
                    *failed = true;
                    (Outcome::Fail(e), String::new())
                }
            }
        };
        r.stages.push(Stage { name, outcome, detail });
    };
    let b = match make() {
        Ok(b) => b,
        Err(e) => {
            push(r, "backend init", Err(e), &mut failed);
            for name in ["kernel load", "per-op smoke conformance", "tiny model load", "one fixed request"] {
                push(r, name, Err(String::new()), &mut failed);
            }
            return;
        }
    };
    let info = b.device_info().clone();
    push(r, "backend init", Ok(format!("{} on {}, {} compute units", info.name, info.arch, info.compute_units)), &mut failed);
    push(r, "kernel load", kernel_load(), &mut failed);
    let smoke = if failed {
        Err(String::new())
    } else {
        guarded(|| {
            let tests = kernel_api::conformance::all_tests::<B>();
            // Failing tests panic (they are test bodies); keep their messages out of the report's
            // stderr and summarise them instead.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let mut bad: Vec<(String, String)> = Vec::new();
            for (op, name, f) in &tests {
                if let Err(e) = guarded(|| {
                    f(&b);
                    Ok(())
                }) {
                    bad.push((format!("{op}/{name}"), e));
                }
            }
            std::panic::set_hook(hook);
            if bad.is_empty() {
                Ok(format!("{} conformance tests passed", tests.len()))
            } else {
                let first: String = bad[0].1.lines().next().unwrap_or("").chars().take(240).collect();
                let names: Vec<&str> = bad.iter().take(6).map(|(n, _)| n.as_str()).collect();
                Err(format!(
                    "{} of {} conformance tests failed ({}{}); first: {}: {first}",
                    bad.len(),
                    tests.len(),
                    names.join(", "),
                    if bad.len() > names.len() { ", ..." } else { "" },
                    bad[0].0
                ))
            }
        })
    };
    push(r, "per-op smoke conformance", smoke, &mut failed);
    let dir = std::env::temp_dir().join(format!("k3-doctor-{}", std::process::id()));
    let opts = ModelOptions { num_pages: 4, max_seqs: 1, ..Default::default() };
    let model = if failed {
        Err(String::new())
    } else {
        guarded(|| {
            write_tiny_checkpoint(&dir, 7, false).map_err(|e| e.to_string())?;
            load_model(&dir, make()?, opts.clone(), &mut |_, _| {}).map_err(|e| e.to_string())
        })
    };
    let loaded = model.as_ref().map(|m| format!("{} layers", m.cfg.num_layers)).map_err(|e| e.clone());
    push(r, "tiny model load", loaded, &mut failed);
    let request = match (failed, model) {
        (false, Ok(mut m)) => guarded(|| {
            let prompt = [1u32, 17, 42, 99, 256];
            let g = m.generate(0, &prompt, 4, 64).map_err(|e| e.to_string())?;
            if !g.logits.iter().all(|x| x.is_finite()) {
                return Err("non-finite logits".into());
            }
            let mut reference = load_model(&dir, CpuBackend::new(), opts.clone(), &mut |_, _| {}).map_err(|e| e.to_string())?;
            let rg = reference.generate(0, &prompt, 4, 64).map_err(|e| e.to_string())?;
            kernel_api::tolerance::check_close("logits vs CPU reference", &g.logits, &rg.logits, kernel_api::Tolerance::F32_ALGO)?;
            Ok(format!("tokens {:?} match the CPU reference", g.tokens))
        }),
        _ => Err(String::new()),
    };
    push(r, "one fixed request", request, &mut failed);
    let _ = std::fs::remove_dir_all(&dir);
}
