//! `k3-peer`: runs this project's ops on the case directories a peer comparison wrote (inputs
//! made by `benches/peer/*.py`), writes the outputs and device-event (or wall-clock) timings
//! next to them. The format is described in `k3_benches::peer`.
//!
//! ```text
//! k3-peer --backend cpu|simt32|simt64|cuda --dir DIR [--warmup N] [--iters N] [--case NAME]
//! ```

use k3_benches::peer::run_dir;
use kernel_api::{Error, Result};
use std::path::PathBuf;
use std::process::ExitCode;

struct Opts {
    backend: String,
    dir: PathBuf,
    warmup: usize,
    iters: usize,
    case: Option<String>,
}

const USAGE: &str = "usage: k3-peer --backend cpu|simt32|simt64|cuda --dir DIR [--warmup N] [--iters N] [--case NAME]";

fn parse() -> Result<Opts> {
    let mut o = Opts { backend: String::new(), dir: PathBuf::new(), warmup: 3, iters: 10, case: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| Error::invalid(a.clone(), format!("needs a value\n{USAGE}")));
        let count = |s: String, flag: &str| s.parse::<usize>().map_err(|e| Error::invalid(flag, format!("`{s}`: {e}")));
        match a.as_str() {
            "--backend" => o.backend = val()?,
            "--dir" => o.dir = PathBuf::from(val()?),
            "--warmup" => o.warmup = count(val()?, "--warmup")?,
            "--iters" => o.iters = count(val()?, "--iters")?.max(1),
            "--case" => o.case = Some(val()?),
            other => return Err(Error::invalid(other, format!("unknown argument\n{USAGE}"))),
        }
    }
    if o.backend.is_empty() || o.dir.as_os_str().is_empty() {
        return Err(Error::invalid("--backend/--dir", format!("both are required\n{USAGE}")));
    }
    Ok(o)
}

fn run(o: &Opts) -> Result<Vec<String>> {
    let only = o.case.as_deref();
    match o.backend.as_str() {
        "cpu" => run_dir(&kernel_api::cpu::CpuBackend::new(), &o.dir, o.warmup, o.iters, only),
        "simt32" | "simt64" => run_dir(&k3_backend_simt::simt_backend(if o.backend == "simt32" { 32 } else { 64 })?, &o.dir, o.warmup, o.iters, only),
        #[cfg(feature = "cuda")]
        "cuda" => run_dir(&k3_backend_cuda::cuda_backend(0)?, &o.dir, o.warmup, o.iters, only),
        other => Err(Error::invalid("--backend", format!("`{other}` is not available in this build (cpu, simt32, simt64{})", if cfg!(feature = "cuda") { ", cuda" } else { "; cuda needs the `cuda` feature" }))),
    }
}

fn main() -> ExitCode {
    match parse().and_then(|o| run(&o)) {
        Ok(lines) => {
            let failed = lines.iter().filter(|l| l.contains("FAILED")).count();
            for l in &lines {
                println!("{l}");
            }
            if failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("k3-peer: {e}");
            ExitCode::from(2)
        }
    }
}
