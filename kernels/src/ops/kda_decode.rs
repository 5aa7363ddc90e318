//! Fused KDA decode launcher (kernels/csrc/ops/kda_decode.cu): one block of [`THREADS`] per
//! (row, head); the head's state streams through a shared-memory tile of K × [`CHUNK`] f32.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::error::Reasons;
use kernel_api::ops::{
    check_workspace, KdaDecode, KdaDecodeArgs, KdaDecodeParams, KdaDecodePlan, KdaGateMode, KdaOutputNorm,
    KdaStateLayout,
};
use kernel_api::{Backend, Result, TensorRef};

/// Threads per block (`kda_decode_fused::kThreads`).
const THREADS: u32 = 128;
/// Value columns per shared tile (`kThreads / kGroup`).
const CHUNK: usize = 32;
/// Conv taps the kernel keeps in registers (`kMaxWidth`).
const MAX_WIDTH: usize = 8;
/// Static shared memory of the kernel (three reduction buffers of at most 4 warps), rounded up.
const STATIC_SHARED: usize = 64;

/// Dynamic shared bytes: q|k|v (2K+V), α (K), o (V) and the K × (CHUNK+1) state tile, in f32.
fn shared_bytes(p: &KdaDecodeParams) -> Option<usize> {
    let (k, v) = (p.head_k, p.head_v);
    let floats =
        k.checked_mul(2)?.checked_add(v)?.checked_add(k)?.checked_add(v)?.checked_add(k.checked_mul(CHUNK + 1)?)?;
    floats.checked_mul(4)
}

impl<R: Runtime> KdaDecode for GpuBackend<R> {
    fn supports(&self, p: &KdaDecodeParams) -> Result<()> {
        let mut r = Reasons::new();
        r.require(p.conv_width <= MAX_WIDTH, "params.conv_width", format!("the kernel holds at most {MAX_WIDTH} taps"));
        let fits = |v: Option<usize>| v.is_some_and(|v| i32::try_from(v).is_ok());
        // Checked here (not through `channels()`): supports may see params no plan validated.
        let channels =
            p.head_k.checked_mul(2).and_then(|x| x.checked_add(p.head_v)).and_then(|x| x.checked_mul(p.heads));
        r.require(fits(channels), "params.heads", "H·(2K+V) channels exceed the kernels' 32-bit range");
        r.require(fits(p.batch.checked_mul(p.heads)), "params.batch", "batch x heads blocks exceed the 32-bit grid");
        r.require(fits(Some(p.state_slots)), "params.state_slots", "slot count exceeds the kernels' 32-bit range");
        let limit = self.device_info().shared_mem_per_block;
        let smem = shared_bytes(p).and_then(|s| s.checked_add(STATIC_SHARED));
        r.require(smem.is_some_and(|s| s <= limit), "params.head_k", format!(
            "the K x {CHUNK} f32 state tile and head vectors need {smem:?} bytes of shared memory, the device has {limit}"
        ));
        r.into_result()
    }

