//! The launches of the K3 hot ops at production shapes, per target: each op's real `plan` and
//! `run` through a [`GpuBackend`] over a [`RecordingRuntime`] that describes itself as the
//! target's product (SM / CU count, shared memory per block, warp size). Nothing runs; the
//! launchers' grids, blocks and dynamic shared memory are recorded.
//!
//! Shapes are those of `k3-device-bench` (its `shapes(false)`): KDA chunked prefill 1x8192 and
//! 8x1024, fused KDA decode batch 1/64/1024, absorbed MLA decode batch 1/16/64 at 8k/64k context
//! (bf16 and fp8-tiled caches; the auto variant and Gluon), each at 12 heads (one GPU of TP8)
//! and 96 (the whole model); the latent MoE's routed path (896 experts, top 16, latent 3584,
//! expert width 384) at 1/64/1024 tokens; and the bf16 dense projections at 1/64/1024 rows.
//! Beyond those, the other ops of a K3 layer at the same token counts with K3's dims
//! (hidden 7168, per-GPU TP8 widths): RMSNorm, the AttnRes mix over 9 sources, the KDA gated
//! output norm and gate activation, the KDA short conv and ragged MLA prefill at the prefill
//! shapes, the MLA cache write, SiTU-GLU of the shared experts, the output sigmoid gate and
//! the embedding gather.

use k3_build_support::resources::occupancy::{TargetLimits, Unit};
use k3_kernels::{GpuBackend, ModuleImage, RecordedLaunch, RecordingRuntime};
use kernel_api::ops::mla_decode::K3_SOFTMAX_SCALE;
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, BackendKind, DType, DeviceInfo, DeviceTensor, Fp8Native, Result};

type Gpu = GpuBackend<RecordingRuntime>;
type Dev = DeviceTensor<Gpu>;

/// One op at one shape on one target, with the launches its run made.
pub struct Case {
    pub op: &'static str,
    pub shape: String,
    pub launches: Vec<RecordedLaunch>,
}

/// The target as the plans see it.
pub fn device(l: &TargetLimits) -> DeviceInfo {
    let (kind, shared, fp8) = match l.unit {
        Unit::Sm(sm) => (BackendKind::Cuda, sm.shared_per_block, Fp8Native::Ocp),
        Unit::Cu(cu) => {
            (BackendKind::Rocm, cu.lds_per_block, if l.target == "gfx942" { Fp8Native::Fnuz } else { Fp8Native::Ocp })
        }
    };
    DeviceInfo {
        kind,
        arch: l.target.to_string(),
        name: format!("{} (recorded)", l.product),
        warp_size: l.warp_size,
        compute_units: l.units,
        shared_mem_per_block: shared as usize,
        // No plan reads the L2 size.
        l2_bytes: 0,
        fp8,
    }
}

const HEADS: [usize; 2] = [12, 96];
const KDA_DIM: usize = 128;
const KDA_PREFILL: [(usize, usize); 2] = [(1, 8192), (8, 1024)];
const KDA_DECODE: [usize; 3] = [1, 64, 1024];
const MLA_BATCH: [usize; 3] = [1, 16, 64];
const MLA_CTX: [usize; 2] = [8192, 65536];
const MLA_PAGE: usize = 64;
/// (hidden, latent, expert width, experts, top_k)
const MOE: (usize, usize, usize, usize, usize) = (7168, 3584, 384, 896, 16);
const TOKENS: [usize; 3] = [1, 64, 1024];
const HIDDEN: usize = 7168;
/// Sources of the largest AttnRes mix: 8 block summaries and the running sum.
const ATTN_RES_SOURCES: usize = 9;
/// Shared experts (2 x 3072, fused) per GPU at TP8.
const SHARED_EXPERT_WIDTH: usize = 6144 / 8;
/// g_proj output (12288) per GPU at TP8.
const GATE_WIDTH: usize = 12288 / 8;
const VOCAB: usize = 163_840;
/// MLA prefill (ragged MHA): q/k 128 nope + 64 rope, v 128.
const MLA_QK: usize = 192;
const MLA_V: usize = 128;
/// Dense projections (N, K, what).
const GEMMS: [(usize, usize, &str); 4] = [
    (3584, 7168, "latent down"),
    (7168, 3584, "latent up"),
    (1536, 7168, "KDA q/k/v per GPU at TP8"),
    (7168, 1536, "KDA o_proj per GPU at TP8"),
];

