//! The tensors a K3 checkpoint holds for a config: names, shapes and accepted dtypes. The
//! inspector checks a checkpoint against this list and the tiny generator writes exactly it.

use crate::config::{FfnKind, K3Config, MixerKind};
use kernel_api::DType;

/// Prefix of every text tensor in the HF checkpoint.
pub const PREFIX: &str = "language_model.";

/// How routed experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertStorage {
    /// `weight_packed` (U8, two E2M1 codes per byte) + `weight_scale` (U8 E8M0, one per 32).
    Mxfp4,
    /// Plain bf16 `weight` (a dequantised twin).
    Bf16,
}

/// One expected tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Full name including the `language_model.` prefix.
    pub name: String,
    pub shape: Vec<usize>,
    /// Accepted dtypes; the first is what the generator writes.
    pub dtypes: &'static [DType],
}

const BF16: &[DType] = &[DType::BF16];
const F32: &[DType] = &[DType::F32];
const U8: &[DType] = &[DType::U8];
/// MLA q_a/kv_a norm weights: assumed bf16, f32 accepted (k3-architecture.md 6 #2).
const BF16_OR_F32: &[DType] = &[DType::BF16, DType::F32];

fn spec(out: &mut Vec<TensorSpec>, name: String, shape: &[usize], dtypes: &'static [DType]) {
    out.push(TensorSpec { name: format!("{PREFIX}{name}"), shape: shape.to_vec(), dtypes });
}

/// Every tensor of the text model, in a stable order (globals, then layer by layer).
pub fn expected_tensors(cfg: &K3Config, experts: ExpertStorage) -> Vec<TensorSpec> {
    let d = cfg.hidden_size;
    let mut v = Vec::new();
    spec(&mut v, "model.embed_tokens.weight".into(), &[cfg.vocab_size, d], BF16);
    spec(&mut v, "model.norm.weight".into(), &[d], BF16);
    spec(&mut v, "model.output_attn_res_norm.weight".into(), &[d], BF16);
    spec(&mut v, "model.output_attn_res_proj.weight".into(), &[1, d], BF16);
    if !cfg.tie_word_embeddings {
        spec(&mut v, "lm_head.weight".into(), &[cfg.vocab_size, d], BF16);
    }
    for i in 0..cfg.num_layers {
        let l = format!("model.layers.{i}");
        for n in ["input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"] {
            spec(&mut v, format!("{l}.{n}.weight"), &[d], BF16);
        }
        for n in ["self_attention_res_proj", "mlp_res_proj"] {
            spec(&mut v, format!("{l}.{n}.weight"), &[1, d], BF16);
        }
        match cfg.mixers[i] {
            MixerKind::Kda => kda_tensors(cfg, &mut v, &l),
            MixerKind::Mla => mla_tensors(cfg, &mut v, &l),
        }
        match cfg.ffns[i] {
            FfnKind::Dense => {
                let f = cfg.intermediate_size;
                spec(&mut v, format!("{l}.mlp.gate_proj.weight"), &[f, d], BF16);
                spec(&mut v, format!("{l}.mlp.up_proj.weight"), &[f, d], BF16);
                spec(&mut v, format!("{l}.mlp.down_proj.weight"), &[d, f], BF16);
            }
            FfnKind::LatentMoe => moe_tensors(cfg, &mut v, &l, experts),
        }
    }
    v
}

fn kda_tensors(cfg: &K3Config, v: &mut Vec<TensorSpec>, l: &str) {
    let d = cfg.hidden_size;
    let k = &cfg.kda;
    let p = cfg.kda_width();
    let a = format!("{l}.self_attn");
    for n in ["q_proj", "k_proj", "v_proj"] {
        spec(v, format!("{a}.{n}.weight"), &[p, d], BF16);
    }
    for n in ["q_conv1d", "k_conv1d", "v_conv1d"] {
        spec(v, format!("{a}.{n}.weight"), &[p, 1, k.conv_kernel], F32);
    }
    spec(v, format!("{a}.f_a_proj.weight"), &[k.head_dim, d], BF16);
    spec(v, format!("{a}.f_b_proj.weight"), &[p, k.head_dim], BF16);
    spec(v, format!("{a}.b_proj.weight"), &[k.num_heads, d], BF16);
    // A_log is stored zero-padded to head_dim (K3: 96 live entries in [128]).
    spec(v, format!("{a}.A_log"), &[k.head_dim.max(k.num_heads)], F32);
    spec(v, format!("{a}.dt_bias"), &[p], F32);
    if k.full_rank_output_gate {
        spec(v, format!("{a}.g_proj.weight"), &[p, d], BF16);
    } else {
        spec(v, format!("{a}.g_a_proj.weight"), &[k.head_dim, d], BF16);
        spec(v, format!("{a}.g_b_proj.weight"), &[p, k.head_dim], BF16);
    }
    spec(v, format!("{a}.o_norm.weight"), &[k.head_dim], F32);
    spec(v, format!("{a}.o_proj.weight"), &[d, p], BF16);
}