    fn run(
        &self,
        plan: &KdaDecodePlan,
        args: KdaDecodeArgs<'_, Self>,
        ws: Option<&mut R::Buffer>,
        stream: &R::Stream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), KdaDecode::workspace_size(self, plan))?;
        KdaDecode::supports(self, &plan.params)?;
        let p = &plan.params;
        if p.batch == 0 {
            return Ok(());
        }
        let mut a = KernelArgs::new();
        let x = &args.x_qkv.layout;
        arg(&mut a, self.ptr(args.x_qkv.buf, x));
        arg(&mut a, dtype_code(x.dtype));
        arg(&mut a, x.strides[0] as i64);
        let cw = &args.conv_weight.layout;
        arg(&mut a, self.ptr(args.conv_weight.buf, cw));
        arg(&mut a, cw.strides[0] as i64);
        arg(&mut a, cw.strides[1] as i64);
        let cs = &args.conv_state.layout;
        arg(&mut a, self.ptr(&*args.conv_state.buf, cs));
        arg(&mut a, dtype_code(cs.dtype));
        for &s in &cs.strides {
            arg(&mut a, s as i64);
        }
        let g = &args.g_raw.layout;
        arg(&mut a, self.ptr(args.g_raw.buf, g));
        arg(&mut a, dtype_code(g.dtype));
        arg(&mut a, g.strides[0] as i64);
        arg(&mut a, g.strides[1] as i64);
        let be = &args.beta.layout;
        arg(&mut a, self.ptr(args.beta.buf, be));
        arg(&mut a, dtype_code(be.dtype));
        arg(&mut a, be.strides[0] as i64);
        arg(&mut a, be.strides[1] as i64);
        // A_log and dt_bias are read only by the gates that use them (check_args requires A_log there).
        let uses_gate = p.gate.uses_gate_params();
        self.push_opt(&mut a, args.a_log.as_ref().filter(|_| uses_gate).map(TensorRef::parts), 1);
        self.push_opt(&mut a, args.dt_bias.as_ref().filter(|_| uses_gate).map(TensorRef::parts), 1);
        let si = &args.state_indices.layout;
        arg(&mut a, self.ptr(args.state_indices.buf, si));
        arg(&mut a, si.strides[0] as i64);
        let st = &args.recurrent_state.layout;
        arg(&mut a, self.ptr(&*args.recurrent_state.buf, st));
        arg(&mut a, dtype_code(st.dtype));
        let (st_k, st_v) = match p.state_layout {
            KdaStateLayout::KMajor => (st.strides[2], st.strides[3]),
            KdaStateLayout::VMajor => (st.strides[3], st.strides[2]),
        };
        for s in [st.strides[0], st.strides[1], st_k, st_v] {
            arg(&mut a, s as i64);
        }
        // Tile loads walk whichever of k and v is closer to contiguous.
        arg(&mut a, i32::from(st_k < st_v));
        let (gated, eps) = match p.output_norm {
            KdaOutputNorm::GatedRmsNorm { eps } => (true, eps),
            KdaOutputNorm::None => (false, 0.0),
        };
        self.push_opt_typed(&mut a, args.output_gate.as_ref().filter(|_| gated).map(TensorRef::parts), 2);
        self.push_opt(&mut a, args.norm_weight.as_ref().filter(|_| gated).map(TensorRef::parts), 1);
        let out = &args.out.layout;
        arg(&mut a, self.ptr(&*args.out.buf, out));
        arg(&mut a, dtype_code(out.dtype));
        arg(&mut a, out.strides[0] as i64);
        arg(&mut a, out.strides[1] as i64);
        arg(&mut a, to_i32("params.heads", p.heads)?);
        arg(&mut a, to_i32("params.head_k", p.head_k)?);
        arg(&mut a, to_i32("params.head_v", p.head_v)?);
        arg(&mut a, to_i32("params.conv_width", p.conv_width)?);
        arg(&mut a, to_i32("params.state_slots", p.state_slots)?);
        let (mode, lower_bound) = match p.gate {
            KdaGateMode::LowerBound { lower_bound } => (0i32, lower_bound),
            KdaGateMode::Softplus => (1, 0.0),
            KdaGateMode::Precomputed => (2, 0.0),
        };
        arg(&mut a, mode);
        arg(&mut a, lower_bound);
        arg(&mut a, i32::from(p.beta_sigmoid));
        arg(&mut a, i32::from(p.qk_l2norm));
        arg(&mut a, p.effective_scale());
        arg(&mut a, i32::from(gated));
        arg(&mut a, eps);
        arg(&mut a, to_i32("params.batch", p.batch)?);
        self.push_checks(&mut a, stream)?;
        let blocks = p.batch.checked_mul(p.heads).unwrap_or(usize::MAX);
        let blocks = to_i32("params.batch x params.heads", blocks)? as u32;
        let smem = shared_bytes(p).unwrap_or(usize::MAX);
        let smem = u32::try_from(smem)
            .map_err(|_| kernel_api::Error::unsupported("params.head_k", "shared tile too large"))?;
        self.launch("kda_decode_fused_step", LaunchConfig::new(blocks, THREADS, smem), &mut a, stream)
    }
}
