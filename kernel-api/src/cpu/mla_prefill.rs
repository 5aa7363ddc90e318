//! CPU reference of [`MlaPrefill`]: per sequence, head and query row, a two-pass softmax in f64
//! over the visible keys, rounded once to the output dtype.

use super::{read_f32, read_i64, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::{ensure, Result};
use crate::ops::{check_workspace, MlaPrefill, MlaPrefillArgs, MlaPrefillParams, MlaPrefillPlan};
use crate::tensor::TensorRef;

/// Reads a device offsets tensor and checks it holds the values the plan validated.
fn read_offsets(t: &TensorRef<'_, CpuBackend>, planned: &[i64], field: &str) -> Result<Vec<usize>> {
    let got = read_i64(t)?;
    ensure(got == planned, field, || format!("device values {got:?} differ from the planned {planned:?}"))?;
    // Planned offsets are validated non-negative and non-decreasing.
    Ok(got.into_iter().map(|x| x as usize).collect())
}

impl MlaPrefill for CpuBackend {
    fn supports(&self, _params: &MlaPrefillParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MlaPrefillPlan,
        mut args: MlaPrefillArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MlaPrefill::workspace_size(self, plan))?;
        let p = &plan.params;
        let cu_q = read_offsets(&args.cu_seqlens, &plan.batch.cu_seqlens, "cu_seqlens")?;
        let cu_k = match &args.cu_seqlens_k {
            Some(t) => read_offsets(t, plan.cu_seqlens_k(), "cu_seqlens_k")?,
            None => cu_q.clone(),
        };
        let (h, dqk, dv) = (p.heads, p.qk_dim, p.v_dim);
        let q = read_f32(&args.q)?;
        let k = read_f32(&args.k)?;
        let v = read_f32(&args.v)?;
        let total = plan.batch.total_tokens;
        let mut out = vec![0f32; total * h * dv];
        let mut lse = vec![f32::NEG_INFINITY; total * h];
        let scale = p.softmax_scale as f64;
        let mut scores = Vec::with_capacity(plan.max_seqlen_k);
        let mut acc = vec![0f64; dv];
        for (qs, ks) in cu_q.windows(2).zip(cu_k.windows(2)) {
            let (q0, lq, k0, lk) = (qs[0], qs[1] - qs[0], ks[0], ks[1] - ks[0]);
            for i in 0..lq {
                // Bottom-right aligned causal mask; the plan guarantees lk >= lq when causal.
                let visible = if p.causal { (i + 1 + lk).saturating_sub(lq).min(lk) } else { lk };
                if visible == 0 {
                    continue; // no key: out stays 0, lse stays -inf
                }
                for hh in 0..h {
                    let qrow = &q[((q0 + i) * h + hh) * dqk..][..dqk];
                    scores.clear();
                    scores.extend((0..visible).map(|j| {
                        let krow = &k[((k0 + j) * h + hh) * dqk..][..dqk];
                        scale * qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                    }));
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    for (j, s) in scores.iter().enumerate() {
                        let w = (s - m).exp() / z;
                        let vrow = &v[((k0 + j) * h + hh) * dv..][..dv];
                        for (a, &x) in acc.iter_mut().zip(vrow) {
                            *a += w * x as f64;
                        }
                    }
                    let r = (q0 + i) * h + hh;
                    for (o, a) in out[r * dv..(r + 1) * dv].iter_mut().zip(&acc) {
                        *o = *a as f32;
                    }
                    lse[r] = (m + z.ln()) as f32;
                }
            }
        }
        write_f32(&mut args.out, &out)?;
        if let Some(l) = args.lse.as_mut() {
            write_f32(l, &lse)?;
        }
        Ok(())
    }
}
