//! Runs `k3-device-bench --backend simt32 --smoke --hardware h200 --device-checks both` and checks
//! its JSON report: the schema of the gpu-check hook (`rows` of {op, shape, dtype, us, tflops,
//! gbs, ..., floor_us, pct_floor}) with rows for every op family, the ones whose kernels check
//! device metadata as on/off pairs, and the `--table` view of that report.

use serde_json::Value;
use std::process::Command;

#[test]
fn smoke_run_on_simt32_reports_every_op_family() {
    let out = std::env::temp_dir().join(format!("k3-device-bench-smoke-{}.json", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_k3-device-bench"))
        .args(["--backend", "simt32", "--smoke", "--hardware", "h200", "--device-checks", "both", "--out"])
        .arg(&out)
        .output()
        .expect("start k3-device-bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}", run.status, String::from_utf8_lossy(&run.stderr));
    let text = std::fs::read_to_string(&out).expect("report written");
    let table = Command::new(env!("CARGO_BIN_EXE_k3-device-bench")).args(["--hardware", "mi355x", "--table"]).arg(&out).output().expect("start --table");
    let _ = std::fs::remove_file(&out);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("%floor") && table.contains("floors for mi355x") && table.contains("moe_gemm_down"), "--table:\n{table}");
    let report: Value = serde_json::from_str(&text).expect("report is JSON");
    assert_eq!(report["backend"], "simt32");
    assert_eq!(report["smoke"], true);
    assert!(report["copy_gbs"].as_f64().is_some_and(|v| v.is_finite() && v > 0.0), "copy_gbs: {}", report["copy_gbs"]);
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0));
    let rows = report["rows"].as_array().expect("rows array");
    for r in rows {
        for key in ["op", "shape", "dtype"] {
            assert!(r[key].as_str().is_some_and(|s| !s.is_empty()), "{key} missing in {r}");
        }
        assert!(r["us"].as_f64().is_some_and(|v| v.is_finite() && v > 0.0), "us in {r}");
        for key in ["tflops", "gbs", "pct_copy"] {
            assert!(r[key].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{key} in {r}");
        }
        assert!(r["bytes"].as_u64().is_some_and(|v| v > 0), "bytes in {r}");
        // The op's own cost and its floor on the named part.
        assert!(r["flops_by_class"]["vector"].as_u64().is_some(), "flops_by_class in {r}");
        assert!(r["floor_us"].as_f64().is_some_and(|v| v > 0.0), "floor_us in {r}");
        assert!(r["pct_floor"].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "pct_floor in {r}");
        assert!(matches!(r["bound"].as_str(), Some("memory" | "compute")), "bound in {r}");
    }
    assert_eq!(report["hardware"]["id"], "h200");
    let count_with = |op: &str, dtype_has: &str, checks: &str| {
        rows.iter()
            .filter(|r| r["op"] == op && r["dtype"].as_str().is_some_and(|d| d.contains(dtype_has)) && r["device_checks"] == checks)
            .count()
    };
    // Smoke shapes: 1 head count; 2 prefill batches, 2 decode batches, 2 MLA batches x 1 context
    // per cache format, with an f32 query on the fp8 cache, and (warp 32) the fp8 cache at 2 and 3
    // KV stages, 2 MoE token counts with the GEMMs also on f32 activations
    // (each with checks on and off) and, at the one past 8 tokens, the router on f32 x once per
    // logits path, 2 GEMM shapes x 2 token counts x 1 route (checks on).
    for checks in ["on", "off"] {
        let count = |op: &str, dtype_has: &str| count_with(op, dtype_has, checks);
        assert_eq!(count("kda_prefill", ""), 2, "checks {checks}");
        assert_eq!(count("kda_decode", ""), 2, "checks {checks}");
        assert_eq!(count("mla_decode", "bf16 cache"), 2, "checks {checks}");
        assert_eq!(count("mla_decode", "fp8"), 6, "checks {checks}");
        let f32_q = rows.iter().filter(|r| r["op"] == "mla_decode" && r["device_checks"] == checks && r["shape"].as_str().is_some_and(|s| s.ends_with(" q=f32")));
        assert_eq!(f32_q.count(), 2, "f32-query MLA rows, checks {checks}");
        for stages in [2, 3] {
            let label = format!("kv_stages={stages}");
            let swept = rows.iter().filter(|r| r["op"] == "mla_decode" && r["device_checks"] == checks && r["shape"].as_str().is_some_and(|s| s.ends_with(&label)));
            assert_eq!(swept.count(), 1, "{label}, checks {checks}");
        }
        for op in ["moe_router", "moe_align", "moe_gemm_gate_up", "moe_gemm_down", "moe_combine", "moe"] {
            assert_eq!(count(op, "") - count(op, "f32 act"), if op == "moe_router" { 4 } else { 2 }, "{op}, checks {checks}");
        }
        // The two GEMMs again on f32 activations (model-k3's dtypes), per token count.
        for op in ["moe_gemm_gate_up", "moe_gemm_down"] {
            assert_eq!(count(op, "f32 act"), 2, "{op} on f32 activations, checks {checks}");
        }
        for path in ["matrix units", "cuda cores"] {
            let rows = rows.iter().filter(|r| r["op"] == "moe_router" && r["device_checks"] == checks && r["shape"].as_str().is_some_and(|s| s.ends_with(path)));
            assert_eq!(rows.filter(|r| r["dtype"].as_str().is_some_and(|d| d.starts_with("f32 x"))).count(), 1, "router logits={path}, checks {checks}");
        }
    }
    assert_eq!(count_with("dense_gemm", "bf16", "on"), 4);
    assert_eq!(count_with("dense_gemm", "bf16", "off"), 0);
    assert!(stdout.contains("mla_decode") && stdout.contains("moe_gemm_down"), "table on stdout:\n{stdout}");
}
