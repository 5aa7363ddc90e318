//! The bad-input suite (issue 15): generated malformed inputs on the host side, each answered by
//! a typed error or a correct result, with 0 panics, 0 signals, 0 hangs and bounded memory.
//!
//! - `k3 op` requests (params JSON and tensors) mutated from one valid request per op, run on
//!   `cpu`, `simt32` and `simt64` ([`OP_CASES`] per op family and backend);
//! - `config.json` mutations: parsed, inspected against the tiny checkpoint and loaded;
//! - safetensors files mutated (length field, header text and entries, truncation, padding):
//!   opened, inspected and loaded;
//! - `k3` command lines with bad flags, run as child processes.
//!
//! Each generator runs in a child process (this test binary re-run on one `#[ignore]`d test)
//! under `ulimit -v` ([`CHILD_MEMORY_KB`]) and a wall-clock limit: a signal, a hang or a memory
//! blow-up fails the parent test, and a panic is caught per case and counted. The children print
//! one `SUMMARY` line per group, which the parent checks and prints. `.ci/run` also runs the op
//! requests with the emulator built under AddressSanitizer (`K3_SIMT_ASAN=1`, where the
//! address-space cap is lifted: ASan reserves terabytes of shadow space).
//!
//! Device metadata that differs from what the plan saw (a device `block_table` unlike the host
//! copy, say) is the kernels' own suite; on the emulator the generators here keep integer
//! tensors' values as they are and override no host metadata, and the CPU backend, which
//! re-checks device metadata, gets those mutations too.

mod common;

use common::mutate::{mutate, mutate_config, mutate_safetensors};
use common::requests::{family, valid_requests};
use common::*;
use kernel_api::conformance::TestRng;
use kernel_api::cpu::CpuBackend;
use model_k3::checkpoint::{shard_file_name, Checkpoint};
use model_k3::config::K3Config;
use model_k3::inspect::inspect_checkpoint;
use model_k3::op_cli::{run_op, OpError};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Malformed `k3 op` requests per op family and backend.
const OP_CASES: usize = 12_000;
/// Mutated configs and safetensors files.
const CONFIG_CASES: usize = 1500;
const HEADER_CASES: usize = 1500;

/// Outcome counts of one generator group.
#[derive(Default)]
struct Tally {
    cases: usize,
    ok: usize,
    errors: BTreeMap<&'static str, usize>,
    panics: Vec<String>,
    /// The first error that names nothing (the suite fails on any).
    unnamed: Option<String>,
    slowest_ms: f64,
}

impl Tally {
    fn record<T, E: std::fmt::Display>(&mut self, seed: u64, f: impl FnOnce() -> Result<T, E>, kind: impl Fn(&E) -> &'static str) {
        let t = Instant::now();
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(_)) => self.ok += 1,
            Ok(Err(e)) => {
                let k = kind(&e);
                if k == "UNNAMED" && self.unnamed.is_none() {
                    self.unnamed = Some(format!("seed {seed}: {e}"));
                }
                *self.errors.entry(k).or_default() += 1;
            }
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                self.panics.push(format!("seed {seed}: {msg}"));
            }
        }
        self.cases += 1;
        self.slowest_ms = self.slowest_ms.max(t.elapsed().as_secs_f64() * 1e3);
    }

    fn summary(&self, group: &str) -> String {
        let errs: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "SUMMARY {group} cases={} ok={} errors={} [{}] panics={} slowest_ms={:.1}{}",
            self.cases,
            self.ok,
            self.errors.values().sum::<usize>(),
            errs.join(" "),
            self.panics.len(),
            self.slowest_ms,
            self.panics.first().map(|p| format!(" first_panic: {p}")).unwrap_or_default()
        ) + &self.unnamed.as_ref().map(|u| format!(" first_unnamed: {u}")).unwrap_or_default()
    }
}

/// The kind of an op error, after checking it names what was wrong.
fn op_error_kind(e: &OpError) -> &'static str {
    // (A params key may itself be the empty string: `params key ``: not a parameter`.)
    let named = e.subject().is_some() && !e.to_string().is_empty();
    match e {
        OpError::Tensor { .. } if named => "tensor",
        OpError::Param { .. } if named => "param",
        OpError::Kernel { source: kernel_api::Error::InvalidInput { .. }, .. } if named => "invalid",
        OpError::Kernel { source: kernel_api::Error::Unsupported { .. }, .. } if named => "unsupported",
        _ => "UNNAMED",
    }
}

fn model_error_kind(e: &model_k3::ModelError) -> &'static str {
    use model_k3::ModelError as M;
    match e {
        M::Io { .. } => "io",
        M::Checkpoint { .. } => "checkpoint",
        M::Tensor { .. } => "tensor",
        M::Kernel(kernel_api::Error::InvalidInput { field, .. }) if !field.is_empty() => "invalid",
        M::Kernel(kernel_api::Error::Unsupported { .. }) => "unsupported",
        _ => "UNNAMED",
    }
}

