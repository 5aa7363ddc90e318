//! Conformance tests of [`crate::ops::KdaDecode`] (and its hand-off from
//! [`crate::ops::CausalConv1d`]). The oracle is written here in f64 from the spec: the conv is
//! evaluated over each slot's full token history (not by shifting a state), and the delta rule
//! in its closed form S' = (I − β k kᵀ)·Diag(α)·S + β k vᵀ.

use super::conv1d::{
    download_bytes, download_view, field_of, layout_in_order, row_strided, silu64, upload_i64, upload_view,
};
use super::{round_through, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::ops::{
    CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, ConvActivation, HostIndices, KdaDecode,
    KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaGateMode, KdaOutputNorm, KdaStateLayout,
};
use crate::tensor::Layout;
use crate::tolerance::{assert_close, Tolerance};


fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---- the model: weights, modes and the f64 oracle --------------------------------------------

/// (H, K, V, W).
type Dims = (usize, usize, usize, usize);

#[derive(Clone, Debug)]
struct Model {
    h: usize,
    k: usize,
    v: usize,
    w: usize,
    gate: KdaGateMode,
    beta_sigmoid: bool,
    qk_l2norm: bool,
    scale: Option<f32>,
    norm: KdaOutputNorm,
    /// `[D, W]`.
    conv_w: Vec<f32>,
    /// `[A >= H]`, padded with zeros like the K3 checkpoint.
    a_log: Vec<f32>,
    /// `[H·K]`, or absent (= 0).
    dt_bias: Option<Vec<f32>>,
    /// `[V]`.
    norm_w: Vec<f32>,
}

impl Model {
    fn random(rng: &mut TestRng, (h, k, v, w): Dims, gate: KdaGateMode, norm: bool) -> Self {
        let d = h * (2 * k + v);
        let a_range = if gate == KdaGateMode::Softplus { (-2.0, 0.0) } else { (-1.0, 0.5) };
        let mut a_log = rng.uniforms(h, a_range.0, a_range.1);
        a_log.extend(std::iter::repeat_n(0.0, rng.below(3)));
        Model {
            h,
            k,
            v,
            w,
            gate,
            beta_sigmoid: true,
            qk_l2norm: true,
            scale: None,
            norm: if norm { KdaOutputNorm::GatedRmsNorm { eps: 1e-5 } } else { KdaOutputNorm::None },
            conv_w: rng.normals(d * w, 0.5),
            a_log,
            dt_bias: Some(rng.normals(h * k, 0.5)),
            norm_w: rng.uniforms(v, 0.5, 1.5),
        }
    }

    fn d(&self) -> usize {
        self.h * (2 * self.k + self.v)
    }

    fn params(&self, batch: usize, slots: usize, layout: KdaStateLayout) -> KdaDecodeParams {
        KdaDecodeParams {
            batch,
            heads: self.h,
            head_k: self.k,
            head_v: self.v,
            conv_width: self.w,
            state_slots: slots,
            state_layout: layout,
            gate: self.gate,
            beta_sigmoid: self.beta_sigmoid,
            qk_l2norm: self.qk_l2norm,
            scale: self.scale,
            output_norm: self.norm,
        }
    }

    /// SiLU of the causal conv at the last of `tokens` (each `[D]`, oldest first); positions
    /// before the first token are 0.
    fn conv_silu(&self, tokens: &[Vec<f32>]) -> Vec<f64> {
        let (n, w) = (tokens.len() as isize, self.w);
        (0..self.d())
            .map(|c| {
                let mut acc = 0f64;
                for j in 0..w {
                    let pos = n - w as isize + j as isize;
                    if pos >= 0 {
                        acc += self.conv_w[c * w + j] as f64 * tokens[pos as usize][c] as f64;
                    }
                }
                silu64(acc)
            })
            .collect()
    }

    fn gate64(&self, f: f32, h: usize, i: usize) -> f64 {
        let f = f as f64;
        let a = self.a_log[h] as f64;
        let dt = self.dt_bias.as_ref().map_or(0.0, |d| d[h * self.k + i] as f64);
        match self.gate {
            KdaGateMode::LowerBound { lower_bound } => lower_bound as f64 * sigmoid64(a.exp() * (f + dt)),
            KdaGateMode::Softplus => -a.exp() * (f + dt).exp().ln_1p(),
            KdaGateMode::Precomputed => f,
        }
    }

    /// One token through every head. `s` is one slot's state `[H][K][V]`; returns `[H·V]`.
    fn heads(&self, u: &[f64], t: &Token, row: usize, s: &mut [f64]) -> Vec<f64> {
        let (h, k, v) = (self.h, self.k, self.v);
        let mut out = vec![0f64; h * v];
        for hh in 0..h {
            let mut q: Vec<f64> = u[hh * k..(hh + 1) * k].to_vec();
            let mut kk: Vec<f64> = u[h * k + hh * k..h * k + (hh + 1) * k].to_vec();
            let vv = &u[2 * h * k + hh * v..2 * h * k + (hh + 1) * v];
            if self.qk_l2norm {
                for x in [&mut q, &mut kk] {
                    let n = (x.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
                    x.iter_mut().for_each(|a| *a /= n);
                }
            }
            let scale = self.scale.map_or(1.0 / (k as f64).sqrt(), |s| s as f64);
            q.iter_mut().for_each(|a| *a *= scale);
            let alpha: Vec<f64> = (0..k).map(|i| self.gate64(t.g_raw[(row * h + hh) * k + i], hh, i).exp()).collect();
            let b_in = t.beta[row * h + hh] as f64;
            let beta = if self.beta_sigmoid { sigmoid64(b_in) } else { b_in };
            // S' = (I − β k kᵀ)·Diag(α)·S + β k vᵀ
            let sh = &mut s[hh * k * v..(hh + 1) * k * v];
            let decayed: Vec<f64> = (0..k * v).map(|e| alpha[e / v] * sh[e]).collect();
            let kta: Vec<f64> = (0..v).map(|j| (0..k).map(|i| kk[i] * decayed[i * v + j]).sum()).collect();
            for i in 0..k {
                for j in 0..v {
                    sh[i * v + j] = decayed[i * v + j] - beta * kk[i] * kta[j] + beta * kk[i] * vv[j];
                }
            }
            let o: Vec<f64> = (0..v).map(|j| (0..k).map(|i| sh[i * v + j] * q[i]).sum()).collect();
            let y = &mut out[hh * v..(hh + 1) * v];
            match self.norm {
                KdaOutputNorm::None => y.copy_from_slice(&o),
                KdaOutputNorm::GatedRmsNorm { eps } => {
                    let rms = (o.iter().map(|a| a * a).sum::<f64>() / v as f64 + eps as f64).sqrt();
                    for j in 0..v {
                        y[j] = self.norm_w[j] as f64 * o[j] / rms * sigmoid64(t.gate[(row * h + hh) * v + j] as f64);
                    }
                }
            }
        }
        out
    }
}

/// Per-token inputs of one decode step, already rounded to their storage dtypes.
#[derive(Clone, Debug)]
struct Token {
    /// `[B, D]`.
    x: Vec<f32>,
    /// `[B, H, K]`.
    g_raw: Vec<f32>,
    /// `[B, H]`.
    beta: Vec<f32>,
    /// `[B, H, V]`.
    gate: Vec<f32>,
}

/// How the tensors are stored.
#[derive(Clone, Copy, Debug)]
struct Storage {
    x_dt: DType,
    /// g_raw, beta and output gate.
    g_dt: DType,
    out_dt: DType,
    state_dt: DType,
    conv_dt: DType,
    layout: KdaStateLayout,
    x_pad: usize,
    /// Conv pool stored `[slots, W-1, D]` (vLLM) instead of `[slots, D, W-1]`.
    sd_conv: bool,
    /// Conv weight stored `[W, D]`.
    wd_weight: bool,
}

impl Storage {
    fn plain(state_dt: DType, layout: KdaStateLayout) -> Self {
        Storage {
            x_dt: DType::F32,
            g_dt: DType::F32,
            out_dt: DType::F32,
            state_dt,
            conv_dt: DType::F32,
            layout,
            x_pad: 0,
            sd_conv: false,
            wd_weight: false,
        }
    }

    fn random(rng: &mut TestRng) -> Self {
        let pick = |r: &mut TestRng| if r.below(2) == 0 { DType::F32 } else { DType::BF16 };
        Storage {
            x_dt: pick(rng),
            g_dt: pick(rng),
            out_dt: pick(rng),
            state_dt: pick(rng),
            conv_dt: pick(rng),
            layout: if rng.below(2) == 0 { KdaStateLayout::KMajor } else { KdaStateLayout::VMajor },
            x_pad: rng.below(2) * 5,
            sd_conv: rng.below(2) == 0,
            wd_weight: rng.below(2) == 0,
        }
    }

    /// Outputs and states carry the rounding of their storage: one bf16 rounding per stored
    /// state or output (BF16 policy), else f32 arithmetic vs the f64 oracle (F32 policy). Inputs
    /// (and the conv history) are rounded before the oracle sees them, so they add nothing.
    fn tolerance(&self) -> Tolerance {
        Tolerance::for_dtype(self.out_dt).max(Tolerance::for_dtype(self.state_dt))
    }
}

impl Token {
    fn random(rng: &mut TestRng, m: &Model, batch: usize, st: &Storage) -> Self {
        let (h, k, v) = (m.h, m.k, m.v);
        // Inputs the conv state stores must survive its dtype too, so the f64 history is exact.
        let x = round_through(st.x_dt, &round_through(st.conv_dt, &rng.normals(batch * m.d(), 1.0)));
        let g_raw = match m.gate {
            KdaGateMode::Precomputed => rng.uniforms(batch * h * k, -1.0, -0.01),
            _ => rng.normals(batch * h * k, 1.0),
        };
        let beta = if m.beta_sigmoid { rng.normals(batch * h, 1.0) } else { rng.uniforms(batch * h, 0.0, 1.0) };
        Token {
            x,
            g_raw: round_through(st.g_dt, &g_raw),
            beta: round_through(st.g_dt, &beta),
            gate: round_through(st.g_dt, &rng.normals(batch * h * v, 1.0)),
        }
    }
}

/// K-major `[slots, H, K, V]` values in the order of a pool stored with `layout`.
fn to_stored(kmajor: &[f32], m: &Model, layout: KdaStateLayout) -> Vec<f32> {
    match layout {
        KdaStateLayout::KMajor => kmajor.to_vec(),
        KdaStateLayout::VMajor => {
            let (k, v) = (m.k, m.v);
            let mut out = vec![0f32; kmajor.len()];
            for (hs, block) in kmajor.chunks_exact(k * v).enumerate() {
                for i in 0..k {
                    for j in 0..v {
                        out[hs * k * v + j * k + i] = block[i * v + j];
                    }
                }
            }
            out
        }
    }
}

/// Inverse of [`to_stored`].
fn from_stored(stored: &[f32], m: &Model, layout: KdaStateLayout) -> Vec<f32> {
    match layout {
        KdaStateLayout::KMajor => stored.to_vec(),
        KdaStateLayout::VMajor => {
            let (k, v) = (m.k, m.v);
            let mut out = vec![0f32; stored.len()];
            for (hs, block) in stored.chunks_exact(k * v).enumerate() {
                for i in 0..k {
                    for j in 0..v {
                        out[hs * k * v + i * v + j] = block[j * k + i];
                    }
                }
            }
            out
        }
    }
}

/// The oracle's view of both pools: every slot's pre-conv token history and its f64 state.
#[derive(Clone, Debug)]
struct Oracle {
    /// `[slot][position][D]`, oldest first.
    tokens: Vec<Vec<Vec<f32>>>,
    /// `[slots, H, K, V]`.
    state: Vec<f64>,
}

impl Oracle {
    /// From pool contents: conv `[slots, D, W-1]`, state K-major `[slots, H, K, V]`.
    fn from_pools(m: &Model, slots: usize, conv: &[f32], state: &[f32]) -> Self {
        let (d, hl) = (m.d(), m.w - 1);
        let tokens = (0..slots)
            .map(|s| (0..hl).map(|i| (0..d).map(|c| conv[(s * d + c) * hl + i]).collect()).collect())
            .collect();
        Oracle { tokens, state: state.iter().map(|&x| x as f64).collect() }
    }

    /// One decode step: returns `[B, H, V]` (zeros for null rows).
    fn step(&mut self, m: &Model, idx: &[i32], t: &Token) -> Vec<f32> {
        let (d, hv, sz) = (m.d(), m.h * m.v, m.h * m.k * m.v);
        let mut out = vec![0f32; idx.len() * hv];
        for (row, &s) in idx.iter().enumerate() {
            if s == 0 {
                continue;
            }
            let s = s as usize;
            self.tokens[s].push(t.x[row * d..(row + 1) * d].to_vec());
            let u = m.conv_silu(&self.tokens[s]);
            let o = m.heads(&u, t, row, &mut self.state[s * sz..(s + 1) * sz]);
            for (dst, &y) in out[row * hv..(row + 1) * hv].iter_mut().zip(&o) {
                *dst = y as f32;
            }
        }
        out
    }

    /// The conv pool `[slots, D, W-1]` the kernel should hold: the last W-1 inputs per slot.
    fn conv_pool(&self, m: &Model, conv_dt: DType) -> Vec<f32> {
        let (d, hl) = (m.d(), m.w - 1);
        let mut out = vec![0f32; self.tokens.len() * d * hl];
        for (s, toks) in self.tokens.iter().enumerate() {
            for i in 0..hl {
                let pos = toks.len() as isize - hl as isize + i as isize;
                for c in 0..d {
                    out[(s * d + c) * hl + i] = if pos >= 0 { toks[pos as usize][c] } else { 0.0 };
                }
            }
        }
        round_through(conv_dt, &out)
    }
}

// ---- running the op ------------------------------------------------------------------------

/// The two pools on the device.
struct Pools<B: Backend> {
    conv: DeviceTensor<B>,
    state: DeviceTensor<B>,
    /// The plan's workspace, kept across steps as a serving engine keeps it (only zeroed when
    /// first allocated): a kernel that relies on a fresh zeroed workspace fails the chains.
    ws: Option<B::Buffer>,
    ws_bytes: usize,
}

impl<B: Backend> Pools<B> {
    /// `conv` is `[slots, D, W-1]`, `state` K-major `[slots, H, K, V]`.
    fn upload(b: &B, m: &Model, st: &Storage, slots: usize, conv: &[f32], state: &[f32]) -> Self {
        let (d, hl) = (m.d(), m.w - 1);
        let order: &[usize] = if st.sd_conv { &[0, 2, 1] } else { &[0, 1, 2] };
        let conv = upload_view(b, layout_in_order(st.conv_dt, &[slots, d, hl], order), conv);
        let shape = match st.layout {
            KdaStateLayout::KMajor => [slots, m.h, m.k, m.v],
            KdaStateLayout::VMajor => [slots, m.h, m.v, m.k],
        };
        let state = upload_view(b, Layout::contiguous(st.state_dt, &shape), &to_stored(state, m, st.layout));
        Pools { conv, state, ws: None, ws_bytes: 0 }
    }

    fn conv_values(&self, b: &B) -> Vec<f32> {
        download_view(b, &self.conv)
    }

    /// The recurrent pool as K-major `[slots, H, K, V]`.
    fn state_kmajor(&self, b: &B, m: &Model, layout: KdaStateLayout) -> Vec<f32> {
        from_stored(&download_view(b, &self.state), m, layout)
    }
}

/// Runs one decode step through the trait; returns the `[B, H, V]` output. The output buffer
/// starts as 7.0 everywhere so null rows must really be written.
fn run_step<B: Backend + KdaDecode>(
    b: &B,
    m: &Model,
    st: &Storage,
    idx: &[i32],
    t: &Token,
    pools: &mut Pools<B>,
) -> Vec<f32> {
    let (bt, d, w) = (idx.len(), m.d(), m.w);
    let slots = pools.conv.layout.shape[0];
    let params = m.params(bt, slots, st.layout);
    let plan = KdaDecode::plan(b, &params, &KdaDecodeBatch { state_indices: idx }).expect("plan");
    let x = upload_view(b, row_strided(st.x_dt, bt, d, st.x_pad, 0), &t.x);
    let wl = if st.wd_weight {
        layout_in_order(DType::F32, &[d, w], &[1, 0])
    } else {
        Layout::contiguous(DType::F32, &[d, w])
    };
    let conv_w = upload_view(b, wl, &m.conv_w);
    let g_raw = upload_view(b, Layout::contiguous(st.g_dt, &[bt, m.h, m.k]), &t.g_raw);
    let beta = upload_view(b, Layout::contiguous(st.g_dt, &[bt, m.h]), &t.beta);
    let a_log = upload_view(b, Layout::contiguous(DType::F32, &[m.a_log.len()]), &m.a_log);
    let dt_bias = m.dt_bias.as_ref().map(|v| upload_view(b, Layout::contiguous(DType::F32, &[v.len()]), v));
    let idx_t = upload_i64(b, DType::I32, &idx.iter().map(|&s| s as i64).collect::<Vec<_>>());
    let normed = matches!(m.norm, KdaOutputNorm::GatedRmsNorm { .. });
    let gate = upload_view(b, Layout::contiguous(st.g_dt, &[bt, m.h, m.v]), &t.gate);
    let norm_w = upload_view(b, Layout::contiguous(DType::F32, &[m.v]), &m.norm_w);
    let mut out = upload_view(b, Layout::contiguous(st.out_dt, &[bt, m.h, m.v]), &vec![7.0; bt * m.h * m.v]);
    let args = KdaDecodeArgs {
        x_qkv: x.as_ref(),
        conv_weight: conv_w.as_ref(),
        conv_state: pools.conv.as_mut(),
        g_raw: g_raw.as_ref(),
        beta: beta.as_ref(),
        a_log: Some(a_log.as_ref()),
        dt_bias: dt_bias.as_ref().map(|t| t.as_ref()),
        state_indices: idx_t.as_ref(),
        recurrent_state: pools.state.as_mut(),
        output_gate: normed.then(|| gate.as_ref()),
        norm_weight: normed.then(|| norm_w.as_ref()),
        out: out.as_mut(),
    };
    let bytes = KdaDecode::workspace_size(b, &plan);
    if pools.ws.is_none() || pools.ws_bytes != bytes {
        pools.ws = b.workspace(bytes).expect("workspace");
        pools.ws_bytes = bytes;
    }
    KdaDecode::run(b, &plan, args, pools.ws.as_mut(), b.default_stream()).expect("run");
    download_view(b, &out)
}

/// Compares the kernel's pools with the oracle: slots no row touched must be bit-identical to
/// `before`; touched recurrent slots within `tol`; the conv pool exactly (it only moves inputs).
fn check_pools<B: Backend>(
    b: &B,
    what: &str,
    m: &Model,
    st: &Storage,
    pools: &Pools<B>,
    oracle: &Oracle,
    before: &[f32],
    touched: &[usize],
    tol: Tolerance,
) {
    assert_eq!(pools.conv_values(b), oracle.conv_pool(m, st.conv_dt), "{what}: conv state pool");
    let got = pools.state_kmajor(b, m, st.layout);
    let sz = m.h * m.k * m.v;
    let (mut g, mut want) = (Vec::new(), Vec::new());
    for s in 0..got.len() / sz {
        let r = s * sz..(s + 1) * sz;
        if touched.contains(&s) {
            g.extend_from_slice(&got[r.clone()]);
            want.extend(oracle.state[r].iter().map(|&x| x as f32));
        } else {
            assert_eq!(&got[r.clone()], &before[r], "{what}: untouched state slot {s} changed");
        }
    }
    assert_close(&format!("{what}: recurrent state"), &g, &want, tol);
}

/// Random pool contents: conv `[slots, D, W-1]` and K-major state, rounded to their dtypes.
fn random_pools(rng: &mut TestRng, m: &Model, st: &Storage, slots: usize) -> (Vec<f32>, Vec<f32>) {
    let conv = round_through(st.conv_dt, &rng.normals(slots * m.d() * (m.w - 1), 1.0));
    let state = round_through(st.state_dt, &rng.normals(slots * m.h * m.k * m.v, 0.5));
    (conv, state)
}

/// Random state indices for `batch` rows over `slots` slots: distinct non-null slots, some rows
/// null (0), row 0 never null.
fn random_indices(rng: &mut TestRng, batch: usize, slots: usize) -> Vec<i32> {
    let perm: Vec<usize> = rng.permutation(slots - 1).into_iter().map(|s| s + 1).collect();
    (0..batch).map(|r| if r > 0 && rng.below(4) == 0 { 0 } else { perm[r] as i32 }).collect()
}

fn touched(idx: &[i32]) -> Vec<usize> {
    idx.iter().filter(|&&s| s != 0).map(|&s| s as usize).collect()
}

// ---- tests ---------------------------------------------------------------------------------

/// One decode step vs the f64 oracle over random shapes (H in 1..3, 12, 96; K = V in 8..32, one
/// K ≠ V, one K = V = 128; W = 3 and 4), every gate mode, β as logits or probabilities, with
/// and without q/k L2 norm, explicit scale, gated RMSNorm on/off, f32/bf16 inputs, states and
/// outputs, K-major and V-major state, strided rows and transposed conv storage. Outputs, both
/// pools and the untouched slots are all checked.
pub fn kda_decode_matches_oracle<B: Backend + KdaDecode>(b: &B) {
    let mut rng = TestRng::new(41);
    // ((H, K, V, W), batch, variants)
    let shapes: &[(Dims, usize, usize)] = &[
        ((1, 8, 8, 4), 3, 6),
        ((2, 16, 16, 4), 4, 6),
        ((3, 32, 32, 4), 2, 4),
        ((2, 8, 16, 4), 3, 4),
        ((2, 8, 8, 3), 3, 3),
        ((12, 8, 8, 4), 2, 2),
        ((96, 4, 4, 4), 2, 1),
        ((1, 128, 128, 4), 2, 2),
        // V/4 = 3 column vectors: GPU V-split blocks with a column vector past V.
        ((2, 8, 12, 4), 2, 8),
    ];
    let gates = [KdaGateMode::LowerBound { lower_bound: -5.0 }, KdaGateMode::Softplus, KdaGateMode::Precomputed];
    let mut n = 0usize;
    for &(dims, batch, variants) in shapes {
        for _ in 0..variants {
            n += 1;
            let mut m = Model::random(&mut rng, dims, gates[n % 3], n % 4 != 1);
            m.beta_sigmoid = n % 5 != 2;
            m.qk_l2norm = n % 6 != 3;
            if n % 7 == 4 {
                m.scale = Some(0.3);
            }
            if n % 3 == 1 {
                m.dt_bias = None;
            }
            let mut st = Storage::random(&mut rng);
            if n.is_multiple_of(2) {
                // Packed inputs and pools: GPU backends take their 16-byte kernels when K and V
                // are multiples of 8 (x_pad, transposed conv storage and weights take the others).
                (st.x_pad, st.sd_conv, st.wd_weight) = (0, false, false);
            }
            let slots = batch + 1 + rng.below(3);
            let idx = random_indices(&mut rng, batch, slots);
            let (conv, state) = random_pools(&mut rng, &m, &st, slots);
            let t = Token::random(&mut rng, &m, batch, &st);
            let mut pools = Pools::upload(b, &m, &st, slots, &conv, &state);
            let mut oracle = Oracle::from_pools(&m, slots, &conv, &state);
            let out = run_step(b, &m, &st, &idx, &t, &mut pools);
            let want = oracle.step(&m, &idx, &t);
            let what = format!("kda_decode case {n} dims {dims:?} {st:?} gate {:?}", m.gate);
            check_null_rows(&what, &out, &idx, m.h * m.v);
            assert_close(&format!("{what}: out"), &out, &want, st.tolerance());
            check_pools(b, &what, &m, &st, &pools, &oracle, &state, &touched(&idx), st.tolerance());
        }
    }
}

/// Null rows must hold exact zeros.
fn check_null_rows(what: &str, out: &[f32], idx: &[i32], row: usize) {
    for (r, &s) in idx.iter().enumerate() {
        if s == 0 {
            assert!(out[r * row..(r + 1) * row].iter().all(|&x| x == 0.0), "{what}: null row {r} is not zero");
        }
    }
}

/// The same step through a K-major and a V-major pool gives the same output and transposed
/// states (identical math, only the state addressing differs: F32 policy).
pub fn kda_decode_state_layouts_agree<B: Backend + KdaDecode>(b: &B) {
    let mut rng = TestRng::new(42);
    for &(dims, dt) in &[((2, 16, 8, 4), DType::F32), ((3, 8, 8, 4), DType::BF16)] {
        let m = Model::random(&mut rng, dims, KdaGateMode::LowerBound { lower_bound: -5.0 }, true);
        let (batch, slots) = (3, 5);
        let idx = random_indices(&mut rng, batch, slots);
        let kst = Storage::plain(dt, KdaStateLayout::KMajor);
        let vst = Storage::plain(dt, KdaStateLayout::VMajor);
        let (conv, state) = random_pools(&mut rng, &m, &kst, slots);
        let t = Token::random(&mut rng, &m, batch, &kst);
        let mut kp = Pools::upload(b, &m, &kst, slots, &conv, &state);
        let mut vp = Pools::upload(b, &m, &vst, slots, &conv, &state);
        let ko = run_step(b, &m, &kst, &idx, &t, &mut kp);
        let vo = run_step(b, &m, &vst, &idx, &t, &mut vp);
        assert_close("kda_decode K-major vs V-major out", &vo, &ko, Tolerance::F32);
        assert_close(
            "kda_decode K-major vs V-major state",
            &vp.state_kmajor(b, &m, KdaStateLayout::VMajor),
            &kp.state_kmajor(b, &m, KdaStateLayout::KMajor),
            Tolerance::F32,
        );
        assert_eq!(vp.conv_values(b), kp.conv_values(b), "kda_decode conv pools differ between layouts");
    }
}

/// T decode steps chained through the op's own pools equal the naive recurrence over the T
/// tokens (conv over each slot's whole history, closed-form delta rule), checked at every step.
/// One row is padded (null slot) for one step in the middle: its sequence skips that step.
pub fn kda_decode_chain_equals_recurrence<B: Backend + KdaDecode>(b: &B) {
    let mut rng = TestRng::new(43);
    let cases = [
        ((2, 16, 16, 4), Storage::plain(DType::F32, KdaStateLayout::VMajor)),
        (
            (1, 8, 8, 4),
            Storage {
                x_dt: DType::BF16,
                g_dt: DType::BF16,
                out_dt: DType::BF16,
                ..Storage::plain(DType::BF16, KdaStateLayout::KMajor)
            },
        ),
        (
            (3, 8, 8, 4),
            Storage { conv_dt: DType::BF16, sd_conv: true, ..Storage::plain(DType::F32, KdaStateLayout::KMajor) },
        ),
    ];
    for (dims, st) in cases {
        let m = Model::random(&mut rng, dims, KdaGateMode::LowerBound { lower_bound: -5.0 }, true);
        let (batch, slots, steps) = (3, 5, 6);
        let idx = random_indices(&mut rng, batch, slots);
        let (conv, state) = random_pools(&mut rng, &m, &st, slots);
        let mut pools = Pools::upload(b, &m, &st, slots, &conv, &state);
        let mut oracle = Oracle::from_pools(&m, slots, &conv, &state);
        // Bf16 states are rounded once per step, and the rounding carries into later steps:
        // T = 6 roundings decayed by α stay inside the BF16 policy (sqrt(6)·1.1e-3 ≈ 2.7e-3).
        let tol = st.tolerance();
        for step in 0..steps {
            // A row whose slot goes null for one step skips that token entirely.
            let mut step_idx = idx.clone();
            if step == 2 {
                step_idx[1] = 0;
            }
            let t = Token::random(&mut rng, &m, batch, &st);
            let out = run_step(b, &m, &st, &step_idx, &t, &mut pools);
            let want = oracle.step(&m, &step_idx, &t);
            let what = format!("kda_decode chain {dims:?} step {step}");
            check_null_rows(&what, &out, &step_idx, m.h * m.v);
            assert_close(&format!("{what}: out"), &out, &want, tol);
        }
        check_pools(b, "kda_decode chain final", &m, &st, &pools, &oracle, &state, &touched(&idx), tol);
    }
}

/// Conv state written by CausalConv1d prefill continues into KdaDecode: prefill 5 tokens (and a
/// 2-token sequence, shorter than W-1) with zero initial history, then the decode of the next
/// token equals a conv over all the tokens followed by the delta rule from the given state.
pub fn kda_decode_continues_conv1d_prefill<B: Backend + KdaDecode + CausalConv1d>(b: &B) {
    let mut rng = TestRng::new(44);
    let m = Model::random(&mut rng, (2, 8, 8, 4), KdaGateMode::LowerBound { lower_bound: -5.0 }, true);
    let st = Storage {
        x_dt: DType::BF16,
        conv_dt: DType::BF16,
        sd_conv: true,
        ..Storage::plain(DType::F32, KdaStateLayout::VMajor)
    };
    let (d, slots) = (m.d(), 3);
    let lens = [5usize, 2];
    let idx = [2i32, 1];
    let prefill: Vec<Vec<Vec<f32>>> =
        lens.iter().map(|&l| (0..l).map(|_| round_through(DType::BF16, &rng.normals(d, 1.0))).collect()).collect();
    // Pools start as garbage history (read_initial_state is off, so it must not be read).
    let (conv, state) = random_pools(&mut rng, &m, &st, slots);
    let mut pools = Pools::upload(b, &m, &st, slots, &conv, &state);

    let cu = [0i64, 5, 7];
    let params = CausalConv1dParams {
        dim: d,
        width: m.w,
        activation: ConvActivation::Silu,
        read_initial_state: false,
        write_final_state: true,
        state_slots: slots,
    };
    let plan = CausalConv1d::plan(
        b,
        &params,
        &CausalConv1dBatch { cu_seqlens: HostIndices::I64(&cu), state_indices: Some(&idx) },
    )
    .expect("conv1d plan");
    let flat: Vec<f32> = prefill.iter().flatten().flatten().copied().collect();
    let x = upload_view(b, Layout::contiguous(DType::BF16, &[7, d]), &flat);
    let weight = upload_view(b, Layout::contiguous(DType::F32, &[d, m.w]), &m.conv_w);
    let cu_t = upload_i64(b, DType::I64, &cu);
    let idx_t = upload_i64(b, DType::I32, &[2, 1]);
    let mut out = upload_view(b, Layout::contiguous(DType::F32, &[7, d]), &vec![0.0; 7 * d]);
    let args = CausalConv1dArgs {
        x: x.as_ref(),
        weight: weight.as_ref(),
        cu_seqlens: cu_t.as_ref(),
        state_indices: Some(idx_t.as_ref()),
        conv_state: Some(pools.conv.as_mut()),
        out: out.as_mut(),
    };
    CausalConv1d::run(b, &plan, args, None, b.default_stream()).expect("conv1d run");

    // The oracle's histories are the whole prefilled sequences (earlier positions are 0).
    let mut oracle = Oracle::from_pools(&m, slots, &conv, &state);
    for (seq, &s) in idx.iter().enumerate() {
        oracle.tokens[s as usize] = prefill[seq].clone();
    }
    let t = Token::random(&mut rng, &m, 2, &st);
    let got = run_step(b, &m, &st, &idx, &t, &mut pools);
    let want = oracle.step(&m, &idx, &t);
    assert_close("kda_decode after conv1d prefill: out", &got, &want, st.tolerance());
    check_pools(b, "kda_decode after conv1d prefill", &m, &st, &pools, &oracle, &state, &touched(&idx), st.tolerance());
}

/// Rows with state index 0 output exact zeros and leave slot 0 of both pools byte-identical;
/// the other rows are unaffected by the padding; a batch of only null rows changes nothing.
pub fn kda_decode_null_slot<B: Backend + KdaDecode>(b: &B) {
    let mut rng = TestRng::new(45);
    let m = Model::random(&mut rng, (2, 8, 8, 4), KdaGateMode::LowerBound { lower_bound: -5.0 }, true);
    let st = Storage::plain(DType::BF16, KdaStateLayout::KMajor);
    let slots = 3;
    let (conv, state) = random_pools(&mut rng, &m, &st, slots);
    let hv = m.h * m.v;

    let padded_idx = [0i32, 2, 0, 1];
    let t = Token::random(&mut rng, &m, 4, &st);
    let mut padded = Pools::upload(b, &m, &st, slots, &conv, &state);
    let conv_before = download_bytes(b, &padded.conv);
    let state_before = download_bytes(b, &padded.state);
    let out = run_step(b, &m, &st, &padded_idx, &t, &mut padded);
    check_null_rows("kda_decode padded batch", &out, &padded_idx, hv);
    let conv_slot = m.d() * (m.w - 1) * st.conv_dt.size_bytes();
    let state_slot = m.h * m.k * m.v * st.state_dt.size_bytes();
    assert_eq!(&download_bytes(b, &padded.conv)[..conv_slot], &conv_before[..conv_slot], "conv slot 0 changed");
    assert_eq!(&download_bytes(b, &padded.state)[..state_slot], &state_before[..state_slot], "state slot 0 changed");

    // The same live rows without padding.
    let pick = |v: &[f32], per: usize| -> Vec<f32> {
        [1usize, 3].iter().flat_map(|&r| v[r * per..(r + 1) * per].to_vec()).collect()
    };
    let (h, k, d) = (m.h, m.k, m.d());
    let live =
        Token { x: pick(&t.x, d), g_raw: pick(&t.g_raw, h * k), beta: pick(&t.beta, h), gate: pick(&t.gate, hv) };
    let mut plain = Pools::upload(b, &m, &st, slots, &conv, &state);
    let live_out = run_step(b, &m, &st, &[2, 1], &live, &mut plain);
    // Identical computations on identical data (F32 policy covers reordering on other backends).
    assert_close("kda_decode live rows with vs without padding", &pick(&out, hv), &live_out, Tolerance::F32);
    assert_close(
        "kda_decode state with vs without padding",
        &download_view(b, &padded.state),
        &download_view(b, &plain.state),
        Tolerance::F32,
    );
    assert_eq!(download_view(b, &padded.conv), download_view(b, &plain.conv), "conv pools with vs without padding");

    let mut idle = Pools::upload(b, &m, &st, slots, &conv, &state);
    let before = (download_bytes(b, &idle.conv), download_bytes(b, &idle.state));
    let two = Token { x: pick(&t.x, d), g_raw: pick(&t.g_raw, h * k), beta: pick(&t.beta, h), gate: pick(&t.gate, hv) };
    let idle_out = run_step(b, &m, &st, &[0, 0], &two, &mut idle);
    assert!(idle_out.iter().all(|&x| x == 0.0), "all-null batch must output zeros");
    assert_eq!(
        (download_bytes(b, &idle.conv), download_bytes(b, &idle.state)),
        before,
        "all-null batch changed a pool"
    );
}

/// Malformed params, indices, widths, dtypes and shapes are typed errors naming the field.
pub fn kda_decode_rejects_bad_input<B: Backend + KdaDecode>(b: &B) {
    let (h, k, v, w, bt, slots) = (2usize, 4usize, 8usize, 4usize, 2usize, 4usize);
    let d = h * (2 * k + v);
    let p = KdaDecodeParams {
        batch: bt,
        heads: h,
        head_k: k,
        head_v: v,
        conv_width: w,
        state_slots: slots,
        state_layout: KdaStateLayout::VMajor,
        gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
    };
    let plan_err =
        |p: &KdaDecodeParams, idx: &[i32]| field_of(KdaDecode::plan(b, p, &KdaDecodeBatch { state_indices: idx }));
    assert_eq!(plan_err(&p, &[1, 4]), "state_indices");
    assert_eq!(plan_err(&p, &[-1, 1]), "state_indices");
    assert_eq!(plan_err(&p, &[3, 3]), "state_indices");
    assert_eq!(plan_err(&p, &[1]), "state_indices");
    assert_eq!(plan_err(&KdaDecodeParams { heads: 0, ..p.clone() }, &[1, 2]), "params.heads");
    assert_eq!(plan_err(&KdaDecodeParams { head_k: 0, ..p.clone() }, &[1, 2]), "params.head_k");
    assert_eq!(plan_err(&KdaDecodeParams { head_v: 0, ..p.clone() }, &[1, 2]), "params.head_v");
    assert_eq!(plan_err(&KdaDecodeParams { conv_width: 0, ..p.clone() }, &[1, 2]), "params.conv_width");
    assert_eq!(plan_err(&KdaDecodeParams { state_slots: 0, ..p.clone() }, &[0, 0]), "params.state_slots");
    assert_eq!(plan_err(&KdaDecodeParams { heads: usize::MAX / 2, ..p.clone() }, &[1, 2]), "params.heads");
    assert_eq!(
        plan_err(&KdaDecodeParams { gate: KdaGateMode::LowerBound { lower_bound: 1.0 }, ..p.clone() }, &[1, 2]),
        "params.gate"
    );
    assert_eq!(plan_err(&KdaDecodeParams { scale: Some(f32::NAN), ..p.clone() }, &[1, 2]), "params.scale");
    let nan_eps = KdaOutputNorm::GatedRmsNorm { eps: f32::NAN };
    assert_eq!(plan_err(&KdaDecodeParams { output_norm: nan_eps, ..p.clone() }, &[1, 2]), "params.output_norm");
    // Repeated null slots are fine.
    KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: &[0, 0] }).expect("null rows may repeat");

    let idx = [3i32, 1];
    // `mut` so the macro below (which names this binding) can run a second plan.
    let mut plan = KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: &idx }).expect("valid plan");
    let t =
        |dt: DType, shape: &[usize]| upload_view(b, Layout::contiguous(dt, shape), &vec![0.0; shape.iter().product()]);
    let x = t(DType::BF16, &[bt, d]);
    let conv_w = t(DType::F32, &[d, w]);
    let mut conv = t(DType::BF16, &[slots, d, w - 1]);
    let g_raw = t(DType::BF16, &[bt, h, k]);
    let beta = t(DType::F32, &[bt, h]);
    let a_log = t(DType::F32, &[h + 3]);
    let dt_bias = t(DType::F32, &[h * k]);
    let idx_t = upload_i64(b, DType::I32, &[3, 1]);
    let mut state = t(DType::F32, &[slots, h, v, k]);
    let gate = t(DType::BF16, &[bt, h, v]);
    let norm_w = t(DType::F32, &[v]);
    let mut out = t(DType::BF16, &[bt, h, v]);
    macro_rules! run_with {
        ($($f:ident : $val:expr),*) => {{
            #[allow(unused_mut)]
            let mut a = KdaDecodeArgs {
                x_qkv: x.as_ref(), conv_weight: conv_w.as_ref(), conv_state: conv.as_mut(), g_raw: g_raw.as_ref(),
                beta: beta.as_ref(), a_log: Some(a_log.as_ref()), dt_bias: Some(dt_bias.as_ref()),
                state_indices: idx_t.as_ref(), recurrent_state: state.as_mut(), output_gate: Some(gate.as_ref()),
                norm_weight: Some(norm_w.as_ref()), out: out.as_mut(),
            };
            $(a.$f = $val;)*
            KdaDecode::run(b, &plan, a, None, b.default_stream())
        }};
    }
    let short_a = t(DType::F32, &[h - 1]);
    assert_eq!(field_of(run_with!(a_log: Some(short_a.as_ref()))), "a_log");
    assert_eq!(field_of(run_with!(a_log: None)), "a_log");
    let a_bf16 = t(DType::BF16, &[h]);
    assert_eq!(field_of(run_with!(a_log: Some(a_bf16.as_ref()))), "a_log");
    let wide_w = t(DType::F32, &[d, w + 1]);
    assert_eq!(field_of(run_with!(conv_weight: wide_w.as_ref())), "conv_weight");
    let narrow_x = t(DType::BF16, &[bt, d - 1]);
    assert_eq!(field_of(run_with!(x_qkv: narrow_x.as_ref())), "x_qkv");
    let x_i32 = t(DType::I32, &[bt, d]);
    assert_eq!(field_of(run_with!(x_qkv: x_i32.as_ref())), "x_qkv");
    let x_cols = upload_view(b, layout_in_order(DType::F32, &[bt, d], &[1, 0]), &vec![0.0; bt * d]);
    assert_eq!(field_of(run_with!(x_qkv: x_cols.as_ref())), "x_qkv");
    let mut conv_w3 = t(DType::BF16, &[slots, d, w]);
    assert_eq!(field_of(run_with!(conv_state: conv_w3.as_mut())), "conv_state");
    let mut state_k = t(DType::F32, &[slots, h, k, v]);
    assert_eq!(field_of(run_with!(recurrent_state: state_k.as_mut())), "recurrent_state");
    let mut state_i32 = t(DType::I32, &[slots, h, v, k]);
    assert_eq!(field_of(run_with!(recurrent_state: state_i32.as_mut())), "recurrent_state");
    let mut state_few = t(DType::F32, &[slots - 1, h, v, k]);
    assert_eq!(field_of(run_with!(recurrent_state: state_few.as_mut())), "recurrent_state");
    let g_f16 = t(DType::F16, &[bt, h, k]);
    assert_eq!(field_of(run_with!(g_raw: g_f16.as_ref())), "g_raw");
    let beta_wide = t(DType::F32, &[bt, h + 1]);
    assert_eq!(field_of(run_with!(beta: beta_wide.as_ref())), "beta");
    let dt_short = t(DType::F32, &[h]);
    assert_eq!(field_of(run_with!(dt_bias: Some(dt_short.as_ref()))), "dt_bias");
    let idx_i64 = upload_i64(b, DType::I64, &[3, 1]);
    assert_eq!(field_of(run_with!(state_indices: idx_i64.as_ref())), "state_indices");
    assert_eq!(field_of(run_with!(output_gate: None)), "output_gate");
    let nw_bf16 = t(DType::BF16, &[v]);
    assert_eq!(field_of(run_with!(norm_weight: Some(nw_bf16.as_ref()))), "norm_weight");
    let mut out_short = t(DType::BF16, &[bt, h, v - 1]);
    assert_eq!(field_of(run_with!(out: out_short.as_mut())), "out");
    let overlapping = Layout { dtype: DType::BF16, shape: vec![bt, h, v], strides: vec![0, v, 1], offset: 0 };
    let mut out_rows_alias = upload_view(b, overlapping, &vec![0.0; bt * h * v]);
    assert_eq!(field_of(run_with!(out: out_rows_alias.as_mut())), "out");
    let pool_alias =
        Layout { dtype: DType::F32, shape: vec![slots, h, v, k], strides: vec![0, v * k, k, 1], offset: 0 };
    let mut state_alias = upload_view(b, pool_alias, &vec![0.0; slots * h * v * k]);
    assert_eq!(field_of(run_with!(recurrent_state: state_alias.as_mut())), "recurrent_state");
    // The unmodified arguments run; without the norm, gate and weight must be absent.
    run_with!().expect("valid arguments run");
    let plain = KdaDecodeParams { output_norm: KdaOutputNorm::None, ..p.clone() };
    plan = KdaDecode::plan(b, &plain, &KdaDecodeBatch { state_indices: &idx }).expect("valid plan");
    assert_eq!(field_of(run_with!()), "output_gate");
    run_with!(output_gate: None, norm_weight: None).expect("valid arguments without the norm");
}

