//! MoE router launcher (csrc/ops/moe_router.cu): a logits kernel writes the f32 logits of every
//! (token, expert) into the workspace, then `moe_router_topk` selects per token, one block each.
//! Logits: up to one token tile (8 tokens, decode) `moe_router_logits`, 4 experts x 8 tokens per
//! block, so the router weight is spread over the card (K3 at batch 1: 224 blocks). Past one
//! tile, a bf16 weight (K3's) goes to the matrix units, `moe_router_logits_mma`: 64 experts x 32
//! tokens per block, f32 x cut into three bf16 planes so every product stays exact, the hidden
//! size split over k ([`logit_splits`]) into logits planes that the selection adds in order; an
//! f32 weight to `moe_router_logits_batched`, 16 experts per block (4 per thread group), so each x
//! chunk a thread loads serves four rows. Rows that are not contiguous and 16-byte aligned (or a
//! hidden size not a multiple of 8) take `moe_router_logits_unaligned`.

use crate::gpu_backend::{arg, blocks_for, dtype_code, rows_16b, to_i32, GpuBackend};
use crate::runtime::{DevicePtr, KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouterPlan, RouterScore};
use kernel_api::{Backend, DType, Error, Layout, Result, TensorRef};
use std::sync::atomic::Ordering;

const THREADS: u32 = 256;
/// Experts per block of `moe_router_logits` / `_unaligned` (moe_router.cu: kRouterThreads /
/// kRouterGroupThreads); `moe_router_logits_batched` holds 4 times as many.
const LOGIT_EXPERTS: usize = 4;
/// Tokens per logits block (kRouterTokenTile).
const LOGIT_TOKENS: usize = 8;
/// Static shared memory of the kernel (warp scratch), rounded up.
const STATIC_SHARED: usize = 512;
/// `moe_router_logits_mma`'s block: experts and tokens (kRouterMmaExperts, kRouterMmaTokens),
/// the k window its splits are made of (kRouterWindow), and its threads in warps.
const MMA_EXPERTS: usize = 64;
const MMA_TOKENS: usize = 32;
const MMA_WINDOW: usize = 32;
const MMA_WARPS: u32 = 4;
/// Most k splits of the MMA logits: each is one more logits plane in the workspace for the
/// selection to add.
const MMA_MAX_SPLITS: usize = 16;
/// Blocks per SM / CU the split count aims the MMA grid at (its launch bounds allow 3 per SM on
/// NVIDIA): 2 x 4 warps, each with 4 windows of 16 weight rows in flight, is 32 KiB per SM.
const MMA_BLOCKS_PER_UNIT: usize = 2;

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

