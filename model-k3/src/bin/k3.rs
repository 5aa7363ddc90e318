//! The `k3` command line.

use clap::{Parser, Subcommand};
use model_k3::inspect::inspect_dir;
use model_k3::tiny::write_tiny_checkpoint;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "k3", version, about = "Kimi K3 on the k3-kernels contract")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Check a checkpoint against its config from headers alone; exits non-zero on any deviation.
    Inspect {
        dir: PathBuf,
    },
    /// Write the tiny test checkpoint (HF layout, MXFP4 experts, deterministic for a seed).
    TinyCheckpoint {
        out: PathBuf,
        /// Store routed experts as exact bf16 (`experts.E.w*.weight`) instead of MXFP4.
        #[arg(long)]
        bf16_twin: bool,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
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
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::TinyCheckpoint { out, bf16_twin, seed } => match write_tiny_checkpoint(&out, seed, bf16_twin) {
            Ok(n) => {
                println!("wrote {n} tensors to {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}