fn mla_tensors(cfg: &K3Config, v: &mut Vec<TensorSpec>, l: &str) {
    let d = cfg.hidden_size;
    let m = &cfg.mla;
    let a = format!("{l}.self_attn");
    spec(v, format!("{a}.q_a_proj.weight"), &[m.q_lora_rank, d], BF16);
    spec(v, format!("{a}.q_a_layernorm.weight"), &[m.q_lora_rank], BF16_OR_F32);
    spec(v, format!("{a}.q_b_proj.weight"), &[m.num_heads * m.qk_head_dim(), m.q_lora_rank], BF16);
    spec(v, format!("{a}.kv_a_proj_with_mqa.weight"), &[m.cache_width(), d], BF16);
    spec(v, format!("{a}.kv_a_layernorm.weight"), &[m.kv_lora_rank], BF16_OR_F32);
    spec(v, format!("{a}.kv_b_proj.weight"), &[m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank], BF16);
    if m.output_gate {
        spec(v, format!("{a}.g_proj.weight"), &[m.num_heads * m.v_head_dim, d], BF16);
    }
    spec(v, format!("{a}.o_proj.weight"), &[d, m.num_heads * m.v_head_dim], BF16);
}

fn moe_tensors(cfg: &K3Config, v: &mut Vec<TensorSpec>, l: &str, experts: ExpertStorage) {
    let d = cfg.hidden_size;
    let m = &cfg.moe;
    let b = format!("{l}.block_sparse_moe");
    spec(v, format!("{b}.gate.weight"), &[m.num_experts, d], BF16);
    spec(v, format!("{b}.gate.e_score_correction_bias"), &[m.num_experts], F32);
    spec(v, format!("{b}.routed_expert_down_proj.weight"), &[m.latent_size, d], BF16);
    if m.latent_norm {
        spec(v, format!("{b}.routed_expert_norm.weight"), &[m.latent_size], BF16);
    }
    spec(v, format!("{b}.routed_expert_up_proj.weight"), &[d, m.latent_size], BF16);
    if m.num_shared_experts > 0 {
        let s = m.shared_width();
        spec(v, format!("{b}.shared_experts.gate_proj.weight"), &[s, d], BF16);
        spec(v, format!("{b}.shared_experts.up_proj.weight"), &[s, d], BF16);
        spec(v, format!("{b}.shared_experts.down_proj.weight"), &[d, s], BF16);
    }
    let (n, lat) = (m.moe_intermediate_size, m.latent_size);
    for e in 0..m.num_experts {
        // w1 = gate, w3 = up: [N, latent]; w2 = down: [latent, N].
        for (w, rows, cols) in [("w1", n, lat), ("w2", lat, n), ("w3", n, lat)] {
            let base = format!("{b}.experts.{e}.{w}");
            match experts {
                ExpertStorage::Mxfp4 => {
                    spec(v, format!("{base}.weight_packed"), &[rows, cols / 2], U8);
                    spec(v, format!("{base}.weight_scale"), &[rows, cols / 32], U8);
                }
                ExpertStorage::Bf16 => spec(v, format!("{base}.weight"), &[rows, cols], BF16),
            }
        }
    }
}

/// Strips the `language_model.` prefix when present (colibri probes both forms).
pub fn strip_prefix(name: &str) -> &str {
    name.strip_prefix(PREFIX).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{K3Config, TINY_CONFIG_JSON};

    #[test]
    fn tiny_inventory_matches_spec_shapes() {
        let cfg = K3Config::from_json_str(TINY_CONFIG_JSON).unwrap();
        let t = expected_tensors(&cfg, ExpertStorage::Mxfp4);
        let find = |n: &str| t.iter().find(|s| s.name == format!("{PREFIX}{n}")).unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(find("model.layers.0.self_attn.A_log").shape, vec![32]);
        assert_eq!(find("model.layers.3.self_attn.g_proj.weight").shape, vec![64, 128]);
        assert_eq!(find("model.layers.3.self_attn.kv_a_proj_with_mqa.weight").shape, vec![80, 128]);
        assert_eq!(find("model.layers.4.self_attn.kv_b_proj.weight").shape, vec![192, 64]);
        assert_eq!(find("model.layers.1.block_sparse_moe.experts.15.w1.weight_packed").shape, vec![96, 32]);
        assert_eq!(find("model.layers.1.block_sparse_moe.experts.15.w1.weight_scale").shape, vec![96, 2]);
        assert_eq!(find("model.layers.1.block_sparse_moe.experts.0.w2.weight_packed").shape, vec![64, 48]);
        assert_eq!(find("model.layers.1.block_sparse_moe.experts.0.w2.weight_scale").shape, vec![64, 3]);
        assert_eq!(find("model.layers.2.block_sparse_moe.gate.e_score_correction_bias").dtypes, &[DType::F32]);
        assert_eq!(find("lm_head.weight").shape, vec![512, 128]);
        // 9,792 bytes per expert (k3-architecture.md 5.2).
        let expert_bytes: usize = t
            .iter()
            .filter(|s| s.name.contains("layers.1.block_sparse_moe.experts.3."))
            .map(|s| s.shape.iter().product::<usize>())
            .sum();
        assert_eq!(expert_bytes, 9792);
    }
}
