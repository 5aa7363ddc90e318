//! MLA ops: mla_prefill (naive ragged attention), mla_cache_write, mla_decode and
//! mla_prefill_absorbed (both over the paged latent cache).

use super::call::{Call, Outputs};
use super::json::Params;
use super::OpError;
use kernel_api::conformance::AllOps;
use kernel_api::ops::{
    KvCacheFormat, KvDims, MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteBatch, MlaCacheWriteParams, MlaDecode, MlaDecodeArgs,
    MlaDecodeBatch, MlaDecodeParams, MlaDecodeVariant, MlaPagedCache, MlaPrefill, MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs,
    MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaPrefillArgs, MlaPrefillBatch, MlaPrefillKv, MlaPrefillParams,
    MlaSplitPolicy,
};
use kernel_api::DType;
use serde_json::Value;

/// `dims` = `{"latent": L, "rope": R}`; `rope` defaults to `width - latent` when the per-token
/// width is known from a tensor.
fn kv_dims(p: &Params<'_>, width: impl FnOnce() -> Result<usize, OpError>) -> Result<KvDims, OpError> {
    let d = p.object("dims")?;
    let latent = d.usize("latent")?;
    let rope = d.usize_or("rope", || {
        let w = width()?;
        w.checked_sub(latent).ok_or_else(|| d.err("latent", format!("{latent} exceeds the per-token width {w} of the tensors")))
    })?;
    Ok(KvDims { latent, rope })
}

/// `format` (a `--kv-cache-dtype` spelling) and `kv_scale` (required by the flat fp8 formats,
/// 1.0 otherwise).
fn format_and_scale(p: &Params<'_>) -> Result<(KvCacheFormat, f32), OpError> {
    let s = p.str("format")?;
    let format = KvCacheFormat::parse(s).map_err(|e| p.err("format", e.to_string()))?;
    let kv_scale = if format.uses_tensor_scale() { p.f32("kv_scale")? } else { p.f32_or("kv_scale", 1.0)? };
    Ok((format, kv_scale))
}

/// The `cache` struct of the paged-cache ops; pages and page size default to `kv_cache`'s shape,
/// the per-token width to `q`'s last dimension.
fn paged_cache<B: AllOps>(c: &Call<'_, B>, q_width_axis: usize) -> Result<MlaPagedCache, OpError> {
    let p = c.p.object("cache")?;
    let dims = kv_dims(&p, || c.shape("q", q_width_axis))?;
    let (format, kv_scale) = format_and_scale(&p)?;
    Ok(MlaPagedCache {
        dims,
        format,
        page_size: p.usize_or("page_size", || c.shape("kv_cache", 1))?,
        num_pages: p.usize_or("num_pages", || c.shape("kv_cache", 0))?,
        kv_scale,
    })
}

/// The page table: host copy and its row length.
fn block_table<B: AllOps>(c: &Call<'_, B>) -> Result<(Vec<i32>, usize), OpError> {
    let (v, shape) = c.host_i32("block_table")?;
    match shape[..] {
        [_, pages] => Ok((v, pages)),
        _ => Err(c.tensor_err("block_table", format!("shape {shape:?} is not [batch, max_pages_per_seq]"))),
    }
}

pub(super) fn mla_prefill<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let q = c.upload("q")?;
    let k = c.upload("k")?;
    let v = c.upload("v")?;
    let cu_dev = c.upload("cu_seqlens")?;
    let cu_k_dev = c.opt_upload("cu_seqlens_k")?;
    let p = MlaPrefillParams {
        heads: c.dim("heads", "q", 1)?,
        qk_dim: c.dim("qk_dim", "q", 2)?,
        v_dim: c.dim("v_dim", "v", 2)?,
        softmax_scale: c.p.f32("softmax_scale")?,
        causal: c.p.bool("causal")?,
    };
    let kv = match c.opt_host_ints("cu_seqlens_k")? {
        Some((cu_seqlens_k, _)) => Some(MlaPrefillKv { total_kv_tokens: c.dim("total_kv_tokens", "k", 0)?, cu_seqlens_k }),
        None => None,
    };
    let batch = MlaPrefillBatch { total_tokens: c.dim("total_tokens", "q", 0)?, cu_seqlens: c.host_ints("cu_seqlens")?.0, kv };
    let out_dtype = c.out_dtype("out", q.dtype());
    c.finish(&["out", "lse"])?;
    let plan = MlaPrefill::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let t = batch.total_tokens;
    let mut out = c.zeros("out", out_dtype, &[t, p.heads, p.v_dim])?;
    let mut lse = c.zeros("lse", DType::F32, &[t, p.heads])?;
    let mut ws = c.workspace(MlaPrefill::workspace_size(c.b, &plan))?;
    let args = MlaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        cu_seqlens: cu_dev.as_ref(),
        cu_seqlens_k: cu_k_dev.as_ref().map(|t| t.as_ref()),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaPrefill::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out), ("lse", &lse)])
}

pub(super) fn mla_cache_write<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let kv = c.upload("kv")?;
    let slots_dev = c.upload("slot_mapping")?;
    let mut cache = c.upload("cache")?;
    let (format, kv_scale) = format_and_scale(&c.p)?;
    let p = MlaCacheWriteParams {
        dims: kv_dims(&c.p, || c.shape("kv", 1))?,
        num_pages: c.dim("num_pages", "cache", 0)?,
        page_size: c.dim("page_size", "cache", 1)?,
        format,
        kv_scale,
    };
    let batch = MlaCacheWriteBatch { slot_mapping: c.host_ints("slot_mapping")?.0 };
    c.finish(&[])?;
    let plan = MlaCacheWrite::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let mut ws = c.workspace(MlaCacheWrite::workspace_size(c.b, &plan))?;
    let args = MlaCacheWriteArgs { kv: kv.as_ref(), slot_mapping: slots_dev.as_ref(), cache: cache.as_mut() };
    MlaCacheWrite::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("cache", &cache)])
}

