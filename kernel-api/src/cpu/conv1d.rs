use super::{math, read_f32, read_i64, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::conv1d::{validate_cu_seqlens, validate_slot_indices};
use crate::ops::{
    check_workspace, CausalConv1d, CausalConv1dArgs, CausalConv1dParams, CausalConv1dPlan, ConvActivation,
};
use crate::tensor::{Layout, TensorMut, TensorRef};

/// The layout of slot `slot` of a pool tensor (its leading dimension dropped).
fn slot_layout(pool: &Layout, slot: usize) -> Result<Layout> {
    let slots = pool.shape.first().copied().unwrap_or(0);
    if slot >= slots || pool.strides.is_empty() {
        return Err(Error::invalid("state_indices", format!("slot {slot} is outside a pool of {slots} slots")));
    }
    Ok(Layout {
        dtype: pool.dtype,
        shape: pool.shape[1..].to_vec(),
        strides: pool.strides[1..].to_vec(),
        offset: pool.offset + slot * pool.strides[0],
    })
}

/// All values of one pool slot in logical row-major order, decoded to f32.
pub(super) fn read_slot(pool: &TensorMut<'_, CpuBackend>, slot: usize) -> Result<Vec<f32>> {
    read_f32(&TensorRef::new(&*pool.buf, slot_layout(&pool.layout, slot)?))
}

/// Overwrites one pool slot (values in logical row-major order), rounding once to the pool dtype;
/// every other slot keeps its bytes.
pub(super) fn write_slot(pool: &mut TensorMut<'_, CpuBackend>, slot: usize, values: &[f32]) -> Result<()> {
    let layout = slot_layout(&pool.layout, slot)?;
    write_f32(&mut TensorMut::new(&mut *pool.buf, layout), values)
}

fn activate(act: ConvActivation, x: f32) -> f32 {
    match act {
        ConvActivation::Identity => x,
        ConvActivation::Silu => math::silu(x),
    }
}

impl CausalConv1d for CpuBackend {
    fn supports(&self, _params: &CausalConv1dParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &CausalConv1dPlan,
        mut args: CausalConv1dArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), CausalConv1d::workspace_size(self, plan))?;
        let p = &plan.params;
        let (d, w) = (p.dim, p.width);
        let hist_len = w - 1;
        // The device copies of the indices are what a kernel reads: validate those values.
        let cu = read_i64(&args.cu_seqlens)?;
        let (n, t, _) = validate_cu_seqlens(&cu, Some(plan.total_tokens), "cu_seqlens")?;
        let slots: Vec<usize> = match &args.state_indices {
            Some(ix) => {
                let v = read_i64(ix)?;
                validate_slot_indices(&v, p.state_slots, "state_indices")?;
                v.into_iter().map(|s| s as usize).collect()
            }
            None => (0..n).collect(),
        };
        let x = read_f32(&args.x)?;
        let weight = read_f32(&args.weight)?;
        let mut out = vec![0f32; t * d];
        for seq in 0..n {
            let (start, end) = (cu[seq] as usize, cu[seq + 1] as usize);
            let len = end - start;
            if len == 0 {
                continue; // no output rows, state untouched
            }
            let slot = slots
                .get(seq)
                .copied()
                .ok_or_else(|| Error::invalid("state_indices", "fewer entries than sequences"))?;
            let history = match (&args.conv_state, p.read_initial_state) {
                (Some(pool), true) => read_slot(pool, slot)?,
                _ => vec![0f32; d * hist_len],
            };
            let mut final_state = vec![0f32; d * hist_len];
            let mut ext = Vec::with_capacity(hist_len + len);
            for c in 0..d {
                // ext = [history of c (oldest first), x_start..x_end of c]
                ext.clear();
                ext.extend_from_slice(&history[c * hist_len..(c + 1) * hist_len]);
                ext.extend((start..end).map(|row| x[row * d + c]));
                let taps = &weight[c * w..(c + 1) * w];
                for tt in 0..len {
                    let acc: f64 = taps.iter().zip(&ext[tt..tt + w]).map(|(&a, &b)| a as f64 * b as f64).sum();
                    out[(start + tt) * d + c] = activate(p.activation, acc as f32);
                }
                final_state[c * hist_len..(c + 1) * hist_len].copy_from_slice(&ext[len..]);
            }
            if p.write_final_state {
                let pool = args
                    .conv_state
                    .as_mut()
                    .ok_or_else(|| Error::invalid("conv_state", "required when writing state"))?;
                write_slot(pool, slot, &final_state)?;
            }
        }
        write_f32(&mut args.out, &out)
    }
}
