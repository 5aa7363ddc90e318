//! Dense ops: gemm, the norms, attn_res_mix, the elementwise ops, copy_cast / add_assign and
//! lse_merge.

use super::call::{Call, Outputs};
use super::OpError;
use kernel_api::conformance::AllOps;
use kernel_api::ops::{
    AddAssign, AddAssignArgs, AttnResMix, AttnResMixArgs, AttnResMixParams, CopyCast, CopyCastArgs, ElementwiseParams,
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, Gemm,
    GemmArgs, GemmParams, L2Norm, L2NormArgs, L2NormParams, LseMerge, LseMergeArgs, LseMergeParams, RmsNorm, RmsNormArgs,
    RmsNormParams, RmsWeightOrder, SigmoidGate, SigmoidGateArgs, SigmoidGateParams, SituGlu, SituGluArgs, SituGluInput,
    SituGluParams,
};
use kernel_api::DType;

/// An optional dtype params key (`x_dtype`), defaulting to `default`.
fn dtype_key<B: AllOps>(c: &Call<'_, B>, key: &str, default: Option<DType>) -> Result<Option<DType>, OpError> {
    match c.p.opt_str(key)? {
        Some(s) => super::tensors::parse_dtype(s).map(Some).ok_or_else(|| c.p.err(key, format!("unknown dtype \"{s}\""))),
        None => Ok(default),
    }
}

pub(super) fn gemm<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let w = c.upload("w")?;
    let bias = c.opt_upload("bias")?;
    let x_dtype = dtype_key(c, "x_dtype", Some(x.dtype()))?.unwrap_or(x.dtype());
    // `out_dtype` is both a GemmParams field and the usual `out_dtypes.out`; either may say it.
    let out_dtype = match (dtype_key(c, "out_dtype", None)?, c.opt_out_dtype("out")) {
        (Some(a), Some(b)) if a != b => return Err(c.p.err("out_dtype", format!("{a} disagrees with out_dtypes.out = {b}"))),
        (a, b) => a.or(b).unwrap_or(x_dtype),
    };
    let p = GemmParams {
        m: c.dim("m", "x", 0)?,
        n: c.dim("n", "w", 0)?,
        k: c.dim("k", "x", 1)?,
        x_dtype,
        w_dtype: dtype_key(c, "w_dtype", Some(w.dtype()))?.unwrap_or(w.dtype()),
        out_dtype,
        bias_dtype: dtype_key(c, "bias_dtype", bias.as_ref().map(|t| t.dtype()))?,
    };
    c.finish(&["out"])?;
    let plan = Gemm::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", p.out_dtype, &[p.m, p.n])?;
    let mut ws = c.workspace(Gemm::workspace_size(c.b, &plan))?;
    let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: bias.as_ref().map(|t| t.as_ref()), out: out.as_mut() };
    Gemm::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn rms_norm<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let w = c.upload("w")?;
    let p = RmsNormParams {
        m: c.dim("m", "x", 0)?,
        d: c.dim("d", "x", 1)?,
        eps: c.p.f32("eps")?,
        weight_order: c.p.choice(
            "weight_order",
            &[("f32", RmsWeightOrder::F32), ("cast_before_weight", RmsWeightOrder::CastBeforeWeight)],
            Some(RmsWeightOrder::F32),
        )?,
    };
    let out_dtype = c.out_dtype("out", x.dtype());
    c.finish(&["out"])?;
    let plan = RmsNorm::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.d])?;
    let mut ws = c.workspace(RmsNorm::workspace_size(c.b, &plan))?;
    let args = RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() };
    RmsNorm::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn gated_rms_norm<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let o = c.upload("o")?;
    let gate = c.upload("gate")?;
    let w = c.upload("w")?;
    let p = GatedRmsNormParams {
        m: c.dim("m", "o", 0)?,
        heads: c.dim("heads", "o", 1)?,
        head_dim: c.dim("head_dim", "o", 2)?,
        eps: c.p.f32("eps")?,
    };
    let out_dtype = c.out_dtype("out", o.dtype());
    c.finish(&["out"])?;
    let plan = GatedRmsNorm::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.heads, p.head_dim])?;
    let mut ws = c.workspace(GatedRmsNorm::workspace_size(c.b, &plan))?;
    let args = GatedRmsNormArgs { o: o.as_ref(), gate: gate.as_ref(), w: w.as_ref(), out: out.as_mut() };
    GatedRmsNorm::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn l2_norm<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let p = L2NormParams { m: c.dim("m", "x", 0)?, d: c.dim("d", "x", 1)?, eps: c.p.f32("eps")? };
    let out_dtype = c.out_dtype("out", x.dtype());
    c.finish(&["out"])?;
    let plan = L2Norm::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.d])?;
    let mut ws = c.workspace(L2Norm::workspace_size(c.b, &plan))?;
    L2Norm::run(c.b, &plan, L2NormArgs { x: x.as_ref(), out: out.as_mut() }, ws.as_mut(), c.b.default_stream())
        .map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn attn_res_mix<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let sources = c.upload("sources")?;
    let score_vector = c.upload("score_vector")?;
    let p = AttnResMixParams {
        sources: c.dim("sources", "sources", 0)?,
        m: c.dim("m", "sources", 1)?,
        d: c.dim("d", "sources", 2)?,
        eps: c.p.f32("eps")?,
    };
    let out_dtype = c.out_dtype("out", sources.dtype());
    c.finish(&["out"])?;
    let plan = AttnResMix::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.d])?;
    let mut ws = c.workspace(AttnResMix::workspace_size(c.b, &plan))?;
    let args = AttnResMixArgs { sources: sources.as_ref(), score_vector: score_vector.as_ref(), out: out.as_mut() };
    AttnResMix::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn situ_glu<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let fused = c.opt_upload("gate_up")?;
    let gate = c.opt_upload("gate")?;
    let up = c.opt_upload("up")?;
    let (m, n, in_dtype) = match (&fused, &gate, &up) {
        (Some(f), None, None) => {
            let width = c.shape("gate_up", 1)?;
            if width % 2 != 0 {
                return Err(c.tensor_err("gate_up", format!("width {width} is odd; gate_up holds gate columns then up columns")));
            }
            (c.dim("m", "gate_up", 0)?, c.p.usize_or("n", || Ok(width / 2))?, f.dtype())
        }
        (None, Some(g), Some(_)) => (c.dim("m", "gate", 0)?, c.dim("n", "gate", 1)?, g.dtype()),
        (Some(_), _, _) => return Err(c.tensor_err("gate_up", "given together with `gate`/`up`; pass either gate_up or gate and up")),
        (None, None, _) => return Err(c.tensor_err("gate", "missing from the inputs file (pass gate and up, or gate_up)")),
        (None, Some(_), None) => return Err(c.tensor_err("up", "missing from the inputs file (pass gate and up, or gate_up)")),
    };
    let p = SituGluParams { m, n, beta: c.p.f32("beta")?, linear_beta: c.p.opt_f32("linear_beta")? };
    let out_dtype = c.out_dtype("out", in_dtype);
    c.finish(&["out"])?;
    let plan = SituGlu::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.n])?;
    let mut ws = c.workspace(SituGlu::workspace_size(c.b, &plan))?;
    let input = match (&fused, &gate, &up) {
        (Some(f), _, _) => SituGluInput::Fused(f.as_ref()),
        (None, Some(g), Some(u)) => SituGluInput::Separate { gate: g.as_ref(), up: u.as_ref() },
        _ => return Err(c.tensor_err("gate", "missing from the inputs file")),
    };
    SituGlu::run(c.b, &plan, SituGluArgs { input, out: out.as_mut() }, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn sigmoid_gate<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let g = c.upload("g")?;
    let p = SigmoidGateParams { m: c.dim("m", "x", 0)?, n: c.dim("n", "x", 1)? };
    let out_dtype = c.out_dtype("out", x.dtype());
    c.finish(&["out"])?;
    let plan = SigmoidGate::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.n])?;
    let mut ws = c.workspace(SigmoidGate::workspace_size(c.b, &plan))?;
    let args = SigmoidGateArgs { x: x.as_ref(), g: g.as_ref(), out: out.as_mut() };
    SigmoidGate::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn embedding_gather<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let table = c.upload("table")?;
    let ids_dev = c.upload("ids")?;
    let (ids, _) = c.host_ints("ids")?;
    let p = EmbeddingGatherParams { vocab: c.dim("vocab", "table", 0)?, d: c.dim("d", "table", 1)?, m: c.dim("m", "ids", 0)? };
    let out_dtype = c.out_dtype("out", table.dtype());
    c.finish(&["out"])?;
    let plan = EmbeddingGather::plan(c.b, &p, &ids).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.m, p.d])?;
    let mut ws = c.workspace(EmbeddingGather::workspace_size(c.b, &plan))?;
    let args = EmbeddingGatherArgs { table: table.as_ref(), ids: ids_dev.as_ref(), out: out.as_mut() };
    EmbeddingGather::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

