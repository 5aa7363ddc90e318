//! Norm and AttnRes launchers (kernels in `csrc/ops/dense_norm.cu` and `dense_attn_res.cu`).
//! RMSNorm and the AttnRes mix run one block per row; the gated per-head RMSNorm and the L2 norm
//! one warp per row, [`ROW_WARPS`] rows per block.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::attn_res::{AttnResMix, AttnResMixArgs, AttnResMixParams, AttnResMixPlan};
use kernel_api::ops::check_workspace;
use kernel_api::ops::norm::{
    GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, GatedRmsNormPlan, L2Norm, L2NormArgs, L2NormParams, L2NormPlan, RmsNorm,
    RmsNormArgs, RmsNormParams, RmsNormPlan, RmsWeightOrder,
};
use kernel_api::{Backend, Result};

/// Rows (warps) per block of the warp-per-row kernels.
const ROW_WARPS: u32 = 4;
/// Threads of a block-per-row kernel: 128 for rows up to 1024 wide, 256 above (K3's 7168).
fn row_threads(d: usize) -> u32 {
    if d <= 1024 {
        128
    } else {
        256
    }
}

/// Blocks for `rows` rows at one warp per row.
fn warp_row_blocks(field: &str, rows: usize) -> Result<u32> {
    Ok(to_i32(field, rows.div_ceil(ROW_WARPS as usize))? as u32)
}

impl<R: Runtime> RmsNorm for GpuBackend<R> {
    fn supports(&self, p: &RmsNormParams) -> Result<()> {
        to_i32("params.m", p.m)?;
        to_i32("params.d", p.d)?;
        Ok(())
    }

    fn run(&self, plan: &RmsNormPlan, args: RmsNormArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), RmsNorm::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let (x, w, out) = (&args.x.layout, &args.w.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.x.buf, x));
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        arg(&mut a, self.ptr(args.w.buf, w));
        arg(&mut a, dtype_code(w.dtype));
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, to_i32("params.d", p.d)?);
        arg(&mut a, p.eps);
        arg(&mut a, i32::from(p.weight_order == RmsWeightOrder::CastBeforeWeight));
        let cfg = LaunchConfig::new(to_i32("params.m", p.m)? as u32, row_threads(p.d), 0);
        self.launch("dense_rms_norm", cfg, &mut a, stream)
    }
}

impl<R: Runtime> GatedRmsNorm for GpuBackend<R> {
    fn supports(&self, p: &GatedRmsNormParams) -> Result<()> {
        to_i32("params.m x params.heads", p.m.saturating_mul(p.heads))?;
        to_i32("params.head_dim", p.head_dim)?;
        Ok(())
    }

    fn run(&self, plan: &GatedRmsNormPlan, args: GatedRmsNormArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), GatedRmsNorm::workspace_size(self, plan))?;
        let p = &plan.params;
        let rows = p.m * p.heads;
        if rows == 0 {
            return Ok(());
        }
        let (o, g, w, out) = (&args.o.layout, &args.gate.layout, &args.w.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.o.buf, o));
        arg(&mut a, dtype_code(o.dtype));
        arg(&mut a, o.strides[0] as i64);
        arg(&mut a, o.strides[1] as i64);
        arg(&mut a, self.ptr(args.gate.buf, g));
        arg(&mut a, dtype_code(g.dtype));
        arg(&mut a, g.strides[0] as i64);
        arg(&mut a, g.strides[1] as i64);
        arg(&mut a, self.ptr(args.w.buf, w));
        arg(&mut a, dtype_code(w.dtype));
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, to_i32("params.m x params.heads", rows)?);
        arg(&mut a, to_i32("params.heads", p.heads)?);
        arg(&mut a, to_i32("params.head_dim", p.head_dim)?);
        arg(&mut a, p.eps);
        let threads = ROW_WARPS * self.device_info().warp_size;
        let cfg = LaunchConfig::new(warp_row_blocks("params.m x params.heads", rows)?, threads, 0);
        self.launch("dense_gated_rms_norm", cfg, &mut a, stream)
    }
}

impl<R: Runtime> L2Norm for GpuBackend<R> {
    fn supports(&self, p: &L2NormParams) -> Result<()> {
        to_i32("params.m", p.m)?;
        to_i32("params.d", p.d)?;
        Ok(())
    }

    fn run(&self, plan: &L2NormPlan, args: L2NormArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), L2Norm::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let (x, out) = (&args.x.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.x.buf, x));
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, to_i32("params.m", p.m)?);
        arg(&mut a, to_i32("params.d", p.d)?);
        arg(&mut a, p.eps);
        let threads = ROW_WARPS * self.device_info().warp_size;
        self.launch(
            "dense_l2_norm",
            LaunchConfig::new(warp_row_blocks("params.m", p.m)?, threads, 0),
            &mut a,
            stream,
        )
    }
}

impl<R: Runtime> AttnResMix for GpuBackend<R> {
    fn supports(&self, p: &AttnResMixParams) -> Result<()> {
        to_i32("params.m", p.m)?;
        to_i32("params.d", p.d)?;
        Ok(())
    }

    fn run(&self, plan: &AttnResMixPlan, args: AttnResMixArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), AttnResMix::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let (s, w, out) = (&args.sources.layout, &args.score_vector.layout, &args.out.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.sources.buf, s));
        arg(&mut a, dtype_code(s.dtype));
        arg(&mut a, s.strides[0] as i64);
        arg(&mut a, s.strides[1] as i64);
        arg(&mut a, self.ptr(args.score_vector.buf, w));
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        // The plan bounds S by MAX_SOURCES (64), the kernel's on-chip score array.
        arg(&mut a, to_i32("params.sources", p.sources)?);
        arg(&mut a, to_i32("params.d", p.d)?);
        arg(&mut a, p.eps);
        // At least MAX_SOURCES threads: thread i turns score i into its softmax weight.
        let cfg = LaunchConfig::new(to_i32("params.m", p.m)? as u32, row_threads(p.d), 0);
        self.launch("dense_attn_res_mix", cfg, &mut a, stream)
    }
}
