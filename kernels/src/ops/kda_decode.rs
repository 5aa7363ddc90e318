//! Fused KDA decode launcher (kernels/csrc/ops/kda_decode.cu). Two schedules:
//!
//! - V-split (f32 K-major state with unit v stride and 16-byte aligned rows, K ≤ [`SPLIT_MAX_K`],
//!   K and V multiples of 4): `kda_decode_prepare` (one block per (row, head)) writes the head's
//!   q̂, k̂, α, v and β to a workspace row; `kda_decode_fused_step` runs the delta rule on a grid
//!   of (row·head, V / (4·vecs)) blocks of [`SPLIT_LANES`]·vecs threads, each holding its K × 4·vecs
//!   slice of the state in registers; the gated RMSNorm runs from the split blocks' o and Σo²
//!   partials in each row's last split block to finish (no third launch) when the output gate,
//!   norm weight and `out` take 16-byte vectors, else in `kda_decode_norm_unaligned` after the
//!   split. `vecs` is the largest of 4, 2, 1 (and at most the column vectors of a head) that
//!   still gives 4 blocks per SM / CU of the device.
//! - Otherwise `kda_decode_generic_step`: one block of [`THREADS`] per (row, head), the state
//!   streamed through a shared-memory tile of K × [`CHUNK`] f32.
//!
//! prepare, the norm and generic each have a 16-byte form (`kda_decode_prepare`, the norm folded
//! into the split, `kda_decode_generic_step`: inputs, conv history, output gate, norm weight,
//! outputs and, in generic, the state move as 16-byte vectors of 8 elements) and an
//! `*_unaligned` form that takes any layout the contract allows. The host picks the 16-byte
//! form when K and V are multiples of 8 and the tensors are packed and aligned ([`vec8`],
//! `kda_vector_inputs`, `kda_vector_outputs`), as K3's are.

use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{DevicePtr, KernelArgs, LaunchConfig, Runtime};
use kernel_api::error::Reasons;
use kernel_api::ops::{
    check_workspace, KdaDecode, KdaDecodeArgs, KdaDecodeParams, KdaDecodePlan, KdaGateMode, KdaOutputNorm,
    KdaStateLayout,
};
use kernel_api::{Backend, DType, Result, TensorRef};

/// Threads per block (`kda_decode_fused::kThreads`).
const THREADS: u32 = 128;
/// Value columns per shared tile (`kThreads / kGroup`).
const CHUNK: usize = 32;
/// Static shared memory of the kernel (three reduction buffers of at most 4 warps), rounded up.
const STATIC_SHARED: usize = 64;
/// V-split: k lanes per 4-column vector (`kSplitLanes`), largest K (`kSplitLanes · kSplitRows`), column
/// vectors per block at most (`kSplitMaxVecs`), workspace row header floats (`kWsHeader`).
const SPLIT_LANES: u32 = 64;
const SPLIT_MAX_K: usize = 128;
const SPLIT_MAX_VECS: usize = 4;
const WS_HEADER: usize = 4;
/// `kda_decode_fused_step`'s output modes (`kNormNone`, `kNormLaunched`, `kNormFold`).
const NORM_NONE: i32 = 0;
const NORM_LAUNCHED: i32 = 1;
const NORM_FOLD: i32 = 2;
/// Blocks per SM / CU the V-split aims for at small batch (latency hiding by parallelism).
const SPLIT_BLOCKS_PER_UNIT: usize = 4;

/// Whether the plan's shapes allow the V-split (the tensors' dtypes, strides and alignment are
/// checked at run time; the workspace is sized whenever the shapes allow it).
fn split_shapes(p: &KdaDecodeParams) -> bool {
    p.state_layout == KdaStateLayout::KMajor
        && p.head_k <= SPLIT_MAX_K
        && p.head_k % 4 == 0
        && p.head_v % 4 == 0
        && p.head_v / 4 <= 65_535
}

