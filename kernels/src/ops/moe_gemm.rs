//! Grouped expert GEMM and combine launchers (csrc/ops/moe_gemm.cu): one grouped-GEMM kernel on
//! a grid of (M-blocks, 64-column tiles), whose blocks without an expert write the zero rows of
//! the pairs the align op listed as unserved (no zero-fill launch); `moe_combine_sum` one block
//! per (token, tile of 4 x 256 columns).
//!
//! Kernel choice: `moe_gemm_grouped_mma` (bf16 tensor-core fragments, 4 warps; its 16-row twin
//! `moe_gemm_grouped_m16_mma` at `block_m` <= 16) when every operand entering the product is
//! exact in bf16 and the input and weight rows are contiguous along k and 16-byte aligned (the
//! kernels move them in 16-byte vectors): bf16 input (with or without the MXFP8 round trip, whose
//! e4m3 x 2^x values of a bf16 row stay on bf16's grid) and bf16 or MXFP4 weights (e2m1 x
//! 2^(S-127) is exact in bf16). f32 input at `block_m` <= 16 (model-k3's activations at decode)
//! takes the 16-row kernels' `_f32a` form: the activation ring holds the f32 rows and each A
//! fragment is split into three bf16 planes whose sum is the f32 value exactly, so the products
//! stay exact and the weights are read and decoded once. Otherwise (f32 weights, f32 input in
//! larger M-blocks, other layouts) `moe_gemm_grouped`, the f32 FMA kernel: the spec decodes
//! operands exactly to f32, so an f32 operand is never rounded to bf16. All these kernels take
//! the same arguments and use the same tiles and epilogues.
//!
//! The MMA kernels' k loop is a multi-stage pipeline of 64-k steps (see csrc/ops/moe_gemm.cu):
//! MXFP4 weights stay raw in a 4-step ring (3 on AMD) and are decoded at MMA-fragment load, bf16
//! weights take a 2-step ring, both filled by cp.async on NVIDIA (and by deferred copies in the SIMT
//! emulator, where a missing wait reads stale data); on AMD the weights go through registers
//! (MXFP4 two steps ahead, bf16 one: no per-lane asynchronous LDS copy there, k3/async_copy.h).
//!
//! Split-k ([`split_k`]): when the served M-blocks x column tiles would leave the card idle
//! (decode, `block_m` <= 16), `moe_gemm_grouped_m16_splitk_mma` runs on a grid of (M-blocks,
//! k splits x column tiles), each split writing its raw f32 accumulators to the workspace (each
//! half row n rounded up to 4 floats, so the reduce moves them in 16-byte loads for any n), and
//! `moe_gemm_splitk_reduce` sums them in ascending split order (deterministic: no atomics) and
//! applies the epilogue.

