//! Model weights on a backend, in the layouts the ops take. Checkpoint dtypes are preserved
//! (bf16 stays bf16, the fp32 tensors stay fp32); a few tensors are fused or re-laid at load:
//! - KDA q/k/v projections -> one `[3P, d]` projection, their convs -> `[3P, W]` f32;
//! - MLA `kv_b_proj` -> per-head W_UK^T `[latent, nope]` (absorbed into the query) and W_UV
//!   `[v, latent]` (applied after attention: the sigmoid gate sits between W_UV and W_o, so it
//!   cannot fold into W_o);
//! - routed experts -> stacked `[E, 2N, L]` gate|up and `[E, L, N]` down (MXFP4 codes and scales
//!   stacked the same way, never re-quantised);
//! - AttnRes score vectors = norm weight x projection weight, in f32.

use crate::checkpoint::Checkpoint;
use crate::config::{FfnKind, K3Config, MixerKind};
use crate::error::{ModelError, Result};
use crate::finite::{copy_checked, describe, CopyError, Encoding};
use kernel_api::tensor::decode_f32;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor};

/// A host tensor read from the checkpoint with its dtype and shape checked.
fn host(ck: &Checkpoint, name: &str, shape: &[usize], dtypes: &[DType]) -> Result<HostTensor> {
    let e = ck.entry(name).ok_or_else(|| ModelError::tensor(name, "missing from the checkpoint"))?;
    if e.shape != shape {
        return Err(ModelError::tensor(name, format!("shape {:?}, expected {:?}", e.shape, shape)));
    }
    if !dtypes.contains(&e.dtype) {
        return Err(ModelError::tensor(name, format!("dtype {}, expected {:?}", e.dtype, dtypes)));
    }
    let src = ck.bytes(e);
    let enc = Encoding::of(&e.name, e.dtype);
    let bytes = copy_checked(enc, src).map_err(|err| match err {
        CopyError::NonFinite(i) => {
            let size = src.len() / e.shape.iter().product::<usize>().max(1);
            let value = describe(enc, &src[i * size..(i + 1) * size]);
            ModelError::tensor(&e.name, format!("element {i} is {value}: a weight must be finite"))
        }
        CopyError::Alloc(n) => ModelError::tensor(&e.name, format!("cannot allocate {n} bytes on the host")),
    })?;
    Ok(HostTensor::from_bytes(e.dtype, shape, bytes)?)
}

fn f32_values(t: &HostTensor) -> Vec<f32> {
    let s = t.dtype.size_bytes();
    t.bytes.chunks_exact(s).map(|c| decode_f32(t.dtype, c)).collect()
}

/// Concatenates same-dtype host tensors along dim 0.
fn concat0(parts: &[HostTensor], name: &str) -> Result<HostTensor> {
    let first = parts.first().ok_or_else(|| ModelError::tensor(name, "nothing to concatenate"))?;
    let mut shape = first.shape.clone();
    shape[0] = parts.iter().map(|p| p.shape[0]).sum();
    let bytes = parts.iter().flat_map(|p| p.bytes.iter().copied()).collect();
    Ok(HostTensor::from_bytes(first.dtype, &shape, bytes)?)
}

/// Rows `[r0, r1)` of a 2-D tensor.
fn rows(t: &HostTensor, r0: usize, r1: usize) -> Result<HostTensor> {
    let row_bytes = t.shape[1] * t.dtype.size_bytes();
    Ok(HostTensor::from_bytes(t.dtype, &[r1 - r0, t.shape[1]], t.bytes[r0 * row_bytes..r1 * row_bytes].to_vec())?)
}

/// Transpose of a 2-D tensor (same dtype).
fn transpose(t: &HostTensor) -> Result<HostTensor> {
    let (r, c) = (t.shape[0], t.shape[1]);
    let s = t.dtype.size_bytes();
    let mut out = vec![0u8; t.bytes.len()];
    for i in 0..r {
        for j in 0..c {
            out[(j * r + i) * s..(j * r + i + 1) * s].copy_from_slice(&t.bytes[(i * c + j) * s..(i * c + j + 1) * s]);
        }
    }
    Ok(HostTensor::from_bytes(t.dtype, &[c, r], out)?)
}