/// Every case on `l`, in a fixed order. An op that fails to plan or run is an error: the report
/// must not silently lose a launch.
pub fn all(l: &TargetLimits) -> Result<Vec<Case>> {
    let b = GpuBackend::new(RecordingRuntime::new(device(l)), &ModuleImage::host_linked("recorded"), "recorded")?;
    let mut cases = Vec::new();
    let mut case = |op: &'static str, shape: String, f: &dyn Fn(&Gpu) -> Result<()>| -> Result<()> {
        f(&b).map_err(|e| kernel_api::Error::invalid(op, format!("{shape} on {}: {e}", l.target)))?;
        cases.push(Case { op, shape, launches: b.runtime().take_launches() });
        Ok(())
    };
    for h in HEADS {
        for (seqs, len) in KDA_PREFILL {
            case("kda_prefill", format!("H{h} {seqs}x{len}"), &|b| kda_prefill(b, h, seqs, len))?;
        }
        for batch in KDA_DECODE {
            case("kda_decode", format!("H{h} b{batch}"), &|b| kda_decode(b, h, batch))?;
        }
        for ctx in MLA_CTX {
            for batch in MLA_BATCH {
                for (format, fname) in
                    [(KvCacheFormat::Bf16, "bf16"), (KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), "fp8-tiled")]
                {
                    // bf16 queries, and f32 ones as model-k3 passes them (f32 activations).
                    for (variant, vname, q_dt) in [
                        (MlaDecodeVariant::Auto, "auto", DType::BF16),
                        (MlaDecodeVariant::GluonStyle, "gluon", DType::BF16),
                        (MlaDecodeVariant::Auto, "auto f32-q", DType::F32),
                    ] {
                        let shape = format!("H{h} b{batch} ctx{}k {fname} {vname}", ctx / 1024);
                        case("mla_decode", shape, &|b| mla_decode(b, h, batch, ctx, format, variant, q_dt))?;
                    }
                }
            }
        }
    }
    for t in TOKENS {
        case("moe", format!("T{t}"), &|b| moe(b, t, DType::BF16))?;
        // model-k3's f32 activations (router x, both GEMMs' inputs and the gate-up output).
        case("moe", format!("T{t} f32-act"), &|b| moe(b, t, DType::F32))?;
    }
    for (n, k, what) in GEMMS {
        for m in TOKENS {
            case("dense_gemm", format!("M{m} N{n} K{k} ({what})"), &|b| dense_gemm(b, m, n, k))?;
        }
    }
    for t in TOKENS {
        case("rms_norm", format!("T{t} D{HIDDEN}"), &|b| rms_norm(b, t))?;
        case("attn_res_mix", format!("T{t} S{ATTN_RES_SOURCES} D{HIDDEN}"), &|b| attn_res_mix(b, t))?;
        case("situ_glu", format!("T{t} N{SHARED_EXPERT_WIDTH} (shared experts per GPU at TP8)"), &|b| situ_glu(b, t))?;
        case("sigmoid_gate", format!("T{t} N{GATE_WIDTH} (output gate per GPU at TP8)"), &|b| sigmoid_gate(b, t))?;
        case("embedding_gather", format!("T{t} V{VOCAB} D{HIDDEN}"), &|b| embedding_gather(b, t))?;
        for (format, fname) in [(KvCacheFormat::Bf16, "bf16"), (KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn), "fp8-tiled")] {
            case("mla_cache_write", format!("T{t} {fname}"), &|b| mla_cache_write(b, t, format))?;
        }
    }
    for (seqs, len) in KDA_PREFILL {
        let t = seqs * len;
        case("kda_gate", format!("H12 T{t}"), &|b| kda_gate(b, 12, t))?;
        case("gated_rms_norm", format!("H12 T{t}"), &|b| gated_rms_norm(b, 12, t))?;
        case("causal_conv1d", format!("{seqs}x{len} D{}", 12 * 3 * KDA_DIM), &|b| causal_conv1d(b, 12 * 3 * KDA_DIM, seqs, len))?;
        for h in HEADS {
            case("mla_prefill", format!("H{h} {seqs}x{len}"), &|b| mla_prefill(b, h, seqs, len))?;
        }
    }
    Ok(cases)
}

fn z(b: &Gpu, dtype: DType, shape: &[usize]) -> Result<Dev> {
    b.zeros(dtype, shape)
}

