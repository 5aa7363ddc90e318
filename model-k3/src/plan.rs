//! `k3 plan`: the speed-of-light floor of one K3 decode step and of a prefill, per GPU.
//!
//! Every op a K3 forward pass runs is listed with its params at the per-GPU shapes of the
//! chosen tensor-parallel degree, costed by the op's own `cost` method in kernel-api (the
//! bytes it must move, the FLOPs it must do by math class) and turned into a floor on the chosen
//! part by [`kernel_api::hardware`]: `max(bytes / HBM bandwidth, FLOPs / peak)`. The whole-step
//! floor is the sum over ops (one kernel each, no overlap between kernels).
//!
//! Sharding at `--tp N` (what vLLM/SGLang do for K3; `BENCHMARKS.md` lists it with the reasons):
//! - KDA and MLA heads split N ways (96 / N per GPU); column-parallel q/k/v/g, q_b, kv_b, g_proj,
//!   f_b and b_proj, row-parallel o_proj; q_a, kv_a and f_a replicated; the MLA latent cache
//!   replicated on every GPU (one latent shared by all heads).
//! - MoE `--moe tp` (default): every GPU holds all 896 experts at width 3072 / N; `--moe ep`:
//!   896 / N experts per GPU at full width, each GPU serving tokens·16 / N routing pairs.
//!   Router and the latent down/up projections are replicated (vLLM `ReplicatedLinear`);
//!   shared experts, the dense FFN of layer 0 and lm_head split N ways.
//! - AttnRes mixes, norms and residual adds run on the full hidden width on every GPU.
//! - Not modelled: all-reduces, all-to-alls and other communication, launch latency, kernel
//!   gaps, and per-token state snapshots for speculative rollback.
//!
//! Routing: each token picks 16 experts uniformly at random
//! ([`kernel_api::ops::MoeRouting::expected_experts_touched`]), as the published MoE kernel
//! benchmarks do.

use crate::config::{FfnKind, K3Config, K3_CONFIG_JSON};
use kernel_api::cost::{Cost, MathClass};
use kernel_api::hardware::{self, Bound, Hardware};
use kernel_api::ops::*;
use kernel_api::{DType, Error, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// `k3 plan` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct PlanArgs {
    /// GPU: h200, b200, b300, gb300, mi300x, mi355x.
    #[arg(long)]
    pub hardware: String,
    /// Tensor-parallel degree (GPUs per model replica).
    #[arg(long, default_value_t = 8)]
    pub tp: usize,
    /// Sequences decoded together (decode) / prompts prefilled together (prefill).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Tokens per sequence: cached context at decode, prompt length at prefill.
    #[arg(long, default_value_t = 8192)]
    pub context: usize,
    /// Speculative draft tokens verified per decode step (query length 1 + draft).
    #[arg(long, default_value_t = 0)]
    pub draft_tokens: usize,
    /// bf16, fp8-e4m3fn, fp8-e4m3fnuz, fp8-tiled-e4m3fn, fp8-tiled-e4m3fnuz.
    #[arg(long, default_value = "bf16")]
    pub kv_cache_dtype: String,
    /// Expert placement: `tp` (all experts, width / tp) or `ep` (experts / tp, full width).
    #[arg(long, default_value = "tp")]
    pub moe: String,
    /// Routed-expert activations: `bf16` (W4A16) or `mxfp8` (W4A8).
    #[arg(long, default_value = "bf16")]
    pub moe_activations: String,
    /// KDA recurrent state dtype: `f32` or `bf16`.
    #[arg(long, default_value = "f32")]
    pub kda_state: String,
    /// A config.json to plan instead of the released K3 config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the plan as JSON (schema `k3-plan/1`).
    #[arg(long)]
    pub json: bool,
}

/// Where the routed experts live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeParallel {
    Tensor,
    Expert,
}

/// Validated options of a plan.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub hardware: &'static Hardware,
    pub tp: usize,
    pub batch: usize,
    pub context: usize,
    pub draft_tokens: usize,
    pub kv_format: KvCacheFormat,
    pub moe_parallel: MoeParallel,
    pub moe_activations: Option<MoeActivationQuant>,
    pub kda_state: DType,
}

