//! KDA ops: kda_gate, kda_prefill, kda_decode and causal_conv1d.

use super::call::{Call, Outputs};
use super::json::Params;
use super::OpError;
use kernel_api::conformance::AllOps;
use kernel_api::ops::{
    CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, ConvActivation, HostIndices, KdaCheckpointOffsets,
    KdaDecode, KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaGate, KdaGateArgs, KdaGateMode, KdaGateParams, KdaOutputNorm,
    KdaPrefill, KdaPrefillArgs, KdaPrefillBatch, KdaPrefillParams, KdaStateLayout,
};
use kernel_api::DType;
use serde_json::Value;

/// A gate mode: `"softplus"`, `"precomputed"` or `{"lower_bound": -5.0}`.
fn gate_mode(p: &Params<'_>, key: &str) -> Result<KdaGateMode, OpError> {
    const EXPECTED: &str = "expected \"softplus\", \"precomputed\" or {\"lower_bound\": x}";
    match p.get(key) {
        None => Err(p.err(key, format!("missing ({EXPECTED})"))),
        Some(Value::String(s)) => match s.as_str() {
            "softplus" => Ok(KdaGateMode::Softplus),
            "precomputed" => Ok(KdaGateMode::Precomputed),
            other => Err(p.err(key, format!("unknown value \"{other}\" ({EXPECTED})"))),
        },
        Some(Value::Object(_)) => Ok(KdaGateMode::LowerBound { lower_bound: p.object(key)?.f32("lower_bound")? }),
        Some(other) => Err(p.err(key, format!("{EXPECTED}, got {other}"))),
    }
}

fn state_layout(p: &Params<'_>) -> Result<KdaStateLayout, OpError> {
    p.choice("state_layout", &[("k_major", KdaStateLayout::KMajor), ("v_major", KdaStateLayout::VMajor)], Some(KdaStateLayout::KMajor))
}

/// `output_norm`: `"none"` or `{"gated_rms_norm": {"eps": 1e-5}}`.
fn output_norm(p: &Params<'_>) -> Result<KdaOutputNorm, OpError> {
    const EXPECTED: &str = "expected \"none\" or {\"gated_rms_norm\": {\"eps\": x}}";
    match p.get("output_norm") {
        None => Err(p.err("output_norm", format!("missing ({EXPECTED})"))),
        Some(Value::String(s)) if s == "none" => Ok(KdaOutputNorm::None),
        Some(Value::Object(_)) => {
            let o = p.object("output_norm")?;
            Ok(KdaOutputNorm::GatedRmsNorm { eps: o.object("gated_rms_norm")?.f32("eps")? })
        }
        Some(other) => Err(p.err("output_norm", format!("{EXPECTED}, got {other}"))),
    }
}

pub(super) fn kda_gate<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let g_raw = c.upload("g_raw")?;
    let a_log = c.opt_upload("a_log")?;
    let dt_bias = c.opt_upload("dt_bias")?;
    let heads = c.dim("heads", "g_raw", 1)?;
    let p = KdaGateParams {
        tokens: c.dim("tokens", "g_raw", 0)?,
        heads,
        head_dim: c.dim("head_dim", "g_raw", 2)?,
        a_log_len: c.p.usize_or("a_log_len", || if a_log.is_some() { c.shape("a_log", 0) } else { Ok(heads) })?,
        mode: gate_mode(&c.p, "mode")?,
    };
    c.finish(&["g_out"])?;
    let plan = KdaGate::plan(c.b, &p).map_err(c.kernel())?;
    let mut g_out = c.zeros("g_out", DType::F32, &[p.tokens, p.heads, p.head_dim])?;
    let mut ws = c.workspace(KdaGate::workspace_size(c.b, &plan))?;
    let args = KdaGateArgs {
        g_raw: g_raw.as_ref(),
        a_log: a_log.as_ref().map(|t| t.as_ref()),
        dt_bias: dt_bias.as_ref().map(|t| t.as_ref()),
        g_out: g_out.as_mut(),
    };
    KdaGate::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("g_out", &g_out)])
}