fn kda_prefill(b: &Gpu, heads: usize, seqs: usize, len: usize) -> Result<()> {
    let (t, kd, bf) = (seqs * len, KDA_DIM, DType::BF16);
    let mut p = KdaPrefillParams::k3_defaults(heads, kd, kd);
    p.state_slots = seqs;
    p.read_initial_state = true;
    p.write_final_state = true;
    let cu: Vec<i64> = (0..=seqs as i64).map(|i| i * len as i64).collect();
    let plan = KdaPrefill::plan(b, &p, &KdaPrefillBatch { cu_seqlens: &cu, state_indices: None, checkpoints: None })?;
    let (q, k, v, g) = (z(b, bf, &[t, heads, kd])?, z(b, bf, &[t, heads, kd])?, z(b, bf, &[t, heads, kd])?, z(b, bf, &[t, heads, kd])?);
    let (beta, a_log, dt_bias) = (z(b, bf, &[t, heads])?, z(b, DType::F32, &[heads])?, z(b, DType::F32, &[heads * kd])?);
    let cu_d = z(b, DType::I64, &[seqs + 1])?;
    let mut state = z(b, DType::F32, &[seqs, heads, kd, kd])?;
    let mut out = z(b, bf, &[t, heads, kd])?;
    let mut ws = b.workspace(KdaPrefill::workspace_size(b, &plan))?;
    let args = KdaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        g_raw: g.as_ref(),
        beta: beta.as_ref(),
        a_log: Some(a_log.as_ref()),
        dt_bias: Some(dt_bias.as_ref()),
        cu_seqlens: cu_d.as_ref(),
        state_indices: None,
        state: Some(state.as_mut()),
        checkpoint_offsets: None,
        checkpoint_state: None,
        out: out.as_mut(),
    };
    KdaPrefill::run(b, &plan, args, ws.as_mut(), b.default_stream())
}

fn kda_decode(b: &Gpu, heads: usize, batch: usize) -> Result<()> {
    let (kd, w, slots, bf) = (KDA_DIM, 4, batch + 1, DType::BF16);
    let p = KdaDecodeParams {
        batch,
        heads,
        head_k: kd,
        head_v: kd,
        conv_width: w,
        state_slots: slots,
        state_layout: KdaStateLayout::KMajor,
        gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
    };
    let d = p.channels();
    let idx: Vec<i32> = (1..=batch as i32).collect();
    let plan = KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: &idx })?;
    let (x, cw, g, beta) = (z(b, bf, &[batch, d])?, z(b, DType::F32, &[d, w])?, z(b, bf, &[batch, heads, kd])?, z(b, bf, &[batch, heads])?);
    let (a_log, dt_bias, si) = (z(b, DType::F32, &[heads])?, z(b, DType::F32, &[heads * kd])?, z(b, DType::I32, &[batch])?);
    let (og, nw) = (z(b, bf, &[batch, heads, kd])?, z(b, DType::F32, &[kd])?);
    let mut conv_state = z(b, DType::F32, &[slots, d, w - 1])?;
    let mut state = z(b, DType::F32, &[slots, heads, kd, kd])?;
    let mut out = z(b, bf, &[batch, heads, kd])?;
    let mut ws = b.workspace(KdaDecode::workspace_size(b, &plan))?;
    let args = KdaDecodeArgs {
        x_qkv: x.as_ref(),
        conv_weight: cw.as_ref(),
        conv_state: conv_state.as_mut(),
        g_raw: g.as_ref(),
        beta: beta.as_ref(),
        a_log: Some(a_log.as_ref()),
        dt_bias: Some(dt_bias.as_ref()),
        state_indices: si.as_ref(),
        recurrent_state: state.as_mut(),
        output_gate: Some(og.as_ref()),
        norm_weight: Some(nw.as_ref()),
        out: out.as_mut(),
    };
    KdaDecode::run(b, &plan, args, ws.as_mut(), b.default_stream())
}