/// AttnRes score vector w = norm weight x proj weight[0, :], in f32 (section 2.2).
pub fn attn_res_score(norm: &HostTensor, proj: &HostTensor) -> Result<HostTensor> {
    Ok(kernel_api::ops::attn_res::attn_res_score_vector(norm, proj)?)
}

pub struct KdaWeights<B: Backend> {
    pub qkv: DeviceTensor<B>,
    pub conv: DeviceTensor<B>,
    pub f_a: DeviceTensor<B>,
    pub f_b: DeviceTensor<B>,
    pub b: DeviceTensor<B>,
    pub output_gate: OutputGate<B>,
    pub a_log: DeviceTensor<B>,
    pub dt_bias: DeviceTensor<B>,
    pub o_norm: DeviceTensor<B>,
    pub o: DeviceTensor<B>,
}

pub enum OutputGate<B: Backend> {
    FullRank(DeviceTensor<B>),
    LowRank { a: DeviceTensor<B>, b: DeviceTensor<B> },
}

pub struct MlaWeights<B: Backend> {
    pub q_a: DeviceTensor<B>,
    pub q_a_norm: DeviceTensor<B>,
    pub q_b: DeviceTensor<B>,
    pub kv_a: DeviceTensor<B>,
    pub kv_a_norm: DeviceTensor<B>,
    /// Per head: W_UK^T `[latent, nope]`.
    pub w_uk_t: Vec<DeviceTensor<B>>,
    /// Per head: W_UV `[v, latent]`.
    pub w_uv: Vec<DeviceTensor<B>>,
    pub g: Option<DeviceTensor<B>>,
    pub o: DeviceTensor<B>,
}

pub struct DenseMlpWeights<B: Backend> {
    pub gate: DeviceTensor<B>,
    pub up: DeviceTensor<B>,
    pub down: DeviceTensor<B>,
}

/// Routed expert matrices, stacked over experts.
pub enum ExpertMatrix<B: Backend> {
    Bf16(DeviceTensor<B>),
    Mxfp4 { packed: DeviceTensor<B>, scales: DeviceTensor<B> },
}

pub struct MoeWeights<B: Backend> {
    pub router: DeviceTensor<B>,
    pub bias: DeviceTensor<B>,
    pub latent_down: DeviceTensor<B>,
    pub latent_norm: Option<DeviceTensor<B>>,
    pub latent_up: DeviceTensor<B>,
    pub shared: Option<DenseMlpWeights<B>>,
    /// `[E, 2N, L]` (gate rows then up rows per expert).
    pub w13: ExpertMatrix<B>,
    /// `[E, L, N]`.
    pub w2: ExpertMatrix<B>,
}

pub enum MixerWeights<B: Backend> {
    Kda(KdaWeights<B>),
    Mla(MlaWeights<B>),
}

pub enum FfnWeights<B: Backend> {
    Dense(DenseMlpWeights<B>),
    Moe(MoeWeights<B>),
}

pub struct LayerWeights<B: Backend> {
    pub input_norm: DeviceTensor<B>,
    pub post_norm: DeviceTensor<B>,
    pub attn_res_score: DeviceTensor<B>,
    pub mlp_res_score: DeviceTensor<B>,
    pub mixer: MixerWeights<B>,
    pub ffn: FfnWeights<B>,
}

pub struct ModelWeights<B: Backend> {
    pub embed: DeviceTensor<B>,
    pub final_norm: DeviceTensor<B>,
    pub out_res_score: DeviceTensor<B>,
    pub lm_head: DeviceTensor<B>,
    pub layers: Vec<LayerWeights<B>>,
}

const BF16: &[DType] = &[DType::BF16];
const F32: &[DType] = &[DType::F32];
const BF16_F32: &[DType] = &[DType::BF16, DType::F32];

struct Loader<'a, B: Backend> {
    ck: &'a Checkpoint,
    b: &'a B,
    on_tensor: &'a mut dyn FnMut(usize),
}

