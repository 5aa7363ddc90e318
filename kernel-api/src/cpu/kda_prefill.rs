//! CPU reference of the KDA chunked prefill: the chunkwise WY form of k3-architecture.md §2.3,
//! in f64 inside a chunk, with the state rounded to f32 between chunks (the f32 state every
//! reference keeps). One rayon task per (sequence, head).

use super::math::{l2_normalize, sigmoid};
use super::{read_f32, read_i64, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::{
    check_workspace, kda_gate_value, KdaPrefill, KdaPrefillArgs, KdaPrefillParams, KdaPrefillPlan, KdaStateLayout,
    KDA_L2_EPS,
};
use crate::tensor::{Layout, TensorMut, TensorRef};
use rayon::prelude::*;

impl KdaPrefill for CpuBackend {
    fn supports(&self, _params: &KdaPrefillParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &KdaPrefillPlan,
        mut args: KdaPrefillArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), KdaPrefill::workspace_size(self, plan))?;
        check_metadata(plan, &args)?;
        let p = &plan.params;
        let (h_n, kd, vd) = (p.heads, p.k_dim, p.v_dim);
        let inputs = Inputs {
            q: read_f32(&args.q)?,
            k: read_f32(&args.k)?,
            v: read_f32(&args.v)?,
            g_raw: read_f32(&args.g_raw)?,
            beta: read_f32(&args.beta)?,
            // Precomputed gates read neither tensor; zeros stand in for them.
            a_log: match &args.a_log {
                Some(t) if p.gate.uses_gate_params() => read_f32(t)?,
                _ => vec![0.0; h_n],
            },
            dt_bias: match &args.dt_bias {
                Some(t) if p.gate.uses_gate_params() => read_f32(t)?,
                _ => vec![0.0; h_n * kd],
            },
        };

        // Initial states, K-major per head: [H][K·V] for each sequence.
        let head_len = kd * vd;
        let mut initial: Vec<Vec<f32>> = Vec::with_capacity(plan.num_seqs);
        for n in 0..plan.num_seqs {
            match (&args.state, p.read_initial_state) {
                (Some(pool), true) => {
                    let slot = sub_ref(pool.buf, &pool.layout, &[plan.slot(n)]);
                    initial.push(to_k_major(&read_f32(&slot)?, p.state_layout, h_n, kd, vd));
                }
                _ => initial.push(vec![0.0; h_n * head_len]),
            }
        }

        let tasks: Vec<(usize, usize)> = (0..plan.num_seqs).flat_map(|n| (0..h_n).map(move |h| (n, h))).collect();
        let results: Vec<HeadResult> = tasks
            .par_iter()
            .map(|&(n, h)| run_head(plan, &inputs, n, h, &initial[n][h * head_len..(h + 1) * head_len]))
            .collect();

        let mut out = vec![0f32; plan.tokens * h_n * vd];
        let mut finals: Vec<Vec<f32>> = vec![vec![0.0; h_n * head_len]; plan.num_seqs];
        let c_n = plan.checkpoints_per_seq;
        let mut ckpts: Vec<Option<Vec<f32>>> = vec![None; plan.num_seqs * c_n];
        for (&(n, h), r) in tasks.iter().zip(results) {
            for (j, t) in plan.seq_range(n).enumerate() {
                out[(t * h_n + h) * vd..(t * h_n + h + 1) * vd].copy_from_slice(&r.out[j * vd..(j + 1) * vd]);
            }
            finals[n][h * head_len..(h + 1) * head_len].copy_from_slice(&r.final_state);
            for (c, s) in r.checkpoints {
                ckpts[n * c_n + c].get_or_insert_with(|| vec![0.0; h_n * head_len])[h * head_len..(h + 1) * head_len]
                    .copy_from_slice(&s);
            }
        }

        write_f32(&mut args.out, &out)?;
        if let (Some(pool), true) = (args.state.as_mut(), p.write_final_state) {
            for (n, state) in finals.iter().enumerate() {
                let mut slot = sub_mut(pool, &[plan.slot(n)]);
                write_f32(&mut slot, &from_k_major(state, p.state_layout, h_n, kd, vd))?;
            }
        }
        if let Some(cs) = args.checkpoint_state.as_mut() {
            for (e, state) in ckpts.iter().enumerate() {
                if let Some(state) = state {
                    let mut dst = sub_mut(cs, &[e / c_n, e % c_n]);
                    write_f32(&mut dst, &from_k_major(state, p.state_layout, h_n, kd, vd))?;
                }
            }
        }
        Ok(())
    }
}