use crate::gpu_backend::{arg, blocks_for, dtype_code, rows_16b, to_i32, GpuBackend};
use crate::runtime::{DevicePtr, KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{
    check_workspace, MoeActivationQuant, MoeCombine, MoeCombineArgs, MoeCombineParams, MoeCombinePlan, MoeGemmArgs,
    MoeGemmParams, MoeGemmPlan, MoeGemmStage, MoeGroupedGemm, MoeWeightFormat,
};
use kernel_api::{Backend, DType, DeviceInfo, Error, Layout, Result, TensorRef};

const THREADS: u32 = 256;
/// Warps of the MMA kernel (a 2x2 grid of 32x32 warp tiles).
const MMA_WARPS: u32 = 4;
/// Output columns per block (`kMoeBN` in the kernel).
const TILE_N: usize = 64;

/// k per pipeline step of the MMA kernels (`kMmaBK`): the granule of a k split.
const STEP_K: usize = 64;
/// Most k splits of one GEMM.
const MAX_SPLITS: usize = 16;
/// Most rows per M-block of the split-k reduce, which stages a block's sorted ids in shared
/// memory (`kReduceStagedRows` in moe_gemm.cu); [`split_k`] splits only at `block_m` <= 16.
const REDUCE_STAGED_ROWS: usize = 16;

/// Resident blocks per SM / CU of `moe_gemm_grouped_m16_splitk_mma` (bf16 input) and of its
/// `_f32a` form (the same on every target) on the report's targets: the occupancy that
/// benches/kernel-resources.json derives from the compiled binaries (registers, shared memory and
/// the card's limits; the unit test below fails when a regenerated report disagrees). sm_90a,
/// sm_100a / sm_103a: 4 (registers and shared memory); gfx942 (MI300X): 2 (64 KiB of LDS);
/// gfx950 (MI355X): 5 (VGPRs and 160 KiB of LDS). Other devices take a conservative 3 at warp 32
/// (e.g. sm_80's 164 KiB of shared memory holds 3 blocks) and 2 at warp 64.
fn splitk_resident_blocks(arch: &str, warp: u32) -> usize {
    match arch {
        "sm_90a" | "sm_100a" | "sm_103a" => 4,
        "gfx942" => 2,
        "gfx950" => 5,
        _ if warp == 64 => 2,
        _ => 3,
    }
}

/// Split over k of the 16-row MMA kernel (`block_m` <= 16): (splits, k per split, a multiple
/// of [`STEP_K`]). At decode sizes the served M-blocks x column tiles leave most of the card idle
/// (K3 TP8 gate_up at batch 1: 16 x 6 = 96 blocks of 56 k steps on 132 SMs); the k range is then
/// cut so the grid comes as close as it can to one full wave of resident blocks
/// ([`splitk_resident_blocks`] per SM / CU) without exceeding it. Served M-blocks are at most
/// min(pairs, M-blocks) (each holds a pair). Depends on the plan and the device only (both input
/// forms hold the same resident blocks), so `workspace_size` and `run` agree.
fn split_k(plan: &MoeGemmPlan, info: &DeviceInfo) -> (usize, usize) {
    let p = &plan.params;
    let steps = p.k.div_ceil(STEP_K);
    if p.routing.block_m > 16 {
        return (1, steps * STEP_K);
    }
    let per_unit = splitk_resident_blocks(&info.arch, info.warp_size);
    let tiles = p.n.div_ceil(TILE_N);
    let blocks = plan.pairs.min(plan.num_blocks).max(1).saturating_mul(tiles);
    let want = (info.compute_units as usize).saturating_mul(per_unit) / blocks;
    let most = steps.min(MAX_SPLITS).min(65_535 / tiles.max(1)).max(1);
    let chunk = steps.div_ceil(want.clamp(1, most));
    (steps.div_ceil(chunk), chunk * STEP_K)
}

/// Floats per pair in one split's partial sums: the gate half and, for GateUp, the up half, each
/// n rounded up to 4 so every half starts on a 16-byte boundary (`moe_partial_pitch` in
/// moe_gemm.cu, which both the split GEMM and the reduce use).
fn partial_row_floats(plan: &MoeGemmPlan) -> usize {
    let halves = match plan.params.stage {
        MoeGemmStage::GateUp { .. } => 2,
        MoeGemmStage::Down => 1,
    };
    plan.params.n.div_ceil(4).saturating_mul(4 * halves)
}

/// How the input reaches the matrix units, when the MMA kernels compute the spec's products
/// exactly (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MmaInput {
    /// bf16 rows, as they are.
    Bf16,
    /// f32 rows split into three exact bf16 planes (the 16-row kernels' `_f32a` form).
    F32Planes,
}