/// `splits`: `"auto"` (default), `{"compute_units": n}` or `{"num_splits": n}`.
fn split_policy(p: &Params<'_>) -> Result<MlaSplitPolicy, OpError> {
    match p.get("splits") {
        None => Ok(MlaSplitPolicy::Auto),
        Some(Value::String(s)) if s == "auto" => Ok(MlaSplitPolicy::Auto),
        Some(Value::Object(_)) => {
            let o = p.object("splits")?;
            match (o.has("compute_units"), o.has("num_splits")) {
                (true, false) => {
                    let n = o.usize("compute_units")?;
                    let n = u32::try_from(n).map_err(|_| o.err("compute_units", format!("{n} does not fit u32")))?;
                    Ok(MlaSplitPolicy::ComputeUnits(n))
                }
                (false, true) => Ok(MlaSplitPolicy::NumSplits(o.usize("num_splits")?)),
                _ => Err(p.err("splits", "expected exactly one of {\"compute_units\": n} or {\"num_splits\": n}")),
            }
        }
        Some(other) => Err(p.err("splits", format!("expected \"auto\", {{\"compute_units\": n}} or {{\"num_splits\": n}}, got {other}"))),
    }
}

pub(super) fn mla_decode<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let q = c.upload("q")?;
    let kv_cache = c.upload("kv_cache")?;
    let bt_dev = c.upload("block_table")?;
    let sl_dev = c.upload("seq_lens")?;
    let p = MlaDecodeParams {
        cache: paged_cache(c, 3)?,
        heads: c.dim("heads", "q", 2)?,
        q_len: c.dim("q_len", "q", 1)?,
        softmax_scale: c.p.f32("softmax_scale")?,
        variant: c.p.choice(
            "variant",
            &[("auto", MlaDecodeVariant::Auto), ("asm", MlaDecodeVariant::AsmStyle), ("gluon", MlaDecodeVariant::GluonStyle)],
            Some(MlaDecodeVariant::Auto),
        )?,
        splits: split_policy(&c.p)?,
    };
    let (seq_lens, _) = c.host_i32("seq_lens")?;
    let (block_table, max_pages_per_seq) = block_table(c)?;
    let out_dtype = c.out_dtype("out", q.dtype());
    c.finish(&["out", "lse"])?;
    let batch = MlaDecodeBatch { seq_lens: &seq_lens, block_table: &block_table, max_pages_per_seq };
    let plan = MlaDecode::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let rows = [plan.batch, p.q_len, p.heads];
    let mut out = c.zeros("out", out_dtype, &[rows[0], rows[1], rows[2], p.cache.dims.latent])?;
    let mut lse = c.zeros("lse", DType::F32, &rows)?;
    let mut ws = c.workspace(MlaDecode::workspace_size(c.b, &plan))?;
    let args = MlaDecodeArgs {
        q: q.as_ref(),
        kv_cache: kv_cache.as_ref(),
        block_table: bt_dev.as_ref(),
        seq_lens: sl_dev.as_ref(),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaDecode::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out), ("lse", &lse)])
}

pub(super) fn mla_prefill_absorbed<B: AllOps>(c: &Call<'_, B>) -> Result<Outputs, OpError> {
    let q = c.upload("q")?;
    let kv_cache = c.upload("kv_cache")?;
    let cu_dev = c.upload("cu_seqlens_q")?;
    let sl_dev = c.upload("seq_lens")?;
    let bt_dev = c.upload("block_table")?;
    let p = MlaPrefillAbsorbedParams {
        cache: paged_cache(c, 2)?,
        heads: c.dim("heads", "q", 1)?,
        softmax_scale: c.p.f32("softmax_scale")?,
        causal: c.p.bool("causal")?,
    };
    let (cu_seqlens_q, _) = c.host_i32("cu_seqlens_q")?;
    let (seq_lens, _) = c.host_i32("seq_lens")?;
    let (block_table, max_pages_per_seq) = block_table(c)?;
    let out_dtype = c.out_dtype("out", q.dtype());
    c.finish(&["out", "lse"])?;
    let batch = MlaPrefillAbsorbedBatch { cu_seqlens_q: &cu_seqlens_q, seq_lens: &seq_lens, block_table: &block_table, max_pages_per_seq };
    let plan = MlaPrefillAbsorbed::plan(c.b, &p, &batch).map_err(c.kernel())?;
    let mut out = c.zeros("out", out_dtype, &[plan.total_q, p.heads, p.cache.dims.latent])?;
    let mut lse = c.zeros("lse", DType::F32, &[plan.total_q, p.heads])?;
    let mut ws = c.workspace(MlaPrefillAbsorbed::workspace_size(c.b, &plan))?;
    let args = MlaPrefillAbsorbedArgs {
        q: q.as_ref(),
        kv_cache: kv_cache.as_ref(),
        cu_seqlens_q: cu_dev.as_ref(),
        seq_lens: sl_dev.as_ref(),
        block_table: bt_dev.as_ref(),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaPrefillAbsorbed::run(c.b, &plan, args, ws.as_mut(), c.b.default_stream()).map_err(c.kernel())?;
    c.download(vec![("out", &out), ("lse", &lse)])
}
