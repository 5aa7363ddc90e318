//! The K3 configuration: `config.json` (its `text_config` when present) turned into typed,
//! cross-checked dimensions. Layer lists are 1-indexed in the file and 0-based here.
//!
//! Accepted variants:
//! - K3 (and the tiny test config of k3-architecture.md section 5): lower-bound decay gate
//!   (`gate_lower_bound`), full-rank output gate `g_proj`.
//! - The Kimi-Linear-style companion (no `gate_lower_bound`, `use_full_rank_gate: false`):
//!   softplus decay gate and a low-rank `g_a_proj`/`g_b_proj` output gate. Everything else (AttnRes,
//!   latent MoE, SiTU) stays K3's: the full Kimi-Linear-48B model, which has none of those, is not
//!   supported.
//!
//! There is no RoPE in K3 (`mla_use_nope: true`); a config asking for rotary embeddings is
//! rejected rather than silently run without them.
//!
//! Every size and count is checked against [`crate::limits`] while parsing, and the number of
//! tensors the config asks for is bounded before any list of them is built, so an absurd value
//! is an error naming its key, not minutes of work or an abort. Values the ops would refuse
//! (`activation_situ_beta` ≤ 0, `num_experts` 0, a `top_k` no group choice can reach) are
//! refused here too, so `k3 inspect` reports what `k3 run` would.

use crate::limits::{MAX_DIM, MAX_EXPERTS, MAX_LAYERS, MAX_TENSORS};
use kernel_api::{Error, Result};
use serde_json::Value;

/// What a layer's token mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    Kda,
    Mla,
}

/// What a layer's FFN is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    Dense,
    LatentMoe,
}

/// The KDA decay-gate activation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGate {
    /// g = lb * sigmoid(exp(A_log) * (f + dt_bias)) (K3).
    LowerBound(f32),
    /// g = -exp(A_log) * softplus(f + dt_bias) (Kimi-Linear).
    Softplus,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KdaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    pub gate: KdaGate,
    /// true: one full-rank `g_proj`; false: low-rank `g_a_proj`/`g_b_proj` of rank `head_dim`.
    pub full_rank_output_gate: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    pub num_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub output_gate: bool,
}

impl MlaConfig {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
    /// 1/sqrt(qk head dim): K3 uses 1/sqrt(192), not 1/sqrt(576).
    pub fn softmax_scale(&self) -> f32 {
        1.0 / (self.qk_head_dim() as f32).sqrt()
    }
    /// Values cached per token (latent + shared k_pe).
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub latent_size: usize,
    pub latent_norm: bool,
    pub renormalize: bool,
    pub routed_scaling_factor: f32,
    pub num_expert_group: usize,
    pub topk_group: usize,
}

impl MoeConfig {
    pub fn shared_width(&self) -> usize {
        self.num_shared_experts * self.moe_intermediate_size
    }
}

/// Typed K3 text config.
#[derive(Clone, Debug, PartialEq)]
pub struct K3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    /// MLA q_a/kv_a norms: the official KimiRMSNorm default (1e-6), see k3-architecture.md 6 #1.
    pub mla_norm_eps: f32,
    pub situ_beta: f32,
    pub situ_linear_beta: Option<f32>,
    pub attn_res_block_size: usize,
    pub first_k_dense_replace: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub max_position_embeddings: usize,
    pub mixers: Vec<MixerKind>,
    pub ffns: Vec<FfnKind>,
    pub kda: KdaConfig,
    pub mla: MlaConfig,
    pub moe: MoeConfig,
    /// Whether the file declares MXFP4 experts (informational: quantisation is detected from
    /// the tensors present, never from this).
    pub declares_mxfp4: bool,
}

fn get<'a>(obj: &'a Value, key: &str) -> Result<&'a Value> {
    obj.get(key).ok_or_else(|| Error::invalid(key, "missing from config"))
}

/// A non-negative integer no larger than [`MAX_DIM`] (every size and count of the config).
fn as_dim(key: &str, v: &Value) -> Result<usize> {
    match v.as_u64() {
        Some(x) if x <= MAX_DIM as u64 => Ok(x as usize),
        Some(x) => Err(Error::invalid(key, format!("{x} is over the limit of {MAX_DIM} (model_k3::limits::MAX_DIM)"))),
        None => Err(Error::invalid(key, format!("expected a non-negative integer, got {v}"))),
    }
}

fn usize_key(obj: &Value, key: &str) -> Result<usize> {
    as_dim(key, get(obj, key)?)
}

/// A size that must be at least 1.
fn pos_key(obj: &Value, key: &str) -> Result<usize> {
    let n = usize_key(obj, key)?;
    require(n >= 1, key, || "must be at least 1".into())?;
    Ok(n)
}

