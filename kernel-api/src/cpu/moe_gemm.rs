use super::{math, read_f32, read_i64, write_f32, write_f32_rows, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::formats::{mxfp4_dequantize, Mxfp8Block, MX_BLOCK};
use crate::ops::{
    check_workspace, MoeActivationQuant, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeCombinePlan, MoeGemmArgs,
    MoeGemmParams, MoeGemmPlan, MoeGemmStage, MoeGroupedGemm, MoeWeightFormat,
};
use crate::tensor::{Layout, TensorRef};
use rayon::prelude::*;

/// Raw bytes of a one-byte-per-element tensor in logical order (E8M0 scales must not be decoded
/// as values here: the MXFP4 decoder reads the exponent byte).
fn read_bytes(t: &TensorRef<'_, CpuBackend>, field: &str) -> Result<Vec<u8>> {
    if t.layout.dtype.size_bytes() != 1 {
        return Err(Error::invalid(field, format!("dtype {} is not a byte format", t.layout.dtype)));
    }
    t.layout
        .element_offsets()
        .into_iter()
        .map(|o| t.buf.0.get(o).copied().ok_or_else(|| Error::invalid(field, "element outside the buffer")))
        .collect()
}

/// Expert `e`'s slice `[rows, cols]` of a stacked `[E, rows, cols]` tensor.
fn expert_view<'a>(t: &TensorRef<'a, CpuBackend>, e: usize) -> TensorRef<'a, CpuBackend> {
    let l = &t.layout;
    let layout = Layout { dtype: l.dtype, shape: l.shape[1..].to_vec(), strides: l.strides[1..].to_vec(), offset: l.offset + e * l.strides[0] };
    TensorRef::new(t.buf, layout)
}

/// Expert `e`'s weight as f32 `[rows, k]`; MXFP4 decodes exactly (no re-quantisation). Only
/// experts that serve a pair are decoded.
fn expert_weight(plan: &MoeGemmPlan, args: &MoeGemmArgs<'_, CpuBackend>, e: usize) -> Result<Vec<f32>> {
    let p = &plan.params;
    match p.weights {
        MoeWeightFormat::Dense => read_f32(&expert_view(&args.weight, e)),
        MoeWeightFormat::Mxfp4 => {
            let scale = args.weight_scale.as_ref().ok_or_else(|| Error::invalid("weight_scale", "required for MXFP4 weights"))?;
            let packed = read_bytes(&expert_view(&args.weight, e), "weight")?;
            let scales = read_bytes(&expert_view(scale, e), "weight_scale")?;
            mxfp4_dequantize(&packed, &scales, plan.weight_rows, p.k)
        }
    }
}

/// Replaces each 32-element group of every row by its MXFP8 round trip.
fn quantize_mxfp8(values: &mut [f32]) {
    for chunk in values.chunks_exact_mut(MX_BLOCK) {
        let mut block = [0f32; MX_BLOCK];
        block.copy_from_slice(chunk);
        chunk.copy_from_slice(&Mxfp8Block::quantize(&block).dequantize());
    }
}

/// The contract's dot product: sequential over k, exact products, f64 sum, one f32 rounding.
fn dot(a: &[f32], w: &[f32]) -> f32 {
    a.iter().zip(w).fold(0f64, |acc, (&x, &y)| acc + x as f64 * y as f64) as f32
}

/// The pairs the align outputs list: `Some(e)` served by local expert e, `None` listed as served
/// by no expert (written as zeros); pairs listed nowhere are absent (their rows are not written).
/// Every value is range-checked and a pair listed twice is rejected.
fn listed_pairs(plan: &MoeGemmPlan, args: &MoeGemmArgs<'_, CpuBackend>) -> Result<Vec<(usize, Option<usize>)>> {
    let r = &plan.params.routing;
    let sorted = read_i64(&args.sorted_token_ids)?;
    let expert_ids = read_i64(&args.expert_ids)?;
    let used = read_i64(&args.num_tokens_post_padded)?.first().copied().unwrap_or(-1);
    let used = usize::try_from(used).ok().filter(|&u| u <= plan.max_padded && u % r.block_m == 0).ok_or_else(|| {
        Error::invalid("num_tokens_post_padded", format!("{used} is not a multiple of {} in 0..={}", r.block_m, plan.max_padded))
    })?;
    let mut seen = vec![false; plan.pairs];
    let mut listed = Vec::new();
    for (blk, &e) in expert_ids.iter().enumerate() {
        // Past num_tokens_post_padded the expert ids are not read (the GPU kernels do not).
        let expert = if blk < used / r.block_m && e != -1 {
            Some(usize::try_from(e).ok().filter(|&e| e < r.experts).ok_or_else(|| {
                Error::invalid("expert_ids", format!("block {blk} names expert {e}, outside -1..{}", r.experts))
            })?)
        } else {
            None
        };
        for (i, &id) in sorted.iter().enumerate().skip(blk * r.block_m).take(r.block_m) {
            if id == plan.pairs as i64 {
                // Padding sentinel. Served runs may hold more entries after it; in a block
                // without an expert the unserved pairs are packed before it.
                if expert.is_none() {
                    break;
                }
                continue;
            }
            let pair = usize::try_from(id).ok().filter(|&q| q < plan.pairs).ok_or_else(|| {
                Error::invalid("sorted_token_ids", format!("entry {i} is {id}, outside 0..={} (sentinel)", plan.pairs))
            })?;
            if std::mem::replace(&mut seen[pair], true) {
                return Err(Error::invalid("sorted_token_ids", format!("pair {pair} appears twice")));
            }
            listed.push((pair, expert));
        }
    }
    Ok(listed)
}

