//! `k3 tiny-checkpoint`: writes the tiny test config of k3-architecture.md section 5 in the
//! exact HF layout (one shard per layer plus one for the global tensors, six-digit shard total,
//! `language_model.` prefix, index with `total_size`), deterministic for a seed.
//!
//! How weights are drawn, and why (sections 5.3, 5.5):
//! - routed experts on the E2M1 grid times power-of-two scales, so the bf16 twin (`--bf16-twin`,
//!   `experts.E.w*.weight` holding the exact dequantised values) must give bit-identical results;
//! - norm weights 1 + N(0, 0.05), so a missing weight multiply cannot cancel out;
//! - KDA `k_proj` correlated with `q_proj` and a larger `v_proj` gain, so the KDA output is well
//!   above the `o_norm` epsilon and the layer really contributes;
//! - `dt_bias` uniform in [-4, 2], giving a spread of decays; `A_log` zero-padded past the heads;
//! - the router bias f32, as in the real checkpoint.

use crate::checkpoint::{dtype_to_st, shard_file_name, INDEX_FILE};
use crate::config::{K3Config, TINY_CONFIG_JSON};
use crate::error::{ModelError, Result};
use crate::inventory::{expected_tensors, ExpertStorage, TensorSpec, PREFIX};
use crate::tiny_folder::{install, lock_parent, tiny_state, TinyState, COMPLETE_MARKER};
use half::bf16;
use kernel_api::conformance::TestRng;
use kernel_api::formats::{F4E2M1, E8M0};
use kernel_api::DType;
use std::collections::BTreeMap;
use std::path::Path;

/// Per-tensor RNG: a hash of (seed, name), so each tensor is independent of the others' order.
fn rng_for(seed: u64, name: &str) -> TestRng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    TestRng::new(h)
}

fn normals(rng: &mut TestRng, n: usize, std: f32) -> Vec<f32> {
    rng.normals(n, std)
}

/// MXFP4 codes and scale bytes of one expert matrix `[rows, cols]`, drawn on the grid.
fn mxfp4_draw(seed: u64, base: &str, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut rng = rng_for(seed, base);
    let codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    // E2M1 codes have RMS ~2.9; 2^-5..2^-4 puts weights near 1/sqrt(cols) for cols 64..96.
    let scales: Vec<u8> = (0..rows * cols / 32).map(|_| E8M0::from_exponent(-5 + rng.below(2) as i32).to_bits()).collect();
    let packed = codes.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect();
    (packed, scales)
}

fn mxfp4_dequant(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            out[r * cols + c] = F4E2M1::from_bits(code).to_f32() * E8M0::from_bits(scales[r * cols / 32 + c / 32]).to_f32();
        }
    }
    out
}

fn to_bytes(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => v.iter().flat_map(|x| bf16::from_f32(*x).to_bits().to_le_bytes()).collect(),
    }
}

/// Values of one non-expert tensor.
fn draw(cfg: &K3Config, seed: u64, s: &TensorSpec) -> Vec<f32> {
    let name = s.name.strip_prefix(PREFIX).unwrap_or(&s.name);
    let n: usize = s.shape.iter().product();
    let fan_in = *s.shape.last().unwrap_or(&1) as f32;
    let mut rng = rng_for(seed, name);
    let linear = |rng: &mut TestRng, gain: f32| normals(rng, n, gain / fan_in.sqrt());
    if name.ends_with("norm.weight") || name.ends_with("_layernorm.weight") {
        return normals(&mut rng, n, 0.05).into_iter().map(|x| 1.0 + x).collect();
    }
    if name.ends_with("embed_tokens.weight") {
        return normals(&mut rng, n, 1.0);
    }
    if name.ends_with("_res_proj.weight") {
        return normals(&mut rng, n, 0.5);
    }
    if name.ends_with("A_log") {
        let h = cfg.kda.num_heads;
        return (0..n).map(|i| if i < h { rng.range(-1.0, 0.5) } else { 0.0 }).collect();
    }
    if name.ends_with("dt_bias") {
        return rng.uniforms(n, -4.0, 2.0);
    }
    if name.ends_with("e_score_correction_bias") {
        return normals(&mut rng, n, 0.05);
    }
    if name.ends_with("_conv1d.weight") {
        // [P, 1, W]: the current-token tap dominates so the conv is a mild smoothing.
        let w = cfg.kda.conv_kernel;
        return (0..n).map(|i| if i % w == w - 1 { 1.0 + 0.1 * rng.normal() } else { 0.3 * rng.normal() }).collect();
    }
    if name.ends_with("self_attn.k_proj.weight") {
        // Correlate k with q (section 5.5) so q.k is not ~0.
        let q_name = name.replace("k_proj", "q_proj");
        let q = normals(&mut rng_for(seed, &q_name), n, 1.0 / fan_in.sqrt());
        let noise = linear(&mut rng, 0.6);
        return q.iter().zip(&noise).map(|(a, b)| 0.8 * a + b).collect();
    }
    if name.ends_with("self_attn.q_proj.weight") {
        return normals(&mut rng_for(seed, name), n, 1.0 / fan_in.sqrt());
    }
    if name.ends_with("self_attn.v_proj.weight") {
        return linear(&mut rng, 3.0);
    }
    if name.ends_with("f_a_proj.weight") || name.ends_with("f_b_proj.weight") {
        return linear(&mut rng, 0.5);
    }
    linear(&mut rng, 1.0)
}