/// The MMA kernels' input form for these dtypes, or `None` for the f32 FMA kernel: the weights
/// must be exact in bf16 (MXFP4 or bf16), the input bf16, or f32 at `block_m` <= 16.
fn mma_input(p: &MoeGemmParams, input: DType, weight: DType) -> Option<MmaInput> {
    if p.weights != MoeWeightFormat::Mxfp4 && weight != DType::BF16 {
        return None;
    }
    match input {
        DType::BF16 => Some(MmaInput::Bf16),
        DType::F32 if p.routing.block_m <= 16 => Some(MmaInput::F32Planes),
        _ => None,
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// The routing metadata and output arguments that the grouped GEMM and its split-k reduce
    /// take in the same order (moe_gemm.cu: sorted pairs, expert ids, padded count, router
    /// weights, output, then pairs / top_k / experts / block_m).
    fn push_routing_out(&self, a: &mut KernelArgs, plan: &MoeGemmPlan, args: &MoeGemmArgs<'_, Self>, out_ptr: DevicePtr) -> Result<()> {
        let (r, out) = (&plan.params.routing, &args.out.layout);
        arg(a, self.ptr(args.sorted_token_ids.buf, &args.sorted_token_ids.layout));
        arg(a, args.sorted_token_ids.layout.strides[0] as i64);
        arg(a, self.ptr(args.expert_ids.buf, &args.expert_ids.layout));
        arg(a, args.expert_ids.layout.strides[0] as i64);
        arg(a, self.ptr(args.num_tokens_post_padded.buf, &args.num_tokens_post_padded.layout));
        self.push_opt(a, args.topk_weights.as_ref().map(TensorRef::parts), 2);
        arg(a, out_ptr);
        arg(a, dtype_code(out.dtype));
        arg(a, out.strides[0] as i64);
        arg(a, out.strides[1] as i64);
        arg(a, to_i32("pairs", plan.pairs)?);
        arg(a, to_i32("params.routing.top_k", r.top_k)?);
        arg(a, to_i32("params.routing.experts", r.experts)?);
        arg(a, to_i32("params.routing.block_m", r.block_m)?);
        Ok(())
    }
}

impl<R: Runtime> MoeGroupedGemm for GpuBackend<R> {
    fn supports(&self, p: &MoeGemmParams) -> Result<()> {
        let r = &p.routing;
        to_i32("params.k", p.k)?;
        to_i32("params.n", p.n)?;
        to_i32("params.routing.block_m", r.block_m)?;
        to_i32("params.routing.experts", r.experts)?;
        let pairs = r.tokens.checked_mul(r.top_k).ok_or_else(|| Error::unsupported("params.routing.tokens", "overflow"))?;
        to_i32("params.routing.tokens x top_k", pairs)?;
        // Weight rows (2n for gate/up) are indexed with 64-bit strides; only the row index itself
        // must fit an int.
        to_i32("params.n x 2", p.n.saturating_mul(2))?;
        // One block per M-block: keep grid.x * 256 threads within every vendor's 2^32 limit.
        if r.num_blocks().is_none_or(|b| b > 1 << 24) {
            return Err(Error::unsupported("params.routing.block_m", "more than 2^24 M-blocks; use a larger block_m"));
        }
        if p.n.div_ceil(TILE_N) > 65_535 {
            return Err(Error::unsupported("params.n", format!("{} needs more than 65535 column tiles", p.n)));
        }
        Ok(())
    }

    /// The split-k partial sums (f32 raw accumulators, `splits x pairs x row`, a row one half
    /// per weight-row group, each n rounded up to 4 floats: [`partial_row_floats`]) when the plan
    /// splits; sized whenever the MMA kernels could serve the plan (the input dtype and
    /// alignment are only known at `run`, which then leaves the workspace unused).
    fn workspace_size(&self, plan: &MoeGemmPlan) -> usize {
        let (splits, _) = split_k(plan, self.device_info());
        if splits <= 1 {
            return 0;
        }
        splits.saturating_mul(plan.pairs).saturating_mul(partial_row_floats(plan)).saturating_mul(4)
    }

    fn run(&self, plan: &MoeGemmPlan, args: MoeGemmArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MoeGroupedGemm::workspace_size(self, plan))?;
        MoeGroupedGemm::supports(self, &plan.params)?;
        let p = &plan.params;
        let r = &p.routing;
        if plan.pairs == 0 {
            return Ok(());
        }
        let out = &args.out.layout;
        let out_ptr = self.ptr(&*args.out.buf, out);

        let (inp, w) = (&args.input.layout, &args.weight.layout);
        let mut a = KernelArgs::new();
        let (in_ptr, w_ptr) = (self.ptr(args.input.buf, inp), self.ptr(args.weight.buf, w));
        arg(&mut a, in_ptr);
        arg(&mut a, dtype_code(inp.dtype));
        arg(&mut a, inp.strides[0] as i64);
        arg(&mut a, inp.strides[1] as i64);
        arg(&mut a, w_ptr);
        arg(&mut a, dtype_code(w.dtype));
        for &s in &w.strides[..3] {
            arg(&mut a, s as i64);
        }
        let scale = match (p.weights, &args.weight_scale) {
            (MoeWeightFormat::Mxfp4, Some(s)) => Some(s.parts()),
            (MoeWeightFormat::Mxfp4, None) => return Err(Error::invalid("weight_scale", "required for MXFP4 weights")),
            (MoeWeightFormat::Dense, _) => None,
        };
        self.push_opt(&mut a, scale, 3);
        self.push_routing_out(&mut a, plan, &args, out_ptr)?;
        arg(&mut a, to_i32("params.k", p.k)?);
        arg(&mut a, to_i32("params.n", p.n)?);
        arg(&mut a, to_i32("max_padded", plan.max_padded)?);
        let (gate_up, beta, linear_beta) = match p.stage {
            MoeGemmStage::GateUp { beta, linear_beta } => (1i32, beta, linear_beta.unwrap_or(0.0)),
            MoeGemmStage::Down => (0i32, 0.0f32, 0.0f32),
        };
        arg(&mut a, gate_up);
        arg(&mut a, beta);
        arg(&mut a, linear_beta);
        arg(&mut a, i32::from(p.activation_quant == Some(MoeActivationQuant::Mxfp8)));
        // The MMA kernel reads input and weight rows in 16-byte vectors (k a multiple of 8, so
        // every 8-element chunk is whole); other layouts take the f32 kernel (never split).
        let vector_rows = p.k % 8 == 0 && rows_16b(in_ptr, inp) && rows_16b(w_ptr, w);
        let mma_in = mma_input(p, inp.dtype, w.dtype).filter(|_| vector_rows);
        let mma = mma_in.is_some();
        let (splits, k_chunk) = if mma { split_k(plan, self.device_info()) } else { (1, p.k) };
        if splits > 1 && r.block_m > REDUCE_STAGED_ROWS {
            return Err(Error::unsupported("params.routing.block_m", "the split-k reduce takes M-blocks of at most 16 rows"));
        }
        let partial = match (splits > 1, ws.as_deref()) {
            (true, Some(buf)) => self.ptr(buf, &Layout::contiguous(DType::F32, &[0])),
            (true, None) => return Err(Error::invalid("workspace", "the split-k partial sums need the plan's workspace")),
            (false, _) => DevicePtr(0),
        };
        if partial.0 % 16 != 0 {
            // The reduce reads every half row of the partials in 16-byte loads.
            return Err(Error::invalid("workspace", "the split-k partial sums need a 16-byte aligned buffer"));
        }
        arg(&mut a, to_i32("params.k", k_chunk)?);
        arg(&mut a, partial);
        self.push_checks(&mut a, stream)?;
        // Served M-blocks come first and each holds a pair, so blocks from index `pairs` on can
        // hold none: they are not launched (at decode most of the worst-case padding,
        // e.g. 841 M-blocks for 16 pairs of 896 experts, would otherwise only exit).
        let m_blocks = plan.num_blocks.min(plan.pairs);
        let m_blocks = u32::try_from(m_blocks).map_err(|_| Error::unsupported("params.routing", "too many M-blocks"))?;
        let grid = (m_blocks, (p.n.div_ceil(TILE_N) * splits) as u32);
        let (name, threads) = if mma {
            // Decode-sized M-blocks take the 16-row tiling, where every warp owns live rows.
            let name = match (r.block_m <= 16, splits > 1, mma_in) {
                (true, true, Some(MmaInput::F32Planes)) => "moe_gemm_grouped_m16_splitk_mma_f32a",
                (true, false, Some(MmaInput::F32Planes)) => "moe_gemm_grouped_m16_mma_f32a",
                (true, true, _) => "moe_gemm_grouped_m16_splitk_mma",
                (true, false, _) => "moe_gemm_grouped_m16_mma",
                (false, ..) => "moe_gemm_grouped_mma",
            };
            (name, MMA_WARPS * self.device_info().warp_size)
        } else {
            ("moe_gemm_grouped", THREADS)
        };
        self.launch(name, LaunchConfig::new(grid, threads, 0), &mut a, stream)?;
        if splits <= 1 {
            return Ok(());
        }

        // Sum the splits in order and apply the epilogue (moe_gemm_splitk_reduce).
        let mut c = KernelArgs::new();
        arg(&mut c, partial);
        arg(&mut c, splits as i32);
        self.push_routing_out(&mut c, plan, &args, out_ptr)?;
        arg(&mut c, to_i32("params.n", p.n)?);
        arg(&mut c, to_i32("max_padded", plan.max_padded)?);
        arg(&mut c, gate_up);
        arg(&mut c, beta);
        arg(&mut c, linear_beta);
        self.push_checks(&mut c, stream)?;
        // Four columns per thread (16-byte loads of the partials).
        let grid = (m_blocks, p.n.div_ceil(4 * THREADS as usize) as u32);
        self.launch("moe_gemm_splitk_reduce", LaunchConfig::new(grid, THREADS, 0), &mut c, stream)
    }
}