/// An optional integer key: absent or null gives `default`; anything else must be a valid size.
fn opt_usize_key(obj: &Value, key: &str, default: usize) -> Result<usize> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => as_dim(key, v),
    }
}

/// A number that must be finite as an f32.
fn as_f32(key: &str, v: &Value) -> Result<f32> {
    let x = v.as_f64().ok_or_else(|| Error::invalid(key, format!("expected a number, got {v}")))?;
    let f = x as f32;
    require(f.is_finite(), key, || format!("{x} is not a finite f32"))?;
    Ok(f)
}

fn f32_key(obj: &Value, key: &str) -> Result<f32> {
    as_f32(key, get(obj, key)?)
}

/// An optional number: absent or null gives `None`.
fn opt_f32_key(obj: &Value, key: &str) -> Result<Option<f32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_f32(key, v).map(Some),
    }
}

fn bool_key(obj: &Value, key: &str) -> Result<bool> {
    let v = get(obj, key)?;
    v.as_bool().ok_or_else(|| Error::invalid(key, format!("expected true/false, got {v}")))
}

fn str_key<'a>(obj: &'a Value, key: &str) -> Result<&'a str> {
    let v = get(obj, key)?;
    v.as_str().ok_or_else(|| Error::invalid(key, format!("expected a string, got {v}")))
}

/// A token id (absent or null: `None`); a value that does not fit u32 is an error, not truncated.
fn opt_token_id(obj: &Value, key: &str) -> Result<Option<u32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| Error::invalid(key, format!("expected a token id (an integer in 0..=4294967295), got {v}"))),
    }
}

fn layer_list(obj: &Value, key: &str, n: usize) -> Result<Vec<usize>> {
    let field = format!("linear_attn_config.{key}");
    let arr = obj.get(key).and_then(|v| v.as_array()).ok_or_else(|| Error::invalid(&field, "missing or not a list"))?;
    arr.iter()
        .map(|v| match v.as_u64() {
            Some(i) if i >= 1 && (i as usize) <= n => Ok(i as usize - 1),
            _ => Err(Error::invalid(&field, format!("entry {v} is not a 1-based layer index in 1..={n}"))),
        })
        .collect()
}

fn require(cond: bool, key: &str, why: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::invalid(key, why()))
    }
}

impl K3Config {
    /// Parses `config.json` text.
    pub fn from_json_str(s: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(s).map_err(|e| Error::invalid("config.json", format!("not valid JSON: {e}")))?;
        Self::from_json(&v)
    }

    /// Reads `text_config` when present, else the root object.
    pub fn from_json(root: &Value) -> Result<Self> {
        let t = root.get("text_config").unwrap_or(root);
        require(t.is_object(), "text_config", || "expected an object".into())?;
        for key in ["rope_theta", "rope_scaling"] {
            if t.get(key).is_some_and(|v| !v.is_null()) {
                return Err(Error::unsupported(key, "K3 has no positional encoding; a RoPE config is not supported"));
            }
        }
        if t.get("mla_use_nope").is_some_and(|v| v == &Value::Bool(false)) {
            return Err(Error::unsupported("mla_use_nope", "false would need RoPE, which K3 does not have"));
        }
        let act = str_key(t, "hidden_act")?;
        require(act == "situ", "hidden_act", || format!("only `situ` is supported, got `{act}`"))?;
        let router = t.get("moe_router_activation_func").and_then(|v| v.as_str()).unwrap_or("sigmoid");
        require(router == "sigmoid", "moe_router_activation_func", || format!("only `sigmoid` is supported, got `{router}`"))?;

        let num_layers = usize_key(t, "num_hidden_layers")?;
        require((1..=MAX_LAYERS).contains(&num_layers), "num_hidden_layers", || {
            format!("{num_layers} is outside 1..={MAX_LAYERS} (model_k3::limits::MAX_LAYERS)")
        })?;
        let lac = get(t, "linear_attn_config")?;
        let kda_layers = layer_list(lac, "kda_layers", num_layers)?;
        let mla_layers = layer_list(lac, "full_attn_layers", num_layers)?;
        let mut mixers = vec![None; num_layers];
        for (list, kind, key) in [(&kda_layers, MixerKind::Kda, "kda_layers"), (&mla_layers, MixerKind::Mla, "full_attn_layers")] {
            for &i in list {
                if mixers[i].is_some() {
                    return Err(Error::invalid(
                        format!("linear_attn_config.{key}"),
                        format!("layer {} (1-based) is listed twice or in both lists", i + 1),
                    ));
                }
                mixers[i] = Some(kind);
            }
        }
        let mixers: Vec<MixerKind> = mixers
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.ok_or_else(|| Error::invalid("linear_attn_config", format!("layer {} (1-based) is in neither kda_layers nor full_attn_layers", i + 1))))
            .collect::<Result<_>>()?;

