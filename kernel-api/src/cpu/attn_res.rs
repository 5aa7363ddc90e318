//! CPU AttnRes Mix (spec in [`crate::ops::attn_res`]): f64 scores, softmax and sum.

use super::gemm::write_contiguous_f32;
use super::math::rms_inv;
use super::{read_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::Result;
use crate::ops::{check_workspace, AttnResMix, AttnResMixArgs, AttnResMixParams, AttnResMixPlan};

impl AttnResMix for CpuBackend {
    fn supports(&self, _params: &AttnResMixParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &AttnResMixPlan,
        mut args: AttnResMixArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), AttnResMix::workspace_size(self, plan))?;
        let p = &plan.params;
        let (s_n, m_n, d) = (p.sources, p.m, p.d);
        if m_n == 0 {
            return Ok(());
        }
        let v = read_f32(&args.sources)?; // logical [S, M, D]
        let w = read_f32(&args.score_vector)?;
        let mut out = vec![0f32; m_n * d];
        let mut scores = vec![0f64; s_n];
        for m in 0..m_n {
            let source = |i: usize| &v[(i * m_n + m) * d..(i * m_n + m + 1) * d];
            // Scores on the RMS-normalised source: r_i · Σ_j w_j v_ij.
            for (i, s) in scores.iter_mut().enumerate() {
                let vi = source(i);
                let dot: f64 = vi.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum();
                *s = dot * rms_inv(vi, p.eps) as f64;
            }
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let z: f64 = e.iter().sum();
            // The weighted sum runs over the RAW sources.
            let mut acc = vec![0f64; d];
            for (i, ei) in e.iter().enumerate() {
                let pi = ei / z;
                for (a, &x) in acc.iter_mut().zip(source(i)) {
                    *a += pi * x as f64;
                }
            }
            for (o, a) in out[m * d..(m + 1) * d].iter_mut().zip(&acc) {
                *o = *a as f32;
            }
        }
        write_contiguous_f32(&mut args.out, &out)
    }
}
