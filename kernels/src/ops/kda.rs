//! KDA gate and chunked prefill launchers (kernels in csrc/ops/kda_gate.cu, kda_prefill.cu).
//!
//! The prefill runs as FlashKDA does: a token-parallel prepare pass per (chunk, head) (K1) whose
//! results go to the caller's workspace, then a recurrence pass per (value split, head,
//! sequence) (K2) with the state slice in shared memory. The chunk list comes from a one-block
//! schedule kernel over the device `cu_seqlens` and checkpoint offsets; the host only sizes the
//! grids from the plan.

use crate::gpu_backend::{arg, blocks_for, dtype_code, to_i32, GpuBackend};
use crate::runtime::{DevicePtr, KernelArgs, LaunchConfig, Runtime};
use kernel_api::error::Reasons;
use kernel_api::ops::{
    check_workspace, KdaGate, KdaGateArgs, KdaGateMode, KdaGateParams, KdaGatePlan, KdaPrefill, KdaPrefillArgs,
    KdaPrefillParams, KdaPrefillPlan, KdaStateLayout,
};
use kernel_api::{Backend, DType, Error, Result, TensorMut, TensorRef};

const GATE_THREADS: u32 = 256;
const SCHEDULE_THREADS: u32 = 256;
const PREPARE_THREADS: u32 = 128;
const RECURRENCE_THREADS: u32 = 256;
/// Largest grid y / z dimension (heads, sequences of the recurrence pass).
const GRID_YZ: usize = 65_535;
/// Shared memory assumed when the device does not report its per-block limit.
const DEFAULT_SHARED: usize = 48 * 1024;

/// (mode code, lower bound) as the kernels take them (kda_gate.cuh `KdaGateModeCode`).
fn gate_code(mode: KdaGateMode) -> (i32, f32) {
    match mode {
        KdaGateMode::LowerBound { lower_bound } => (0, lower_bound),
        KdaGateMode::Softplus => (1, 0.0),
        KdaGateMode::Precomputed => (2, 0.0),
    }
}

/// Device pointer and element stride of an optional 1-D f32 tensor (null when absent).
fn opt_vec<R: Runtime>(b: &GpuBackend<R>, t: Option<&TensorRef<'_, GpuBackend<R>>>) -> (DevicePtr, i64) {
    match t {
        Some(t) => (b.ptr(t.buf, &t.layout), t.layout.strides[0] as i64),
        None => (DevicePtr(0), 0),
    }
}

impl<R: Runtime> KdaGate for GpuBackend<R> {
    fn supports(&self, p: &KdaGateParams) -> Result<()> {
        to_i32("params.heads", p.heads)?;
        to_i32("params.head_dim", p.head_dim)?;
        Ok(())
    }

    fn run(&self, plan: &KdaGatePlan, args: KdaGateArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), KdaGate::workspace_size(self, plan))?;
        let p = &plan.params;
        let total = p.tokens * p.heads * p.head_dim;
        if total == 0 {
            return Ok(());
        }
        let (g, o) = (&args.g_raw.layout, &args.g_out.layout);
        let (mode, lb) = gate_code(p.mode);
        let (a_ptr, a_s) = opt_vec(self, args.a_log.as_ref());
        let (d_ptr, d_s) = opt_vec(self, args.dt_bias.as_ref());
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.g_raw.buf, g));
        arg(&mut a, dtype_code(g.dtype));
        arg(&mut a, g.strides[0] as i64);
        arg(&mut a, g.strides[1] as i64);
        arg(&mut a, a_ptr);
        arg(&mut a, a_s);
        arg(&mut a, d_ptr);
        arg(&mut a, d_s);
        arg(&mut a, self.ptr(&*args.g_out.buf, o));
        arg(&mut a, o.strides[0] as i64);
        arg(&mut a, o.strides[1] as i64);
        arg(&mut a, total as i64);
        arg(&mut a, to_i32("params.heads", p.heads)?);
        arg(&mut a, to_i32("params.head_dim", p.head_dim)?);
        arg(&mut a, mode);
        arg(&mut a, lb);
        let cfg = LaunchConfig::new(blocks_for(total, GATE_THREADS as usize), GATE_THREADS, 0);
        self.launch("kda_gate_activate", cfg, &mut a, stream)
    }
}

