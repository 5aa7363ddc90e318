//! # k3-build-support: ahead-of-time device compiles for backend build scripts
//!
//! Compiles the kernel dialect (`kernels/csrc`, see `k3/compat.h`) with nvcc into cubins for
//! `K3_CUDA_ARCHS` (default `90a,100a,103a`) and with clang into HSA code objects for
//! `K3_HIP_ARCHS` (default `gfx942,gfx950`), caches the outputs by content hash, and never
//! fails a build: a missing toolchain or a failed compile becomes a `cargo::warning` and an
//! "unavailable" entry the backend reports at run time.
//!
//! A backend build script (backend-cuda; backend-rocm is the same with `compile_hip`):
//!
//! ```no_run
//! use k3_build_support::{compile_cuda, declare_cfgs, emit_cfg_if_any, kernel_sources, write_image_table};
//! use k3_build_support::{BuildEnv, Config, Platform};
//! use std::path::PathBuf;
//!
//! let env = BuildEnv::build_script();
//! declare_cfgs(&env);
//! let csrc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels/csrc");
//! let sources = kernel_sources(&csrc).unwrap_or_default(); // a listing error shows up as no images
//! let cfg = Config::for_build_script(&env, sources, vec![csrc]);
//! let cuda = compile_cuda(&env, &cfg);
//! emit_cfg_if_any(&env, Platform::Cuda, &cuda);
//! if let Err(e) = write_image_table(&cfg.out_dir.join("cuda_images.rs"), &cuda, &[]) {
//!     env.warning(&format!("k3-backend-cuda: {e}"));
//! }
//! // lib.rs: mod images { include!(concat!(env!("OUT_DIR"), "/cuda_images.rs")); }
//! ```
//!
//! Environment (each read is reported with `cargo::rerun-if-env-changed`): see
//! `build-support/README.md` for the full table.

pub mod arch;
pub mod compile;
pub mod config;
pub mod disasm;
pub mod embed;
pub mod env;
pub mod hash;
mod par;
pub mod resources;
pub mod sources;
pub mod toolchain;

pub use arch::{CudaArch, HipArch, DEFAULT_CUDA_ARCHS, DEFAULT_HIP_ARCHS};
pub use compile::{
    bundle_fatbins, compile_cuda, compile_cuda_with, compile_hip, compile_hip_assembly, ArchOutcome, Artifact,
    ArtifactKind, Failure, Platform, Skip,
};
pub use config::Config;
pub use embed::{declare_cfgs, emit_cfg_if_any, write_image_table, write_sources_table, CFG_CUDA_KERNELS, CFG_HIP_KERNELS};
pub use env::BuildEnv;
pub use sources::kernel_sources;
pub use toolchain::{find_hip_clang, find_nvcc, ClangKind, HipClang, NotFound, Nvcc};