impl PlanOptions {
    /// Parses and checks the flags; every error names its flag.
    pub fn from_args(a: &PlanArgs) -> Result<Self> {
        let kv_format = KvCacheFormat::parse(&a.kv_cache_dtype).map_err(|e| rename(e, "--kv-cache-dtype"))?;
        let moe_parallel = match a.moe.as_str() {
            "tp" => MoeParallel::Tensor,
            "ep" => MoeParallel::Expert,
            o => return Err(Error::invalid("--moe", format!("`{o}` (expected tp or ep)"))),
        };
        let moe_activations = match a.moe_activations.as_str() {
            "bf16" => None,
            "mxfp8" => Some(MoeActivationQuant::Mxfp8),
            o => return Err(Error::invalid("--moe-activations", format!("`{o}` (expected bf16 or mxfp8)"))),
        };
        let kda_state = match a.kda_state.as_str() {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            o => return Err(Error::invalid("--kda-state", format!("`{o}` (expected f32 or bf16)"))),
        };
        Ok(PlanOptions {
            hardware: hardware::by_id(&a.hardware, "--hardware")?,
            tp: a.tp,
            batch: a.batch,
            context: a.context,
            draft_tokens: a.draft_tokens,
            kv_format,
            moe_parallel,
            moe_activations,
            kda_state,
        })
    }
}

fn rename(e: Error, field: &str) -> Error {
    match e {
        Error::InvalidInput { why, .. } => Error::invalid(field, why),
        other => other,
    }
}

/// Decode step or prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Decode,
    Prefill,
}

/// One op of one layer kind, summed over its instances in the phase.
#[derive(Clone, Debug)]
pub struct PlanRow {
    /// Layer kind: `KDA layers x69`, `MoE x92`, ...
    pub group: String,
    pub op: String,
    /// Kernel launches of this op in the phase.
    pub count: u64,
    /// Bytes and FLOPs of all instances.
    pub cost: Cost,
    /// Σ over instances of each instance's floor, and of its two limits.
    pub floor_s: f64,
    pub memory_s: f64,
    pub compute_s: f64,
}

impl PlanRow {
    pub fn bound(&self) -> Bound {
        if self.compute_s > self.memory_s {
            Bound::Compute
        } else {
            Bound::Memory
        }
    }
}

/// The floors of one phase.
#[derive(Clone, Debug)]
pub struct PhasePlan {
    /// Tokens processed by the phase on every GPU.
    pub tokens: u64,
    pub rows: Vec<PlanRow>,
}

impl PhasePlan {
    pub fn floor_s(&self) -> f64 {
        self.rows.iter().map(|r| r.floor_s).sum()
    }
    fn add(&mut self, hw: &Hardware, group: &str, op: &str, cost: Result<Cost>, instances: u64) -> Result<()> {
        // Every count grows with batch x context (the other flags are bounded), so an overflow
        // anywhere is theirs.
        let cost = cost.map_err(|e| Error::invalid("--batch", format!("--batch x --context is too large to model ({op}: {e})")))?;
        let f = hw.floor(&cost);
        let total = cost.checked_mul(instances).ok_or_else(too_large)?;
        let n = instances as f64;
        match self.rows.iter_mut().find(|r| r.group == group && r.op == op) {
            Some(r) => {
                r.count += instances;
                r.cost = r.cost.checked_add(&total).ok_or_else(too_large)?;
                r.floor_s += n * f.seconds();
                r.memory_s += n * f.memory_s;
                r.compute_s += n * f.compute_s;
            }
            None => self.rows.push(PlanRow {
                group: group.into(),
                op: op.into(),
                count: instances,
                cost: total,
                floor_s: n * f.seconds(),
                memory_s: n * f.memory_s,
                compute_s: n * f.compute_s,
            }),
        }
        Ok(())
    }
}

fn too_large() -> Error {
    Error::invalid("--batch", "--batch x --context is too large to model (byte or FLOP counts overflow u64)")
}

/// A decode step and a prefill of the K3 model on one GPU.
#[derive(Clone, Debug)]
pub struct Plan {
    pub options: PlanOptions,
    pub decode: PhasePlan,
    pub prefill: PhasePlan,
}

impl Plan {
    pub fn decode_step_s(&self) -> f64 {
        self.decode.floor_s()
    }
    pub fn prefill_per_token_s(&self) -> f64 {
        self.prefill.floor_s() / self.prefill.tokens.max(1) as f64
    }
}