/// Writes the tiny checkpoint into `out`, atomically: the files go to a temporary sibling folder
/// that is renamed to `out` once complete (with [`COMPLETE_MARKER`] written last; see
/// [`crate::tiny_folder`]), so `out` is
/// never seen half-made, even when the writer is killed. `out` may be missing, an empty folder, or
/// an earlier tiny checkpoint (complete or half-made), which is replaced; a folder holding
/// anything else, or a path that is not a folder, is refused and left alone. Returns the number of
/// tensors.
pub fn write_tiny_checkpoint(out: &Path, seed: u64, bf16_twin: bool) -> Result<usize> {
    let _lock = lock_parent(out)?;
    if let TinyState::Foreign(why) = tiny_state(out)? {
        return Err(ModelError::checkpoint(out, format!("{why}; refusing to replace it (choose a new folder)")));
    }
    install(out, seed, bf16_twin)
}

/// The files of the tiny checkpoint, written into the existing folder `out`, the completion
/// marker last. Returns the number of tensors.
pub(crate) fn write_files(out: &Path, seed: u64, bf16_twin: bool) -> Result<usize> {
    let cfg = K3Config::from_json_str(TINY_CONFIG_JSON)?;
    let cfg_path = out.join("config.json");
    std::fs::write(&cfg_path, TINY_CONFIG_JSON).map_err(|e| ModelError::io(&cfg_path, e))?;
    let storage = if bf16_twin { ExpertStorage::Bf16 } else { ExpertStorage::Mxfp4 };
    let specs = expected_tensors(&cfg, storage);

    // Shard k holds layer k; the last shard holds the global tensors.
    let n_shards = cfg.num_layers + 1;
    let mut shards: Vec<Vec<(String, DType, Vec<usize>, Vec<u8>)>> = vec![Vec::new(); n_shards];
    for s in &specs {
        let short = s.name.strip_prefix(PREFIX).unwrap_or(&s.name);
        let shard = short
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(n_shards - 1);
        let dtype = s.dtypes[0];
        let bytes = if let Some(base) = expert_base(short) {
            let (rows, cols) = if short.contains(".w2.") {
                (cfg.moe.latent_size, cfg.moe.moe_intermediate_size)
            } else {
                (cfg.moe.moe_intermediate_size, cfg.moe.latent_size)
            };
            let (packed, scales) = mxfp4_draw(seed, base, rows, cols);
            if short.ends_with(".weight_packed") {
                packed
            } else if short.ends_with(".weight_scale") {
                scales
            } else {
                to_bytes(DType::BF16, &mxfp4_dequant(&packed, &scales, rows, cols))
            }
        } else {
            to_bytes(dtype, &draw(&cfg, seed, s))
        };
        shards[shard].push((s.name.clone(), dtype, s.shape.clone(), bytes));
    }

    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (i, tensors) in shards.iter().enumerate() {
        let file = shard_file_name(i, n_shards);
        let path = out.join(&file);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, shape, b)| {
                safetensors::tensor::TensorView::new(dtype_to_st(*d), shape.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| ModelError::tensor(n.clone(), e.to_string()))
            })
            .collect::<Result<_>>()?;
        safetensors::serialize_to_file(views, None, &path).map_err(|e| ModelError::checkpoint(&path, e.to_string()))?;
        for (n, _, _, b) in tensors {
            weight_map.insert(n.clone(), file.clone());
            total += b.len() as u64;
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let index_path = out.join(INDEX_FILE);
    let text = serde_json::to_string_pretty(&index).map_err(|e| ModelError::checkpoint(&index_path, e.to_string()))?;
    std::fs::write(&index_path, text).map_err(|e| ModelError::io(&index_path, e))?;
    let marker = out.join(COMPLETE_MARKER);
    std::fs::write(&marker, format!("seed {seed}, bf16 twin {bf16_twin}\n")).map_err(|e| ModelError::io(&marker, e))?;
    Ok(specs.len())
}

/// `...experts.E.wN` for an expert tensor name.
fn expert_base(short: &str) -> Option<&str> {
    if !short.contains(".experts.") {
        return None;
    }
    for suffix in [".weight_packed", ".weight_scale", ".weight"] {
        if let Some(b) = short.strip_suffix(suffix) {
            return Some(b);
        }
    }
    None
}
