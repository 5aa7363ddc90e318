use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use kernel_api::{TensorMut};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, LseMerge, LseMergeArgs, LseMergeParams, LseMergePlan};
use kernel_api::Result;

impl<R: Runtime> LseMerge for GpuBackend<R> {
    fn supports(&self, p: &LseMergeParams) -> Result<()> {
        to_i32("params.parts", p.parts)?;
        to_i32("params.head_dim", p.head_dim)?;
        to_i32("params.tokens x params.heads", p.tokens.saturating_mul(p.heads))?;
        Ok(())
    }

    fn run(&self, plan: &LseMergePlan, args: LseMergeArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), LseMerge::workspace_size(self, plan))?;
        let p = &plan.params;
        let rows = p.tokens * p.heads;
        if rows == 0 {
            return Ok(());
        }
        let (po, pl, out) = (&args.partial_out.layout, &args.partial_lse.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.partial_out.buf, po));
        arg(&mut a, dtype_code(po.dtype));
        for &s in &po.strides[..3] {
            arg(&mut a, s as i64);
        }
        arg(&mut a, self.ptr(args.partial_lse.buf, pl));
        for &s in &pl.strides {
            arg(&mut a, s as i64);
        }
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, out.strides[0] as i64);
        arg(&mut a, out.strides[1] as i64);
        self.push_opt(&mut a, args.lse.as_ref().map(TensorMut::parts), 2);
        arg(&mut a, to_i32("params.parts", p.parts)?);
        arg(&mut a, to_i32("params.heads", p.heads)?);
        arg(&mut a, to_i32("params.head_dim", p.head_dim)?);
        let cfg = LaunchConfig::new(to_i32("rows", rows)? as u32, 128u32, 0);
        self.launch("lse_merge", cfg, &mut a, stream)
    }
}