/// The per-GPU shapes at the plan's parallelism.
struct Shapes {
    hidden: usize,
    kda_heads: usize,
    kda_dim: usize,
    mla_heads: usize,
    experts: usize,
    expert_width: usize,
    shared_width: usize,
    dense_width: usize,
    vocab: usize,
}

fn shapes(cfg: &K3Config, o: &PlanOptions) -> Result<Shapes> {
    let tp = o.tp;
    let divides = |total: usize, what: &str| -> Result<usize> {
        if tp == 0 || !total.is_multiple_of(tp) {
            return Err(Error::invalid("--tp", format!("{tp} does not divide the {total} {what}")));
        }
        Ok(total / tp)
    };
    let kda_heads = divides(cfg.kda.num_heads, "KDA heads")?;
    let mla_heads = divides(cfg.mla.num_heads, "MLA heads")?;
    let moe = &cfg.moe;
    let (experts, expert_width) = match o.moe_parallel {
        MoeParallel::Tensor => (moe.num_experts, divides(moe.moe_intermediate_size, "expert width")?),
        MoeParallel::Expert => {
            if !moe.num_experts.is_multiple_of(tp) {
                return Err(Error::invalid("--moe", format!("ep: --tp {tp} does not divide the {} experts", moe.num_experts)));
            }
            (moe.num_experts / tp, moe.moe_intermediate_size)
        }
    };
    if expert_width % 32 != 0 {
        return Err(Error::invalid("--tp", format!("{tp} leaves an expert width of {expert_width}, not a multiple of the MXFP4 group of 32")));
    }
    Ok(Shapes {
        hidden: cfg.hidden_size,
        kda_heads,
        kda_dim: cfg.kda.head_dim,
        mla_heads,
        experts,
        expert_width,
        shared_width: moe.shared_width().div_ceil(tp),
        dense_width: cfg.intermediate_size.div_ceil(tp),
        vocab: cfg.vocab_size.div_ceil(tp),
    })
}

const BF: DType = DType::BF16;

fn gemm(m: usize, n: usize, k: usize) -> Result<Cost> {
    GemmParams::new(m, n, k, BF, BF, BF).cost()
}

fn rms(m: usize, d: usize) -> Result<Cost> {
    RmsNormParams { m, d, eps: 1e-5, weight_order: RmsWeightOrder::CastBeforeWeight }.cost(BF, BF, BF)
}

fn add(m: usize, d: usize) -> Result<Cost> {
    ElementwiseParams { shape: vec![m, d] }.add_assign_cost(BF, BF)
}

/// Plans the model of `cfg` (K3's when `None`) under `o`.
pub fn plan(cfg: &K3Config, o: &PlanOptions) -> Result<Plan> {
    let s = shapes(cfg, o)?;
    if o.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    let q_len = o.draft_tokens.checked_add(1).filter(|&q| q <= mla_decode::MLA_MAX_Q_LEN).ok_or_else(|| {
        Error::invalid("--draft-tokens", format!("{} exceeds {} (MLA decode takes at most {} query tokens)", o.draft_tokens, mla_decode::MLA_MAX_Q_LEN - 1, mla_decode::MLA_MAX_Q_LEN))
    })?;
    if o.context < q_len {
        return Err(Error::invalid("--context", format!("{} is shorter than the {q_len} tokens of one decode step", o.context)));
    }
    if cfg.max_position_embeddings > 0 && o.context > cfg.max_position_embeddings {
        return Err(Error::invalid("--context", format!("{} exceeds the model's max_position_embeddings {}", o.context, cfg.max_position_embeddings)));
    }
    let decode_tokens = o.batch.checked_mul(q_len).ok_or_else(too_large)?;
    let prefill_tokens = o.batch.checked_mul(o.context).ok_or_else(too_large)?;
    let kv_tokens = (o.batch as u64).checked_mul(o.context as u64).ok_or_else(too_large)?;
    let decode = phase(cfg, o, &s, Phase::Decode, decode_tokens, kv_tokens)?;
    let prefill = phase(cfg, o, &s, Phase::Prefill, prefill_tokens, kv_tokens)?;
    Ok(Plan { options: o.clone(), decode, prefill })
}