/// Shared-memory bytes of K1 for a chunk size: L and X `[C][C]` plus β `[C]`, f32.
fn prepare_shared(chunk: usize) -> usize {
    (2 * chunk * chunk + chunk) * 4
}

/// Shared-memory bytes of K2 for `vb` value columns: S `[K][vb + 1]` (padded rows), v' `[C][vb]`,
/// e^G `[K]`, f32.
fn recurrence_shared(p: &KdaPrefillParams, vb: usize) -> usize {
    (p.k_dim * (vb + 1) + p.chunk_size * vb + p.k_dim) * 4
}

impl<R: Runtime> GpuBackend<R> {
    fn shared_budget(&self) -> usize {
        match self.device_info().shared_mem_per_block {
            0 => DEFAULT_SHARED,
            b => b,
        }
    }

    /// Value columns per K2 block: all V when the whole state fits in shared memory, else the
    /// widest power of two that fits; halved (FlashKDA's V-split) when one block per (sequence,
    /// head) would leave more than half of the compute units idle (2·H·N ≤ units). Splits never
    /// need a cross-block reduction. `supports` guarantees that one column fits.
    fn value_split(&self, p: &KdaPrefillParams, num_seqs: usize) -> usize {
        let budget = self.shared_budget() / 4;
        let fit = (budget.saturating_sub(2 * p.k_dim) / (p.k_dim + p.chunk_size)).max(1);
        let mut vb = if p.v_dim <= fit { p.v_dim } else { 1 << fit.ilog2() };
        let units = self.device_info().compute_units as usize;
        if 2 * p.heads * num_seqs <= units && vb == p.v_dim {
            vb = p.v_dim.div_ceil(2);
        }
        vb
    }
}

impl<R: Runtime> KdaPrefill for GpuBackend<R> {
    fn supports(&self, p: &KdaPrefillParams) -> Result<()> {
        let mut r = Reasons::new();
        let budget = self.shared_budget();
        r.require(prepare_shared(p.chunk_size) <= budget, "params.chunk_size", format!(
            "the prepare pass needs {} B of shared memory, the device has {budget}",
            prepare_shared(p.chunk_size)
        ));
        r.require(recurrence_shared(p, 1) <= budget, "params.k_dim", format!(
            "one state column of K = {} and chunk {} does not fit {budget} B of shared memory",
            p.k_dim, p.chunk_size
        ));
        r.require(p.chunk_size <= 64, "params.chunk_size", "the prepare pass holds at most 64 tokens per column");
        r.require(p.heads <= GRID_YZ, "params.heads", format!("{} heads exceed the {GRID_YZ} blocks of a grid's y dimension", p.heads));
        r.into_result()?;
        to_i32("params.heads", p.heads)?;
        to_i32("params.k_dim", p.k_dim)?;
        to_i32("params.v_dim", p.v_dim)?;
        Ok(())
    }

