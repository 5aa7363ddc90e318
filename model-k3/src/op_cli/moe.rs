//! MoE ops: moe_router, moe_align, moe_grouped_gemm and moe_combine.

use super::call::{Call, Outputs};
use super::json::Params;
use super::OpError;
use kernel_api::conformance::AllOps;
use kernel_api::ops::{
    MoeActivationQuant, MoeAlign, MoeAlignArgs, MoeAlignParams, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeGemmArgs,
    MoeGemmParams, MoeGemmStage, MoeGroupedGemm, MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouting, MoeWeightFormat,
    RouterScore,
};
use kernel_api::DType;
use serde_json::Value;

pub(super) fn moe_router<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let weight = c.upload("weight")?;
    let bias = c.opt_upload("bias")?;
    let p = MoeRouterParams {
        tokens: c.dim("tokens", "x", 0)?,
        hidden: c.dim("hidden", "x", 1)?,
        experts: c.dim("experts", "weight", 0)?,
        top_k: c.p.usize("top_k")?,
        n_group: c.p.usize_or("n_group", || Ok(1))?,
        topk_group: c.p.usize_or("topk_group", || Ok(1))?,
        renormalize: c.p.bool("renormalize")?,
        routed_scaling_factor: c.p.f32_or("routed_scaling_factor", 1.0)?,
        score: c.p.choice("score", &[("sigmoid", RouterScore::Sigmoid)], Some(RouterScore::Sigmoid))?,
    };
    c.finish(&["topk_ids", "topk_weights"])?;
    let plan = MoeRouter::plan(c.b, &p).map_err(c.kernel())?;
    let mut ids = c.zeros("topk_ids", DType::I32, &[p.tokens, p.top_k])?;
    let mut weights = c.zeros("topk_weights", DType::F32, &[p.tokens, p.top_k])?;
    let mut ws = c.workspace(MoeRouter::workspace_size(c.b, &plan))?;
    let args = MoeRouterArgs {
        x: x.as_ref(),
        weight: weight.as_ref(),
        bias: bias.as_ref().map(|t| t.as_ref()),
        topk_ids: ids.as_mut(),
        topk_weights: weights.as_mut(),
    };
    MoeRouter::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("topk_ids", &ids), ("topk_weights", &weights)])
}

/// The `routing` struct; `tokens` and `top_k` default to the given closures (tensor shapes).
fn routing(
    p: &Params<'_>,
    tokens: impl FnOnce() -> Result<usize, OpError>,
    top_k: impl FnOnce() -> Result<usize, OpError>,
    experts: impl FnOnce() -> Result<usize, OpError>,
) -> Result<MoeRouting, OpError> {
    let r = p.object("routing")?;
    Ok(MoeRouting {
        tokens: r.usize_or("tokens", tokens)?,
        top_k: r.usize_or("top_k", top_k)?,
        experts: r.usize_or("experts", experts)?,
        block_m: r.usize("block_m")?,
    })
}

pub(super) fn moe_align<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let topk_ids = c.upload("topk_ids")?;
    let expert_map = c.opt_upload("expert_map")?;
    let routing = routing(
        &c.p,
        || c.shape("topk_ids", 0),
        || c.shape("topk_ids", 1),
        || Err(c.p.err("routing.experts", "missing (expected the number of local experts)")),
    )?;
    let global_experts = match (c.p.has("global_experts"), &expert_map) {
        (true, _) => Some(c.p.usize("global_experts")?),
        (false, Some(_)) => Some(c.shape("expert_map", 0)?),
        (false, None) => None,
    };
    let p = MoeAlignParams { routing, global_experts };
    c.finish(&["sorted_token_ids", "expert_ids", "num_tokens_post_padded"])?;
    let plan = MoeAlign::plan(c.b, &p).map_err(c.kernel())?;
    let mut sorted = c.zeros("sorted_token_ids", DType::I32, &[plan.max_padded])?;
    let mut expert_ids = c.zeros("expert_ids", DType::I32, &[plan.num_blocks])?;
    let mut post = c.zeros("num_tokens_post_padded", DType::I32, &[1])?;
    let mut ws = c.workspace(MoeAlign::workspace_size(c.b, &plan))?;
    let args = MoeAlignArgs {
        topk_ids: topk_ids.as_ref(),
        expert_map: expert_map.as_ref().map(|t| t.as_ref()),
        sorted_token_ids: sorted.as_mut(),
        expert_ids: expert_ids.as_mut(),
        num_tokens_post_padded: post.as_mut(),
    };
    MoeAlign::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("sorted_token_ids", &sorted), ("expert_ids", &expert_ids), ("num_tokens_post_padded", &post)])
}