impl<B: Backend> Loader<'_, B> {
    fn up(&mut self, t: &HostTensor) -> Result<DeviceTensor<B>> {
        (self.on_tensor)(t.bytes.len());
        Ok(self.b.upload_tensor(t)?)
    }
    fn load(&mut self, name: &str, shape: &[usize], dtypes: &[DType]) -> Result<DeviceTensor<B>> {
        let t = host(self.ck, name, shape, dtypes)?;
        self.up(&t)
    }
}

impl<B: Backend> ModelWeights<B> {
    /// Loads every tensor to `backend`; `on_tensor(bytes)` is called after each upload (progress).
    pub fn load(ck: &Checkpoint, backend: &B, on_tensor: &mut dyn FnMut(usize)) -> Result<Self> {
        let cfg = &ck.config;
        let d = cfg.hidden_size;
        let mut l = Loader { ck, b: backend, on_tensor };
        let embed = l.load("model.embed_tokens.weight", &[cfg.vocab_size, d], BF16_F32)?;
        let final_norm = l.load("model.norm.weight", &[d], BF16_F32)?;
        let s = attn_res_score(
            &host(ck, "model.output_attn_res_norm.weight", &[d], BF16_F32)?,
            &host(ck, "model.output_attn_res_proj.weight", &[1, d], BF16_F32)?,
        )?;
        let out_res_score = l.up(&s)?;
        let lm_head = if cfg.tie_word_embeddings {
            l.load("model.embed_tokens.weight", &[cfg.vocab_size, d], BF16_F32)?
        } else {
            l.load("lm_head.weight", &[cfg.vocab_size, d], BF16_F32)?
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            layers.push(load_layer(&mut l, cfg, i)?);
        }
        Ok(ModelWeights { embed, final_norm, out_res_score, lm_head, layers })
    }
}

fn load_layer<B: Backend>(l: &mut Loader<'_, B>, cfg: &K3Config, i: usize) -> Result<LayerWeights<B>> {
    let d = cfg.hidden_size;
    let p = format!("model.layers.{i}");
    let ck = l.ck;
    let score = |site: &str| -> Result<HostTensor> {
        attn_res_score(&host(ck, &format!("{p}.{site}_res_norm.weight"), &[d], BF16_F32)?, &host(ck, &format!("{p}.{site}_res_proj.weight"), &[1, d], BF16_F32)?)
    };
    let (a_score, m_score) = (score("self_attention")?, score("mlp")?);
    let input_norm = l.load(&format!("{p}.input_layernorm.weight"), &[d], BF16_F32)?;
    let post_norm = l.load(&format!("{p}.post_attention_layernorm.weight"), &[d], BF16_F32)?;
    let attn_res_score = l.up(&a_score)?;
    let mlp_res_score = l.up(&m_score)?;
    let mixer = match cfg.mixers[i] {
        MixerKind::Kda => MixerWeights::Kda(load_kda(l, cfg, &p)?),
        MixerKind::Mla => MixerWeights::Mla(load_mla(l, cfg, &p)?),
    };
    let ffn = match cfg.ffns[i] {
        FfnKind::Dense => FfnWeights::Dense(load_mlp(l, &format!("{p}.mlp"), cfg.intermediate_size, d)?),
        FfnKind::LatentMoe => FfnWeights::Moe(load_moe(l, cfg, &p)?),
    };
    Ok(LayerWeights { input_norm, post_norm, attn_res_score, mlp_res_score, mixer, ffn })
}

fn load_mlp<B: Backend>(l: &mut Loader<'_, B>, p: &str, f: usize, d: usize) -> Result<DenseMlpWeights<B>> {
    Ok(DenseMlpWeights {
        gate: l.load(&format!("{p}.gate_proj.weight"), &[f, d], BF16)?,
        up: l.load(&format!("{p}.up_proj.weight"), &[f, d], BF16)?,
        down: l.load(&format!("{p}.down_proj.weight"), &[d, f], BF16)?,
    })
}

