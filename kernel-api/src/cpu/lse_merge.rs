use super::{read_f32, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::Result;
use crate::ops::{check_workspace, LseMerge, LseMergeArgs, LseMergeParams, LseMergePlan};

impl LseMerge for CpuBackend {
    fn supports(&self, _params: &LseMergeParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &LseMergePlan,
        mut args: LseMergeArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), LseMerge::workspace_size(self, plan))?;
        let p = &plan.params;
        let parts = read_f32(&args.partial_out)?;
        let lses = read_f32(&args.partial_lse)?;
        let rows = p.tokens * p.heads;
        let d = p.head_dim;
        let mut out = vec![0f32; rows * d];
        let mut lse_out = vec![f32::NEG_INFINITY; rows];
        for r in 0..rows {
            let m = (0..p.parts).map(|q| lses[q * rows + r]).fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                continue; // every part empty: out = 0, lse = -inf
            }
            let w: Vec<f64> = (0..p.parts).map(|q| ((lses[q * rows + r] - m) as f64).exp()).collect();
            let total: f64 = w.iter().sum();
            let mut acc = vec![0f64; d];
            for (q, wq) in w.iter().enumerate() {
                let scale = wq / total;
                for (i, a) in acc.iter_mut().enumerate() {
                    *a += scale * parts[(q * rows + r) * d + i] as f64;
                }
            }
            for (o, a) in out[r * d..(r + 1) * d].iter_mut().zip(&acc) {
                *o = *a as f32;
            }
            lse_out[r] = m + total.ln() as f32;
        }
        write_f32(&mut args.out, &out)?;
        if let Some(l) = args.lse.as_mut() {
            write_f32(l, &lse_out)?;
        }
        Ok(())
    }
}