/// `shape` from the params, else the shape of tensor `name`.
fn shape_param<B: AllOps>(c: &Call<'_, B>, name: &str) -> Result<Vec<usize>, OpError> {
    match c.p.int_array("shape")? {
        Some((v, s)) if s.len() == 1 => v
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| c.p.err("shape", format!("dimension {d} is negative"))))
            .collect(),
        Some(_) => Err(c.p.err("shape", "expected a flat array of dimensions")),
        None => Ok(c.host(name)?.shape.clone()),
    }
}

pub(super) fn copy_cast<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let x = c.upload("x")?;
    let p = ElementwiseParams { shape: shape_param(c, "x")? };
    let out_dtype = c.out_dtype("out", x.dtype());
    c.finish(&["out"])?;
    let plan = CopyCast::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &p.shape)?;
    CopyCast::run(c.b, &plan, CopyCastArgs { x: x.as_ref(), out: out.as_mut() }, c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out)])
}

pub(super) fn add_assign<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let mut acc = c.upload("acc")?;
    let x = c.upload("x")?;
    let p = ElementwiseParams { shape: shape_param(c, "acc")? };
    c.finish(&[])?;
    let plan = AddAssign::plan(c.b, &p).map_err(c.kernel())?;
    AddAssign::run(c.b, &plan, AddAssignArgs { acc: acc.as_mut(), x: x.as_ref() }, c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("acc", &acc)])
}

pub(super) fn lse_merge<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let partial_out = c.upload("partial_out")?;
    let partial_lse = c.upload("partial_lse")?;
    let p = LseMergeParams {
        parts: c.dim("parts", "partial_out", 0)?,
        tokens: c.dim("tokens", "partial_out", 1)?,
        heads: c.dim("heads", "partial_out", 2)?,
        head_dim: c.dim("head_dim", "partial_out", 3)?,
    };
    let out_dtype = c.out_dtype("out", partial_out.dtype());
    c.finish(&["out", "lse"])?;
    let plan = LseMerge::plan(c.b, &p).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[p.tokens, p.heads, p.head_dim])?;
    let mut lse = c.zeros("lse", DType::F32, &[p.tokens, p.heads])?;
    let mut ws = c.workspace(LseMerge::workspace_size(c.b, &plan))?;
    let args = LseMergeArgs {
        partial_out: partial_out.as_ref(),
        partial_lse: partial_lse.as_ref(),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    LseMerge::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out), ("lse", &lse)])
}
