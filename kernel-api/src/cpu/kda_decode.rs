use super::conv1d::{read_slot, write_slot};
use super::{math, read_f32, read_i64, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::Result;
use crate::ops::kda_decode::{validate_decode_indices, KDA_L2NORM_EPS};
use crate::ops::kda_gate::kda_gate_value;
use crate::ops::{
    check_workspace, KdaDecode, KdaDecodeArgs, KdaDecodeParams, KdaDecodePlan, KdaOutputNorm, KdaStateLayout,
};
use crate::tensor::{Layout, TensorRef};

/// Dot product with f64 accumulation.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>() as f32
}

/// Offset of S[i][j] (key i, value j) inside one head's stored state.
fn state_offset(layout: KdaStateLayout, k: usize, v: usize, i: usize, j: usize) -> usize {
    match layout {
        KdaStateLayout::KMajor => i * v + j,
        KdaStateLayout::VMajor => j * k + i,
    }
}

/// One head's delta-rule step on S (K×V, row-major, f32). Returns o = Sᵀq after the update.
fn delta_rule_step(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], alpha: &[f32], beta: f32) -> Vec<f32> {
    let vd = v.len();
    for (row, &a) in s.chunks_exact_mut(vd).zip(alpha) {
        row.iter_mut().for_each(|x| *x *= a);
    }
    let column = |s: &[f32], j: usize| -> Vec<f32> { (0..k.len()).map(|i| s[i * vd + j]).collect() };
    // r = v − Sᵀk uses the decayed S.
    let r: Vec<f32> = (0..vd).map(|j| v[j] - dot(&column(s, j), k)).collect();
    for (row, &ki) in s.chunks_exact_mut(vd).zip(k) {
        for (x, &rj) in row.iter_mut().zip(&r) {
            *x += beta * ki * rj;
        }
    }
    (0..vd).map(|j| dot(&column(s, j), q)).collect()
}

impl KdaDecode for CpuBackend {
    fn supports(&self, _params: &KdaDecodeParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &KdaDecodePlan,
        mut args: KdaDecodeArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), KdaDecode::workspace_size(self, plan))?;
        let p = &plan.params;
        let (bt, h, kd, vd, w) = (p.batch, p.heads, p.head_k, p.head_v, p.conv_width);
        let d = p.channels();
        let hist_len = w - 1;
        // The kernel reads the device indices: re-validate those values.
        let slots = read_i64(&args.state_indices)?;
        validate_decode_indices(&slots, p.state_slots, "state_indices")?;
        let x = read_f32(&args.x_qkv)?;
        let conv_w = read_f32(&args.conv_weight)?;
        let g_raw = read_f32(&args.g_raw)?;
        let beta_in = read_f32(&args.beta)?;
        let a_log = match &args.a_log {
            // Only the first H entries are used (K3 pads A_log to 128): read just those, so a long
            // declared length (even over a zero stride) costs nothing.
            Some(t) => read_f32(&TensorRef::new(t.buf, Layout { shape: vec![h], ..t.layout.clone() }))?,
            None => Vec::new(), // Precomputed gate: never read
        };
        let dt_bias = match &args.dt_bias {
            Some(t) => read_f32(t)?,
            None => vec![0.0; h * kd],
        };
        let gate = match &args.output_gate {
            Some(t) => read_f32(t)?,
            None => Vec::new(),
        };
        let norm_w = match &args.norm_weight {
            Some(t) => read_f32(t)?,
            None => Vec::new(),
        };
        let scale = p.effective_scale();
        let mut out = vec![0f32; bt * h * vd];
        for (b, &slot) in slots.iter().enumerate() {
            if slot == 0 {
                continue; // null slot: zero output, pools untouched
            }
            let slot = slot as usize;

            // Short conv + SiLU on every packed channel, shifting the conv state.
            let history = read_slot(&args.conv_state, slot)?;
            let mut new_history = vec![0f32; d * hist_len];
            let mut u = vec![0f32; d];
            let mut window = vec![0f32; w];
            for c in 0..d {
                window[..hist_len].copy_from_slice(&history[c * hist_len..(c + 1) * hist_len]);
                window[hist_len] = x[b * d + c];
                u[c] = math::silu(dot(&conv_w[c * w..(c + 1) * w], &window));
                new_history[c * hist_len..(c + 1) * hist_len].copy_from_slice(&window[1..]);
            }
            write_slot(&mut args.conv_state, slot, &new_history)?;

            let mut state = read_slot(&args.recurrent_state, slot)?;
            let head_size = kd * vd;
            for hh in 0..h {
                let mut q = u[hh * kd..(hh + 1) * kd].to_vec();
                let mut k = u[h * kd + hh * kd..h * kd + (hh + 1) * kd].to_vec();
                let v = &u[2 * h * kd + hh * vd..2 * h * kd + (hh + 1) * vd];
                if p.qk_l2norm {
                    math::l2_normalize(&mut q, KDA_L2NORM_EPS);
                    math::l2_normalize(&mut k, KDA_L2NORM_EPS);
                }
                q.iter_mut().for_each(|x| *x *= scale);
                let a = a_log.get(hh).copied().unwrap_or(0.0);
                let row = (b * h + hh) * kd;
                let alpha: Vec<f32> =
                    (0..kd).map(|i| kda_gate_value(p.gate, g_raw[row + i], a, dt_bias[hh * kd + i]).exp()).collect();
                let bv = beta_in[b * h + hh];
                let beta = if p.beta_sigmoid { math::sigmoid(bv) } else { bv };

                let stored = &mut state[hh * head_size..(hh + 1) * head_size];
                let mut s = vec![0f32; head_size];
                for i in 0..kd {
                    for j in 0..vd {
                        s[i * vd + j] = stored[state_offset(p.state_layout, kd, vd, i, j)];
                    }
                }
                let o = delta_rule_step(&mut s, &q, &k, v, &alpha, beta);
                for i in 0..kd {
                    for j in 0..vd {
                        stored[state_offset(p.state_layout, kd, vd, i, j)] = s[i * vd + j];
                    }
                }

                let y = &mut out[(b * h + hh) * vd..(b * h + hh + 1) * vd];
                match p.output_norm {
                    KdaOutputNorm::None => y.copy_from_slice(&o),
                    KdaOutputNorm::GatedRmsNorm { eps } => {
                        let inv = math::rms_inv(&o, eps);
                        let g = &gate[(b * h + hh) * vd..(b * h + hh + 1) * vd];
                        for j in 0..vd {
                            y[j] = norm_w[j] * o[j] * inv * math::sigmoid(g[j]);
                        }
                    }
                }
            }
            write_slot(&mut args.recurrent_state, slot, &state)?;
        }
        write_f32(&mut args.out, &out)
    }
}