/// The ops of one phase: `t` tokens on every GPU.
fn phase(cfg: &K3Config, o: &PlanOptions, s: &Shapes, ph: Phase, t: usize, kv_tokens: u64) -> Result<PhasePlan> {
    let hw = o.hardware;
    let mut p = PhasePlan { tokens: t as u64, rows: Vec::new() };
    let (d, b) = (s.hidden, o.batch);
    let n_kda = cfg.kda_layers().count();
    let n_mla = cfg.mla_layers().count();
    let n_moe = cfg.ffns.iter().filter(|f| **f == FfnKind::LatentMoe).count();
    let n_dense = cfg.ffns.len() - n_moe;
    let kda_g = format!("KDA layers x{n_kda}");
    let mla_g = format!("MLA layers x{n_mla}");
    let moe_g = format!("MoE x{n_moe}");
    let dense_g = format!("dense FFN x{n_dense}");
    let res_g = format!("AttnRes, norms, residual x{}", cfg.num_layers);
    let head_g = "embedding, lm_head".to_string();
    let (kda_n, mla_n, moe_n, dense_n) = (n_kda as u64, n_mla as u64, n_moe as u64, n_dense as u64);

    // ---- KDA layers
    let (hk, kd) = (s.kda_heads, s.kda_dim);
    let w = hk * kd;
    p.add(hw, &kda_g, "in_proj q|k|v|g (GEMM)", gemm(t, 4 * w, d), kda_n)?;
    p.add(hw, &kda_g, "f_a (GEMM, replicated)", gemm(t, kd, d), kda_n)?;
    p.add(hw, &kda_g, "f_b (GEMM)", gemm(t, w, kd), kda_n)?;
    p.add(hw, &kda_g, "b_proj (GEMM)", gemm(t, hk, d), kda_n)?;
    let mut pre = KdaPrefillParams::k3_defaults(hk, kd, kd);
    pre.a_log_len = cfg.kda.head_dim.max(hk);
    pre.state_slots = b;
    match (ph, o.draft_tokens) {
        (Phase::Decode, 0) => {
            let dec = KdaDecodeParams {
                head_k: kd,
                head_v: kd,
                conv_width: cfg.kda.conv_kernel,
                gate: pre.gate,
                output_norm: KdaOutputNorm::GatedRmsNorm { eps: cfg.rms_norm_eps },
                ..KdaDecodeParams::k3(t, hk)
            };
            p.add(hw, &kda_g, "kda_decode (conv, gate, delta rule, gated norm)", dec.cost(BF, BF, o.kda_state), kda_n)?;
        }
        _ => {
            // Prefill, or a speculative verify of 1 + draft tokens per sequence as a short prefill.
            let conv = CausalConv1dParams { dim: 3 * w, width: cfg.kda.conv_kernel, activation: ConvActivation::Silu, read_initial_state: true, write_final_state: true, state_slots: b };
            p.add(hw, &kda_g, "causal_conv1d q|k|v", conv.cost(t, b, BF, BF), kda_n)?;
            pre.read_initial_state = ph == Phase::Decode;
            pre.write_final_state = true;
            pre.chunk_size = if ph == Phase::Decode { 16 } else { 64 };
            p.add(hw, &kda_g, "kda_prefill (chunked delta rule)", pre.cost(t, b, BF, o.kda_state), kda_n)?;
            let norm = GatedRmsNormParams { m: t, heads: hk, head_dim: kd, eps: cfg.rms_norm_eps };
            p.add(hw, &kda_g, "gated_rms_norm", norm.cost(BF, BF, BF), kda_n)?;
        }
    }
    p.add(hw, &kda_g, "o_proj (GEMM)", gemm(t, d, w), kda_n)?;

    // ---- MLA layers
    let mla = &cfg.mla;
    let hm = s.mla_heads;
    let (lat, rope, nope, vd) = (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim);
    p.add(hw, &mla_g, "q_a (GEMM, replicated)", gemm(t, mla.q_lora_rank, d), mla_n)?;
    p.add(hw, &mla_g, "q_a_layernorm", rms(t, mla.q_lora_rank), mla_n)?;
    p.add(hw, &mla_g, "q_b (GEMM)", gemm(t, hm * mla.qk_head_dim(), mla.q_lora_rank), mla_n)?;
    p.add(hw, &mla_g, "kv_a (GEMM, replicated)", gemm(t, lat + rope, d), mla_n)?;
    p.add(hw, &mla_g, "kv_a_layernorm", rms(t, lat), mla_n)?;
    let dims = KvDims { latent: lat, rope };
    let write = MlaCacheWriteParams { dims, num_pages: 1, page_size: 64, format: o.kv_format, kv_scale: 1.0 };
    p.add(hw, &mla_g, "mla_cache_write", write.cost(t, BF), mla_n)?;
    let cache = MlaPagedCache { dims, format: o.kv_format, page_size: 64, num_pages: 1, kv_scale: 1.0 };
    match ph {
        Phase::Decode => {
            p.add(hw, &mla_g, "W_UK absorb (GEMM per head)", gemm(t, lat, nope), mla_n * hm as u64)?;
            let dec = MlaDecodeParams {
                cache,
                heads: hm,
                q_len: o.draft_tokens + 1,
                softmax_scale: mla.softmax_scale(),
                variant: MlaDecodeVariant::Auto,
                splits: MlaSplitPolicy::Auto,
            };
            p.add(hw, &mla_g, "mla_decode (absorbed, paged latent cache)", dec.cost(b, kv_tokens, BF, BF), mla_n)?;
            p.add(hw, &mla_g, "W_UV (GEMM per head)", gemm(t, vd, lat), mla_n * hm as u64)?;
        }
        Phase::Prefill => {
            p.add(hw, &mla_g, "kv_b decompress (GEMM)", gemm(t, hm * (nope + vd), lat), mla_n)?;
            let pre = MlaPrefillParams { heads: hm, qk_dim: mla.qk_head_dim(), v_dim: vd, softmax_scale: mla.softmax_scale(), causal: true };
            p.add(hw, &mla_g, "mla_prefill (causal MHA)", pre.cost(b, o.context, o.context, BF), mla_n)?;
        }
    }
    p.add(hw, &mla_g, "g_proj (GEMM)", gemm(t, hm * vd, d), mla_n)?;
    p.add(hw, &mla_g, "sigmoid_gate", SigmoidGateParams { m: t, n: hm * vd }.cost(BF, BF, BF), mla_n)?;
    p.add(hw, &mla_g, "o_proj (GEMM)", gemm(t, d, hm * vd), mla_n)?;

    // ---- MoE layers
    let moe = &cfg.moe;
    let latent = moe.latent_size;
    p.add(hw, &moe_g, "router (replicated)", MoeRouterParams::sigmoid(t, d, moe.num_experts, moe.top_k).cost(BF, BF), moe_n)?;
    p.add(hw, &moe_g, "latent down (GEMM, replicated)", gemm(t, latent, d), moe_n)?;
    let local_tokens = match o.moe_parallel {
        MoeParallel::Tensor => t,
        MoeParallel::Expert => t.div_ceil(o.tp),
    };
    let routing = MoeRouting { tokens: local_tokens, top_k: moe.top_k, experts: s.experts, block_m: 16 };
    let touched = routing.expected_experts_touched();
    p.add(hw, &moe_g, "moe_align", MoeAlignParams { routing: routing.clone(), global_experts: None }.cost(), moe_n)?;
    let stage = |stage, k, n| MoeGemmParams { routing: routing.clone(), k, n, stage, weights: MoeWeightFormat::Mxfp4, activation_quant: o.moe_activations };
    let gate_up = stage(MoeGemmStage::GateUp { beta: cfg.situ_beta, linear_beta: cfg.situ_linear_beta }, latent, s.expert_width);
    p.add(hw, &moe_g, "experts gate_up + SiTU (MXFP4)", gate_up.cost(touched, BF, BF, BF), moe_n)?;
    let down = stage(MoeGemmStage::Down, s.expert_width, latent);
    p.add(hw, &moe_g, "experts down (MXFP4)", down.cost(touched, BF, BF, DType::F32), moe_n)?;
    let combine = MoeCombineParams { tokens: local_tokens, top_k: moe.top_k, hidden: latent };
    p.add(hw, &moe_g, "moe_combine", combine.cost(DType::F32, BF), moe_n)?;
    p.add(hw, &moe_g, "latent norm", rms(t, latent), moe_n)?;
    p.add(hw, &moe_g, "latent up (GEMM, replicated)", gemm(t, d, latent), moe_n)?;
    let situ = |n| SituGluParams { m: t, n, beta: cfg.situ_beta, linear_beta: cfg.situ_linear_beta }.cost(BF, BF);
    p.add(hw, &moe_g, "shared experts gate|up (GEMM)", gemm(t, 2 * s.shared_width, d), moe_n)?;
    p.add(hw, &moe_g, "shared experts SiTU", situ(s.shared_width), moe_n)?;
    p.add(hw, &moe_g, "shared experts down (GEMM)", gemm(t, d, s.shared_width), moe_n)?;
    p.add(hw, &moe_g, "routed + shared add", add(t, d), moe_n)?;

    // ---- dense FFN
    if dense_n > 0 {
        p.add(hw, &dense_g, "gate|up (GEMM)", gemm(t, 2 * s.dense_width, d), dense_n)?;
        p.add(hw, &dense_g, "SiTU", situ(s.dense_width), dense_n)?;
        p.add(hw, &dense_g, "down (GEMM)", gemm(t, d, s.dense_width), dense_n)?;
    }

    // ---- AttnRes, norms, residual adds (per layer: the bank grows at every block start)
    let mut bank = 0usize;
    for layer in 0..cfg.num_layers {
        if bank > 0 {
            p.add(hw, &res_g, "AttnRes mix before the mixer", mix(bank + 1, t, d), 1)?;
        }
        let block_start = cfg.is_block_start(layer);
        if block_start {
            bank += 1;
        }
        p.add(hw, &res_g, "input_layernorm", rms(t, d), 1)?;
        if !block_start {
            p.add(hw, &res_g, "residual add", add(t, d), 1)?;
        }
        p.add(hw, &res_g, "AttnRes mix before the FFN", mix(bank + 1, t, d), 1)?;
        p.add(hw, &res_g, "post_attention_layernorm", rms(t, d), 1)?;
        p.add(hw, &res_g, "residual add", add(t, d), 1)?;
    }

    // ---- embedding, output mix, final norm, lm_head
    let logits = if ph == Phase::Decode { t } else { b };
    p.add(hw, &head_g, "embedding_gather", EmbeddingGatherParams { vocab: cfg.vocab_size, d, m: t }.cost(BF, DType::I32, BF), 1)?;
    p.add(hw, &head_g, "output AttnRes mix", mix(bank + 1, logits, d), 1)?;
    p.add(hw, &head_g, "final norm", rms(logits, d), 1)?;
    p.add(hw, &head_g, "lm_head (GEMM)", gemm(logits, s.vocab, d), 1)?;
    Ok(p)
}