/// The device copies of the batch metadata must hold what the plan validated.
fn check_metadata(plan: &KdaPrefillPlan, a: &KdaPrefillArgs<'_, CpuBackend>) -> Result<()> {
    let same = |t: &TensorRef<'_, CpuBackend>, host: &[i64], field: &str| -> Result<()> {
        let dev = read_i64(t)?;
        match dev.iter().zip(host).position(|(d, h)| d != h) {
            None if dev.len() == host.len() => Ok(()),
            Some(i) => Err(Error::invalid(field, format!("entry {i} is {} on the device but {} in the plan", dev[i], host[i]))),
            None => Err(Error::invalid(field, "length differs from the plan")),
        }
    };
    same(&a.cu_seqlens, &plan.cu_seqlens, "cu_seqlens")?;
    if let (Some(t), Some(h)) = (&a.state_indices, &plan.state_indices) {
        same(t, h, "state_indices")?;
    }
    if let Some(t) = &a.checkpoint_offsets {
        same(t, &plan.checkpoint_offsets, "checkpoint_offsets")?;
    }
    Ok(())
}

/// The sub-tensor at leading indices `lead` (validated in range by the plan).
fn sub_layout(l: &Layout, lead: &[usize]) -> Layout {
    let mut idx = lead.to_vec();
    idx.resize(l.rank(), 0);
    Layout {
        dtype: l.dtype,
        shape: l.shape[lead.len()..].to_vec(),
        strides: l.strides[lead.len()..].to_vec(),
        offset: l.index(&idx),
    }
}

fn sub_ref<'a>(buf: &'a HostBuffer, l: &Layout, lead: &[usize]) -> TensorRef<'a, CpuBackend> {
    TensorRef::new(buf, sub_layout(l, lead))
}

fn sub_mut<'a>(t: &'a mut TensorMut<'_, CpuBackend>, lead: &[usize]) -> TensorMut<'a, CpuBackend> {
    let layout = sub_layout(&t.layout, lead);
    TensorMut::new(&mut *t.buf, layout)
}

/// `[H, d1, d2]` in `layout` to `[H, K, V]`.
fn to_k_major(s: &[f32], layout: KdaStateLayout, h_n: usize, kd: usize, vd: usize) -> Vec<f32> {
    let mut out = vec![0f32; h_n * kd * vd];
    for h in 0..h_n {
        for i in 0..kd {
            for j in 0..vd {
                out[(h * kd + i) * vd + j] = s[h * kd * vd + layout.index(i, j, kd, vd)];
            }
        }
    }
    out
}

/// `[H, K, V]` to `[H, d1, d2]` in `layout`.
fn from_k_major(s: &[f32], layout: KdaStateLayout, h_n: usize, kd: usize, vd: usize) -> Vec<f32> {
    let mut out = vec![0f32; h_n * kd * vd];
    for h in 0..h_n {
        for i in 0..kd {
            for j in 0..vd {
                out[h * kd * vd + layout.index(i, j, kd, vd)] = s[(h * kd + i) * vd + j];
            }
        }
    }
    out
}

/// Every input decoded to f32 in logical order.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g_raw: Vec<f32>,
    beta: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
}

/// What one (sequence, head) task produces.
struct HeadResult {
    /// `[len, V]`.
    out: Vec<f32>,
    /// `[K, V]`.
    final_state: Vec<f32>,
    /// (checkpoint entry, `[K, V]` state).
    checkpoints: Vec<(usize, Vec<f32>)>,
}

/// One token's activated operands for one head.
struct Token {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: f32,
}

fn prepare_token(p: &KdaPrefillParams, x: &Inputs, t: usize, h: usize) -> Token {
    let (h_n, kd, vd) = (p.heads, p.k_dim, p.v_dim);
    let row_k = (t * h_n + h) * kd..(t * h_n + h + 1) * kd;
    let mut q = x.q[row_k.clone()].to_vec();
    let mut k = x.k[row_k.clone()].to_vec();
    if p.use_qk_l2norm {
        l2_normalize(&mut q, KDA_L2_EPS);
        l2_normalize(&mut k, KDA_L2_EPS);
    }
    q.iter_mut().for_each(|e| *e *= p.q_scale);
    let g = x.g_raw[row_k]
        .iter()
        .enumerate()
        .map(|(i, &f)| kda_gate_value(p.gate, f, x.a_log[h], x.dt_bias[h * kd + i]))
        .collect();
    let b = x.beta[t * h_n + h];
    Token { q, k, v: x.v[(t * h_n + h) * vd..(t * h_n + h + 1) * vd].to_vec(), g, beta: if p.beta_sigmoid { sigmoid(b) } else { b } }
}