// ---- the children ---------------------------------------------------------------------------

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Child: malformed `k3 op` requests on `$K3_BAD_INPUT_BACKEND`.
#[test]
#[ignore]
fn child_op_requests() {
    let backend = std::env::var("K3_BAD_INPUT_BACKEND").unwrap_or_else(|_| "cpu".into());
    let cases = env_usize("K3_BAD_INPUT_CASES", OP_CASES);
    match backend.as_str() {
        "cpu" => op_requests(&CpuBackend::new(), "cpu", cases, true),
        "simt32" => op_requests(&k3_backend_simt::simt_backend(32).unwrap(), "simt32", cases, false),
        "simt64" => op_requests(&k3_backend_simt::simt_backend(64).unwrap(), "simt64", cases, false),
        other => panic!("unknown backend {other}"),
    }
}

fn op_requests<B: kernel_api::conformance::AllOps>(b: &B, name: &str, cases: usize, host_metadata: bool) {
    // Panic messages of caught panics would flood the output: the tally keeps the first.
    std::panic::set_hook(Box::new(|_| {}));
    let requests = valid_requests();
    for fam in ["dense", "mla", "kda", "moe"] {
        let ops: Vec<_> = requests.iter().filter(|r| family(r.op) == fam).collect();
        let mut t = Tally::default();
        for i in 0..cases {
            let base = ops[i % ops.len()];
            let seed = (i as u64) << 8 | fam.len() as u64;
            let mut r = TestRng::new(seed);
            let (inputs, params) = mutate(&mut r, base, host_metadata);
            t.record(seed, || run_op(b, base.op, &inputs, &params), op_error_kind);
        }
        println!("{}", t.summary(&format!("op {name} {fam}")));
    }
}

/// Child: mutated configs, parsed, inspected against the tiny checkpoint and loaded.
#[test]
#[ignore]
fn child_configs() {
    std::panic::set_hook(Box::new(|_| {}));
    let d = tiny("bad-config");
    let mut ck = Checkpoint::open(&d).unwrap();
    let root: serde_json::Value = serde_json::from_str(model_k3::config::TINY_CONFIG_JSON).unwrap();
    let cases = env_usize("K3_BAD_INPUT_CASES", CONFIG_CASES);
    let (mut parse, mut inspect, mut load) = (Tally::default(), Tally::default(), Tally::default());
    for i in 0..cases {
        let seed = i as u64;
        let v = mutate_config(&mut TestRng::new(seed), &root);
        let mut parsed = None;
        parse.record(seed, || K3Config::from_json(&v).map(|c| parsed = Some(c)), |e| if e.field().is_some() { "named" } else { "UNNAMED" });
        if let Some(cfg) = parsed {
            ck.config = cfg;
            // Deviations are counted as the inspector's "errors" (each names a tensor).
            inspect.record(
                seed,
                || {
                    let r = inspect_checkpoint(&ck);
                    if r.ok() { Ok(()) } else { Err(r.deviations[0].clone()) }
                },
                |d| if d.contains('`') || d.contains("experts") { "deviation" } else { "UNNAMED" },
            );
            // The loader alone (without the inspector's gate `run` puts in front of it) must
            // also answer a mismatched config with an error, never a panic or an abort.
            load.record(seed, || model_k3::weights::ModelWeights::load(&ck, &CpuBackend::new(), &mut |_| {}).map(|_| ()), model_error_kind);
        }
    }
    println!("{}", parse.summary("config parse"));
    println!("{}", inspect.summary("config inspect"));
    println!("{}", load.summary("config load"));
}

/// Child: mutated safetensors shards, opened, inspected and loaded.
#[test]
#[ignore]
fn child_headers() {
    std::panic::set_hook(Box::new(|_| {}));
    let d = tiny("bad-header");
    let shards = [shard_file_name(5, 6), shard_file_name(1, 6)];
    let originals: Vec<Vec<u8>> = shards.iter().map(|s| std::fs::read(d.join(s)).unwrap()).collect();
    let cases = env_usize("K3_BAD_INPUT_CASES", HEADER_CASES);
    let (mut open, mut load) = (Tally::default(), Tally::default());
    for i in 0..cases {
        let seed = i as u64;
        let which = i % shards.len();
        let bytes = mutate_safetensors(&mut TestRng::new(seed), &originals[which]);
        std::fs::write(d.join(&shards[which]), &bytes).unwrap();
        let mut opened = None;
        open.record(seed, || Checkpoint::open(&d).map(|c| opened = Some(c)), model_error_kind);
        if let Some(ck) = opened {
            let report = inspect_checkpoint(&ck);
            if report.ok() {
                load.record(seed, || model_k3::weights::ModelWeights::load(&ck, &CpuBackend::new(), &mut |_| {}).map(|_| ()), model_error_kind);
            }
        }
        std::fs::write(d.join(&shards[which]), &originals[which]).unwrap();
    }
    println!("{}", open.summary("header open"));
    println!("{}", load.summary("header load"));
}

// ---- the parent -----------------------------------------------------------------------------