/// `stage`: `"down"` or `{"gate_up": {"beta": 4.0, "linear_beta": 25.0}}` (`linear_beta`
/// absent or null = uncapped).
fn stage(p: &Params<'_>) -> Result<MoeGemmStage, OpError> {
    const EXPECTED: &str = "expected \"down\" or {\"gate_up\": {\"beta\": x, \"linear_beta\": y}}";
    match p.get("stage") {
        None => Err(p.err("stage", format!("missing ({EXPECTED})"))),
        Some(Value::String(s)) if s == "down" => Ok(MoeGemmStage::Down),
        Some(Value::Object(_)) => {
            let g = p.object("stage")?.object("gate_up")?;
            Ok(MoeGemmStage::GateUp { beta: g.f32("beta")?, linear_beta: g.opt_f32("linear_beta")? })
        }
        Some(other) => Err(p.err("stage", format!("{EXPECTED}, got {other}"))),
    }
}

pub(super) fn moe_grouped_gemm<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let input = c.upload("input")?;
    let weight = c.upload("weight")?;
    let weight_scale = c.opt_upload("weight_scale")?;
    let sorted = c.upload("sorted_token_ids")?;
    let expert_ids = c.upload("expert_ids")?;
    let post = c.upload("num_tokens_post_padded")?;
    let topk_weights = c.opt_upload("topk_weights")?;
    let stage = stage(&c.p)?;
    let has_tw = topk_weights.is_some();
    let routing = routing(
        &c.p,
        || if has_tw { c.shape("topk_weights", 0) } else { c.shape("input", 0) },
        || if has_tw { c.shape("topk_weights", 1) } else { Err(c.p.err("routing.top_k", "missing (no topk_weights tensor to take it from)")) },
        || c.shape("weight", 0),
    )?;
    let weights = c.p.choice(
        "weights",
        &[("dense", MoeWeightFormat::Dense), ("mxfp4", MoeWeightFormat::Mxfp4)],
        Some(if weight_scale.is_some() { MoeWeightFormat::Mxfp4 } else { MoeWeightFormat::Dense }),
    )?;
    let is_down = stage == MoeGemmStage::Down;
    let n = c.p.usize_or("n", || {
        let rows = c.shape("weight", 1)?;
        match (is_down, rows % 2) {
            (true, _) => Ok(rows),
            (false, 0) => Ok(rows / 2),
            (false, _) => Err(c.tensor_err("weight", format!("{rows} rows per expert; the gate/up stage needs 2n (gate then up)"))),
        }
    })?;
    // The packed MXFP4 weight holds k/2 bytes per row; the input always holds k values.
    let p = MoeGemmParams {
        routing,
        k: c.dim("k", "input", 1)?,
        n,
        stage,
        weights,
        activation_quant: c.p.choice("activation_quant", &[("none", None), ("mxfp8", Some(MoeActivationQuant::Mxfp8))], Some(None))?,
    };
    let out_dtype = c.out_dtype("out", if is_down { DType::F32 } else { input.dtype() });
    c.finish(&["out"])?;
    let plan = MoeGroupedGemm::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[plan.pairs, p.n])?;
    let mut ws = c.workspace(MoeGroupedGemm::workspace_size(c.b, &plan))?;
    let args = MoeGemmArgs {
        input: input.as_ref(),
        weight: weight.as_ref(),
        weight_scale: weight_scale.as_ref().map(|t| t.as_ref()),
        sorted_token_ids: sorted.as_ref(),
        expert_ids: expert_ids.as_ref(),
        num_tokens_post_padded: post.as_ref(),
        topk_weights: topk_weights.as_ref().map(|t| t.as_ref()),
        out: out.as_mut(),
    };
    MoeGroupedGemm::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn moe_combine<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let y = c.upload("y")?;
    let top_k = c.p.usize("top_k")?;
    let rows = c.shape("y", 0)?;
    let tokens = c.p.usize_or("tokens", || {
        if top_k > 0 && rows % top_k == 0 {
            Ok(rows / top_k)
        } else {
            Err(c.tensor_err("y", format!("{rows} rows are not tokens x top_k with top_k = {top_k}")))
        }
    })?;
    let p = MoeCombineParams { tokens, top_k, hidden: c.dim("hidden", "y", 1)? };
    let out_dtype = c.out_dtype("out", y.dtype());
    c.finish(&["out"])?;
    let plan = MoeCombine::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.tokens, p.hidden])?;
    let mut ws = c.workspace(MoeCombine::workspace_size(c.b, &plan))?;
    MoeCombine::run(c.b, &plan, MoeCombineArgs { y: y.as_ref(), out: out.as_mut() }, ws.as_mut(), c.b.default_stream())
        .map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}