/// `q_dt`: the query's dtype, also the output's.
fn mla_decode(b: &Gpu, heads: usize, batch: usize, ctx: usize, format: KvCacheFormat, variant: MlaDecodeVariant, q_dt: DType) -> Result<()> {
    let dims = KvDims::K3;
    let pages_per_seq = ctx.div_ceil(MLA_PAGE);
    let num_pages = batch * pages_per_seq;
    let cache = MlaPagedCache { dims, format, page_size: MLA_PAGE, num_pages, kv_scale: 1.0 / 64.0 };
    let p = MlaDecodeParams { cache, heads, q_len: 1, softmax_scale: K3_SOFTMAX_SCALE, variant, splits: MlaSplitPolicy::Auto };
    let table: Vec<i32> = (0..num_pages as i32).collect();
    let lens = vec![ctx as i32; batch];
    let plan = MlaDecode::plan(b, &p, &MlaDecodeBatch { seq_lens: &lens, block_table: &table, max_pages_per_seq: pages_per_seq })?;
    let kv = z(b, DType::U8, &[num_pages, MLA_PAGE, cache.bytes_per_token()])?;
    let q = z(b, q_dt, &[batch, 1, heads, dims.width()])?;
    let (bt, sl) = (z(b, DType::I32, &[batch, pages_per_seq])?, z(b, DType::I32, &[batch])?);
    let mut out = z(b, q_dt, &[batch, 1, heads, dims.latent])?;
    let mut lse = z(b, DType::F32, &[batch, 1, heads])?;
    let mut ws = b.workspace(MlaDecode::workspace_size(b, &plan))?;
    let args = MlaDecodeArgs {
        q: q.as_ref(),
        kv_cache: kv.as_ref(),
        block_table: bt.as_ref(),
        seq_lens: sl.as_ref(),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaDecode::run(b, &plan, args, ws.as_mut(), b.default_stream())
}

/// The routed path of the latent MoE: router, align, MXFP4 gate-up and down GEMMs, combine, on
/// activations of dtype `act`.
fn moe(b: &Gpu, t: usize, act: DType) -> Result<()> {
    let (hidden, l, n, e, k) = MOE;
    let (bf, s) = (DType::BF16, b.default_stream());
    let (x, router_w, bias, zl) = (z(b, act, &[t, hidden])?, z(b, bf, &[e, hidden])?, z(b, DType::F32, &[e])?, z(b, act, &[t, l])?);
    let (w13, s13) = (z(b, DType::U8, &[e, 2 * n, l / 2])?, z(b, DType::U8, &[e, 2 * n, l / 32])?);
    let (w2, s2) = (z(b, DType::U8, &[e, l, n / 2])?, z(b, DType::U8, &[e, l, n / 32])?);
    let rplan = MoeRouter::plan(b, &MoeRouterParams::sigmoid(t, hidden, e, k))?;
    let mut ids = z(b, DType::I32, &[t, k])?;
    let mut weights = z(b, DType::F32, &[t, k])?;
    let args = MoeRouterArgs { x: x.as_ref(), weight: router_w.as_ref(), bias: Some(bias.as_ref()), topk_ids: ids.as_mut(), topk_weights: weights.as_mut() };
    let mut rws = b.workspace(MoeRouter::workspace_size(b, &rplan))?;
    MoeRouter::run(b, &rplan, args, rws.as_mut(), s)?;

    let routing = MoeRouting { tokens: t, top_k: k, experts: e, block_m: 16 };
    let aplan = MoeAlign::plan(b, &MoeAlignParams { routing: routing.clone(), global_experts: None })?;
    let mut sorted = z(b, DType::I32, &[aplan.max_padded])?;
    let mut expert_ids = z(b, DType::I32, &[aplan.num_blocks])?;
    let mut ntp = z(b, DType::I32, &[1])?;
    let mut aws = b.workspace(MoeAlign::workspace_size(b, &aplan))?;
    let args = MoeAlignArgs {
        topk_ids: ids.as_ref(),
        expert_map: None,
        sorted_token_ids: sorted.as_mut(),
        expert_ids: expert_ids.as_mut(),
        num_tokens_post_padded: ntp.as_mut(),
    };
    MoeAlign::run(b, &aplan, args, aws.as_mut(), s)?;

    let stage = |stage, kk, nn| MoeGemmParams { routing: routing.clone(), k: kk, n: nn, stage, weights: MoeWeightFormat::Mxfp4, activation_quant: None };
    let mut a = z(b, act, &[t * k, n])?;
    let mut y = z(b, DType::F32, &[t * k, l])?;
    for (params, input, w, sc, topk, out) in [
        (stage(MoeGemmStage::GateUp { beta: 4.0, linear_beta: Some(25.0) }, l, n), &zl, &w13, &s13, None, &mut a),
        (stage(MoeGemmStage::Down, n, l), &z(b, act, &[t * k, n])?, &w2, &s2, Some(&weights), &mut y),
    ] {
        let plan = MoeGroupedGemm::plan(b, &params)?;
        let mut ws = b.workspace(MoeGroupedGemm::workspace_size(b, &plan))?;
        let args = MoeGemmArgs {
            input: input.as_ref(),
            weight: w.as_ref(),
            weight_scale: Some(sc.as_ref()),
            sorted_token_ids: sorted.as_ref(),
            expert_ids: expert_ids.as_ref(),
            num_tokens_post_padded: ntp.as_ref(),
            topk_weights: topk.map(DeviceTensor::as_ref),
            out: out.as_mut(),
        };
        MoeGroupedGemm::run(b, &plan, args, ws.as_mut(), s)?;
    }

    let cplan = MoeCombine::plan(b, &MoeCombineParams { tokens: t, top_k: k, hidden: l })?;
    let mut r = z(b, bf, &[t, l])?;
    MoeCombine::run(b, &cplan, MoeCombineArgs { y: y.as_ref(), out: r.as_mut() }, None, s)
}

fn dense_gemm(b: &Gpu, m: usize, n: usize, k: usize) -> Result<()> {
    let bf = DType::BF16;
    let (x, w) = (z(b, bf, &[m, k])?, z(b, bf, &[n, k])?);
    let mut out = z(b, bf, &[m, n])?;
    let plan = Gemm::plan(b, &GemmParams::new(m, n, k, bf, bf, bf))?;
    let mut ws = b.workspace(Gemm::workspace_size(b, &plan))?;
    Gemm::run(b, &plan, GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() }, ws.as_mut(), b.default_stream())
}

