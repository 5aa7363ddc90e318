//! Elementwise launchers (kernels in `csrc/ops/dense_elementwise.cu`): grid-stride loops over
//! `[rows, cols]`, 256 threads a block.

use crate::gpu_backend::{arg, blocks_for, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::check_workspace;
use kernel_api::ops::elementwise::{
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, EmbeddingGatherPlan, SigmoidGate, SigmoidGateArgs, SigmoidGateParams,
    SigmoidGatePlan, SituGlu, SituGluArgs, SituGluInput, SituGluParams, SituGluPlan,
};
use kernel_api::Result;

const THREADS: u32 = 256;

fn cfg(numel: usize) -> LaunchConfig {
    LaunchConfig::new(blocks_for(numel, THREADS as usize), THREADS, 0)
}

impl<R: Runtime> SituGlu for GpuBackend<R> {
    fn supports(&self, p: &SituGluParams) -> Result<()> {
        to_i32("params.n", p.n)?;
        Ok(())
    }

    fn run(&self, plan: &SituGluPlan, args: SituGluArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), SituGlu::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let mut a = KernelArgs::new();
        match &args.input {
            SituGluInput::Separate { gate, up } => {
                for t in [gate, up] {
                    arg(&mut a, self.ptr(t.buf, &t.layout));
                    arg(&mut a, dtype_code(t.layout.dtype));
                    arg(&mut a, t.layout.strides[0] as i64);
                }
            }
            SituGluInput::Fused(gu) => {
                // Columns 0..N are the gate, N..2N the up branch: two views of one row.
                let l = &gu.layout;
                let base = self.ptr(gu.buf, l);
                for ptr in [base, base.offset((p.n * l.dtype.size_bytes()) as u64)] {
                    arg(&mut a, ptr);
                    arg(&mut a, dtype_code(l.dtype));
                    arg(&mut a, l.strides[0] as i64);
                }
            }
        }
        let out = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, p.m as i64);
        arg(&mut a, to_i32("params.n", p.n)?);
        arg(&mut a, p.beta);
        arg(&mut a, p.linear_beta.unwrap_or(0.0)); // 0 = no up-branch cap (the plan rejects 0 as a beta)
        self.launch("dense_situ_glu", cfg(p.m * p.n), &mut a, stream)
    }
}

impl<R: Runtime> SigmoidGate for GpuBackend<R> {
    fn supports(&self, p: &SigmoidGateParams) -> Result<()> {
        to_i32("params.n", p.n)?;
        Ok(())
    }

    fn run(&self, plan: &SigmoidGatePlan, args: SigmoidGateArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), SigmoidGate::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let mut a = KernelArgs::new();
        for t in [&args.x, &args.g] {
            arg(&mut a, self.ptr(t.buf, &t.layout));
            arg(&mut a, dtype_code(t.layout.dtype));
            arg(&mut a, t.layout.strides[0] as i64);
        }
        let out = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, p.m as i64);
        arg(&mut a, to_i32("params.n", p.n)?);
        self.launch("dense_sigmoid_gate", cfg(p.m * p.n), &mut a, stream)
    }
}

impl<R: Runtime> EmbeddingGather for GpuBackend<R> {
    fn supports(&self, p: &EmbeddingGatherParams) -> Result<()> {
        to_i32("params.d", p.d)?;
        Ok(())
    }

    fn run(
        &self,
        plan: &EmbeddingGatherPlan,
        args: EmbeddingGatherArgs<'_, Self>,
        ws: Option<&mut R::Buffer>,
        stream: &R::Stream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), EmbeddingGather::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let (t, ids, out) = (&args.table.layout, &args.ids.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.table.buf, t));
        arg(&mut a, dtype_code(t.dtype));
        arg(&mut a, t.strides[0] as i64);
        arg(&mut a, self.ptr(args.ids.buf, ids));
        arg(&mut a, dtype_code(ids.dtype));
        arg(&mut a, ids.strides[0] as i64);
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, p.m as i64);
        arg(&mut a, to_i32("params.d", p.d)?);
        arg(&mut a, p.vocab as i64);
        self.push_checks(&mut a, stream)?;
        self.launch("dense_embedding_gather", cfg(p.m * p.d), &mut a, stream)
    }
}