impl MoeGroupedGemm for CpuBackend {
    fn supports(&self, _params: &MoeGemmParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MoeGemmPlan,
        mut args: MoeGemmArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        // Re-derived so that a hand-built plan cannot bypass validation.
        let plan = &MoeGemmPlan::new(&plan.params)?;
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MoeGroupedGemm::workspace_size(self, plan))?;
        let p = &plan.params;
        let (k, n, top_k) = (p.k, p.n, p.routing.top_k);
        let mut input = read_f32(&args.input)?;
        if p.activation_quant == Some(MoeActivationQuant::Mxfp8) {
            quantize_mxfp8(&mut input); // k % 32 == 0 (plan), so groups never straddle rows
        }
        let listed = listed_pairs(plan, &args)?;
        let mut w: Vec<Option<Vec<f32>>> = vec![None; p.routing.experts];
        for &(_, e) in &listed {
            if let Some(e) = e.filter(|&e| w[e].is_none()) {
                w[e] = Some(expert_weight(plan, &args, e)?);
            }
        }
        let weight_row = |e: usize, j: usize| match &w[e] {
            Some(we) => &we[j * k..(j + 1) * k],
            None => &[][..],
        };
        let mut expert_of = vec![None; plan.pairs];
        let mut written = vec![false; plan.pairs];
        for &(pair, e) in &listed {
            expert_of[pair] = e;
            written[pair] = true;
        }
        // Rows of `out` are independent (one pair each): computing them in parallel does not
        // change any value or summation order. Rows listed without an expert stay zero.
        let mut out = vec![0f32; plan.pairs * n];
        match p.stage {
            MoeGemmStage::GateUp { beta, linear_beta } => {
                out.par_chunks_mut(n.max(1)).enumerate().for_each(|(pair, row)| {
                    if let Some(e) = expert_of[pair] {
                        let a = &input[(pair / top_k) * k..(pair / top_k + 1) * k];
                        for (j, o) in row.iter_mut().enumerate() {
                            let (g, u) = (dot(a, weight_row(e, j)), dot(a, weight_row(e, n + j)));
                            *o = math::situ(g, u, beta, linear_beta);
                        }
                    }
                });
            }
            MoeGemmStage::Down => {
                let tw =
                    args.topk_weights.as_ref().ok_or_else(|| Error::invalid("topk_weights", "required by the down stage"))?;
                let router_w = read_f32(tw)?;
                out.par_chunks_mut(n.max(1)).enumerate().for_each(|(pair, row)| {
                    if let Some(e) = expert_of[pair] {
                        let a = &input[pair * k..(pair + 1) * k];
                        for (j, o) in row.iter_mut().enumerate() {
                            *o = dot(a, weight_row(e, j)) * router_w[pair];
                        }
                    }
                });
            }
        }
        write_f32_rows(&mut args.out, &out, n, &written)
    }
}

impl MoeCombine for CpuBackend {
    fn supports(&self, _params: &MoeCombineParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MoeCombinePlan,
        mut args: MoeCombineArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        let plan = &MoeCombinePlan::new(&plan.params)?;
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MoeCombine::workspace_size(self, plan))?;
        let p = &plan.params;
        let y = read_f32(&args.y)?;
        let mut out = vec![0f32; p.tokens * p.hidden];
        for (t, row) in out.chunks_exact_mut(p.hidden).enumerate() {
            for (j, o) in row.iter_mut().enumerate() {
                // f64 sum of the top-k rows, rounded once (to f32 here, to the output dtype below).
                let s: f64 = (0..p.top_k).map(|slot| y[(t * p.top_k + slot) * p.hidden + j] as f64).sum();
                *o = s as f32;
            }
        }
        write_f32(&mut args.out, &out)
    }
}