fn load_kda<B: Backend>(l: &mut Loader<'_, B>, cfg: &K3Config, p: &str) -> Result<KdaWeights<B>> {
    let (d, k, pw, w) = (cfg.hidden_size, cfg.kda.head_dim, cfg.kda_width(), cfg.kda.conv_kernel);
    let a = format!("{p}.self_attn");
    let ck = l.ck;
    let proj: Vec<HostTensor> =
        ["q", "k", "v"].iter().map(|n| host(ck, &format!("{a}.{n}_proj.weight"), &[pw, d], BF16)).collect::<Result<_>>()?;
    let convs: Vec<HostTensor> = ["q", "k", "v"]
        .iter()
        .map(|n| host(ck, &format!("{a}.{n}_conv1d.weight"), &[pw, 1, w], F32))
        .collect::<Result<_>>()?;
    let qkv = l.up(&concat0(&proj, &format!("{a}.qkv"))?)?;
    // [P, 1, W] and [P, W] have the same bytes.
    let conv_parts: Vec<HostTensor> =
        convs.iter().map(|c| HostTensor::from_bytes(DType::F32, &[pw, w], c.bytes.clone())).collect::<kernel_api::Result<_>>()?;
    let conv = l.up(&concat0(&conv_parts, &format!("{a}.conv"))?)?;
    let a_len = k.max(cfg.kda.num_heads);
    let a_log_host = host(ck, &format!("{a}.A_log"), &[a_len], F32)?;
    // The padding past the heads must be zero (k3-architecture.md 2.3).
    if f32_values(&a_log_host)[cfg.kda.num_heads..].iter().any(|&x| x != 0.0) {
        return Err(ModelError::tensor(format!("{a}.A_log"), format!("entries past the first {} heads must be zero padding", cfg.kda.num_heads)));
    }
    let output_gate = if cfg.kda.full_rank_output_gate {
        OutputGate::FullRank(l.load(&format!("{a}.g_proj.weight"), &[pw, d], BF16)?)
    } else {
        OutputGate::LowRank {
            a: l.load(&format!("{a}.g_a_proj.weight"), &[k, d], BF16)?,
            b: l.load(&format!("{a}.g_b_proj.weight"), &[pw, k], BF16)?,
        }
    };
    Ok(KdaWeights {
        qkv,
        conv,
        f_a: l.load(&format!("{a}.f_a_proj.weight"), &[k, d], BF16)?,
        f_b: l.load(&format!("{a}.f_b_proj.weight"), &[pw, k], BF16)?,
        b: l.load(&format!("{a}.b_proj.weight"), &[cfg.kda.num_heads, d], BF16)?,
        output_gate,
        a_log: l.up(&a_log_host)?,
        dt_bias: l.load(&format!("{a}.dt_bias"), &[pw], F32)?,
        o_norm: l.load(&format!("{a}.o_norm.weight"), &[k], F32)?,
        o: l.load(&format!("{a}.o_proj.weight"), &[d, pw], BF16)?,
    })
}

fn load_mla<B: Backend>(l: &mut Loader<'_, B>, cfg: &K3Config, p: &str) -> Result<MlaWeights<B>> {
    let d = cfg.hidden_size;
    let m = &cfg.mla;
    let a = format!("{p}.self_attn");
    let kv_b = host(l.ck, &format!("{a}.kv_b_proj.weight"), &[m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank], BF16)?;
    let per = m.qk_nope_head_dim + m.v_head_dim;
    let mut w_uk_t = Vec::with_capacity(m.num_heads);
    let mut w_uv = Vec::with_capacity(m.num_heads);
    for h in 0..m.num_heads {
        let uk = rows(&kv_b, h * per, h * per + m.qk_nope_head_dim)?;
        w_uk_t.push(l.up(&transpose(&uk)?)?);
        w_uv.push(l.up(&rows(&kv_b, h * per + m.qk_nope_head_dim, (h + 1) * per)?)?);
    }
    Ok(MlaWeights {
        q_a: l.load(&format!("{a}.q_a_proj.weight"), &[m.q_lora_rank, d], BF16)?,
        q_a_norm: l.load(&format!("{a}.q_a_layernorm.weight"), &[m.q_lora_rank], BF16_F32)?,
        q_b: l.load(&format!("{a}.q_b_proj.weight"), &[m.num_heads * m.qk_head_dim(), m.q_lora_rank], BF16)?,
        kv_a: l.load(&format!("{a}.kv_a_proj_with_mqa.weight"), &[m.cache_width(), d], BF16)?,
        kv_a_norm: l.load(&format!("{a}.kv_a_layernorm.weight"), &[m.kv_lora_rank], BF16_F32)?,
        w_uk_t,
        w_uv,
        g: if m.output_gate { Some(l.load(&format!("{a}.g_proj.weight"), &[m.num_heads * m.v_head_dim, d], BF16)?) } else { None },
        o: l.load(&format!("{a}.o_proj.weight"), &[d, m.num_heads * m.v_head_dim], BF16)?,
    })
}

