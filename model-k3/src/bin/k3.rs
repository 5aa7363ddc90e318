//! The `k3` command line.

use clap::{Parser, Subcommand};
use kernel_api::cpu::CpuBackend;
use kernel_api::Backend;
use model_k3::doctor;
use model_k3::exec::ModelBackend;
use model_k3::inspect::inspect_dir;
use model_k3::kv_default::resolve_kv_cache_dtype;
use model_k3::model::ModelOptions;
use model_k3::op_cli::run_op_files;
use model_k3::checkpoint::read_config;
use model_k3::runner::{check_run_request, load_model, parity, write_npy};
use model_k3::tiny::write_tiny_checkpoint;
use model_k3::tiny_folder::{ensure_tiny_checkpoint, Ensured};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "k3", version, about = "Kimi K3 on the k3-kernels contract")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Runs `$body` with `$b` bound to the named backend (each arm is its own type, so the generic
/// model code is instantiated per backend).
macro_rules! with_backend {
    ($name:expr, |$b:ident| $body:expr) => {
        match $name {
            "cpu" => {
                let $b = CpuBackend::new();
                $body
            }
            "simt32" | "simt64" => match k3_backend_simt::simt_backend(if $name == "simt32" { 32 } else { 64 }) {
                Ok($b) => $body,
                Err(e) => fail(e),
            },
            #[cfg(feature = "cuda")]
            "cuda" => match k3_backend_cuda::cuda_backend(0) {
                Ok($b) => $body,
                Err(e) => fail(e),
            },
            #[cfg(feature = "rocm")]
            "rocm" => match k3_backend_rocm::rocm_backend(0) {
                Ok($b) => $body,
                Err(e) => fail(e),
            },
            other => fail(format!(
                "backend `{other}` is not available in this build (available: cpu, simt32, simt64{}{})",
                if cfg!(feature = "cuda") { ", cuda" } else { "; cuda needs `--features cuda`" },
                if cfg!(feature = "rocm") { ", rocm" } else { "; rocm needs `--features rocm`" }
            )),
        }
    };
}

#[derive(clap::Args, Clone)]
struct BackendArg {
    /// Backend to run on (`cpu`, `simt32`, `simt64`, `cuda` / `rocm` with those features); defaults to $K3_BACKEND, else `cpu`.
    #[arg(long)]
    backend: Option<String>,
}

impl BackendArg {
    fn name(&self) -> String {
        self.backend.clone().or_else(|| std::env::var("K3_BACKEND").ok()).unwrap_or_else(|| "cpu".into())
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job: make the tiny checkpoint if missing, load it, generate, report speed and parity.
    Demo {
        /// Where the tiny checkpoint lives (created when missing).
        #[arg(long, default_value = "tiny-k3")]
        model: PathBuf,
        #[arg(long, default_value_t = 16)]
        max_new_tokens: usize,
        #[command(flatten)]
        backend: BackendArg,
    },
    /// Run a prompt of token ids through a checkpoint and generate greedily.
    Run {
        #[arg(long)]
        model: PathBuf,
        /// Comma-separated token ids, e.g. 1,2,3.
        #[arg(long, value_delimiter = ',', required = true)]
        prompt_ids: Vec<u32>,
        #[arg(long, default_value_t = 8)]
        max_new_tokens: usize,
        /// bf16, fp8-e4m3fn, fp8-e4m3fnuz, fp8-tiled-e4m3fn, fp8-tiled-e4m3fnuz, or fp8 / fp8-tiled
        /// for the backend's own fp8 flavour (e4m3fnuz on gfx942, e4m3fn elsewhere).
        #[arg(long, default_value = "bf16")]
        kv_cache_dtype: String,
        /// Per-tensor scale of a flat fp8 cache.
        #[arg(long, default_value_t = 0.05)]
        kv_scale: f32,
        /// Prefill chunk size in tokens.
        #[arg(long, default_value_t = 256)]
        chunk: usize,
        /// Write the logits of every fed position as a [positions, vocab] f32 .npy file.
        #[arg(long)]
        logits_out: Option<PathBuf>,
        #[command(flatten)]
        backend: BackendArg,
    },
    /// Check a checkpoint against its config from headers alone; exits non-zero on any deviation.
    Inspect { dir: PathBuf },
    /// Write the tiny test checkpoint (HF layout, MXFP4 experts, deterministic for a seed).
    TinyCheckpoint {
        out: PathBuf,
        /// Store routed experts as exact bf16 (`experts.E.w*.weight`) instead of MXFP4.
        #[arg(long)]
        bf16_twin: bool,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Run ONE kernel op on tensors from a safetensors file and write its outputs to another
    /// (a reproduction package to compare with any reference; see model-k3/README.md).
    Op {
        /// Op name as in the conformance registry: gemm, rms_norm, mla_decode, kda_prefill, ...
        name: String,
        /// Input tensors, named as the op's argument fields (in-place tensors included).
        #[arg(long)]
        inputs: PathBuf,
        /// Params JSON: the op's params fields by name, `out_dtypes`, `dtypes`, host metadata.
        #[arg(long)]
        params: Option<PathBuf>,
        /// Where to write the outputs (pure outputs and in-place tensors).
        #[arg(long)]
        outputs: PathBuf,
        #[command(flatten)]
        backend: BackendArg,
    },
    /// Speed-of-light floors of a K3 decode step and prefill per GPU (a model, not a measurement).
    Plan(model_k3::plan::PlanArgs),
    /// Environment fingerprint and staged checks; names the first failing stage.
    Doctor {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        backend: BackendArg,
    },
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Inspect { dir } => match inspect_dir(&dir) {
            Ok(r) => {
                println!("{r}");
                if r.ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => fail(e),
        },
        Cmd::TinyCheckpoint { out, bf16_twin, seed } => match write_tiny_checkpoint(&out, seed, bf16_twin) {
            Ok(n) => {
                println!("wrote {n} tensors to {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Cmd::Demo { model, max_new_tokens, backend } => with_backend!(backend.name().as_str(), |b| demo(&model, max_new_tokens, b)),
        Cmd::Run { model, prompt_ids, max_new_tokens, kv_cache_dtype, kv_scale, chunk, logits_out, backend } => {
            let tokens = read_config(&model).and_then(|cfg| check_run_request(&cfg, &prompt_ids, max_new_tokens, chunk, kv_scale, logits_out.as_deref()));
            let opts = match tokens {
                Ok(tokens) => ModelOptions { kv_scale, ..run_options(tokens) },
                Err(e) => return fail(e),
            };
            with_backend!(backend.name().as_str(), |b| {
                // `fp8` / `fp8-tiled` take the backend's own flavour.
                match resolve_kv_cache_dtype(&kv_cache_dtype, b.device_info()) {
                    Ok(kv_format) => run(&model, &prompt_ids, max_new_tokens, chunk, ModelOptions { kv_format, ..opts }, logits_out.as_deref(), b),
                    Err(e) => fail(e),
                }
            })
        }
        Cmd::Op { name, inputs, params, outputs, backend } => with_backend!(backend.name().as_str(), |b| {
            match run_op_files(&b, &name, &inputs, params.as_deref(), &outputs) {
                Ok(outs) => {
                    for (n, t) in &outs {
                        println!("{n}: {} {:?}", t.dtype, t.shape);
                    }
                    println!("wrote {} tensors to {}", outs.len(), outputs.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }),
        Cmd::Plan(args) => model_k3::plan::run_cli(&args),
        Cmd::Doctor { json, backend } => {
            let report = doctor::run_doctor(&backend.name());
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// Cache sized for one sequence of `tokens` tokens.
fn run_options(tokens: usize) -> ModelOptions {
    let page_size = 64;
    ModelOptions { page_size, num_pages: tokens.div_ceil(page_size) + 1, max_seqs: 1, ..Default::default() }
}

fn progress_printer() -> impl FnMut(u64, u64) {
    let start = Instant::now();
    let mut last = 0u64;
    move |done, total| {
        // A progress line only for loads that take more than a moment.
        if start.elapsed().as_millis() > 500 && (done == total || done - last > total / 20) {
            eprint!("\r  loading weights: {:>5.1}% of {:.1} MB", 100.0 * done as f64 / total.max(1) as f64, total as f64 / 1e6);
            last = done;
            if done == total {
                eprintln!();
            }
        }
    }
}

fn run<B: ModelBackend>(dir: &Path, prompt: &[u32], max_new: usize, chunk: usize, opts: ModelOptions, logits_out: Option<&Path>, backend: B) -> ExitCode {
    let mut m = match load_model(dir, backend, opts, &mut progress_printer()) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let t = Instant::now();
    let g = match m.generate_with(0, prompt, max_new, chunk, logits_out.is_some()) {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    let secs = t.elapsed().as_secs_f64();
    println!("tokens: {}", g.tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","));
    println!("{} positions in {:.3} s ({:.1} tokens/s)", g.positions, secs, g.positions as f64 / secs.max(1e-9));
    if let Some(p) = logits_out {
        if let Err(e) = write_npy(p, g.rows(), g.vocab, &g.logits) {
            return fail(e);
        }
        println!("logits [{}, {}] f32 written to {}", g.rows(), g.vocab, p.display());
    }
    ExitCode::SUCCESS
}

fn demo<B: ModelBackend>(dir: &Path, max_new: usize, backend: B) -> ExitCode {
    let backend_name = backend.name().to_string();
    let t0 = Instant::now();
    println!("[1/5] checkpoint: {}", dir.display());
    match ensure_tiny_checkpoint(dir, 7, false) {
        Ok(Ensured::Made(n)) => println!("      wrote the tiny K3 checkpoint ({n} tensors, MXFP4 experts)"),
        Ok(Ensured::Remade { why, tensors }) => {
            println!("      found a half-made tiny checkpoint ({why}); wrote it again ({tensors} tensors)")
        }
        Ok(_) => {}
        Err(e) => return fail(e),
    }
    match inspect_dir(dir) {
        Ok(r) if r.ok() => println!("      inspect: OK ({} tensors, {:.1}% quantised bytes)", r.tensors, 100.0 * r.quantized_fraction),
        Ok(r) => return fail(format!("checkpoint deviates from its config:\n{r}")),
        Err(e) => return fail(e),
    }
    let prompt: Vec<u32> = vec![1, 17, 42, 99, 256, 311, 7, 404, 12, 65, 130, 261];
    let opts = ModelOptions { num_pages: 8, max_seqs: 2, ..Default::default() };
    println!("[2/5] load on backend `{backend_name}`");
    let t = Instant::now();
    let mut m = match load_model(dir, backend, opts.clone(), &mut progress_printer()) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    println!("      {} layers ({} KDA, {} MLA) loaded in {:.2} s", m.cfg.num_layers, m.cfg.kda_layers().count(), m.cfg.mla_layers().count(), t.elapsed().as_secs_f64());
    println!("[3/5] prefill {} tokens + generate {max_new}", prompt.len());
    let t = Instant::now();
    let g = match m.generate(0, &prompt, max_new, 64) {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    let secs = t.elapsed().as_secs_f64();
    println!("[4/5] tokens: {}", g.tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" "));
    println!("      {} positions in {:.3} s: {:.1} tokens/s", g.rows(), secs, g.rows() as f64 / secs.max(1e-9));
    // Parity: the same tokens fed one at a time through the decode ops, on the CPU reference.
    println!("[5/5] parity against the CPU reference (token-by-token decode path)");
    let mut reference = match load_model(dir, CpuBackend::new(), opts, &mut |_, _| {}) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let r = match reference.generate(0, &prompt, max_new, 1) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let p = parity(&g, &r, kernel_api::Tolerance::F32_ALGO);
    println!(
        "      parity: tokens {}, logits rel RMSE {:.2e} (limit {:.0e}){} -> {}",
        if p.tokens_equal { "equal" } else { "DIFFER" },
        p.rel_rmse,
        kernel_api::Tolerance::F32_ALGO.rel_rmse,
        if p.nonfinite == (0, 0) { String::new() } else { format!(", non-finite logits {} / {} (reference)", p.nonfinite.0, p.nonfinite.1) },
        if p.ok { "OK" } else { "FAILED" }
    );
    println!("done in {:.2} s", t0.elapsed().as_secs_f64());
    if p.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
