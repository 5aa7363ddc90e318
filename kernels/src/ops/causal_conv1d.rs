//! Causal conv1d prefill launcher (kernels/csrc/ops/causal_conv1d.cu): one thread per
//! (channel, sequence, chunk of [`CHUNK_LEN`] tokens), [`THREADS`] channels per block. The grid
//! is sized from the plan's host metadata (sequence count, longest sequence); the kernel reads
//! the offsets and slots from the device tensors.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{Dim3, KernelArgs, LaunchConfig, Runtime};
use kernel_api::error::Reasons;
use kernel_api::ops::{
    check_workspace, CausalConv1d, CausalConv1dArgs, CausalConv1dParams, CausalConv1dPlan, ConvActivation,
};
use kernel_api::{Error, Result, TensorMut, TensorRef};

const THREADS: u32 = 128;
/// Tokens per thread. At least MAX_WIDTH - 1, so only chunk 0 reaches into the history.
const CHUNK_LEN: usize = 64;
const _: () = assert!(CHUNK_LEN + 1 >= MAX_WIDTH);
/// Conv taps the kernel keeps in registers (`kMaxWidth`).
const MAX_WIDTH: usize = 8;
/// CUDA's limit on grid.y.
const MAX_GRID_Y: usize = 65_535;

impl<R: Runtime> CausalConv1d for GpuBackend<R> {
    fn supports(&self, p: &CausalConv1dParams) -> Result<()> {
        let mut r = Reasons::new();
        r.require(p.width <= MAX_WIDTH, "params.width", format!("the kernel holds at most {MAX_WIDTH} taps"));
        r.require(
            p.dim.div_ceil(THREADS as usize) <= MAX_GRID_Y,
            "params.dim",
            format!("more than {} channels exceed the grid", MAX_GRID_Y * THREADS as usize),
        );
        r.require(
            !p.uses_state() || i32::try_from(p.state_slots).is_ok(),
            "params.state_slots",
            "exceeds the kernels' 32-bit range",
        );
        r.into_result()
    }

    fn run(
        &self,
        plan: &CausalConv1dPlan,
        args: CausalConv1dArgs<'_, Self>,
        ws: Option<&mut R::Buffer>,
        stream: &R::Stream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), CausalConv1d::workspace_size(self, plan))?;
        CausalConv1d::supports(self, &plan.params)?;
        let p = &plan.params;
        if plan.num_seqs == 0 {
            return Ok(()); // no sequences: no metadata to read
        }
        // At least one chunk: a batch of empty sequences still has its device metadata checked.
        let chunks = plan.max_seqlen.div_ceil(CHUNK_LEN).max(1);
        let blocks_x = plan
            .num_seqs
            .checked_mul(chunks)
            .and_then(|v| i32::try_from(v).ok())
            .ok_or_else(|| Error::unsupported("cu_seqlens", "sequences x token chunks exceed the 32-bit grid"))?;
        let mut a = KernelArgs::new();
        let x = &args.x.layout;
        arg(&mut a, self.ptr(args.x.buf, x));
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        let w = &args.weight.layout;
        arg(&mut a, self.ptr(args.weight.buf, w));
        arg(&mut a, w.strides[0] as i64);
        arg(&mut a, w.strides[1] as i64);
        let cu = &args.cu_seqlens.layout;
        arg(&mut a, self.ptr(args.cu_seqlens.buf, cu));
        arg(&mut a, dtype_code(cu.dtype));
        arg(&mut a, cu.strides[0] as i64);
        self.push_opt(&mut a, args.state_indices.as_ref().map(TensorRef::parts), 1);
        self.push_opt_typed(&mut a, args.conv_state.as_ref().filter(|_| p.uses_state()).map(TensorMut::parts), 3);
        let out = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, out.strides[0] as i64);
        arg(&mut a, to_i32("params.dim", p.dim)?);
        arg(&mut a, to_i32("params.width", p.width)?);
        arg(&mut a, i32::from(p.activation == ConvActivation::Silu));
        arg(&mut a, i32::from(p.read_initial_state));
        arg(&mut a, i32::from(p.write_final_state));
        arg(&mut a, i32::try_from(p.state_slots).unwrap_or(i32::MAX)); // only read when state is used (checked above)
        arg(&mut a, plan.total_tokens as i64);
        arg(&mut a, CHUNK_LEN as i32);
        arg(&mut a, to_i32("chunks", chunks)?);
        arg(&mut a, to_i32("cu_seqlens", plan.num_seqs)?);
        self.push_checks(&mut a, stream)?;
        let grid = Dim3::new(blocks_x as u32, p.dim.div_ceil(THREADS as usize) as u32, 1);
        self.launch("causal_conv1d_varlen_fwd", LaunchConfig::new(grid, THREADS, 0), &mut a, stream)
    }
}
