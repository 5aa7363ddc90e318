//! MoE align launcher: `moe_align_block_size` (csrc/ops/moe_align.cu), one block for the whole
//! sort, the workspace holding the per-expert counters and cursors.

use crate::gpu_backend::{arg, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, MoeAlign, MoeAlignArgs, MoeAlignParams, MoeAlignPlan};
use kernel_api::{Error, Result, TensorRef};

const THREADS: u32 = 256;

impl<R: Runtime> MoeAlign for GpuBackend<R> {
    fn supports(&self, p: &MoeAlignParams) -> Result<()> {
        // The plan checks that max_padded fits an i32; the rest are smaller.
        to_i32("params.routing.experts", p.routing.experts)?;
        to_i32("params.routing.block_m", p.routing.block_m)?;
        if let Some(g) = p.global_experts {
            to_i32("params.global_experts", g)?;
        }
        Ok(())
    }

    fn run(&self, plan: &MoeAlignPlan, args: MoeAlignArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MoeAlign::workspace_size(self, plan))?;
        let ws = ws.ok_or_else(|| Error::invalid("workspace", "required by the align kernel"))?;
        let r = &plan.params.routing;
        let (ids, st, eid) = (&args.topk_ids.layout, &args.sorted_token_ids.layout, &args.expert_ids.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.topk_ids.buf, ids));
        arg(&mut a, ids.strides[0] as i64);
        arg(&mut a, ids.strides[1] as i64);
        self.push_opt(&mut a, args.expert_map.as_ref().map(TensorRef::parts), 1);
        arg(&mut a, self.ptr(&*args.sorted_token_ids.buf, st));
        arg(&mut a, st.strides[0] as i64);
        arg(&mut a, self.ptr(&*args.expert_ids.buf, eid));
        arg(&mut a, eid.strides[0] as i64);
        arg(&mut a, self.ptr(&*args.num_tokens_post_padded.buf, &args.num_tokens_post_padded.layout));
        arg(&mut a, self.runtime().device_ptr(ws));
        arg(&mut a, to_i32("params.routing.tokens", r.tokens)?);
        arg(&mut a, to_i32("params.routing.top_k", r.top_k)?);
        arg(&mut a, to_i32("params.global_experts", plan.params.global_experts.unwrap_or(0))?);
        arg(&mut a, to_i32("params.routing.experts", r.experts)?);
        arg(&mut a, to_i32("params.routing.block_m", r.block_m)?);
        arg(&mut a, to_i32("max_padded", plan.max_padded)?);
        self.push_checks(&mut a, stream)?;
        let cfg = LaunchConfig::new(1u32, THREADS, THREADS * 4);
        self.launch("moe_align_block_size", cfg, &mut a, stream)
    }
}