pub(super) fn kda_prefill<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let q = c.upload("q")?;
    let k = c.upload("k")?;
    let v = c.upload("v")?;
    let g_raw = c.upload("g_raw")?;
    let beta = c.upload("beta")?;
    let a_log = c.opt_upload("a_log")?;
    let dt_bias = c.opt_upload("dt_bias")?;
    let cu_dev = c.upload("cu_seqlens")?;
    let idx_dev = c.opt_upload("state_indices")?;
    let mut state = c.opt_upload("state")?;
    let offsets_dev = c.opt_upload("checkpoint_offsets")?;
    let given_checkpoint_state = c.opt_upload("checkpoint_state")?;

    let heads = c.dim("heads", "q", 1)?;
    let p = KdaPrefillParams {
        heads,
        k_dim: c.dim("k_dim", "q", 2)?,
        v_dim: c.dim("v_dim", "v", 2)?,
        a_log_len: c.p.usize_or("a_log_len", || if a_log.is_some() { c.shape("a_log", 0) } else { Ok(heads) })?,
        gate: gate_mode(&c.p, "gate")?,
        beta_sigmoid: c.p.bool("beta_sigmoid")?,
        use_qk_l2norm: c.p.bool("use_qk_l2norm")?,
        q_scale: c.p.f32("q_scale")?,
        chunk_size: c.p.usize_or("chunk_size", || Ok(64))?,
        state_layout: state_layout(&c.p)?,
        state_slots: c.p.usize_or("state_slots", || if state.is_some() { c.shape("state", 0) } else { Ok(0) })?,
        read_initial_state: c.p.bool("read_initial_state")?,
        write_final_state: c.p.bool("write_final_state")?,
    };
    let (cu_seqlens, _) = c.host_ints("cu_seqlens")?;
    let state_indices = c.opt_host_ints("state_indices")?.map(|(v, _)| v);
    let checkpoints = match c.opt_host_ints("checkpoint_offsets")? {
        Some((offsets, shape)) => match shape[..] {
            [_, per_seq] => Some((offsets, per_seq)),
            _ => return Err(c.tensor_err("checkpoint_offsets", format!("shape {shape:?} is not [sequences, checkpoints]"))),
        },
        None => None,
    };
    let out_dtype = c.out_dtype("out", q.dtype());
    c.finish(&["out"])?;
    let batch = KdaPrefillBatch {
        cu_seqlens: &cu_seqlens,
        state_indices: state_indices.as_deref(),
        checkpoints: checkpoints.as_ref().map(|(offsets, per_seq)| KdaCheckpointOffsets { per_seq: *per_seq, offsets }),
    };
    let plan = KdaPrefill::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[plan.tokens, p.heads, p.v_dim])?;
    // Checkpoint states are in place when given (entries of unused offsets keep their value),
    // else allocated zero-filled.
    let mut checkpoint_state = match (given_checkpoint_state, plan.checkpoints_per_seq) {
        (Some(t), _) => Some(t),
        (None, 0) => None,
        (None, per_seq) => {
            let [d1, d2] = plan.state_dims();
            Some(c.zeros("checkpoint_state", DType::F32, &[plan.num_seqs, per_seq, p.heads, d1, d2])?)
        }
    };
    let mut ws = c.workspace(KdaPrefill::workspace_size(c.b, &plan))?;
    let args = KdaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        g_raw: g_raw.as_ref(),
        beta: beta.as_ref(),
        a_log: a_log.as_ref().map(|t| t.as_ref()),
        dt_bias: dt_bias.as_ref().map(|t| t.as_ref()),
        cu_seqlens: cu_dev.as_ref(),
        state_indices: idx_dev.as_ref().map(|t| t.as_ref()),
        state: state.as_mut().map(|t| t.as_mut()),
        checkpoint_offsets: offsets_dev.as_ref().map(|t| t.as_ref()),
        checkpoint_state: checkpoint_state.as_mut().map(|t| t.as_mut()),
        out: out.as_mut(),
    };
    KdaPrefill::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    let mut outs = vec![("out", &out)];
    if let Some(s) = &state {
        outs.push(("state", s));
    }
    if let Some(s) = &checkpoint_state {
        outs.push(("checkpoint_state", s));
    }
    c.download(outs)
}

