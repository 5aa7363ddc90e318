use super::moe_align::write_i32;
use super::{math, read_f32, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::{check_workspace, MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};
use std::cmp::Ordering;

/// Descending by score (NaN ranks like -inf), ties by ascending index.
fn rank(a: (f32, usize), b: (f32, usize)) -> Ordering {
    let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
    key(b.0).partial_cmp(&key(a.0)).unwrap_or(Ordering::Equal).then(a.1.cmp(&b.1))
}

/// The experts allowed by group masking (all of them when n_group = 1).
fn allowed_experts(sel: &[f32], p: &MoeRouterParams) -> Vec<bool> {
    if p.n_group <= 1 {
        return vec![true; sel.len()];
    }
    let size = sel.len() / p.n_group;
    let mut groups: Vec<(f32, usize)> = sel
        .chunks_exact(size)
        .enumerate()
        .map(|(g, chunk)| {
            let mut top: Vec<(f32, usize)> = chunk.iter().copied().zip(0..).collect();
            top.sort_by(|&a, &b| rank(a, b));
            (top.iter().take(2).map(|t| t.0).sum::<f32>(), g)
        })
        .collect();
    groups.sort_by(|&a, &b| rank(a, b));
    let mut allowed = vec![false; sel.len()];
    for &(_, g) in groups.iter().take(p.topk_group) {
        allowed[g * size..(g + 1) * size].fill(true);
    }
    allowed
}

impl MoeRouter for CpuBackend {
    fn supports(&self, params: &MoeRouterParams) -> Result<()> {
        match params.score {
            RouterScore::Sigmoid => Ok(()),
        }
    }

    fn run(
        &self,
        plan: &MoeRouterPlan,
        mut args: MoeRouterArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        // Re-derived so that a hand-built plan cannot bypass validation.
        let plan = &MoeRouterPlan::new(&plan.params)?;
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MoeRouter::workspace_size(self, plan))?;
        let p = &plan.params;
        let (h, e, k) = (p.hidden, p.experts, p.top_k);
        let x = read_f32(&args.x)?;
        let w = read_f32(&args.weight)?;
        let bias = match &args.bias {
            Some(b) => read_f32(b)?,
            None => vec![0.0; e],
        };
        let mut ids = Vec::with_capacity(p.tokens * k);
        let mut weights = Vec::with_capacity(p.tokens * k);
        for xt in x.chunks_exact(h) {
            // f32 operands, exact f64 products and sum, one rounding to the f32 logit.
            let scores: Vec<f32> = w
                .chunks_exact(h)
                .map(|wr| math::sigmoid(wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32))
                .collect();
            let sel: Vec<f32> = scores.iter().zip(&bias).map(|(s, b)| s + b).collect();
            let allowed = allowed_experts(&sel, p);
            let mut cand: Vec<(f32, usize)> = sel.iter().copied().zip(0..).filter(|&(_, i)| allowed[i]).collect();
            cand.sort_by(|&a, &b| rank(a, b));
            // The plan guarantees top_k <= topk_group·(E / n_group) = the number of candidates.
            let chosen = cand.get(..k).ok_or_else(|| Error::invalid("params.top_k", "more than the unmasked experts"))?;
            let denom = if p.renormalize { chosen.iter().map(|&(_, i)| scores[i] as f64).sum::<f64>() + 1e-20 } else { 1.0 };
            for &(_, i) in chosen {
                ids.push(i as i32); // E fits i32 (plan)
                weights.push((scores[i] as f64 / denom * p.routed_scaling_factor as f64) as f32);
            }
        }
        write_i32(&mut args.topk_ids, &ids)?;
        write_f32(&mut args.topk_weights, &weights)
    }
}
