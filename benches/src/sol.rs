//! Speed-of-light columns of the device bench report.
//!
//! Each row carries its op's [`Cost`] (from the op's own `cost` method in kernel-api) and, when
//! the part is known, its floor on that part ([`kernel_api::hardware`]): matched from the
//! driver's device name or named with `--hardware`. `k3-device-bench --table FILE` prints the
//! table from a report alone, so every check script (gpu-check.sh, amd-check.sh) shows the same
//! "% of copy bandwidth" and "% of floor" columns without arithmetic in bash.

use kernel_api::cost::{Cost, MathClass};
use kernel_api::hardware::{self, Hardware};
use kernel_api::Result;
use serde_json::{json, Value};

/// The part floors are computed for: `--hardware` when given, else the one the device name
/// denotes; with a line saying which (or why none).
pub fn resolve_hardware(flag: Option<&str>, device_name: &str) -> Result<(Option<&'static Hardware>, String)> {
    if let Some(id) = flag {
        let h = hardware::by_id(id, "--hardware")?;
        return Ok((Some(h), format!("--hardware {}", h.id)));
    }
    Ok(match hardware::match_device_name(device_name) {
        Some(h) => (Some(h), format!("matched from the device name `{device_name}`")),
        None => (None, format!("no hardware-table part matches the device name `{device_name}` (give --hardware)")),
    })
}

fn class_json(c: &Cost) -> Value {
    json!({
        "bf16": c.flops(MathClass::Bf16Matrix), "fp8": c.flops(MathClass::Fp8Matrix),
        "fp4": c.flops(MathClass::Fp4Matrix), "vector": c.flops(MathClass::Vector),
    })
}

/// The cost a report row was written with.
pub fn row_cost(row: &Value) -> Option<Cost> {
    let f = &row["flops_by_class"];
    let get = |k: &str| f[k].as_u64();
    Some(Cost { bytes: row["bytes"].as_u64()?, flops_by_class: [get("bf16")?, get("fp8")?, get("fp4")?, get("vector")?] })
}

/// The floor columns of a row: `floor_us`, `pct_floor` (floor / measured time, so 100 = at the
/// speed of light) and `bound`; nulls without a part.
pub fn floor_json(us: f64, cost: &Cost, hw: Option<&Hardware>) -> Value {
    match hw {
        Some(h) => {
            let f = h.floor(cost);
            json!({"floor_us": f.seconds() * 1e6, "pct_floor": 100.0 * f.seconds() * 1e6 / us.max(1e-9), "bound": f.bound().name()})
        }
        None => json!({"floor_us": null, "pct_floor": null, "bound": null}),
    }
}

/// One report row. `copy_traffic_gbs` = 2 x bytes copied per second by a large D2D copy.
pub fn row_json(op: &str, shape: &str, dtype: &str, us: f64, cost: &Cost, hw: Option<&Hardware>, copy_traffic_gbs: f64) -> Value {
    let s = us * 1e-6;
    let gbs = cost.bytes as f64 / s / 1e9;
    let mut v = json!({
        "op": op, "shape": shape, "dtype": dtype, "us": us,
        "tflops": cost.total_flops() as f64 / s / 1e12, "gbs": gbs,
        "bytes": cost.bytes, "flops": cost.total_flops(), "flops_by_class": class_json(cost),
        "pct_copy": 100.0 * gbs / copy_traffic_gbs,
    });
    if let (Some(m), Value::Object(f)) = (v.as_object_mut(), floor_json(us, cost, hw)) {
        m.extend(f);
    }
    v
}

/// The table of a `k3-device-bench/1` report; `hw` recomputes the floors for another part.
pub fn table(report: &Value, hw: Option<&Hardware>) -> String {
    let mut out = String::new();
    let part = hw.map(|h| h.id.to_string()).or_else(|| report["hardware"]["id"].as_str().map(str::to_string));
    out += &format!(
        "k3-device-bench on {} ({}), copy {:.1} GB/s copied ({}), floors for {}\n",
        report["backend"].as_str().unwrap_or("?"),
        report["device"].as_str().unwrap_or("?"),
        report["copy_gbs"].as_f64().unwrap_or(0.0),
        report["copy_source"].as_str().unwrap_or("?"),
        part.as_deref().unwrap_or("no part (give --hardware)"),
    );
    out += &format!("{:<17} {:>10} {:>9} {:>9} {:>7} {:>10} {:>7} {:>8}  shape / dtype\n", "op", "us", "TFLOP/s", "GB/s", "%copy", "floor us", "%floor", "bound");
    for r in report["rows"].as_array().into_iter().flatten() {
        let us = r["us"].as_f64().unwrap_or(0.0);
        let floor = match (hw, row_cost(r)) {
            (Some(h), Some(c)) => floor_json(us, &c, Some(h)),
            _ => r.clone(),
        };
        let num = |v: &Value, w: usize, p: usize| v.as_f64().map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.p$}"));
        // Rows timed with the kernels' device-metadata checks off (`--device-checks`) say so.
        let checks = if r["device_checks"] == "off" { " (device checks off)" } else { "" };
        out += &format!(
            "{:<17} {:>10.2} {} {} {} {} {} {:>8}  {} / {}{}\n",
            r["op"].as_str().unwrap_or("?"),
            us,
            num(&r["tflops"], 9, 3),
            num(&r["gbs"], 9, 1),
            num(&r["pct_copy"], 7, 1),
            num(&floor["floor_us"], 10, 2),
            num(&floor["pct_floor"], 7, 1),
            floor["bound"].as_str().unwrap_or("-"),
            r["shape"].as_str().unwrap_or(""),
            r["dtype"].as_str().unwrap_or(""),
            checks,
        );
    }
    out
}