fn rms_norm(b: &Gpu, m: usize) -> Result<()> {
    let p = RmsNormParams { m, d: HIDDEN, eps: 1e-5, weight_order: RmsWeightOrder::CastBeforeWeight };
    let plan = RmsNorm::plan(b, &p)?;
    let (x, w, mut out) = (z(b, DType::BF16, &[m, HIDDEN])?, z(b, DType::BF16, &[HIDDEN])?, z(b, DType::BF16, &[m, HIDDEN])?);
    RmsNorm::run(b, &plan, RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() }, None, b.default_stream())
}

fn attn_res_mix(b: &Gpu, m: usize) -> Result<()> {
    let s = ATTN_RES_SOURCES;
    let plan = AttnResMix::plan(b, &AttnResMixParams { sources: s, m, d: HIDDEN, eps: 1e-5 })?;
    let (src, v, mut out) = (z(b, DType::BF16, &[s, m, HIDDEN])?, z(b, DType::F32, &[HIDDEN])?, z(b, DType::BF16, &[m, HIDDEN])?);
    let args = AttnResMixArgs { sources: src.as_ref(), score_vector: v.as_ref(), out: out.as_mut() };
    AttnResMix::run(b, &plan, args, None, b.default_stream())
}

fn situ_glu(b: &Gpu, m: usize) -> Result<()> {
    let n = SHARED_EXPERT_WIDTH;
    let plan = SituGlu::plan(b, &SituGluParams { m, n, beta: 4.0, linear_beta: Some(25.0) })?;
    let (x, mut out) = (z(b, DType::BF16, &[m, 2 * n])?, z(b, DType::BF16, &[m, n])?);
    SituGlu::run(b, &plan, SituGluArgs { input: SituGluInput::Fused(x.as_ref()), out: out.as_mut() }, None, b.default_stream())
}

fn sigmoid_gate(b: &Gpu, m: usize) -> Result<()> {
    let n = GATE_WIDTH;
    let plan = SigmoidGate::plan(b, &SigmoidGateParams { m, n })?;
    let (x, g, mut out) = (z(b, DType::BF16, &[m, n])?, z(b, DType::BF16, &[m, n])?, z(b, DType::BF16, &[m, n])?);
    SigmoidGate::run(b, &plan, SigmoidGateArgs { x: x.as_ref(), g: g.as_ref(), out: out.as_mut() }, None, b.default_stream())
}

fn embedding_gather(b: &Gpu, m: usize) -> Result<()> {
    let ids: Vec<i64> = (0..m as i64).collect();
    let plan = EmbeddingGather::plan(b, &EmbeddingGatherParams { vocab: VOCAB, d: HIDDEN, m }, &ids)?;
    let (table, ids_d, mut out) = (z(b, DType::BF16, &[VOCAB, HIDDEN])?, z(b, DType::I64, &[m])?, z(b, DType::BF16, &[m, HIDDEN])?);
    let args = EmbeddingGatherArgs { table: table.as_ref(), ids: ids_d.as_ref(), out: out.as_mut() };
    EmbeddingGather::run(b, &plan, args, None, b.default_stream())
}

