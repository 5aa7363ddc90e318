//! Launcher of the ragged MLA prefill (`csrc/ops/mla_prefill.cu`): one launch over (query
//! tiles of 16 rows, heads, sequences); blocks read their offsets from the device `cu_seqlens`.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::error::Reasons;
use kernel_api::ops::{check_workspace, MlaPrefill, MlaPrefillArgs, MlaPrefillParams, MlaPrefillPlan};
use kernel_api::{Error, Result, TensorMut, TensorRef};

/// `kPrefillRows` x `kPrefillKeys` threads; the kernel's register budget for v_dim.
const ROWS: usize = 16;
const KEYS: usize = 16;
const MAX_V_DIM: usize = 256;
/// Shared memory a block may use on every target (the CUDA default without opt-in).
const MAX_SHARED: usize = 48 * 1024;
const MAX_GRID_YZ: usize = 65_535;

/// Q tile, padded K tile, V tile and the probability tile, f32 (None on overflow).
fn shared_bytes(p: &MlaPrefillParams) -> Option<usize> {
    let floats = (ROWS + KEYS).checked_mul(p.qk_dim)?.checked_add(KEYS)?.checked_add(KEYS.checked_mul(p.v_dim)?)?.checked_add(ROWS * KEYS)?;
    floats.checked_mul(4)
}

impl<R: Runtime> MlaPrefill for GpuBackend<R> {
    fn supports(&self, p: &MlaPrefillParams) -> Result<()> {
        let mut r = Reasons::new();
        r.require(p.v_dim <= MAX_V_DIM, "params.v_dim", format!("the GPU kernel takes v_dim <= {MAX_V_DIM}, got {}", p.v_dim));
        r.require(shared_bytes(p).is_some_and(|b| b <= MAX_SHARED), "params.qk_dim", format!("qk_dim {} with v_dim {} needs more than {MAX_SHARED} bytes of shared memory", p.qk_dim, p.v_dim));
        r.require(p.heads <= MAX_GRID_YZ, "params.heads", format!("at most {MAX_GRID_YZ} heads (grid y), got {}", p.heads));
        r.into_result()
    }

    fn run(&self, plan: &MlaPrefillPlan, args: MlaPrefillArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MlaPrefill::workspace_size(self, plan))?;
        MlaPrefill::supports(self, &plan.params)?;
        let p = &plan.params;
        if plan.batch_size == 0 {
            return Ok(());
        }
        if plan.batch_size > MAX_GRID_YZ {
            return Err(Error::unsupported("cu_seqlens", format!("{} sequences exceed the grid's z limit {MAX_GRID_YZ}", plan.batch_size)));
        }
        let (q, k, v) = (&args.q.layout, &args.k.layout, &args.v.layout);
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.q.buf, q));
        arg(&mut a, self.ptr(args.k.buf, k));
        arg(&mut a, self.ptr(args.v.buf, v));
        arg(&mut a, dtype_code(q.dtype));
        for l in [q, k, v] {
            arg(&mut a, l.strides[0] as i64);
            arg(&mut a, l.strides[1] as i64);
        }
        arg(&mut a, self.ptr(args.cu_seqlens.buf, &args.cu_seqlens.layout));
        arg(&mut a, dtype_code(args.cu_seqlens.layout.dtype));
        self.push_opt_typed(&mut a, args.cu_seqlens_k.as_ref().map(TensorRef::parts), 0);
        arg(&mut a, q.shape[0] as i64);
        arg(&mut a, k.shape[0] as i64);
        arg(&mut a, plan.max_seqlen_q as i64);
        let out = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, out.strides[0] as i64);
        arg(&mut a, out.strides[1] as i64);
        self.push_opt(&mut a, args.lse.as_ref().map(TensorMut::parts), 2);
        arg(&mut a, to_i32("params.qk_dim", p.qk_dim)?);
        arg(&mut a, to_i32("params.v_dim", p.v_dim)?);
        arg(&mut a, i32::from(p.causal));
        arg(&mut a, p.softmax_scale);
        self.push_checks(&mut a, stream)?;
        // At least one tile: a batch without queries still has its device metadata checked.
        let tiles = to_i32("max_seqlen_q", plan.max_seqlen_q.div_ceil(ROWS).max(1))? as u32;
        let grid = (tiles, p.heads as u32, plan.batch_size as u32);
        self.launch("mla_prefill", LaunchConfig::new(grid, (ROWS * KEYS) as u32, shared_bytes(p).unwrap_or(0) as u32), &mut a, stream)
    }
}