    fn run(&self, plan: &KdaPrefillPlan, args: KdaPrefillArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), KdaPrefill::workspace_size(self, plan))?;
        KdaPrefill::supports(self, &plan.params)?;
        let p = &plan.params;
        let n = plan.num_seqs;
        // A batch of empty sequences still runs the schedule: it checks the device metadata.
        if n == 0 {
            return Ok(());
        }
        let ws = ws.ok_or_else(|| Error::invalid("workspace", "a batch with sequences needs the plan's workspace"))?;
        let lay = &plan.workspace;
        let base = self.runtime().device_ptr(ws);
        let desc = base.offset(lay.chunk_desc_offset as u64);
        let seq_base = base.offset(lay.seq_chunk_offset as u64);
        let rows = base.offset(lay.token_rows_offset as u64);
        let (heads, kd, vd, chunk) = (to_i32("params.heads", p.heads)?, to_i32("params.k_dim", p.k_dim)?, to_i32("params.v_dim", p.v_dim)?, p.chunk_size as i32);
        let row_len = to_i32("params.k_dim", lay.floats_per_token)?;
        to_i32("cu_seqlens", plan.tokens)?;
        let chunks = to_i32("cu_seqlens", lay.chunks)?;
        if n > GRID_YZ {
            return Err(Error::unsupported("cu_seqlens", format!("{n} sequences exceed the {GRID_YZ} blocks of a grid's z dimension")));
        }

        // Schedule: chunk descriptors and per-sequence chunk starts.
        let (ck_ptr, ck_dt) = match &args.checkpoint_offsets {
            Some(t) => (self.ptr(t.buf, &t.layout), dtype_code(t.layout.dtype)),
            None => (DevicePtr(0), dtype_code(DType::I64)),
        };
        let cu = &args.cu_seqlens;
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(cu.buf, &cu.layout));
        arg(&mut a, dtype_code(cu.layout.dtype));
        arg(&mut a, ck_ptr);
        arg(&mut a, ck_dt);
        arg(&mut a, plan.checkpoints_per_seq as i32);
        arg(&mut a, n as i32);
        arg(&mut a, chunk);
        arg(&mut a, desc);
        arg(&mut a, seq_base);
        arg(&mut a, plan.tokens as i64);
        arg(&mut a, chunks);
        self.push_checks(&mut a, stream)?;
        self.launch("kda_prefill_schedule", LaunchConfig::new(1u32, SCHEDULE_THREADS, 0), &mut a, stream)?;

        // K1: prepare, one block per (chunk, head).
        if chunks > 0 {
            let (gate, lb) = gate_code(p.gate);
            let (a_ptr, a_s) = opt_vec(self, args.a_log.as_ref());
            let (d_ptr, d_s) = opt_vec(self, args.dt_bias.as_ref());
            let mut a = KernelArgs::new();
            for t in [&args.q, &args.k, &args.v, &args.g_raw] {
                arg(&mut a, self.ptr(t.buf, &t.layout));
                arg(&mut a, dtype_code(t.layout.dtype));
                arg(&mut a, t.layout.strides[0] as i64);
                arg(&mut a, t.layout.strides[1] as i64);
            }
            arg(&mut a, self.ptr(args.beta.buf, &args.beta.layout));
            arg(&mut a, dtype_code(args.beta.layout.dtype));
            arg(&mut a, args.beta.layout.strides[0] as i64);
            arg(&mut a, a_ptr);
            arg(&mut a, a_s);
            arg(&mut a, d_ptr);
            arg(&mut a, d_s);
            arg(&mut a, desc);
            arg(&mut a, rows);
            arg(&mut a, heads);
            arg(&mut a, kd);
            arg(&mut a, vd);
            arg(&mut a, chunk);
            arg(&mut a, row_len);
            arg(&mut a, gate);
            arg(&mut a, lb);
            arg(&mut a, p.beta_sigmoid as i32);
            arg(&mut a, p.use_qk_l2norm as i32);
            arg(&mut a, p.q_scale);
            let cfg = LaunchConfig::new((chunks as u32, heads as u32), PREPARE_THREADS, prepare_shared(p.chunk_size) as u32);
            self.launch("kda_prefill_prepare", cfg, &mut a, stream)?;
        }

        // K2: recurrence, one block per (value split, head, sequence).
        let vb = self.value_split(p, n);
        let splits = p.v_dim.div_ceil(vb);
        let mut a = KernelArgs::new();
        arg(&mut a, desc);
        arg(&mut a, seq_base);
        arg(&mut a, rows);
        self.push_opt_typed(&mut a, args.state.as_ref().filter(|_| p.uses_state_pool()).map(TensorMut::parts), 3);
        self.push_opt_typed(&mut a, args.state_indices.as_ref().map(TensorRef::parts), 0);
        self.push_opt(&mut a, args.checkpoint_state.as_ref().map(TensorMut::parts), 4);
        arg(&mut a, plan.checkpoints_per_seq.max(1) as i32);
        let o = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, o));
        arg(&mut a, dtype_code(o.dtype));
        arg(&mut a, o.strides[0] as i64);
        arg(&mut a, o.strides[1] as i64);
        arg(&mut a, heads);
        arg(&mut a, kd);
        arg(&mut a, vd);
        arg(&mut a, vb as i32);
        arg(&mut a, chunk);
        arg(&mut a, row_len);
        arg(&mut a, (p.state_layout == KdaStateLayout::VMajor) as i32);
        arg(&mut a, p.read_initial_state as i32);
        arg(&mut a, p.write_final_state as i32);
        arg(&mut a, i32::try_from(p.state_slots).unwrap_or(i32::MAX));
        self.push_checks(&mut a, stream)?;
        let grid = (splits as u32, heads as u32, n as u32);
        let cfg = LaunchConfig::new(grid, RECURRENCE_THREADS, recurrence_shared(p, vb) as u32);
        self.launch("kda_prefill_recurrence", cfg, &mut a, stream)
    }
}