fn mix(sources: usize, m: usize, d: usize) -> Result<Cost> {
    AttnResMixParams { sources, m, d, eps: 1e-5 }.cost(BF, BF)
}

// ---- output ----------------------------------------------------------------------------------

fn row_json(r: &PlanRow) -> Value {
    let f = |c| r.cost.flops(c);
    json!({
        "group": r.group, "op": r.op, "count": r.count, "bytes": r.cost.bytes,
        "flops": {"bf16": f(MathClass::Bf16Matrix), "fp8": f(MathClass::Fp8Matrix), "fp4": f(MathClass::Fp4Matrix), "vector": f(MathClass::Vector)},
        "floor_us": r.floor_s * 1e6, "memory_us": r.memory_s * 1e6, "compute_us": r.compute_s * 1e6, "bound": r.bound().name(),
    })
}

impl Plan {
    /// Schema `k3-plan/1`.
    pub fn to_json(&self) -> Value {
        let o = &self.options;
        let h = o.hardware;
        let phase = |p: &PhasePlan, extra: Value| {
            let mut v = json!({"tokens": p.tokens, "floor_us": p.floor_s() * 1e6, "rows": p.rows.iter().map(row_json).collect::<Vec<_>>()});
            if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            v
        };
        json!({
            "schema": "k3-plan/1",
            "kind": "model: speed-of-light floors (not measurements)",
            "hardware": {
                "id": h.id, "name": h.name, "hbm_tb_s": h.hbm_bytes_per_s / 1e12,
                "bf16_tflops": h.bf16_flops / 1e12, "fp8_tflops": h.fp8_flops / 1e12,
                "fp4_tflops": h.fp4_flops.map(|f| f / 1e12), "f32_vector_tflops": h.f32_vector_flops / 1e12,
                "compute_units": h.compute_units, "sources": h.sources,
            },
            "options": {
                "tp": o.tp, "batch": o.batch, "context": o.context, "draft_tokens": o.draft_tokens,
                "kv_cache_dtype": o.kv_format.name(),
                "moe": match o.moe_parallel { MoeParallel::Tensor => "tp", MoeParallel::Expert => "ep" },
                "moe_activations": if o.moe_activations.is_some() { "mxfp8" } else { "bf16" },
                "kda_state": o.kda_state.name(),
            },
            "decode": phase(&self.decode, json!({"step_floor_us": self.decode_step_s() * 1e6})),
            "prefill": phase(&self.prefill, json!({"per_token_floor_us": self.prefill_per_token_s() * 1e6})),
        })
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "K3 speed-of-light plan (a model, not a measurement) on {} ({:.2} TB/s, dense bf16 {:.0} / fp8 {:.0} / fp4 {} TFLOP/s)",
            o.hardware.name,
            o.hardware.hbm_bytes_per_s / 1e12,
            o.hardware.bf16_flops / 1e12,
            o.hardware.fp8_flops / 1e12,
            o.hardware.fp4_flops.map_or("none (fp8 path)".into(), |x| format!("{:.0}", x / 1e12)),
        )?;
        writeln!(
            f,
            "per GPU at TP{}: batch {}, context {}, draft tokens {}, KV cache {}, MoE {} with {} activations, KDA state {}",
            o.tp,
            o.batch,
            o.context,
            o.draft_tokens,
            o.kv_format.name(),
            if o.moe_parallel == MoeParallel::Tensor { "tensor-parallel" } else { "expert-parallel" },
            if o.moe_activations.is_some() { "MXFP8" } else { "bf16" },
            o.kda_state.name(),
        )?;
        for (title, p) in [("decode step", &self.decode), ("prefill", &self.prefill)] {
            let total = p.floor_s();
            writeln!(f, "\n{title}: {} tokens per GPU, floor {:.1} µs", p.tokens, total * 1e6)?;
            writeln!(f, "{:<30} {:<46} {:>6} {:>12} {:>6} {:>8} {:>10} {:>10}", "layer kind", "op", "count", "floor µs", "share", "bound", "GB", "TFLOP")?;
            for r in &p.rows {
                writeln!(
                    f,
                    "{:<30} {:<46} {:>6} {:>12.2} {:>5.1}% {:>8} {:>10.3} {:>10.3}",
                    r.group,
                    r.op,
                    r.count,
                    r.floor_s * 1e6,
                    100.0 * r.floor_s / total.max(f64::MIN_POSITIVE),
                    r.bound().name(),
                    r.cost.bytes as f64 / 1e9,
                    r.cost.total_flops() as f64 / 1e12,
                )?;
            }
        }
        writeln!(f, "\ndecode step floor per GPU: {:.3} ms ({:.1} tokens/s per sequence at this floor)", self.decode_step_s() * 1e3, (o.draft_tokens + 1) as f64 / self.decode_step_s())?;
        writeln!(f, "prefill floor per GPU: {:.3} µs per token ({} tokens, {:.3} s)", self.prefill_per_token_s() * 1e6, self.prefill.tokens, self.prefill.floor_s())
    }
}

