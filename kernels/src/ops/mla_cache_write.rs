//! Launcher of the MLA cache write (`csrc/ops/mla_cache_write.cu`): one block per token; the
//! kernel bounds each device slot by the cache's `num_pages x page_size` slots.

use super::mla_format::{format_codes, ByteLayout};
use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::{check_workspace, MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteParams, MlaCacheWritePlan};
use kernel_api::Result;

const THREADS: u32 = 128;

impl<R: Runtime> MlaCacheWrite for GpuBackend<R> {
    fn supports(&self, p: &MlaCacheWriteParams) -> Result<()> {
        to_i32("params.dims.latent + params.dims.rope", p.dims.width())?;
        to_i32("params.page_size", p.page_size)?;
        Ok(())
    }

    fn run(&self, plan: &MlaCacheWritePlan, args: MlaCacheWriteArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MlaCacheWrite::workspace_size(self, plan))?;
        let p = &plan.params;
        let n = plan.num_tokens();
        if n == 0 {
            return Ok(());
        }
        let (kind, fnuz) = format_codes(p.format);
        let cache = ByteLayout::of(&args.cache.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.kv.buf, &args.kv.layout));
        arg(&mut a, dtype_code(args.kv.layout.dtype));
        arg(&mut a, args.kv.layout.strides[0] as i64);
        arg(&mut a, self.ptr(args.slot_mapping.buf, &args.slot_mapping.layout));
        arg(&mut a, dtype_code(args.slot_mapping.layout.dtype));
        arg(&mut a, self.ptr(&*args.cache.buf, &args.cache.layout));
        arg(&mut a, cache.page_stride);
        arg(&mut a, cache.row_stride);
        arg(&mut a, to_i32("params.page_size", p.page_size)?);
        arg(&mut a, to_i32("params.num_pages", p.num_pages)?);
        arg(&mut a, to_i32("slot_mapping", n)?);
        arg(&mut a, kind);
        arg(&mut a, fnuz);
        arg(&mut a, to_i32("params.dims.latent", p.dims.latent)?);
        arg(&mut a, to_i32("params.dims.rope", p.dims.rope)?);
        // The same f32 reciprocal as kv_cache::encode_token (one rounding, on the host).
        arg(&mut a, 1.0f32 / p.kv_scale);
        self.push_checks(&mut a, stream)?;
        let grid = n.min(65_535) as u32;
        self.launch("mla_cache_write", LaunchConfig::new(grid, THREADS, 0), &mut a, stream)
    }
}