/// Split over k of the MMA logits (taken past one token tile): (splits, k per split, a multiple
/// of [`MMA_WINDOW`]). K3 past batch 8 is 14 expert tiles x ceil(T / 32) token tiles, a fraction
/// of the card, so the hidden size is cut until the grid comes near [`MMA_BLOCKS_PER_UNIT`]
/// blocks per SM / CU, at most [`MMA_MAX_SPLITS`]. One split up to one token tile (the other
/// logits kernels). Depends on the params and the device only, so `workspace_size` and `run`
/// agree.
fn logit_splits(p: &MoeRouterParams, compute_units: usize) -> (usize, usize) {
    let windows = p.hidden.div_ceil(MMA_WINDOW).max(1);
    if p.tokens <= LOGIT_TOKENS {
        return (1, windows * MMA_WINDOW);
    }
    let blocks = p.tokens.div_ceil(MMA_TOKENS).saturating_mul(p.experts.div_ceil(MMA_EXPERTS)).max(1);
    let want = compute_units.saturating_mul(MMA_BLOCKS_PER_UNIT) / blocks;
    let chunk = windows.div_ceil(want.clamp(1, MMA_MAX_SPLITS.min(windows)));
    (windows.div_ceil(chunk), chunk * MMA_WINDOW)
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

    /// The f32 logits, `tokens` rows of E rounded up to 4 floats, one such plane per k split of
    /// the MMA logits kernel ([`logit_splits`]; one up to 8 tokens).
    fn workspace_size(&self, plan: &MoeRouterPlan) -> usize {
        let (splits, _) = logit_splits(&plan.params, self.device_info().compute_units as usize);
        plan.params.tokens.saturating_mul(logits_stride(&plan.params)).saturating_mul(4 * splits)
    }

    fn run(&self, plan: &MoeRouterPlan, args: MoeRouterArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MoeRouter::workspace_size(self, plan))?;
        MoeRouter::supports(self, &plan.params)?;
        let p = &plan.params;
        if p.tokens == 0 {
            return Ok(());
        }
        let (x, w) = (&args.x.layout, &args.weight.layout);
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
        let (tokens, hidden, experts) =
            (to_i32("params.tokens", p.tokens)?, to_i32("params.hidden", p.hidden)?, to_i32("params.experts", p.experts)?);
        let (splits, k_chunk) = logit_splits(p, self.device_info().compute_units as usize);
        let cores_only = self.router_cores_only.load(Ordering::Relaxed);
        // The expert tiles go on grid.y (at most 65535: 4.19 M experts); beyond that the batched
        // kernel, whose experts are on grid.x.
        let expert_tiles = p.experts.div_ceil(MMA_EXPERTS);
        if vector && w.dtype == DType::BF16 && p.tokens > LOGIT_TOKENS && expert_tiles <= 65_535 && !cores_only {
            let mut a = KernelArgs::new();
            arg(&mut a, x_ptr);
            arg(&mut a, dtype_code(x.dtype));
            arg(&mut a, x.strides[0] as i64);
            arg(&mut a, w_ptr);
            arg(&mut a, w.strides[0] as i64);
            arg(&mut a, logits);
            arg(&mut a, lstride);
            arg(&mut a, tokens);
            arg(&mut a, hidden);
            arg(&mut a, experts);
            arg(&mut a, to_i32("params.hidden", k_chunk)?);
            let grid = (blocks_for(p.tokens, MMA_TOKENS), expert_tiles as u32, splits as u32);
            let cfg = LaunchConfig::new(grid, MMA_WARPS * self.device_info().warp_size, 0);
            self.launch("moe_router_logits_mma", cfg, &mut a, stream)?;
            return self.select(plan, &args, logits, lstride, splits, stream);
        }
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
        arg(&mut a, tokens);
        arg(&mut a, hidden);
        arg(&mut a, experts);
        let (name, per_block) = match (vector, p.tokens > LOGIT_TOKENS) {
            (false, _) => ("moe_router_logits_unaligned", LOGIT_EXPERTS),
            (true, false) => ("moe_router_logits", LOGIT_EXPERTS),
            // An f32 weight (a bf16 one took the MMA kernel above unless `router_cores_only`).
            (true, true) => ("moe_router_logits_batched", 4 * LOGIT_EXPERTS),
        };
        // experts fits an i32 (the plan checks it), so the expert blocks fit grid.x.
        let grid = (p.experts.div_ceil(per_block) as u32, blocks_for(p.tokens, LOGIT_TOKENS));
        self.launch(name, LaunchConfig::new(grid, THREADS, 0), &mut a, stream)?;
        self.select(plan, &args, logits, lstride, 1, stream)
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// Whether a bf16 router weight past one token tile takes the matrix-unit logits kernel (true,
    /// the default) or the CUDA-core one (`moe_router_logits_batched`, which then reads the bf16
    /// weight) for later launches: for benchmarks that time the two side by side
    /// (`k3-device-bench`). The workspace size does not depend on it.
    pub fn set_router_matrix_units(&self, on: bool) {
        self.router_cores_only.store(!on, Ordering::Relaxed);
    }

    /// `moe_router_topk` over the `splits` logits planes in the workspace (tokens x `lstride`
    /// floats each, one after the other).
    fn select(
        &self,
        plan: &MoeRouterPlan,
        args: &MoeRouterArgs<'_, Self>,
        logits: DevicePtr,
        lstride: i64,
        splits: usize,
        stream: &R::Stream,
    ) -> Result<()> {
        let p = &plan.params;
        let (ids, wts) = (&args.topk_ids.layout, &args.topk_weights.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, logits);
        arg(&mut a, lstride);
        arg(&mut a, splits as i32);
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


#[cfg(test)]
mod tests {
    use super::{logit_splits, MMA_MAX_SPLITS, MMA_WINDOW};
    use kernel_api::ops::MoeRouterParams;

    /// Whole windows per split, no empty split, the cap, and K3's shapes on an H200 (132 SMs) and
    /// an MI300X (304 CUs).
    #[test]
    fn logit_splits_cover_the_hidden_size_in_windows() {
        for (tokens, hidden, experts, units) in [(64, 7168, 896, 132), (16, 7168, 896, 304), (9, 200, 37, 2), (1024, 7168, 896, 132), (40, 8, 5, 1000)] {
            let (splits, chunk) = logit_splits(&MoeRouterParams::sigmoid(tokens, hidden, experts, 1), units);
            assert!(chunk % MMA_WINDOW == 0 && (1..=MMA_MAX_SPLITS).contains(&splits), "{tokens} {hidden}: {splits} x {chunk}");
            assert!(splits * chunk >= hidden && (splits - 1) * chunk < hidden, "{tokens} {hidden}: {splits} x {chunk}");
        }
        let k3 = |tokens, units| logit_splits(&MoeRouterParams::sigmoid(tokens, 7168, 896, 16), units);
        assert_eq!(k3(64, 132), (9, 800), "2 x 14 tiles, 264 / 28 = 9 splits of 25 windows");
        assert_eq!(k3(16, 304), (16, 448), "14 tiles: the cap");
        assert_eq!(k3(1024, 132), (1, 7168), "448 tiles: no split");
        assert_eq!(k3(8, 132), (1, 7168), "one token tile: the other kernels, one plane");
    }
}
