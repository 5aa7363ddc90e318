//! Gates: conditions on the resource figures that CI enforces, one per line of a small text
//! file (`benches/kernel-gates.txt`):
//!
//! ```text
//! # kernel       target    condition                 (`#` starts a comment)
//! *_mma          *         matrix_total > 0
//! kda_decode_*   sm_*      scratch_stores == 0
//! mla_decode_*   gfx*      calls == 0
//! kda_decode_*   *         wide_load_share >= 0.9
//! ```
//!
//! Kernel and target are globs (`*` any run of characters, `?` one); the condition compares a
//! metric of [`KernelResources::METRICS`] with a number (`==`, `!=`, `<`, `<=`, `>`, `>=`). A gate
//! fails for every (kernel, target) it matches where the condition is false; a metric that does
//! not apply there (AGPRs on NVIDIA, the load share of a kernel without global loads) is not
//! checked. A gate that matches no kernel at all is an error too, so a renamed kernel cannot
//! silently drop out of its gate.

use super::KernelResources;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn parse(s: &str) -> Option<Cmp> {
        Some(match s {
            "==" => Cmp::Eq,
            "!=" => Cmp::Ne,
            "<" => Cmp::Lt,
            "<=" => Cmp::Le,
            ">" => Cmp::Gt,
            ">=" => Cmp::Ge,
            _ => return None,
        })
    }

    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        }
    }
}

/// One line of a gate file.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub kernel: String,
    pub target: String,
    pub metric: String,
    pub cmp: Cmp,
    pub value: f64,
    /// 1-based line in the file, for messages.
    pub line: usize,
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {} {} {} {} {}", self.line, self.kernel, self.target, self.metric, self.cmp.as_str(), self.value)
    }
}

/// Parses a gate file; every malformed line is reported (line number and why).
pub fn parse(text: &str) -> Result<Vec<Gate>, String> {
    let mut gates = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [kernel, target, metric, cmp, value] = words[..] else {
            errors.push(format!("line {}: expected `KERNEL TARGET METRIC OP NUMBER`, got `{line}`", i + 1));
            continue;
        };
        if !KernelResources::METRICS.contains(&metric) {
            errors.push(format!("line {}: unknown metric `{metric}` (known: {})", i + 1, KernelResources::METRICS.join(", ")));
            continue;
        }
        let Some(cmp) = Cmp::parse(cmp) else {
            errors.push(format!("line {}: unknown comparison `{cmp}` (==, !=, <, <=, >, >=)", i + 1));
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            errors.push(format!("line {}: `{value}` is not a number", i + 1));
            continue;
        };
        gates.push(Gate { kernel: kernel.into(), target: target.into(), metric: metric.into(), cmp, value, line: i + 1 });
    }
    if errors.is_empty() {
        Ok(gates)
    } else {
        Err(errors.join("\n"))
    }
}

/// `*` matches any run of characters, `?` any one.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some((b'?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// Checks every gate against the report's kernels: one message per failure, naming the gate,
/// the kernel, the target and the value found.
pub fn check(gates: &[Gate], kernels: &[KernelResources]) -> Vec<String> {
    let mut failures = Vec::new();
    for g in gates {
        let matched: Vec<&KernelResources> =
            kernels.iter().filter(|k| glob(&g.kernel, &k.kernel) && glob(&g.target, &k.target)).collect();
        if matched.is_empty() {
            failures.push(format!("gate {g}: matches no kernel on any target"));
        }
        for k in matched {
            if let Some(v) = k.metric(&g.metric) {
                if !g.cmp.holds(v, g.value) {
                    failures.push(format!("gate {g}: {} on {} has {} = {v}", k.kernel, k.target, g.metric));
                }
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{CodeStats, Vendor};

    fn k(name: &str, target: &str, hmma: u64, scratch_stores: u64, agprs: Option<u32>) -> KernelResources {
        let mut code = CodeStats { scratch_stores, ..Default::default() };
        for _ in 0..hmma {
            code.matrix_op("mma.sync", "HMMA.16816.F32.BF16");
        }
        KernelResources {
            kernel: name.into(),
            source: "x.cu".into(),
            target: target.into(),
            vendor: if agprs.is_some() { Vendor::Amd } else { Vendor::Nvidia },
            regs: 64,
            agprs,
            sgprs: agprs,
            vgpr_spills: agprs,
            sgpr_spills: agprs,
            max_block_threads: None,
            static_shared_bytes: 0,
            scratch_bytes: 0,
            code,
            callee_scratch_ops: 0,
            callees: Vec::new(),
        }
    }

    #[test]
    fn globs() {
        assert!(glob("*_mma", "dense_gemm_bf16_mma"));
        assert!(!glob("*_mma", "dense_gemm_bf16_mma_x"));
        assert!(glob("sm_10?a", "sm_103a") && !glob("sm_10?a", "sm_90a"));
        assert!(glob("*", "") && glob("a*b*c", "aXbYbc") && !glob("a*b*c", "aXbY"));
    }

    #[test]
    fn parse_reports_every_bad_line() {
        let g = parse("# comment\n*_mma * matrix_total > 0   # trailing comment\n\nkda_* gfx* agprs <= 128\n").expect("valid");
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].line, g[0].cmp, g[0].value), (2, Cmp::Gt, 0.0));
        assert_eq!((g[1].kernel.as_str(), g[1].target.as_str(), g[1].metric.as_str()), ("kda_*", "gfx*", "agprs"));
        let err = parse("a * regs\na * nope > 1\na * regs ~ 1\na * regs > many\n").expect_err("four bad lines");
        for want in ["line 1: expected", "line 2: unknown metric `nope`", "line 3: unknown comparison", "line 4: `many`"] {
            assert!(err.contains(want), "{want} in {err}");
        }
    }

    #[test]
    fn check_fails_per_kernel_and_target_and_on_unmatched_gates() {
        let ks = [
            k("gemm_mma", "sm_90a", 8, 0, None),
            k("gemm_mma", "gfx942", 0, 3, Some(0)),
            k("decode", "sm_90a", 0, 2, None),
        ];
        let gates = parse("*_mma * matrix_total > 0\ndecode sm_* scratch_stores == 0\n* * agprs == 0\nrenamed * calls == 0\n").expect("valid");
        let f = check(&gates, &ks);
        assert_eq!(f.len(), 3, "{f:#?}");
        assert!(f[0].contains("gemm_mma on gfx942 has matrix_total = 0"), "{}", f[0]);
        assert!(f[1].contains("decode on sm_90a has scratch_stores = 2"), "{}", f[1]);
        assert!(f[2].contains("line 4") && f[2].contains("matches no kernel"), "{}", f[2]);
        // `agprs == 0` holds on the AMD kernel and does not apply to the NVIDIA ones.
        assert!(check(&parse("* gfx* agprs == 0").expect("valid"), &ks).is_empty());
    }
}