/// Floats per workspace row: header | q̂ | k̂ | α | v | o | Σo² per column vector, padded to 4.
fn ws_row(p: &KdaDecodeParams) -> usize {
    (WS_HEADER + 3 * p.head_k + 2 * p.head_v + p.head_v / 4).next_multiple_of(4)
}

/// Column vectors per split block: the widest block that still fills the device.
fn split_vecs(rows: usize, col_vecs: usize, units: usize) -> usize {
    let want = SPLIT_BLOCKS_PER_UNIT * units.max(1);
    let mut vecs = SPLIT_MAX_VECS.min(col_vecs.next_power_of_two());
    while vecs > 1 && rows.saturating_mul(col_vecs.div_ceil(vecs)) < want {
        vecs /= 2;
    }
    vecs
}

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

    fn workspace_size(&self, plan: &KdaDecodePlan) -> usize {
        let p = &plan.params;
        if !split_shapes(p) {
            return 0;
        }
        p.batch.saturating_mul(p.heads).saturating_mul(ws_row(p)).saturating_mul(4)
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
        let st = &args.recurrent_state.layout;
        let st_ptr = self.ptr(&*args.recurrent_state.buf, st);
        let ws_ptr = ws.as_deref().map(|w| self.ptr(w, &kernel_api::Layout::contiguous(DType::F32, &[0])));
        // K-major: strides [slot, head, k, v]; the V-split moves each k row as 16-byte vectors.
        let split = split_shapes(p)
            && st.dtype == DType::F32
            && st.strides[3] == 1
            && st.strides[..3].iter().all(|s| s % 4 == 0)
            && st_ptr.0 % 16 == 0
            && ws_ptr.is_some_and(|w| w.0 % 16 == 0);
        match ws_ptr.filter(|_| split) {
            Some(ws_ptr) => self.kda_run_split(p, &args, ws_ptr, st_ptr, stream),
            None => self.kda_run_generic(p, &args, st_ptr, stream),
        }
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// Arguments the generic and prepare kernels share: x_qkv, the conv pool, the gate inputs
    /// and the state indices.
    fn kda_push_head_inputs(&self, a: &mut KernelArgs, p: &KdaDecodeParams, args: &KdaDecodeArgs<'_, Self>) {
        let x = &args.x_qkv.layout;
        arg(a, self.ptr(args.x_qkv.buf, x));
        arg(a, dtype_code(x.dtype));
        arg(a, x.strides[0] as i64);
        let cw = &args.conv_weight.layout;
        arg(a, self.ptr(args.conv_weight.buf, cw));
        arg(a, cw.strides[0] as i64);
        arg(a, cw.strides[1] as i64);
        let cs = &args.conv_state.layout;
        arg(a, self.ptr(&*args.conv_state.buf, cs));
        arg(a, dtype_code(cs.dtype));
        for &s in &cs.strides {
            arg(a, s as i64);
        }
        let g = &args.g_raw.layout;
        arg(a, self.ptr(args.g_raw.buf, g));
        arg(a, dtype_code(g.dtype));
        arg(a, g.strides[0] as i64);
        arg(a, g.strides[1] as i64);
        let be = &args.beta.layout;
        arg(a, self.ptr(args.beta.buf, be));
        arg(a, dtype_code(be.dtype));
        arg(a, be.strides[0] as i64);
        arg(a, be.strides[1] as i64);
        // A_log and dt_bias are read only by the gates that use them (check_args requires A_log there).
        let uses_gate = p.gate.uses_gate_params();
        self.push_opt(a, args.a_log.as_ref().filter(|_| uses_gate).map(TensorRef::parts), 1);
        self.push_opt(a, args.dt_bias.as_ref().filter(|_| uses_gate).map(TensorRef::parts), 1);
        let si = &args.state_indices.layout;
        arg(a, self.ptr(args.state_indices.buf, si));
        arg(a, si.strides[0] as i64);
    }

    fn kda_push_out(&self, a: &mut KernelArgs, args: &KdaDecodeArgs<'_, Self>) {
        let out = &args.out.layout;
        arg(a, self.ptr(&*args.out.buf, out));
        arg(a, dtype_code(out.dtype));
        arg(a, out.strides[0] as i64);
        arg(a, out.strides[1] as i64);
    }

    /// Gate mode code, lower bound, β sigmoid, q/k L2 norm, scale.
    fn kda_push_gate_scalars(a: &mut KernelArgs, p: &KdaDecodeParams) {
        let (mode, lower_bound) = match p.gate {
            KdaGateMode::LowerBound { lower_bound } => (0i32, lower_bound),
            KdaGateMode::Softplus => (1, 0.0),
            KdaGateMode::Precomputed => (2, 0.0),
        };
        arg(a, mode);
        arg(a, lower_bound);
        arg(a, i32::from(p.beta_sigmoid));
        arg(a, i32::from(p.qk_l2norm));
        arg(a, p.effective_scale());
    }

    fn kda_push_norm_gate(&self, a: &mut KernelArgs, args: &KdaDecodeArgs<'_, Self>, gated: bool) {
        self.push_opt_typed(a, args.output_gate.as_ref().filter(|_| gated).map(TensorRef::parts), 2);
        self.push_opt(a, args.norm_weight.as_ref().filter(|_| gated).map(TensorRef::parts), 1);
    }

    fn kda_run_generic(
        &self,
        p: &KdaDecodeParams,
        args: &KdaDecodeArgs<'_, Self>,
        st_ptr: DevicePtr,
        stream: &R::Stream,
    ) -> Result<()> {
        let mut a = KernelArgs::new();
        self.kda_push_head_inputs(&mut a, p, args);
        let st = &args.recurrent_state.layout;
        arg(&mut a, st_ptr);
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
        let (gated, eps) = norm_of(p);
        self.kda_push_norm_gate(&mut a, args, gated);
        self.kda_push_out(&mut a, args);
        push_dims(&mut a, p)?;
        arg(&mut a, to_i32("params.conv_width", p.conv_width)?);
        arg(&mut a, to_i32("params.state_slots", p.state_slots)?);
        Self::kda_push_gate_scalars(&mut a, p);
        arg(&mut a, i32::from(gated));
        arg(&mut a, eps);
        arg(&mut a, to_i32("params.batch", p.batch)?);
        self.push_checks(&mut a, stream)?;
        let blocks = rows_of(p)?;
        let smem = shared_bytes(p).unwrap_or(usize::MAX);
        // The 16-byte kernel also stages the head's x and conv history ((2K+V)·W f32).
        let staged = smem.saturating_add(staged_bytes(p));
        let (fast, slow) = if st_k < st_v { (st_k, st_v) } else { (st_v, st_k) };
        let rest = [st.strides[0], st.strides[1], slow];
        let vector = fast == 1
            && vec8(st_ptr, &rest)
            && staged.saturating_add(STATIC_SHARED) <= self.device_info().shared_mem_per_block
            && self.kda_vector_outputs(args, gated)
            && self.kda_vector_inputs(p, args);
        let (kernel, smem) =
            if vector { ("kda_decode_generic_step", staged) } else { ("kda_decode_generic_step_unaligned", smem) };
        let smem = u32::try_from(smem)
            .map_err(|_| kernel_api::Error::unsupported("params.head_k", "shared tile too large"))?;
        self.launch(kernel, LaunchConfig::new(blocks, THREADS, smem), &mut a, stream)
    }

    fn kda_run_split(
        &self,
        p: &KdaDecodeParams,
        args: &KdaDecodeArgs<'_, Self>,
        ws: DevicePtr,
        st_ptr: DevicePtr,
        stream: &R::Stream,
    ) -> Result<()> {
        let rows = rows_of(p)?;
        let row = ws_row(p) as i64;
        let (gated, eps) = norm_of(p);
        // 1. conv, gates, q/k norms into the workspace rows.
        let mut a = KernelArgs::new();
        self.kda_push_head_inputs(&mut a, p, args);
        arg(&mut a, ws);
        arg(&mut a, row);
        self.kda_push_out(&mut a, args);
        push_dims(&mut a, p)?;
        arg(&mut a, to_i32("params.conv_width", p.conv_width)?);
        arg(&mut a, to_i32("params.state_slots", p.state_slots)?);
        Self::kda_push_gate_scalars(&mut a, p);
        arg(&mut a, to_i32("params.batch", p.batch)?);
        self.push_checks(&mut a, stream)?;
        // q | k | v and α; the 16-byte kernel also stages the head's x and conv history.
        let head = 4 * (3 * p.head_k + p.head_v);
        let staged = head.saturating_add(staged_bytes(p));
        let fits = staged.saturating_add(STATIC_SHARED) <= self.device_info().shared_mem_per_block;
        let (prepare, smem) = if fits && self.kda_vector_outputs(args, false) && self.kda_vector_inputs(p, args) {
            ("kda_decode_prepare", staged)
        } else {
            ("kda_decode_prepare_unaligned", head)
        };
        self.launch(prepare, LaunchConfig::new(rows, THREADS, smem as u32), &mut a, stream)?;
        // 2. the delta rule on the state slices.
        let col_vecs = p.head_v / 4;
        let vecs = split_vecs(rows as usize, col_vecs, self.device_info().compute_units as usize);
        let st = &args.recurrent_state.layout;
        let mut a = KernelArgs::new();
        arg(&mut a, ws);
        arg(&mut a, row);
        arg(&mut a, st_ptr);
        for s in &st.strides[..3] {
            arg(&mut a, *s as i64);
        }
        // The gated RMSNorm: folded into the split's last block per row when its operands take
        // 16-byte vectors (`kNormFold`), else a third launch (`kNormLaunched`).
        let norm_mode = match (gated, gated && self.kda_vector_outputs(args, true)) {
            (false, _) => NORM_NONE,
            (true, true) => NORM_FOLD,
            (true, false) => NORM_LAUNCHED,
        };
        self.kda_push_norm_gate(&mut a, args, norm_mode == NORM_FOLD);
        self.kda_push_out(&mut a, args);
        push_dims(&mut a, p)?;
        arg(&mut a, to_i32("params.state_slots", p.state_slots)?);
        arg(&mut a, vecs as i32);
        arg(&mut a, norm_mode);
        arg(&mut a, eps);
        self.push_checks(&mut a, stream)?;
        let grid = (rows, col_vecs.div_ceil(vecs) as u32);
        let smem = 4 * 3 * p.head_k as u32;
        self.launch("kda_decode_fused_step", LaunchConfig::new(grid, SPLIT_LANES * vecs as u32, smem), &mut a, stream)?;
        if norm_mode != NORM_LAUNCHED {
            return Ok(());
        }
        // 3. the gated RMSNorm over each head's V outputs, for operands off the 16-byte path.
        let mut a = KernelArgs::new();
        arg(&mut a, ws);
        arg(&mut a, row);
        self.kda_push_norm_gate(&mut a, args, gated);
        self.kda_push_out(&mut a, args);
        push_dims(&mut a, p)?;
        arg(&mut a, eps);
        self.launch("kda_decode_norm_unaligned", LaunchConfig::new(rows, THREADS, 0), &mut a, stream)
    }

    /// Whether `out` (and with `gated`, the output gate and norm weight) take 8-column vectors:
    /// 16-byte aligned rows (strides multiples of 8 elements), a unit-stride aligned norm weight.
    fn kda_vector_outputs(&self, args: &KdaDecodeArgs<'_, Self>, gated: bool) -> bool {
        let out = &args.out.layout;
        let gate_ok = |g: &TensorRef<'_, Self>| vec8(self.ptr(g.buf, &g.layout), &g.layout.strides[..2]);
        let weight_ok = |n: &TensorRef<'_, Self>| n.layout.strides[0] == 1 && vec8(self.ptr(n.buf, &n.layout), &[]);
        vec8(self.ptr(&*args.out.buf, out), &out.strides[..2])
            && (!gated || args.output_gate.as_ref().is_some_and(gate_ok) && args.norm_weight.as_ref().is_some_and(weight_ok))
    }

    /// Whether the 16-byte kernels (`kda_decode_prepare`, `kda_decode_generic_step`) may read
    /// the head inputs: K and V multiples of 8, and x, g_raw, the conv weights, the conv pool
    /// and dt_bias laid out so that every head's run of channels starts 16-byte aligned
    /// (`kda_decode_head_inputs<true>`). K3's tensors (contiguous, fresh allocations) qualify.
    fn kda_vector_inputs(&self, p: &KdaDecodeParams, args: &KdaDecodeArgs<'_, Self>) -> bool {
        let (x, g) = (&args.x_qkv.layout, &args.g_raw.layout);
        let (cw, cs, w) = (&args.conv_weight.layout, &args.conv_state.layout, p.conv_width);
        let dt_bias = args.dt_bias.as_ref().filter(|_| p.gate.uses_gate_params());
        p.head_k.is_multiple_of(8)
            && p.head_v.is_multiple_of(8)
            && vec8(self.ptr(args.x_qkv.buf, x), &x.strides[..1])
            && vec8(self.ptr(args.g_raw.buf, g), &g.strides[..2])
            && cw.strides[..] == [w, 1]
            && vec8(self.ptr(args.conv_weight.buf, cw), &[])
            && (w == 1 || cs.strides[1..] == [w - 1, 1] && vec8(self.ptr(&*args.conv_state.buf, cs), &cs.strides[..1]))
            && dt_bias.is_none_or(|t| t.layout.strides[0] == 1 && vec8(self.ptr(t.buf, &t.layout), &[]))
    }
}