        let first_dense = usize_key(t, "first_k_dense_replace")?;
        let freq = opt_usize_key(t, "moe_layer_freq", 1)?;
        require(freq == 1, "moe_layer_freq", || format!("only 1 (MoE on every layer after the dense ones) is supported, got {freq}"))?;
        let ffns = (0..num_layers).map(|i| if i < first_dense { FfnKind::Dense } else { FfnKind::LatentMoe }).collect();

        let hidden = pos_key(t, "hidden_size")?;
        let n_heads = pos_key(t, "num_attention_heads")?;
        let n_kv = opt_usize_key(t, "num_key_value_heads", n_heads)?;
        require(n_kv == n_heads, "num_key_value_heads", || format!("{n_kv} differs from num_attention_heads {n_heads}; MLA here has one latent shared by all heads and equal q/kv head counts"))?;

        let gate = match lac.get("gate_lower_bound") {
            Some(v) if !v.is_null() => {
                let lb = v.as_f64().ok_or_else(|| Error::invalid("linear_attn_config.gate_lower_bound", "expected a number"))? as f32;
                require(lb < 0.0 && lb.is_finite(), "linear_attn_config.gate_lower_bound", || format!("must be negative, got {lb}"))?;
                KdaGate::LowerBound(lb)
            }
            _ => KdaGate::Softplus,
        };
        let kda = KdaConfig {
            num_heads: usize_key(lac, "num_heads").map_err(|e| prefix(e, "linear_attn_config."))?,
            head_dim: usize_key(lac, "head_dim").map_err(|e| prefix(e, "linear_attn_config."))?,
            conv_kernel: usize_key(lac, "short_conv_kernel_size").map_err(|e| prefix(e, "linear_attn_config."))?,
            gate,
            full_rank_output_gate: lac.get("use_full_rank_gate").and_then(|v| v.as_bool()).unwrap_or(false),
        };
        require(kda.conv_kernel >= 2, "linear_attn_config.short_conv_kernel_size", || "must be at least 2".into())?;
        require(kda.num_heads >= 1 && kda.head_dim >= 1, "linear_attn_config.num_heads", || "heads and head_dim must be positive".into())?;

        let mla = MlaConfig {
            num_heads: n_heads,
            q_lora_rank: pos_key(t, "q_lora_rank")?,
            kv_lora_rank: pos_key(t, "kv_lora_rank")?,
            qk_nope_head_dim: pos_key(t, "qk_nope_head_dim")?,
            qk_rope_head_dim: usize_key(t, "qk_rope_head_dim")?,
            v_head_dim: pos_key(t, "v_head_dim")?,
            output_gate: t.get("mla_use_output_gate").and_then(|v| v.as_bool()).unwrap_or(false),
        };
        let n_group = opt_usize_key(t, "num_expert_group", 1)?;
        let topk_group = opt_usize_key(t, "topk_group", 1)?;
        let moe = MoeConfig {
            num_experts: usize_key(t, "num_experts")?,
            top_k: usize_key(t, "num_experts_per_token")?,
            num_shared_experts: usize_key(t, "num_shared_experts")?,
            moe_intermediate_size: pos_key(t, "moe_intermediate_size")?,
            latent_size: pos_key(t, "routed_expert_hidden_size")?,
            latent_norm: bool_key(t, "latent_moe_use_norm")?,
            renormalize: bool_key(t, "moe_renormalize")?,
            routed_scaling_factor: f32_key(t, "routed_scaling_factor")?,
            num_expert_group: n_group,
            topk_group,
        };
        require((1..=MAX_EXPERTS).contains(&moe.num_experts), "num_experts", || {
            format!("{} is outside 1..={MAX_EXPERTS} (model_k3::limits::MAX_EXPERTS)", moe.num_experts)
        })?;
        require(moe.top_k >= 1 && moe.top_k <= moe.num_experts, "num_experts_per_token", || {
            format!("{} must be in 1..={}", moe.top_k, moe.num_experts)
        })?;
        require(n_group >= 1 && moe.num_experts % n_group == 0, "num_expert_group", || {
            format!("{n_group} groups do not divide {} experts", moe.num_experts)
        })?;
        require(topk_group >= 1 && topk_group <= n_group, "topk_group", || format!("{topk_group} must be in 1..={n_group}"))?;
        let selectable = topk_group * (moe.num_experts / n_group);
        require(moe.top_k <= selectable, "num_experts_per_token", || {
            format!("{} exceeds the {selectable} experts left after keeping {topk_group} of {n_group} groups", moe.top_k)
        })?;
        require(moe.routed_scaling_factor > 0.0, "routed_scaling_factor", || format!("must be positive, got {}", moe.routed_scaling_factor))?;