fn mla_cache_write(b: &Gpu, tokens: usize, format: KvCacheFormat) -> Result<()> {
    let dims = KvDims::K3;
    let num_pages = tokens.div_ceil(MLA_PAGE);
    let p = MlaCacheWriteParams { dims, num_pages, page_size: MLA_PAGE, format, kv_scale: 1.0 / 64.0 };
    let plan = MlaCacheWrite::plan(b, &p, &MlaCacheWriteBatch { slot_mapping: (0..tokens as i64).collect() })?;
    let (kv, slots) = (z(b, DType::BF16, &[tokens, dims.width()])?, z(b, DType::I64, &[tokens])?);
    let mut cache = match format {
        KvCacheFormat::Bf16 => z(b, DType::BF16, &[num_pages, MLA_PAGE, dims.width()])?,
        _ => z(b, DType::U8, &[num_pages, MLA_PAGE, plan.bytes_per_token])?,
    };
    let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots.as_ref(), cache: cache.as_mut() };
    MlaCacheWrite::run(b, &plan, args, None, b.default_stream())
}

fn kda_gate(b: &Gpu, heads: usize, t: usize) -> Result<()> {
    let p = KdaGateParams { tokens: t, heads, head_dim: KDA_DIM, a_log_len: heads, mode: KdaGateMode::LowerBound { lower_bound: -5.0 } };
    let plan = KdaGate::plan(b, &p)?;
    let (g, a_log, dt_bias) = (z(b, DType::BF16, &[t, heads, KDA_DIM])?, z(b, DType::F32, &[heads])?, z(b, DType::F32, &[heads * KDA_DIM])?);
    let mut out = z(b, DType::F32, &[t, heads, KDA_DIM])?;
    let args = KdaGateArgs { g_raw: g.as_ref(), a_log: Some(a_log.as_ref()), dt_bias: Some(dt_bias.as_ref()), g_out: out.as_mut() };
    KdaGate::run(b, &plan, args, None, b.default_stream())
}

fn gated_rms_norm(b: &Gpu, heads: usize, m: usize) -> Result<()> {
    let plan = GatedRmsNorm::plan(b, &GatedRmsNormParams { m, heads, head_dim: KDA_DIM, eps: 1e-5 })?;
    let (o, g, w) = (z(b, DType::BF16, &[m, heads, KDA_DIM])?, z(b, DType::BF16, &[m, heads, KDA_DIM])?, z(b, DType::F32, &[KDA_DIM])?);
    let mut out = z(b, DType::BF16, &[m, heads, KDA_DIM])?;
    let args = GatedRmsNormArgs { o: o.as_ref(), gate: g.as_ref(), w: w.as_ref(), out: out.as_mut() };
    GatedRmsNorm::run(b, &plan, args, None, b.default_stream())
}

fn causal_conv1d(b: &Gpu, dim: usize, seqs: usize, len: usize) -> Result<()> {
    let (t, w) = (seqs * len, 4);
    let p = CausalConv1dParams {
        dim,
        width: w,
        activation: ConvActivation::Silu,
        read_initial_state: true,
        write_final_state: true,
        state_slots: seqs,
    };
    let cu: Vec<i64> = (0..=seqs as i64).map(|i| i * len as i64).collect();
    let plan = CausalConv1d::plan(b, &p, &CausalConv1dBatch { cu_seqlens: HostIndices::I64(&cu), state_indices: None })?;
    let (x, weight, cu_d) = (z(b, DType::BF16, &[t, dim])?, z(b, DType::F32, &[dim, w])?, z(b, DType::I64, &[seqs + 1])?);
    let (mut state, mut out) = (z(b, DType::F32, &[seqs, dim, w - 1])?, z(b, DType::BF16, &[t, dim])?);
    let args = CausalConv1dArgs {
        x: x.as_ref(),
        weight: weight.as_ref(),
        cu_seqlens: cu_d.as_ref(),
        state_indices: None,
        conv_state: Some(state.as_mut()),
        out: out.as_mut(),
    };
    CausalConv1d::run(b, &plan, args, None, b.default_stream())
}