fn run_head(plan: &KdaPrefillPlan, x: &Inputs, n: usize, h: usize, initial: &[f32]) -> HeadResult {
    let p = &plan.params;
    let vd = p.v_dim;
    let range = plan.seq_range(n);
    let tokens: Vec<Token> = range.clone().map(|t| prepare_token(p, x, t, h)).collect();
    let mut state: Vec<f64> = initial.iter().map(|&s| s as f64).collect();
    let mut out = vec![0f32; range.len() * vd];
    let ckpts = plan.checkpoints(n);
    let mut saved = Vec::new();
    for chunk in plan.chunks(n) {
        let o = chunk_step(p.k_dim, vd, &tokens[chunk.clone()], &mut state);
        out[chunk.start * vd..chunk.end * vd].copy_from_slice(&o);
        // The chunk schedule restarts at checkpoint offsets, so each lies on a chunk end.
        if let Some(&(c, _)) = ckpts.iter().find(|(_, off)| *off == chunk.end) {
            saved.push((c, state.iter().map(|&s| s as f32).collect()));
        }
    }
    HeadResult { out, final_state: state.iter().map(|&s| s as f32).collect(), checkpoints: saved }
}

/// One chunk of the WY form: returns o `[c, V]` and advances `state` (K×V, f32 values held
/// in f64) through the chunk. Only exponentials of G_i − G_j (i ≥ j) or of G_i (≤ 0) appear.
fn chunk_step(kd: usize, vd: usize, tok: &[Token], state: &mut [f64]) -> Vec<f32> {
    let c = tok.len();
    // G[i] = cumulative log-decay from the chunk start through token i.
    let mut big_g = vec![0f64; c * kd];
    for i in 0..c {
        for d in 0..kd {
            let prev = if i == 0 { 0.0 } else { big_g[(i - 1) * kd + d] };
            big_g[i * kd + d] = prev + tok[i].g[d] as f64;
        }
    }
    // decayed_dot(a, i, j) = Σ_d a_i,d k_j,d e^{G_i,d − G_j,d} for j ≤ i.
    let decayed_dot = |a: &[f32], i: usize, j: usize| -> f64 {
        (0..kd).map(|d| a[d] as f64 * tok[j].k[d] as f64 * (big_g[i * kd + d] - big_g[j * kd + d]).exp()).sum()
    };
    // X = (I + L)^{-1} Diag(β) by forward substitution, L[i][j] = β_i·decayed_dot(k_i, i, j).
    let mut x = vec![0f64; c * c];
    for i in 0..c {
        let beta = tok[i].beta as f64;
        x[i * c + i] = beta;
        for j in 0..i {
            let l_ij = beta * decayed_dot(&tok[i].k, i, j);
            for m in 0..=j {
                x[i * c + m] -= l_ij * x[j * c + m];
            }
        }
    }
    // v'_i = u_i − w_i S with w = X (e^G ⊙ k), u = X v.
    let mut v_new = vec![0f64; c * vd];
    for i in 0..c {
        let mut w = vec![0f64; kd];
        let row = &mut v_new[i * vd..(i + 1) * vd];
        for j in 0..=i {
            let xij = x[i * c + j];
            for d in 0..kd {
                w[d] += xij * big_g[j * kd + d].exp() * tok[j].k[d] as f64;
            }
            for e in 0..vd {
                row[e] += xij * tok[j].v[e] as f64;
            }
        }
        for d in 0..kd {
            for e in 0..vd {
                row[e] -= w[d] * state[d * vd + e];
            }
        }
    }
    // o_i = (q_i ⊙ e^{G_i}) S + Σ_{j ≤ i} decayed_dot(q_i, i, j) v'_j.
    let mut out = vec![0f32; c * vd];
    for i in 0..c {
        let mut o = vec![0f64; vd];
        for d in 0..kd {
            let qd = tok[i].q[d] as f64 * big_g[i * kd + d].exp();
            for e in 0..vd {
                o[e] += qd * state[d * vd + e];
            }
        }
        for j in 0..=i {
            let a = decayed_dot(&tok[i].q, i, j);
            for e in 0..vd {
                o[e] += a * v_new[j * vd + e];
            }
        }
        for e in 0..vd {
            out[i * vd + e] = o[e] as f32;
        }
    }
    // S ← Diag(e^{G_last}) S + Σ_j (e^{G_last − G_j} ⊙ k_j) v'_jᵀ, then stored as f32.
    let last = (c - 1) * kd;
    for d in 0..kd {
        let keep = big_g[last + d].exp();
        for e in 0..vd {
            state[d * vd + e] *= keep;
        }
        for j in 0..c {
            let kj = (big_g[last + d] - big_g[j * kd + d]).exp() * tok[j].k[d] as f64;
            for e in 0..vd {
                state[d * vd + e] += kj * v_new[j * vd + e];
            }
        }
    }
    for s in state.iter_mut() {
        *s = *s as f32 as f64;
    }
    out
}