        // The SiTU op needs both betas finite and > 0 (kernel_api::ops::elementwise): checked
        // here too, so `inspect` reports what `run` would refuse.
        let linear_beta = opt_f32_key(t, "activation_situ_linear_beta")?;
        let situ_beta = opt_f32_key(t, "activation_situ_beta")?.unwrap_or(1.0);
        for (key, beta) in [("activation_situ_beta", Some(situ_beta)), ("activation_situ_linear_beta", linear_beta)] {
            if let Some(b) = beta {
                require(b > 0.0, key, || format!("must be positive, got {b}"))?;
            }
        }
        let block = usize_key(t, "attn_res_block_size")?;
        require(block >= 1, "attn_res_block_size", || "must be at least 1".into())?;
        let eps = f32_key(t, "rms_norm_eps")?;
        require(eps > 0.0, "rms_norm_eps", || format!("must be positive, got {eps}"))?;

        let declares_mxfp4 = t
            .get("quantization_config")
            .and_then(|q| q.get("format"))
            .and_then(|f| f.as_str())
            .is_some_and(|f| f.contains("mxfp4"));

        let cfg = K3Config {
            vocab_size: pos_key(t, "vocab_size")?,
            hidden_size: hidden,
            num_layers,
            intermediate_size: usize_key(t, "intermediate_size")?,
            rms_norm_eps: eps,
            mla_norm_eps: 1e-6,
            situ_beta,
            situ_linear_beta: linear_beta,
            attn_res_block_size: block,
            first_k_dense_replace: first_dense,
            tie_word_embeddings: t.get("tie_word_embeddings").and_then(|v| v.as_bool()).unwrap_or(false),
            bos_token_id: opt_token_id(t, "bos_token_id")?.or(opt_token_id(root, "bos_token_id")?),
            eos_token_id: opt_token_id(t, "eos_token_id")?.or(opt_token_id(root, "eos_token_id")?),
            pad_token_id: opt_token_id(t, "pad_token_id")?.or(opt_token_id(root, "pad_token_id")?),
            max_position_embeddings: opt_usize_key(t, "max_position_embeddings", 0)?,
            mixers,
            ffns,
            kda,
            mla,
            moe,
            declares_mxfp4,
        };
        cfg.check_tensor_count()?;
        Ok(cfg)
    }

    /// An upper bound of the tensors this config asks a checkpoint for must stay within
    /// [`MAX_TENSORS`], before the inspector or the loader builds any list of them. Each layer
    /// holds at most 32 tensors besides its routed experts; a MoE layer adds six per expert (MXFP4
    /// codes and scales of w1, w2, w3).
    fn check_tensor_count(&self) -> Result<()> {
        let moe_layers = self.ffns.iter().filter(|f| **f == FfnKind::LatentMoe).count() as u64;
        let experts = moe_layers * 6 * self.moe.num_experts as u64;
        let total = experts + 32 * self.num_layers as u64 + 8;
        if total <= MAX_TENSORS {
            return Ok(());
        }
        let (key, what) = if experts > MAX_TENSORS / 2 {
            ("num_experts", format!("{} experts x {moe_layers} MoE layers x 6 tensors", self.moe.num_experts))
        } else {
            ("num_hidden_layers", format!("{} layers", self.num_layers))
        };
        Err(Error::invalid(key, format!("{what} ask for up to {total} tensors, over the limit of {MAX_TENSORS} (model_k3::limits::MAX_TENSORS)")))
    }

    /// Layers whose AttnRes snapshot the running partial sum (0-based index % block == 0).
    pub fn is_block_start(&self, layer: usize) -> bool {
        layer % self.attn_res_block_size == 0
    }

    pub fn kda_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.mixers.iter().enumerate().filter(|(_, m)| **m == MixerKind::Kda).map(|(i, _)| i)
    }

    pub fn mla_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.mixers.iter().enumerate().filter(|(_, m)| **m == MixerKind::Mla).map(|(i, _)| i)
    }

    /// KDA projection width H*K.
    pub fn kda_width(&self) -> usize {
        self.kda.num_heads * self.kda.head_dim
    }
}

fn prefix(e: Error, p: &str) -> Error {
    match e {
        Error::InvalidInput { field, why } => Error::InvalidInput { field: format!("{p}{field}"), why },
        other => other,
    }
}

/// The tiny test config of k3-architecture.md section 5.2, verbatim.
pub const TINY_CONFIG_JSON: &str = include_str!("tiny_config.json");

/// The released K3 text config (k3-architecture.md section 1.3), for `k3 plan` and tests that
/// need the production dimensions without a checkpoint.
pub const K3_CONFIG_JSON: &str = include_str!("k3_config.json");