impl<R: Runtime> MoeCombine for GpuBackend<R> {
    fn supports(&self, p: &MoeCombineParams) -> Result<()> {
        to_i32("params.tokens", p.tokens)?;
        to_i32("params.hidden", p.hidden)?;
        to_i32("params.top_k", p.top_k)?;
        to_i32("params.tokens x top_k", p.tokens.saturating_mul(p.top_k))?;
        if p.hidden.div_ceil(4 * THREADS as usize) > 65_535 {
            return Err(Error::unsupported("params.hidden", format!("{} needs more than 65535 column tiles", p.hidden)));
        }
        Ok(())
    }

    fn run(&self, plan: &MoeCombinePlan, args: MoeCombineArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MoeCombine::workspace_size(self, plan))?;
        MoeCombine::supports(self, &plan.params)?;
        let p = &plan.params;
        if p.tokens == 0 {
            return Ok(());
        }
        let (y, out) = (&args.y.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.y.buf, y));
        arg(&mut a, y.strides[0] as i64);
        arg(&mut a, y.strides[1] as i64);
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, out.strides[0] as i64);
        arg(&mut a, out.strides[1] as i64);
        arg(&mut a, to_i32("params.tokens", p.tokens)?);
        arg(&mut a, to_i32("params.top_k", p.top_k)?);
        arg(&mut a, to_i32("params.hidden", p.hidden)?);
        // Tiles of 4 columns per thread (moe_combine_sum); at most 65535 of them (supports).
        let grid = (blocks_for(p.tokens, 1), p.hidden.div_ceil(4 * THREADS as usize) as u32);
        self.launch("moe_combine_sum", LaunchConfig::new(grid, THREADS, 0), &mut a, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::splitk_resident_blocks;

    /// The table agrees with the resource report (benches/kernel-resources.json, regenerated
    /// from the binaries by `k3-kernel-report --write`): every K3 launch of either split kernel
    /// there has the resident blocks the table gives its target.
    #[test]
    fn splitk_resident_blocks_match_the_report() {
        for kernel in ["moe_gemm_grouped_m16_splitk_mma", "moe_gemm_grouped_m16_splitk_mma_f32a"] {
            let launches = crate::ops::report_resident_blocks(kernel);
            for (target, resident) in &launches {
                let warp = if target.starts_with("gfx") { 64 } else { 32 };
                assert_eq!(*resident, splitk_resident_blocks(target, warp), "{kernel} on {target}");
            }
            assert!(launches.len() >= 5, "launches of {kernel} on the five report targets, found {}", launches.len());
        }
    }
}
