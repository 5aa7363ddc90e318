//! # model-k3: Kimi K3 on the k3-kernels contract
//!
//! - [`config`]: `config.json` -> typed, cross-checked dims and layer map;
//! - [`inventory`]: the tensors a checkpoint must hold for a config;
//! - [`checkpoint`]: HF-layout loading (index, memory-mapped shards, header-only open);
//! - [`inspect`]: checkpoint conformance against the config;
//! - [`tiny`]: the deterministic tiny checkpoint generator; [`tiny_folder`]: its atomic,
//!   lock-serialised folder and the complete / half-made check;
//! - [`plan`]: `k3 plan`, the speed-of-light floors of a K3 decode step and prefill per GPU;
//! - [`kv_default`]: the fp8 KV-cache flavour a device computes with, and scale conversion;
//! - [`op_cli`]: `k3 op`, one op on tensors from a safetensors file (reproduction packages);
//! - [`limits`]: the caps on every size taken from a file or a flag; [`files`]: regular-file
//!   readers and replace-by-rename writers; [`st_header`]: precise safetensors header errors.

pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod doctor;
pub mod exec;
pub mod error;
pub mod files;
pub mod finite;
pub mod inspect;
pub mod inventory;
pub mod kv_default;
pub mod limits;
pub mod model;
pub mod op_cli;
pub mod plan;
pub mod runner;
pub mod st_header;
pub mod tiny;
pub mod tiny_folder;
pub mod weights;

pub use error::{ModelError, Result};
