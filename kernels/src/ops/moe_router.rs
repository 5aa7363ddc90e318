//! MoE router launcher: `moe_router_topk` (csrc/ops/moe_router.cu), one block per token.

use crate::gpu_backend::{arg, blocks_for, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};
use kernel_api::{Backend, Error, Result, TensorRef};

const THREADS: u32 = 256;
/// Static shared memory of the kernel (warp scratch), rounded up.
const STATIC_SHARED: usize = 512;

/// Dynamic shared bytes: scores, selection scores and flags per expert, two per group, the
/// chosen ids (`None` on overflow).
fn shared_bytes(p: &MoeRouterParams) -> Option<usize> {
    p.experts.checked_mul(12)?.checked_add(p.n_group.checked_mul(8)?)?.checked_add(p.top_k.checked_mul(4)?)
}

impl<R: Runtime> MoeRouter for GpuBackend<R> {
    fn supports(&self, p: &MoeRouterParams) -> Result<()> {
        if p.score != RouterScore::Sigmoid {
            return Err(Error::unsupported("params.score", format!("{:?}: only the sigmoid router has a kernel", p.score)));
        }
        to_i32("params.tokens", p.tokens)?;
        to_i32("params.hidden", p.hidden)?;
        to_i32("params.experts", p.experts)?;
        let limit = self.device_info().shared_mem_per_block.min(48 * 1024).saturating_sub(STATIC_SHARED);
        match shared_bytes(p) {
            Some(b) if b <= limit => Ok(()),
            _ => Err(Error::unsupported(
                "params.experts",
                format!(
                    "{} experts need {} bytes of shared memory per token block, more than the {limit} available",
                    p.experts,
                    shared_bytes(p).map_or("too many".into(), |b| b.to_string())
                ),
            )),
        }
    }

    fn run(&self, plan: &MoeRouterPlan, args: MoeRouterArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MoeRouter::workspace_size(self, plan))?;
        MoeRouter::supports(self, &plan.params)?;
        let p = &plan.params;
        if p.tokens == 0 {
            return Ok(());
        }
        let (x, w, ids, wts) = (&args.x.layout, &args.weight.layout, &args.topk_ids.layout, &args.topk_weights.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.x.buf, x));
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        arg(&mut a, x.strides[1] as i64);
        arg(&mut a, self.ptr(args.weight.buf, w));
        arg(&mut a, dtype_code(w.dtype));
        arg(&mut a, w.strides[0] as i64);
        arg(&mut a, w.strides[1] as i64);
        self.push_opt(&mut a, args.bias.as_ref().map(TensorRef::parts), 1);
        arg(&mut a, self.ptr(&*args.topk_ids.buf, ids));
        arg(&mut a, ids.strides[0] as i64);
        arg(&mut a, ids.strides[1] as i64);
        arg(&mut a, self.ptr(&*args.topk_weights.buf, wts));
        arg(&mut a, wts.strides[0] as i64);
        arg(&mut a, wts.strides[1] as i64);
        arg(&mut a, to_i32("params.tokens", p.tokens)?);
        arg(&mut a, to_i32("params.hidden", p.hidden)?);
        arg(&mut a, to_i32("params.experts", p.experts)?);
        arg(&mut a, to_i32("params.top_k", p.top_k)?);
        arg(&mut a, to_i32("params.n_group", p.n_group)?);
        arg(&mut a, to_i32("params.topk_group", p.topk_group)?);
        arg(&mut a, i32::from(p.renormalize));
        arg(&mut a, p.routed_scaling_factor);
        let shared = shared_bytes(p).ok_or_else(|| Error::unsupported("params.experts", "shared memory size overflows"))?;
        let cfg = LaunchConfig::new(blocks_for(p.tokens, 1), THREADS, shared as u32);
        self.launch("moe_router_topk", cfg, &mut a, stream)
    }
}
