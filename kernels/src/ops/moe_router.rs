//! MoE router launcher (csrc/ops/moe_router.cu): a logits kernel writes the f32 logits of every
//! (token, expert) into the workspace, then `moe_router_topk` selects per token, one block each.
//! Logits: up to one token tile (8 tokens, decode) `moe_router_logits`, 4 experts x 8 tokens per
//! block, so the router weight is spread over the card (K3 at batch 1: 224 blocks); past one tile
//! `moe_router_logits_batched`, 16 experts per block (4 per thread group), so each x chunk a
//! thread loads serves four rows; rows that are not contiguous and 16-byte aligned (or a hidden
//! size not a multiple of 8) take `moe_router_logits_unaligned`.

use crate::gpu_backend::{arg, blocks_for, dtype_code, rows_16b, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};
use kernel_api::{Backend, DType, Error, Layout, Result, TensorRef};

const THREADS: u32 = 256;
/// Experts per block of `moe_router_logits` / `_unaligned` (moe_router.cu: kRouterThreads /
/// kRouterGroupThreads); `moe_router_logits_batched` holds 4 times as many.
const LOGIT_EXPERTS: usize = 4;
/// Tokens per logits block (kRouterTokenTile).
const LOGIT_TOKENS: usize = 8;
/// Static shared memory of the kernel (warp scratch), rounded up.
const STATIC_SHARED: usize = 512;

/// Dynamic shared bytes: scores, selection scores and flags per expert, two per group, the
/// chosen ids (`None` on overflow).
fn shared_bytes(p: &MoeRouterParams) -> Option<usize> {
    p.experts.checked_mul(12)?.checked_add(p.n_group.checked_mul(8)?)?.checked_add(p.top_k.checked_mul(4)?)
}

/// Floats per logits row in the workspace: E rounded up to 4, so every row starts on 16 bytes
/// (moe_router_topk reads them 4 at a time).
fn logits_stride(p: &MoeRouterParams) -> usize {
    p.experts.div_ceil(4) * 4
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

    /// The f32 logits, `tokens` rows of E rounded up to 4 floats.
    fn workspace_size(&self, plan: &MoeRouterPlan) -> usize {
        plan.params.tokens.saturating_mul(logits_stride(&plan.params)).saturating_mul(4)
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
        let logits = match ws.as_deref() {
            Some(buf) => self.ptr(buf, &Layout::contiguous(DType::F32, &[0])),
            None => return Err(Error::invalid("workspace", "the router's logits need the plan's workspace")),
        };
        if logits.0 % 16 != 0 {
            return Err(Error::invalid("workspace", "the router's logits need a 16-byte aligned buffer"));
        }
        let lstride = logits_stride(p) as i64;
        let (x_ptr, w_ptr) = (self.ptr(args.x.buf, x), self.ptr(args.weight.buf, w));
        let vector = p.hidden % 8 == 0 && rows_16b(x_ptr, x) && rows_16b(w_ptr, w);
        let mut a = KernelArgs::new();
        arg(&mut a, x_ptr);
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        if !vector {
            arg(&mut a, x.strides[1] as i64);
        }
        arg(&mut a, w_ptr);
        arg(&mut a, dtype_code(w.dtype));
        arg(&mut a, w.strides[0] as i64);
        if !vector {
            arg(&mut a, w.strides[1] as i64);
        }
        arg(&mut a, logits);
        arg(&mut a, lstride);
        arg(&mut a, to_i32("params.tokens", p.tokens)?);
        arg(&mut a, to_i32("params.hidden", p.hidden)?);
        arg(&mut a, to_i32("params.experts", p.experts)?);
        let (name, per_block) = match (vector, p.tokens > LOGIT_TOKENS) {
            (false, _) => ("moe_router_logits_unaligned", LOGIT_EXPERTS),
            (true, false) => ("moe_router_logits", LOGIT_EXPERTS),
            (true, true) => ("moe_router_logits_batched", 4 * LOGIT_EXPERTS),
        };
        // experts fits an i32 (the plan checks it), so the expert blocks fit grid.x.
        let grid = (p.experts.div_ceil(per_block) as u32, blocks_for(p.tokens, LOGIT_TOKENS));
        self.launch(name, LaunchConfig::new(grid, THREADS, 0), &mut a, stream)?;

        let mut a = KernelArgs::new();
        arg(&mut a, logits);
        arg(&mut a, lstride);
        self.push_opt(&mut a, args.bias.as_ref().map(TensorRef::parts), 1);
        arg(&mut a, self.ptr(&*args.topk_ids.buf, ids));
        arg(&mut a, ids.strides[0] as i64);
        arg(&mut a, ids.strides[1] as i64);
        arg(&mut a, self.ptr(&*args.topk_weights.buf, wts));
        arg(&mut a, wts.strides[0] as i64);
        arg(&mut a, wts.strides[1] as i64);
        arg(&mut a, to_i32("params.tokens", p.tokens)?);
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