fn mla_prefill(b: &Gpu, heads: usize, seqs: usize, len: usize) -> Result<()> {
    let t = seqs * len;
    let p = MlaPrefillParams { heads, qk_dim: MLA_QK, v_dim: MLA_V, softmax_scale: K3_SOFTMAX_SCALE, causal: true };
    let cu: Vec<i64> = (0..=seqs as i64).map(|i| i * len as i64).collect();
    let plan = MlaPrefill::plan(b, &p, &MlaPrefillBatch { total_tokens: t, cu_seqlens: cu, kv: None })?;
    let (q, k, v) = (z(b, DType::BF16, &[t, heads, MLA_QK])?, z(b, DType::BF16, &[t, heads, MLA_QK])?, z(b, DType::BF16, &[t, heads, MLA_V])?);
    let cu_d = z(b, DType::I64, &[seqs + 1])?;
    let (mut out, mut lse) = (z(b, DType::BF16, &[t, heads, MLA_V])?, z(b, DType::F32, &[t, heads])?);
    let mut ws = b.workspace(MlaPrefill::workspace_size(b, &plan))?;
    let args = MlaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        cu_seqlens: cu_d.as_ref(),
        cu_seqlens_k: None,
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaPrefill::run(b, &plan, args, ws.as_mut(), b.default_stream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_build_support::resources::occupancy::TARGETS;
    use k3_kernels::Dim3;

    #[test]
    fn every_case_launches_on_every_target() {
        for l in &TARGETS {
            let cases = all(l).expect("all cases plan and run");
            assert_eq!(cases.len(), 2 * (2 + 3 + 2 * 3 * 2 * 3) + 2 * 3 + 4 * 3 + 3 * (5 + 2) + 2 * (3 + 2), "{}", l.target);
            for c in &cases {
                assert!(!c.launches.is_empty(), "{} {} {} launched nothing", l.target, c.op, c.shape);
            }
            // KDA decode at batch 1: prepare, then the V-split delta rule on (row·head, V/4)
            // blocks of 64 threads (4 columns each, the narrowest split) with the gated norm
            // folded into each row's last block: two launches.
            let d = cases.iter().find(|c| c.op == "kda_decode" && c.shape == "H12 b1").expect("case");
            let got: Vec<_> = d.launches.iter().map(|x| (x.kernel.as_str(), x.config.grid, x.config.block)).collect();
            assert_eq!(got, [
                ("kda_decode_prepare", Dim3::x(12), Dim3::x(128)),
                ("kda_decode_fused_step", Dim3::new(12, 32, 1), Dim3::x(64)),
            ], "{}", l.target);
            // The auto MLA variant is the persistent asm kernel: one block per resident block
            // slot, 1 per SM on NVIDIA, 2 per CU on gfx942 / gfx950.
            let m = cases.iter().find(|c| c.op == "mla_decode" && c.shape == "H12 b1 ctx8k bf16 auto").expect("case");
            let asm = m.launches.iter().find(|x| x.kernel == "mla_decode_asm_mma").expect("asm kernel");
            let per_unit = if l.warp_size == 64 { 2 } else { 1 };
            assert_eq!(asm.config.grid, Dim3::x(per_unit * l.units), "{}", l.target);
            // f32 queries on the 16-byte path take the MMA core too (hi + lo planes).
            let m = cases.iter().find(|c| c.op == "mla_decode" && c.shape == "H12 b1 ctx8k fp8-tiled auto f32-q").expect("case");
            assert!(m.launches.iter().any(|x| x.kernel == "mla_decode_asm_mma_f32q"), "{}", l.target);
            // model-k3's f32 activations at batch 1 take the MoE GEMMs' f32-input MMA form (gate-up
            // split over k, down unsplit), not the f32 FMA kernel.
            let m = cases.iter().find(|c| c.op == "moe" && c.shape == "T1 f32-act").expect("case");
            let moe: Vec<_> = m.launches.iter().map(|x| x.kernel.as_str()).filter(|k| k.starts_with("moe_gemm_grouped")).collect();
            assert_eq!(moe, ["moe_gemm_grouped_m16_splitk_mma_f32a", "moe_gemm_grouped_m16_mma_f32a"], "{}", l.target);
            // The MMA GEMM's block is 4 warps of the target's width.
            let g = cases.iter().find(|c| c.op == "dense_gemm").expect("case");
            assert_eq!(g.launches[0].config.block, Dim3::x(4 * l.warp_size));
        }
    }
}