/// Shared bytes the 16-byte prepare and generic kernels add for the head's conv history and x:
/// (2K + V)·W f32 (saturating: a width the device cannot hold picks the `*_unaligned` kernel).
fn staged_bytes(p: &KdaDecodeParams) -> usize {
    (2 * p.head_k + p.head_v).saturating_mul(p.conv_width).saturating_mul(4)
}

/// Whether a tensor takes vectors of 8 elements (16 bytes of bf16, two 16-byte f32 halves):
/// its address 16-byte aligned and the given strides (in elements) multiples of 8.
fn vec8(ptr: DevicePtr, strides: &[usize]) -> bool {
    ptr.0.is_multiple_of(16) && strides.iter().all(|s| s.is_multiple_of(8))
}

/// Whether the output goes through the gated RMSNorm, and its epsilon.
fn norm_of(p: &KdaDecodeParams) -> (bool, f32) {
    match p.output_norm {
        KdaOutputNorm::GatedRmsNorm { eps } => (true, eps),
        KdaOutputNorm::None => (false, 0.0),
    }
}

/// heads, head_k, head_v as the kernels take them.
fn push_dims(a: &mut KernelArgs, p: &KdaDecodeParams) -> Result<()> {
    arg(a, to_i32("params.heads", p.heads)?);
    arg(a, to_i32("params.head_k", p.head_k)?);
    arg(a, to_i32("params.head_v", p.head_v)?);
    Ok(())
}

/// batch × heads: one (row, head) per block (row) of the grid.
fn rows_of(p: &KdaDecodeParams) -> Result<u32> {
    let rows = p.batch.checked_mul(p.heads).unwrap_or(usize::MAX);
    Ok(to_i32("params.batch x params.heads", rows)? as u32)
}