fn load_moe<B: Backend>(l: &mut Loader<'_, B>, cfg: &K3Config, p: &str) -> Result<MoeWeights<B>> {
    let d = cfg.hidden_size;
    let m = &cfg.moe;
    let (n, lat, e) = (m.moe_intermediate_size, m.latent_size, m.num_experts);
    let b = format!("{p}.block_sparse_moe");
    let ck = l.ck;
    let packed = ck.entry(&format!("{b}.experts.0.w1.weight_packed")).is_some();
    let stack = |l: &mut Loader<'_, B>, which: &[&str], rows: usize, cols: usize| -> Result<ExpertMatrix<B>> {
        let total_rows = rows * which.len();
        // Sizes here were checked against the shards' headers by the inspector (`load_model`);
        // the stacked buffers are still reserved fallibly, with overflow-checked sizes.
        let stacked = |elem_per_row: usize, what: &str| -> Result<Vec<u8>> {
            let n = e.checked_mul(total_rows).and_then(|r| r.checked_mul(elem_per_row));
            let mut v = Vec::new();
            match n {
                Some(n) if v.try_reserve_exact(n).is_ok() => Ok(v),
                _ => Err(ModelError::tensor(format!("{b}.experts.*.{what}"), format!("{e} experts x {total_rows} x {elem_per_row} bytes cannot be allocated on the host"))),
            }
        };
        if packed {
            let mut pk = stacked(cols / 2, "weight_packed")?;
            let mut sc = stacked(cols / 32, "weight_scale")?;
            for x in 0..e {
                for w in which {
                    pk.extend(host(ck, &format!("{b}.experts.{x}.{w}.weight_packed"), &[rows, cols / 2], &[DType::U8])?.bytes);
                    sc.extend(host(ck, &format!("{b}.experts.{x}.{w}.weight_scale"), &[rows, cols / 32], &[DType::U8])?.bytes);
                }
            }
            Ok(ExpertMatrix::Mxfp4 {
                packed: l.up(&HostTensor::from_bytes(DType::U8, &[e, total_rows, cols / 2], pk)?)?,
                scales: l.up(&HostTensor::from_bytes(DType::U8, &[e, total_rows, cols / 32], sc)?)?,
            })
        } else {
            let mut bytes = stacked(cols * 2, "weight")?;
            for x in 0..e {
                for w in which {
                    bytes.extend(host(ck, &format!("{b}.experts.{x}.{w}.weight"), &[rows, cols], BF16)?.bytes);
                }
            }
            Ok(ExpertMatrix::Bf16(l.up(&HostTensor::from_bytes(DType::BF16, &[e, total_rows, cols], bytes)?)?))
        }
    };
    let w13 = stack(l, &["w1", "w3"], n, lat)?;
    let w2 = stack(l, &["w2"], lat, n)?;
    Ok(MoeWeights {
        router: l.load(&format!("{b}.gate.weight"), &[e, d], BF16_F32)?,
        // The router bias must stay f32: a bf16 bias is a checkpoint error, never truncated.
        bias: l.load(&format!("{b}.gate.e_score_correction_bias"), &[e], F32)?,
        latent_down: l.load(&format!("{b}.routed_expert_down_proj.weight"), &[lat, d], BF16)?,
        latent_norm: if m.latent_norm { Some(l.load(&format!("{b}.routed_expert_norm.weight"), &[lat], BF16_F32)?) } else { None },
        latent_up: l.load(&format!("{b}.routed_expert_up_proj.weight"), &[d, lat], BF16)?,
        shared: if m.num_shared_experts > 0 { Some(load_mlp(l, &format!("{b}.shared_experts"), m.shared_width(), d)?) } else { None },
        w13,
        w2,
    })
}