/// Reads the config a plan uses: `path`, else the released K3 config.
pub fn load_config(path: Option<&std::path::Path>) -> Result<K3Config> {
    match path {
        None => K3Config::from_json_str(K3_CONFIG_JSON),
        Some(p) => {
            let text = crate::files::read_text_capped(p, crate::limits::CONFIG_FILE_MAX, "model_k3::limits::CONFIG_FILE_MAX")
                .map_err(|e| Error::invalid("--config", format!("{}: {e}", p.display())))?;
            K3Config::from_json_str(&text).map_err(|e| rename_prefixed(e, "--config"))
        }
    }
}

fn rename_prefixed(e: Error, flag: &str) -> Error {
    match e {
        Error::InvalidInput { field, why } => Error::invalid(flag, format!("{field}: {why}")),
        other => other,
    }
}

/// `k3 plan`: prints the plan (text or JSON); exit 2 with the error on bad flags.
pub fn run_cli(a: &PlanArgs) -> ExitCode {
    let res = load_config(a.config.as_deref()).and_then(|cfg| PlanOptions::from_args(a).and_then(|o| plan(&cfg, &o)));
    match res {
        Ok(p) if a.json => {
            println!("{}", serde_json::to_string_pretty(&p.to_json()).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(p) => {
            print!("{p}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