/// Runs one child test of this binary under the memory cap and `timeout`; returns its SUMMARY lines.
fn child(test: &str, env: &[(&str, &str)], timeout: Duration) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    // An AddressSanitizer build (K3_SIMT_ASAN=1) reserves terabytes of shadow address space, so
    // the address-space cap is lifted there; the time limit stays.
    let cap = if std::env::var_os("K3_SIMT_ASAN").is_some() { "unlimited".to_string() } else { CHILD_MEMORY_KB.to_string() };
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg("ulimit -v \"$1\" && shift && exec \"$@\"").arg("sh").arg(cap);
    cmd.arg(exe).args([test, "--exact", "--ignored", "--nocapture", "--test-threads", "1"]);
    cmd.envs(env.iter().copied()).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let r = run_with_timeout(cmd, timeout);
    assert!(!r.timed_out, "{test} {env:?}: no answer within {timeout:?} (a hang)\n{}", r.stdout);
    assert!(r.signal.is_none() && r.code == Some(0), "{test} {env:?}: exit {:?} signal {:?}\n{}\n{}", r.code, r.signal, r.stdout, r.stderr);
    // (The harness prints `test NAME ... ` without a newline before the first line of output.)
    let lines: Vec<String> = r.stdout.lines().filter_map(|l| l.find("SUMMARY ").map(|i| l[i..].to_string())).collect();
    for l in &lines {
        println!("{l}  ({:.1} s for the child)", r.secs);
    }
    lines
}

fn check(lines: &[String], groups: usize) {
    assert_eq!(lines.len(), groups, "{lines:?}");
    for l in lines {
        assert!(l.contains(" panics=0 "), "{l}");
        assert!(!l.contains("UNNAMED"), "an error that names nothing: {l}");
    }
}

#[test]
fn valid_requests_run_on_cpu() {
    let b = CpuBackend::new();
    let reqs = valid_requests();
    let mut ops: Vec<&str> = reqs.iter().map(|r| r.op).collect();
    ops.sort();
    let mut all = model_k3::op_cli::op_names();
    all.sort();
    assert_eq!(ops, all, "one seed request per op");
    for r in &reqs {
        run_op(&b, r.op, &r.inputs, &r.params).unwrap_or_else(|e| panic!("{}: {e}", r.op));
    }
}

#[test]
fn malformed_op_requests_on_every_backend() {
    for backend in ["cpu", "simt32", "simt64"] {
        check(&child("child_op_requests", &[("K3_BAD_INPUT_BACKEND", backend)], Duration::from_secs(600)), 4);
    }
}

#[test]
fn malformed_configs() {
    check(&child("child_configs", &[], Duration::from_secs(300)), 3);
}

#[test]
fn malformed_safetensors_files() {
    check(&child("child_headers", &[], Duration::from_secs(300)), 2);
}

/// `k3` command lines with bad flags: each exits by itself with a status (clap usage errors are
/// 2, ours `error: ...` with 2 or 1), within the memory cap and the time limit, never a panic.
#[test]
fn malformed_command_lines() {
    let d = tiny("bad-cli");
    let m = d.to_str().unwrap().to_string();
    let values = ["0", "-1", "1", "18446744073709551615", "1e9", "nan", "inf", "-inf", "", "x", "1,,2", "99999999999999999999", "0.0"];
    let flags = ["--max-new-tokens", "--chunk", "--kv-scale", "--kv-cache-dtype", "--prompt-ids", "--backend"];
    let mut r = TestRng::new(15);
    let mut cases: Vec<Vec<String>> = Vec::new();
    for _ in 0..36 {
        let mut args = vec!["run".to_string(), "--model".into(), m.clone(), "--prompt-ids".into(), "1,2".into(), "--max-new-tokens".into(), "2".into()];
        for _ in 0..1 + r.below(2) {
            args.push(flags[r.below(flags.len())].into());
            args.push(values[r.below(values.len())].into());
        }
        cases.push(args);
    }
    for extra in [
        vec!["run", "--model", "/nonexistent", "--prompt-ids", "1"],
        vec!["run", "--model", &m, "--prompt-ids", "512"],
        vec!["run", "--model", &m, "--prompt-ids", "4294967295"],
        vec!["run", "--model", &m, "--prompt-ids", "-3"],
        vec!["inspect", "/dev/null"],
        vec!["inspect", ""],
        vec!["tiny-checkpoint", "/dev/null"],
        vec!["tiny-checkpoint", &m],
        vec!["demo", "--model", "/dev/null"],
        vec!["op", "gemm", "--inputs", "/nonexistent", "--outputs", "/dev/null"],
        vec!["op", "no_such_op", "--inputs", "/dev/null", "--outputs", "/dev/null"],
        vec!["--bogus"],
    ] {
        cases.push(extra.into_iter().map(String::from).collect());
    }
    let start = Instant::now();
    let mut exits: BTreeMap<i32, usize> = BTreeMap::new();
    for args in &cases {
        let r = k3(args, &[], Duration::from_secs(60));
        assert!(r.clean(), "{args:?}: {r:?}");
        *exits.entry(r.code.unwrap()).or_default() += 1;
        if r.code != Some(0) {
            assert!(r.stderr.contains("error"), "{args:?}: {r:?}");
        }
    }
    println!("SUMMARY cli cases={} exits={exits:?} in {:.1} s", cases.len(), start.elapsed().as_secs_f64());
}
