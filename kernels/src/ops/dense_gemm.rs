//! Dense GEMM launcher. The runtime's vendor BLAS first, when it takes the params
//! ([`Runtime::vendor_gemm_workspace`]: cuBLASLt on CUDA, hipBLASLt on ROCm); else, or when the vendor library has
//! no algorithm for the operands' strides and alignments, the dialect's kernels in
//! `csrc/ops/dense_gemm.cu`: the bf16 MMA kernel when x and W are both bf16, the f32 FMA kernel
//! otherwise (an f32 operand is never rounded to bf16: the spec decodes inputs exactly).
//! 64x64 output tiles; grid x over N tiles, y over M tiles.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, MatrixOperand, Runtime, VendorGemmArgs};
use kernel_api::ops::{check_workspace, Gemm, GemmArgs, GemmParams, GemmPlan};
use kernel_api::{Backend, DType, Error, Result, TensorRef};

/// Output tile of both kernels (`DENSE_GEMM_BM` x `DENSE_GEMM_BN`).
const TILE: usize = 64;
/// Threads of the f32 kernel (`DENSE_GEMM_F32_THREADS`).
const F32_THREADS: u32 = 256;
/// Warps of the MMA kernel (a 2x2 grid of 32x32 warp tiles).
const MMA_WARPS: u32 = 4;
/// CUDA and HIP cap grid y at 65535.
const MAX_GRID_Y: usize = 65_535;

fn grid(p: &GemmParams) -> Result<(u32, u32)> {
    let tiles_m = p.m.div_ceil(TILE);
    if tiles_m > MAX_GRID_Y {
        return Err(Error::unsupported(
            "params.m",
            format!(
                "{} rows need {tiles_m} row tiles; the GPU GEMM takes at most {}",
                p.m,
                MAX_GRID_Y * TILE
            ),
        ));
    }
    let tiles_n = to_i32("params.n", p.n.div_ceil(TILE))?;
    Ok((tiles_n as u32, tiles_m as u32))
}

fn operand<'a, R: Runtime>(t: &TensorRef<'a, GpuBackend<R>>) -> MatrixOperand<'a, R::Buffer> {
    MatrixOperand { buf: t.buf, offset_bytes: t.layout.offset * t.layout.dtype.size_bytes(), row_stride: t.layout.strides[0] }
}

fn uses_mma(p: &GemmParams) -> bool {
    p.x_dtype == DType::BF16 && p.w_dtype == DType::BF16
}

impl<R: Runtime> Gemm for GpuBackend<R> {
    fn supports(&self, p: &GemmParams) -> Result<()> {
        to_i32("params.m", p.m)?;
        to_i32("params.n", p.n)?;
        to_i32("params.k", p.k)?;
        // The kernels' grid bounds M only when they will run it: a vendor library takes any M.
        // (If that library then has no algorithm for the operands, `run` falls back to the
        // kernels and reports the grid limit there.)
        if self.runtime().vendor_gemm_workspace(p).is_none() {
            grid(p)?;
        }
        Ok(())
    }

    fn workspace_size(&self, plan: &GemmPlan) -> usize {
        self.runtime().vendor_gemm_workspace(&plan.params).unwrap_or(0)
    }

    fn run(&self, plan: &GemmPlan, args: GemmArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), Gemm::workspace_size(self, plan))?;
        let p = &plan.params;
        if p.m == 0 {
            return Ok(());
        }
        let (x, w, out) = (&args.x.layout, &args.w.layout, &args.out.layout);
        if self.runtime().vendor_gemm_workspace(p).is_some() {
            let vendor = VendorGemmArgs {
                x: operand(&args.x),
                w: operand(&args.w),
                bias: args.bias.as_ref().map(operand),
                out: &mut *args.out.buf,
                out_offset_bytes: out.offset * out.dtype.size_bytes(),
                workspace: ws,
            };
            match self.runtime().vendor_gemm(p, vendor, stream) {
                Err(Error::Unsupported { .. }) => {} // no vendor algorithm for these operands
                done => return done,
            }
        }
        let (grid_x, grid_y) = grid(p)?;
        let mma = uses_mma(p);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.x.buf, x));
        if !mma {
            arg(&mut a, dtype_code(x.dtype));
        }
        arg(&mut a, x.strides[0] as i64);
        arg(&mut a, self.ptr(args.w.buf, w));
        if !mma {
            arg(&mut a, dtype_code(w.dtype));
        }
        arg(&mut a, w.strides[0] as i64);
        self.push_opt_typed(&mut a, args.bias.as_ref().map(TensorRef::parts), 0);
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, to_i32("params.m", p.m)?);
        arg(&mut a, to_i32("params.n", p.n)?);
        arg(&mut a, to_i32("params.k", p.k)?);
        let (name, threads) = if mma {
            ("dense_gemm_bf16_mma", MMA_WARPS * self.device_info().warp_size)
        } else {
            ("dense_gemm_f32_fma", F32_THREADS)
        };
        self.launch(name, LaunchConfig::new((grid_x, grid_y), threads, 0), &mut a, stream)
    }
}