pub(super) fn kda_decode<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x_qkv = c.upload("x_qkv")?;
    let conv_weight = c.upload("conv_weight")?;
    let mut conv_state = c.upload("conv_state")?;
    let g_raw = c.upload("g_raw")?;
    let beta = c.upload("beta")?;
    let a_log = c.opt_upload("a_log")?;
    let dt_bias = c.opt_upload("dt_bias")?;
    let idx_dev = c.upload("state_indices")?;
    let mut recurrent_state = c.upload("recurrent_state")?;
    let output_gate = c.opt_upload("output_gate")?;
    let norm_weight = c.opt_upload("norm_weight")?;

    let layout = state_layout(&c.p)?;
    let p = KdaDecodeParams {
        batch: c.dim("batch", "x_qkv", 0)?,
        heads: c.dim("heads", "g_raw", 1)?,
        head_k: c.dim("head_k", "g_raw", 2)?,
        // The value width is the state's column (K-major) or row (V-major) count.
        head_v: c.dim("head_v", "recurrent_state", if layout == KdaStateLayout::KMajor { 3 } else { 2 })?,
        conv_width: c.dim("conv_width", "conv_weight", 1)?,
        state_slots: c.dim("state_slots", "recurrent_state", 0)?,
        state_layout: layout,
        gate: gate_mode(&c.p, "gate")?,
        beta_sigmoid: c.p.bool("beta_sigmoid")?,
        qk_l2norm: c.p.bool("qk_l2norm")?,
        scale: c.p.opt_f32("scale")?,
        output_norm: output_norm(&c.p)?,
    };
    let (state_indices, _) = c.host_i32("state_indices")?;
    let out_dtype = c.out_dtype("out", x_qkv.dtype());
    c.finish(&["out"])?;
    let plan = KdaDecode::plan(c.b, &p, &KdaDecodeBatch { state_indices: &state_indices }).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.batch, p.heads, p.head_v])?;
    let mut ws = c.workspace(KdaDecode::workspace_size(c.b, &plan))?;
    let args = KdaDecodeArgs {
        x_qkv: x_qkv.as_ref(),
        conv_weight: conv_weight.as_ref(),
        conv_state: conv_state.as_mut(),
        g_raw: g_raw.as_ref(),
        beta: beta.as_ref(),
        a_log: a_log.as_ref().map(|t| t.as_ref()),
        dt_bias: dt_bias.as_ref().map(|t| t.as_ref()),
        state_indices: idx_dev.as_ref(),
        recurrent_state: recurrent_state.as_mut(),
        output_gate: output_gate.as_ref().map(|t| t.as_ref()),
        norm_weight: norm_weight.as_ref().map(|t| t.as_ref()),
        out: out.as_mut(),
    };
    KdaDecode::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out), ("conv_state", &conv_state), ("recurrent_state", &recurrent_state)])
}

pub(super) fn causal_conv1d<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let weight = c.upload("weight")?;
    let cu_dev = c.upload("cu_seqlens")?;
    let idx_dev = c.opt_upload("state_indices")?;
    let mut conv_state = c.opt_upload("conv_state")?;
    let p = CausalConv1dParams {
        dim: c.dim("dim", "x", 1)?,
        width: c.dim("width", "weight", 1)?,
        activation: c.p.choice("activation", &[("identity", ConvActivation::Identity), ("silu", ConvActivation::Silu)], None)?,
        read_initial_state: c.p.bool("read_initial_state")?,
        write_final_state: c.p.bool("write_final_state")?,
        state_slots: c.p.usize_or("state_slots", || if conv_state.is_some() { c.shape("conv_state", 0) } else { Ok(0) })?,
    };
    // The plan checks the host offsets' dtype against the device tensor's: follow the tensor.
    let (cu_i64, _) = c.host_ints("cu_seqlens")?;
    let cu_i32: Vec<i32>;
    let cu_seqlens = if cu_dev.dtype() == DType::I32 {
        cu_i32 = c.host_i32("cu_seqlens")?.0;
        HostIndices::I32(&cu_i32)
    } else {
        HostIndices::I64(&cu_i64)
    };
    let state_indices = c.opt_host_i32("state_indices")?;
    let out_dtype = c.out_dtype("out", x.dtype());
    c.finish(&["out"])?;
    let batch = CausalConv1dBatch { cu_seqlens, state_indices: state_indices.as_deref() };
    let plan = CausalConv1d::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[plan.total_tokens, p.dim])?;
    let mut ws = c.workspace(CausalConv1d::workspace_size(c.b, &plan))?;
    let args = CausalConv1dArgs {
        x: x.as_ref(),
        weight: weight.as_ref(),
        cu_seqlens: cu_dev.as_ref(),
        state_indices: idx_dev.as_ref().map(|t| t.as_ref()),
        conv_state: conv_state.as_mut().map(|t| t.as_mut()),
        out: out.as_mut(),
    };
    CausalConv1d::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    let mut outs = vec![("out", &out)];
    if let Some(s) = &conv_state {
        outs.push(("conv_state", s));
    }
    c.download(outs)
}
