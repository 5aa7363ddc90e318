//! Conformance tests of [`crate::ops::KdaPrefill`]. The oracle is the token-by-token delta rule
//! of k3-architecture.md §2.3 in f64, with its own gate, L2 norm and sigmoid.

use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{
    KdaCheckpointOffsets, KdaGateMode, KdaPrefill, KdaPrefillArgs, KdaPrefillBatch, KdaPrefillParams, KdaStateLayout,
};
use crate::tensor::{HostTensor, Layout};
use crate::tolerance::{assert_close, Tolerance};


const LB5: KdaGateMode = KdaGateMode::LowerBound { lower_bound: -5.0 };

/// A prefill problem in host values. The pool and checkpoints are K-major `[.., H, K, V]` here;
/// uploads transpose them for V-major plans.
#[derive(Clone, Debug)]
struct Problem {
    params: KdaPrefillParams,
    cu: Vec<i64>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g_raw: Vec<f32>,
    /// `[T, H]`: logits or probabilities per `params.beta_sigmoid`.
    beta: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `[slots, H, K, V]`.
    pool: Vec<f32>,
    state_indices: Option<Vec<i64>>,
    /// (entries per sequence, `[N, C]` offsets).
    checkpoints: Option<(usize, Vec<i64>)>,
}

/// Dtypes and strides of one run.
#[derive(Clone, Copy, Debug)]
struct RunCfg {
    io: DType,
    state: DType,
    cu: DType,
    /// Row stride of `beta` (≥ H).
    beta_stride: usize,
}

const F32_RUN: RunCfg = RunCfg { io: DType::F32, state: DType::F32, cu: DType::I64, beta_stride: 0 };

impl Problem {
    /// Random inputs for `lens` sequences; a reads-and-writes pool of `slots` slots.
    fn random(rng: &mut TestRng, params: KdaPrefillParams, lens: &[usize], slots: usize) -> Problem {
        let (h, kd, vd) = (params.heads, params.k_dim, params.v_dim);
        let mut cu = vec![0i64];
        for &l in lens {
            cu.push(cu[cu.len() - 1] + l as i64);
        }
        let t = *cu.last().unwrap_or(&0) as usize;
        // Without the in-kernel L2 norm, unit-norm-ish q and k keep the delta rule contractive.
        let qk_std = if params.use_qk_l2norm { 1.0 } else { 1.0 / (kd as f32).sqrt() };
        let g_raw = match params.gate {
            KdaGateMode::Precomputed => rng.uniforms(t * h * kd, -1.0, 0.0),
            _ => rng.normals(t * h * kd, 1.0),
        };
        let beta = if params.beta_sigmoid { rng.normals(t * h, 1.5) } else { rng.uniforms(t * h, 0.0, 1.0) };
        let a_len = params.a_log_len;
        Problem {
            cu,
            q: rng.normals(t * h * kd, qk_std),
            k: rng.normals(t * h * kd, qk_std),
            v: rng.normals(t * h * vd, 1.0),
            g_raw,
            beta,
            a_log: (0..a_len).map(|i| if i < h { rng.range(-1.0, 0.5) } else { 0.0 }).collect(),
            // Mostly negative z: long-memory channels, as trained KDA gates are.
            dt_bias: rng.uniforms(h * kd, -3.0, 0.5),
            pool: rng.normals(slots * h * kd * vd, 0.5),
            state_indices: None,
            checkpoints: None,
            params: KdaPrefillParams { state_slots: slots, read_initial_state: true, write_final_state: true, ..params },
        }
    }

    fn tokens(&self) -> usize {
        *self.cu.last().unwrap_or(&0) as usize
    }
    fn num_seqs(&self) -> usize {
        self.cu.len().saturating_sub(1)
    }
    fn head_state(&self) -> usize {
        self.params.heads * self.params.k_dim * self.params.v_dim
    }
    fn slot(&self, n: usize) -> usize {
        self.state_indices.as_ref().map_or(n, |s| s[n] as usize)
    }
    fn batch(&self) -> KdaPrefillBatch<'_> {
        KdaPrefillBatch {
            cu_seqlens: &self.cu,
            state_indices: self.state_indices.as_deref(),
            checkpoints: self.checkpoints.as_ref().map(|(c, o)| KdaCheckpointOffsets { per_seq: *c, offsets: o }),
        }
    }
    /// The first `len` tokens of sequence `n` as a one-sequence problem on the same pool.
    fn prefix(&self, n: usize, len: usize, checkpoints: Option<Vec<i64>>) -> Problem {
        self.window(n, 0, len, checkpoints)
    }
    /// Tokens `from..to` of sequence `n` as a one-sequence problem using `n`'s slot as slot 0.
    fn window(&self, n: usize, from: usize, to: usize, checkpoints: Option<Vec<i64>>) -> Problem {
        let (h, kd, vd) = (self.params.heads, self.params.k_dim, self.params.v_dim);
        let t0 = self.cu[n] as usize;
        let rows = |x: &[f32], w: usize| x[(t0 + from) * w..(t0 + to) * w].to_vec();
        let hs = self.head_state();
        let slot = self.slot(n);
        Problem {
            params: KdaPrefillParams { state_slots: 1, ..self.params.clone() },
            cu: vec![0, (to - from) as i64],
            q: rows(&self.q, h * kd),
            k: rows(&self.k, h * kd),
            v: rows(&self.v, h * vd),
            g_raw: rows(&self.g_raw, h * kd),
            beta: rows(&self.beta, h),
            a_log: self.a_log.clone(),
            dt_bias: self.dt_bias.clone(),
            pool: self.pool[slot * hs..(slot + 1) * hs].to_vec(),
            state_indices: None,
            checkpoints: checkpoints.map(|c| (c.len(), c)),
        }
    }
}

/// K-major `[blocks, H, K, V]` to the plan's layout, or back (`inverse`).
fn relayout(x: &[f32], p: &KdaPrefillParams, inverse: bool) -> Vec<f32> {
    let (kd, vd) = (p.k_dim, p.v_dim);
    if p.state_layout == KdaStateLayout::KMajor {
        return x.to_vec();
    }
    let mut out = vec![0f32; x.len()];
    for blk in 0..x.len() / (kd * vd) {
        for i in 0..kd {
            for j in 0..vd {
                let (km, vm) = (blk * kd * vd + i * vd + j, blk * kd * vd + j * kd + i);
                if inverse {
                    out[km] = x[vm];
                } else {
                    out[vm] = x[km];
                }
            }
        }
    }
    out
}

/// Device tensors of one run (fields can be swapped by the bad-input test).
struct Device<B: Backend> {
    q: DeviceTensor<B>,
    k: DeviceTensor<B>,
    v: DeviceTensor<B>,
    g_raw: DeviceTensor<B>,
    beta: DeviceTensor<B>,
    a_log: DeviceTensor<B>,
    dt_bias: DeviceTensor<B>,
    cu: DeviceTensor<B>,
    state_indices: Option<DeviceTensor<B>>,
    pool: DeviceTensor<B>,
    ck_offsets: Option<DeviceTensor<B>>,
    ck_state: Option<DeviceTensor<B>>,
    out: DeviceTensor<B>,
}

/// Sentinel written into checkpoint slots before a run: unused entries must keep it.
const CK_SENTINEL: f32 = 7.0;

fn index_tensor<B: Backend>(b: &B, dt: DType, shape: &[usize], v: &[i64]) -> DeviceTensor<B> {
    let host = match dt {
        DType::I32 => HostTensor::from_i32(shape, &v.iter().map(|&x| x as i32).collect::<Vec<_>>()),
        _ => HostTensor::from_i64(shape, v),
    };
    b.upload_tensor(&host.unwrap()).unwrap()
}

impl<B: Backend> Device<B> {
    fn new(b: &B, pr: &Problem, cfg: RunCfg) -> Self {
        let p = &pr.params;
        let (t, h, kd, vd) = (pr.tokens(), p.heads, p.k_dim, p.v_dim);
        let [d1, d2] = p.state_layout.trailing_dims(kd, vd);
        let stride = cfg.beta_stride.max(h);
        let mut beta_rows = vec![0f32; t * stride];
        for r in 0..t {
            beta_rows[r * stride..r * stride + h].copy_from_slice(&pr.beta[r * h..(r + 1) * h]);
        }
        let mut beta = upload_f32(b, cfg.io, &[t * stride], &beta_rows).unwrap();
        beta.layout = Layout { dtype: cfg.io, shape: vec![t, h], strides: vec![stride, 1], offset: 0 };
        let n = pr.num_seqs();
        let (ck_offsets, ck_state) = match &pr.checkpoints {
            Some((c, offs)) => {
                let sentinel = vec![CK_SENTINEL; n * c * pr.head_state()];
                (
                    Some(index_tensor(b, cfg.cu, &[n, *c], offs)),
                    Some(upload_f32(b, DType::F32, &[n, *c, h, d1, d2], &sentinel).unwrap()),
                )
            }
            None => (None, None),
        };
        Device {
            q: upload_f32(b, cfg.io, &[t, h, kd], &pr.q).unwrap(),
            k: upload_f32(b, cfg.io, &[t, h, kd], &pr.k).unwrap(),
            v: upload_f32(b, cfg.io, &[t, h, vd], &pr.v).unwrap(),
            g_raw: upload_f32(b, cfg.io, &[t, h, kd], &pr.g_raw).unwrap(),
            beta,
            a_log: upload_f32(b, DType::F32, &[pr.a_log.len()], &pr.a_log).unwrap(),
            dt_bias: upload_f32(b, DType::F32, &[h * kd], &pr.dt_bias).unwrap(),
            cu: index_tensor(b, cfg.cu, &[n + 1], &pr.cu),
            state_indices: pr.state_indices.as_ref().map(|s| index_tensor(b, DType::I32, &[n], s)),
            pool: upload_f32(b, cfg.state, &[p.state_slots, h, d1, d2], &relayout(&pr.pool, p, false)).unwrap(),
            ck_offsets,
            ck_state,
            out: b.zeros(cfg.io, &[t, h, vd]).unwrap(),
        }
    }

    fn args(&mut self) -> KdaPrefillArgs<'_, B> {
        KdaPrefillArgs {
            q: self.q.as_ref(),
            k: self.k.as_ref(),
            v: self.v.as_ref(),
            g_raw: self.g_raw.as_ref(),
            beta: self.beta.as_ref(),
            a_log: Some(self.a_log.as_ref()),
            dt_bias: Some(self.dt_bias.as_ref()),
            cu_seqlens: self.cu.as_ref(),
            state_indices: self.state_indices.as_ref().map(|t| t.as_ref()),
            state: Some(self.pool.as_mut()),
            checkpoint_offsets: self.ck_offsets.as_ref().map(|t| t.as_ref()),
            checkpoint_state: self.ck_state.as_mut().map(|t| t.as_mut()),
            out: self.out.as_mut(),
        }
    }
}

/// What a run produced, states K-major.
struct Outputs {
    o: Vec<f32>,
    pool: Vec<f32>,
    checkpoints: Vec<f32>,
}

fn try_run<B: Backend + KdaPrefill>(b: &B, pr: &Problem, cfg: RunCfg) -> Result<Outputs> {
    let plan = KdaPrefill::plan(b, &pr.params, &pr.batch())?;
    let mut d = Device::new(b, pr, cfg);
    let mut ws = b.alloc_zeroed(KdaPrefill::workspace_size(b, &plan))?;
    KdaPrefill::run(b, &plan, d.args(), Some(&mut ws), b.default_stream())?;
    let ck = match &d.ck_state {
        Some(t) => relayout(&download_f32(b, t)?, &pr.params, true),
        None => Vec::new(),
    };
    Ok(Outputs { o: download_f32(b, &d.out)?, pool: relayout(&download_f32(b, &d.pool)?, &pr.params, true), checkpoints: ck })
}

fn run<B: Backend + KdaPrefill>(b: &B, pr: &Problem, cfg: RunCfg) -> Outputs {
    try_run(b, pr, cfg).unwrap_or_else(|e| panic!("kda_prefill run failed: {e}"))
}

/// The oracle's answer: outputs, the expected pool after the run, checkpoint states (K-major).
struct Expected {
    o: Vec<f32>,
    pool: Vec<f32>,
    /// `[N, C]` entries: None for unused ones.
    checkpoints: Vec<Option<Vec<f32>>>,
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn l2norm64(x: &[f32]) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    x.iter().map(|&v| v as f64 / (ss + 1e-6).sqrt()).collect()
}

/// Token-by-token delta rule in f64 on the inputs as stored in `cfg` dtypes.
fn oracle(pr: &Problem, cfg: RunCfg) -> Expected {
    let p = &pr.params;
    let (h_n, kd, vd) = (p.heads, p.k_dim, p.v_dim);
    let seen = |x: &[f32]| round_through(cfg.io, x);
    let (q, k, v, g_raw, beta) = (seen(&pr.q), seen(&pr.k), seen(&pr.v), seen(&pr.g_raw), seen(&pr.beta));
    let init_pool = round_through(cfg.state, &pr.pool);
    let mut pool = init_pool.clone();
    let hs = pr.head_state();
    let c_n = pr.checkpoints.as_ref().map_or(0, |c| c.0);
    let mut ckpts: Vec<Option<Vec<f32>>> = vec![None; pr.num_seqs() * c_n];
    let mut o = vec![0f32; pr.tokens() * h_n * vd];
    for n in 0..pr.num_seqs() {
        let slot = pr.slot(n);
        let (t0, t1) = (pr.cu[n] as usize, pr.cu[n + 1] as usize);
        let mut state: Vec<f64> = if p.read_initial_state {
            init_pool[slot * hs..(slot + 1) * hs].iter().map(|&x| x as f64).collect()
        } else {
            vec![0.0; hs]
        };
        for t in t0..t1 {
            for h in 0..h_n {
                let row = (t * h_n + h) * kd..(t * h_n + h + 1) * kd;
                let (mut qt, kt): (Vec<f64>, Vec<f64>) = if p.use_qk_l2norm {
                    (l2norm64(&q[row.clone()]), l2norm64(&k[row.clone()]))
                } else {
                    (q[row.clone()].iter().map(|&x| x as f64).collect(), k[row.clone()].iter().map(|&x| x as f64).collect())
                };
                qt.iter_mut().for_each(|x| *x *= p.q_scale as f64);
                let vt: Vec<f64> = v[(t * h_n + h) * vd..(t * h_n + h + 1) * vd].iter().map(|&x| x as f64).collect();
                let b_raw = beta[t * h_n + h] as f64;
                let bt = if p.beta_sigmoid { sigmoid64(b_raw) } else { b_raw };
                let s = &mut state[h * kd * vd..(h + 1) * kd * vd];
                for i in 0..kd {
                    let f = g_raw[row.start + i] as f64;
                    let x = f + pr.dt_bias[h * kd + i] as f64;
                    let a = (pr.a_log[h] as f64).exp();
                    let g = match p.gate {
                        KdaGateMode::LowerBound { lower_bound } => lower_bound as f64 * sigmoid64(a * x),
                        KdaGateMode::Softplus => -a * (1.0 + x.exp()).ln(),
                        KdaGateMode::Precomputed => f,
                    };
                    s[i * vd..(i + 1) * vd].iter_mut().for_each(|e| *e *= g.exp());
                }
                for j in 0..vd {
                    let pred: f64 = (0..kd).map(|i| s[i * vd + j] * kt[i]).sum();
                    let r = vt[j] - pred;
                    for i in 0..kd {
                        s[i * vd + j] += bt * kt[i] * r;
                    }
                    let out: f64 = (0..kd).map(|i| s[i * vd + j] * qt[i]).sum();
                    o[(t * h_n + h) * vd + j] = out as f32;
                }
            }
            if let Some((c, offs)) = &pr.checkpoints {
                for e in 0..*c {
                    if offs[n * c + e] == (t + 1 - t0) as i64 {
                        ckpts[n * c + e] = Some(state.iter().map(|&x| x as f32).collect());
                    }
                }
            }
        }
        if p.write_final_state {
            for (dst, &src) in pool[slot * hs..(slot + 1) * hs].iter_mut().zip(&state) {
                *dst = src as f32;
            }
        }
    }
    Expected { o, pool, checkpoints: ckpts }
}

/// Output tolerance for an I/O dtype: chunked vs recurrent in f32 is a different algorithm
/// (F32_ALGO); bf16 outputs carry one rounding plus bf16 inputs (BF16).
fn out_tol(io: DType) -> Tolerance {
    if io == DType::BF16 {
        Tolerance::BF16
    } else {
        Tolerance::F32_ALGO
    }
}

/// Compares a run with the oracle: outputs, whole pool, used checkpoints.
fn check_against_oracle(what: &str, pr: &Problem, cfg: RunCfg, got: &Outputs) {
    let want = oracle(pr, cfg);
    assert_close(&format!("{what}: out"), &got.o, &want.o, out_tol(cfg.io));
    // A bf16 pool is rounded once on write-back; f32 pools are compared as algorithm variants.
    let state_tol = if cfg.state == DType::BF16 { Tolerance::BF16 } else { Tolerance::F32_ALGO };
    assert_close(&format!("{what}: final state pool"), &got.pool, &want.pool, state_tol);
    let hs = pr.head_state();
    for (e, ck) in want.checkpoints.iter().enumerate() {
        if let Some(ck) = ck {
            assert_close(&format!("{what}: checkpoint {e}"), &got.checkpoints[e * hs..(e + 1) * hs], ck, Tolerance::F32_ALGO);
        }
    }
}

fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: element {i} is {} but {} (bit-exact equality required)", got[i], want[i]);
    }
}

fn params(heads: usize, kd: usize, vd: usize, chunk: usize, gate: KdaGateMode, layout: KdaStateLayout) -> KdaPrefillParams {
    KdaPrefillParams {
        a_log_len: heads + 2,
        gate,
        chunk_size: chunk,
        state_layout: layout,
        ..KdaPrefillParams::k3_defaults(heads, kd, vd)
    }
}

/// Chunked prefill equals the token-by-token recurrence (outputs and final states) over head
/// counts 1..4, K ≠ V, every gate mode, β logits and probabilities, with and without the L2
/// norm, both state layouts, one K = V = 128 case, f32 and bf16 I/O.
pub fn kda_prefill_matches_recurrence<B: Backend + KdaPrefill>(b: &B) {
    use KdaStateLayout::{KMajor, VMajor};
    let mut rng = TestRng::new(31);
    // (H, K, V, chunk, gate, layout, sequence lengths)
    type Case = (usize, usize, usize, usize, KdaGateMode, KdaStateLayout, &'static [usize]);
    let cases: &[Case] = &[
        (1, 16, 16, 16, LB5, KMajor, &[37]),
        (2, 32, 32, 32, KdaGateMode::Softplus, VMajor, &[5, 0, 29]),
        (3, 16, 32, 16, KdaGateMode::Precomputed, KMajor, &[20, 13]),
        (4, 16, 16, 64, LB5, VMajor, &[9, 40, 3]),
        (1, 128, 128, 32, LB5, VMajor, &[41]),
    ];
    for (ci, &(h, kd, vd, chunk, gate, layout, lens)) in cases.iter().enumerate() {
        let mut p = params(h, kd, vd, chunk, gate, layout);
        if ci == 2 {
            // β given as probabilities and q, k used as they come.
            p.beta_sigmoid = false;
            p.use_qk_l2norm = false;
        }
        let pr = Problem::random(&mut rng, p, lens, lens.len());
        let what = format!("case {ci} (H {h}, K {kd}, V {vd}, chunk {chunk}, {gate:?}, {layout:?}, lens {lens:?})");
        check_against_oracle(&format!("{what} f32"), &pr, F32_RUN, &run(b, &pr, F32_RUN));
        if kd <= 32 {
            let cfg = RunCfg { io: DType::BF16, ..F32_RUN };
            check_against_oracle(&format!("{what} bf16 io"), &pr, cfg, &run(b, &pr, cfg));
        }
    }
}

/// A 37-token prefill split 20 + 17 (state carried through the pool) equals one pass.
pub fn kda_prefill_split_equals_single_pass<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(32);
    for chunk in [16, 64] {
        let pr = Problem::random(&mut rng, params(2, 16, 16, chunk, LB5, KdaStateLayout::VMajor), &[37], 1);
        let whole = run(b, &pr, F32_RUN);
        let first = run(b, &pr.window(0, 0, 20, None), F32_RUN);
        let mut second = pr.window(0, 20, 37, None);
        second.pool = first.pool.clone();
        let second = run(b, &second, F32_RUN);
        let split_o: Vec<f32> = first.o.iter().chain(&second.o).copied().collect();
        // The two runs chunk the sequence differently: an algorithm variant in f32.
        assert_close(&format!("split 20+17 out (chunk {chunk})"), &split_o, &whole.o, Tolerance::F32_ALGO);
        assert_close(&format!("split 20+17 final state (chunk {chunk})"), &second.pool, &whole.pool, Tolerance::F32_ALGO);
    }
}

/// Checkpoints are bit-equal to the final state of a prefix-only run of the same length (with
/// the same earlier checkpoints, moot when those fall on chunk multiples), unused entries are
/// untouched, and resuming from a checkpoint reproduces the rest of the pass bit for bit.
pub fn kda_prefill_checkpoints_bit_exact<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(33);
    let p = params(2, 16, 16, 16, LB5, KdaStateLayout::VMajor);
    let mut pr = Problem::random(&mut rng, p, &[37, 50], 3);
    pr.state_indices = Some(vec![2, 0]);
    // Sequence 0: 7 (not a chunk multiple), 32, unused. Sequence 1: unused, 16, 50 (= its length).
    pr.checkpoints = Some((3, vec![7, 32, -1, -1, 16, 50]));
    let full = run(b, &pr, F32_RUN);
    check_against_oracle("checkpointed run", &pr, F32_RUN, &full);
    let hs = pr.head_state();
    let ck = |e: usize| &full.checkpoints[e * hs..(e + 1) * hs];
    let final_of = |pr: &Problem| run(b, pr, F32_RUN).pool;

    assert_bits_eq("checkpoint (0, 0) @7 vs 7-token prefill", ck(0), &final_of(&pr.prefix(0, 7, None)));
    assert_bits_eq("checkpoint (0, 1) @32 vs 32-token prefill checkpointed at 7", ck(1), &final_of(&pr.prefix(0, 32, Some(vec![7]))));
    assert_bits_eq("checkpoint (1, 1) @16 vs 16-token prefill", ck(4), &final_of(&pr.prefix(1, 16, None)));
    // 16 is a chunk multiple, so the 50-token prefill needs no checkpoint to chunk the same way.
    assert_bits_eq("checkpoint (1, 2) @50 vs 50-token prefill", ck(5), &final_of(&pr.prefix(1, 50, None)));
    assert_bits_eq("checkpoint (1, 2) @50 vs final state", ck(5), &full.pool[0..hs]);
    for e in [2, 3] {
        assert!(ck(e).iter().all(|&x| x == CK_SENTINEL), "unused checkpoint entry {e} was written");
    }

    // Restore the checkpoint at 7 and recompute tokens 7..37 (checkpoint 32 becomes 25).
    let mut rest = pr.window(0, 7, 37, Some(vec![25]));
    rest.pool = ck(0).to_vec();
    let rest = run(b, &rest, F32_RUN);
    let (h, vd) = (pr.params.heads, pr.params.v_dim);
    assert_bits_eq("resumed outputs vs single pass", &rest.o, &full.o[7 * h * vd..37 * h * vd]);
    assert_bits_eq("resumed final state vs single pass", &rest.pool, &full.pool[2 * hs..3 * hs]);
    assert_bits_eq("resumed checkpoint @25 vs checkpoint @32", &rest.checkpoints, ck(1));
}

/// Varlen batches with empty sequences: i32 and i64 `cu_seqlens` agree bit for bit, permuted
/// state indices address the right slots, slots outside the batch are untouched, an empty
/// sequence's final state is its initial state (kept, or zero without `read_initial_state`),
/// and a bf16 pool matches the f32 math up to its one write-back rounding.
pub fn kda_prefill_varlen_state_pool<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(34);
    let p = params(3, 16, 16, 16, LB5, KdaStateLayout::KMajor);
    let lens = [6, 0, 17, 0, 11];
    let mut pr = Problem::random(&mut rng, p, &lens, 8);
    let perm = rng.permutation(8);
    pr.state_indices = Some(perm[..5].iter().map(|&s| s as i64).collect());
    let hs = pr.head_state();
    let slot_of = |pr: &Problem, out: &[f32], n: usize| out[pr.slot(n) * hs..(pr.slot(n) + 1) * hs].to_vec();

    let wide = run(b, &pr, F32_RUN);
    check_against_oracle("varlen (cu i64)", &pr, F32_RUN, &wide);
    let narrow = run(b, &pr, RunCfg { cu: DType::I32, ..F32_RUN });
    assert_bits_eq("cu_seqlens i32 vs i64: out", &narrow.o, &wide.o);
    assert_bits_eq("cu_seqlens i32 vs i64: pool", &narrow.pool, &wide.pool);
    for &s in &perm[5..] {
        assert_bits_eq(&format!("slot {s} outside the batch"), &wide.pool[s * hs..(s + 1) * hs], &pr.pool[s * hs..(s + 1) * hs]);
    }
    for n in [1, 3] {
        assert_bits_eq(&format!("empty sequence {n} keeps its state"), &slot_of(&pr, &wide.pool, n), &slot_of(&pr, &pr.pool, n));
    }

    // Without the initial state every sequence starts from zero; empty ones end at zero.
    let mut zero = pr.clone();
    zero.params.read_initial_state = false;
    let got = run(b, &zero, F32_RUN);
    check_against_oracle("varlen from zero", &zero, F32_RUN, &got);
    for n in [1, 3] {
        assert!(slot_of(&zero, &got.pool, n).iter().all(|&x| x == 0.0), "empty sequence {n} from zero must write zeros");
    }

    // No indices: sequence n uses slot n.
    let mut plain = pr.clone();
    plain.state_indices = None;
    check_against_oracle("varlen, slot n", &plain, F32_RUN, &run(b, &plain, F32_RUN));

    // bf16 pool: the initial state is what bf16 holds; the math stays f32; one rounding on write.
    let cfg = RunCfg { state: DType::BF16, ..F32_RUN };
    let got = run(b, &pr, cfg);
    check_against_oracle("varlen, bf16 state", &pr, cfg, &got);
    let pool_bf16 = round_through(DType::BF16, &pr.pool);
    for n in [1, 3] {
        assert_bits_eq(&format!("bf16 pool: empty sequence {n} keeps its state"), &slot_of(&pr, &got.pool, n), &slot_of(&pr, &pool_bf16, n));
    }
}

/// K-major and V-major pools give transposed, identical states and identical outputs.
pub fn kda_prefill_state_layouts_agree<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(35);
    let pr = Problem::random(&mut rng, params(2, 16, 32, 16, LB5, KdaStateLayout::KMajor), &[19, 26], 2);
    let mut vm = pr.clone();
    vm.params.state_layout = KdaStateLayout::VMajor;
    let (a, c) = (run(b, &pr, F32_RUN), run(b, &vm, F32_RUN));
    // `run` returns both pools K-major; the same algorithm on transposed storage (F32 policy).
    assert_close("layouts: out", &c.o, &a.o, Tolerance::F32);
    assert_close("layouts: state (V-major transposed back)", &c.pool, &a.pool, Tolerance::F32);
}

/// Chunk sizes 16, 32 and 64 agree (and match the oracle).
pub fn kda_prefill_chunk_sizes_agree<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(36);
    let pr = Problem::random(&mut rng, params(2, 16, 16, 16, LB5, KdaStateLayout::KMajor), &[70, 33], 2);
    let base = run(b, &pr, F32_RUN);
    check_against_oracle("chunk 16", &pr, F32_RUN, &base);
    for chunk in [32, 64] {
        let mut other = pr.clone();
        other.params.chunk_size = chunk;
        let got = run(b, &other, F32_RUN);
        // Different chunkings are different f32 evaluation orders of the same math.
        assert_close(&format!("chunk {chunk} vs 16: out"), &got.o, &base.o, Tolerance::F32_ALGO);
        assert_close(&format!("chunk {chunk} vs 16: state"), &got.pool, &base.pool, Tolerance::F32_ALGO);
    }
}

/// With the lower bound −5 and gates at the bound (cumulative log-decay ≈ −320 over a chunk of
/// 64) next to channels with almost no decay, outputs stay finite and correct.
pub fn kda_prefill_long_chunks_stay_finite<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(37);
    let mut pr = Problem::random(&mut rng, params(1, 16, 16, 64, LB5, KdaStateLayout::KMajor), &[135], 1);
    pr.a_log.iter_mut().for_each(|a| *a = 0.0);
    pr.dt_bias.iter_mut().for_each(|d| *d = 0.0);
    // Even channels: z = 12, g ≈ −5. Odd channels: z = −12, g ≈ −3e-5.
    for (e, g) in pr.g_raw.iter_mut().enumerate() {
        *g = if e % 2 == 0 { 12.0 } else { -12.0 };
    }
    let got = run(b, &pr, F32_RUN);
    assert!(got.o.iter().chain(&got.pool).all(|x| x.is_finite()), "non-finite output or state");
    check_against_oracle("gates at the lower bound, chunk 64", &pr, F32_RUN, &got);
}

/// A change that breaks one field of a valid request.
type Defect<'a, T> = Box<dyn Fn(&mut T) + 'a>;

/// Malformed batches, params and arguments are typed errors naming the field.
pub fn kda_prefill_rejects_bad_input<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(38);
    let mut pr = Problem::random(&mut rng, params(2, 16, 16, 16, LB5, KdaStateLayout::KMajor), &[5, 3], 3);
    pr.state_indices = Some(vec![2, 0]);
    pr.checkpoints = Some((2, vec![2, 5, 3, -1]));
    assert!(try_run(b, &pr, F32_RUN).is_ok(), "the base problem must be valid");
    let plan_field = |f: &dyn Fn(&mut Problem)| {
        let mut bad = pr.clone();
        f(&mut bad);
        let e: Error = KdaPrefill::plan(b, &bad.params, &bad.batch()).map(|_| ()).expect_err("plan must reject");
        e.field().map(str::to_string).unwrap_or_else(|| format!("not InvalidInput: {e}"))
    };
    let cases: Vec<(&str, Defect<'_, Problem>)> = vec![
        ("cu_seqlens", Box::new(|p| p.cu = vec![])),
        ("cu_seqlens", Box::new(|p| p.cu = vec![1, 5, 8])),
        ("cu_seqlens", Box::new(|p| p.cu = vec![0, 5, 4])),
        ("state_indices", Box::new(|p| p.state_indices = Some(vec![3, 0]))),
        ("state_indices", Box::new(|p| p.state_indices = Some(vec![-1, 0]))),
        ("state_indices", Box::new(|p| p.state_indices = Some(vec![1, 1]))),
        ("state_indices", Box::new(|p| p.state_indices = Some(vec![1]))),
        ("params.state_slots", Box::new(|p| (p.state_indices, p.params.state_slots) = (None, 1))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![2, 6, 3, -1])))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![0, 5, 3, -1])))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![4, 4, 3, -1])))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![4, 2, 3, -1])))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![2, 5, -2, -1])))),
        ("checkpoint_offsets", Box::new(|p| p.checkpoints = Some((2, vec![2, 5, 3])))),
        ("params.a_log_len", Box::new(|p| p.params.a_log_len = 1)),
        ("params.chunk_size", Box::new(|p| p.params.chunk_size = 24)),
        ("params.heads", Box::new(|p| p.params.heads = 0)),
        ("params.gate", Box::new(|p| p.params.gate = KdaGateMode::LowerBound { lower_bound: 0.5 })),
        ("params.q_scale", Box::new(|p| p.params.q_scale = f32::NAN)),
    ];
    for (want, f) in &cases {
        assert_eq!(plan_field(f.as_ref()), *want);
    }

    // Argument errors: build valid tensors, break one, and run.
    let arg_field = |f: &dyn Fn(&mut Device<B>)| {
        let plan = KdaPrefill::plan(b, &pr.params, &pr.batch()).unwrap();
        let mut d = Device::new(b, &pr, F32_RUN);
        f(&mut d);
        let mut ws = b.alloc_zeroed(KdaPrefill::workspace_size(b, &plan)).unwrap();
        let e = KdaPrefill::run(b, &plan, d.args(), Some(&mut ws), b.default_stream()).expect_err("run must reject");
        e.field().map(str::to_string).unwrap_or_else(|| format!("not InvalidInput: {e}"))
    };
    let t = pr.tokens();
    let up = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let arg_cases: Vec<(&str, Defect<'_, Device<B>>)> = vec![
        ("beta", Box::new(|d| d.beta.layout.strides = vec![1, 1])),
        ("beta", Box::new(|d| d.beta = up(DType::F16, &[t, 2]))),
        ("q", Box::new(|d| d.q = up(DType::F16, &[t, 2, 16]))),
        ("k", Box::new(|d| d.k = up(DType::F32, &[t, 2, 17]))),
        ("v", Box::new(|d| d.v = up(DType::F32, &[t + 1, 2, 16]))),
        ("g_raw", Box::new(|d| d.g_raw = up(DType::I32, &[t, 2, 16]))),
        ("a_log", Box::new(|d| d.a_log = up(DType::F32, &[3]))),
        ("dt_bias", Box::new(|d| d.dt_bias = up(DType::BF16, &[32]))),
        ("cu_seqlens", Box::new(|d| d.cu = up(DType::F32, &[3]))),
        ("state_indices", Box::new(|d| d.state_indices = None)),
        ("state_indices", Box::new(|d| d.state_indices = Some(up(DType::F32, &[2])))),
        ("state", Box::new(|d| d.pool = up(DType::F16, &[3, 2, 16, 16]))),
        ("state", Box::new(|d| d.pool = up(DType::F32, &[2, 2, 16, 16]))),
        ("checkpoint_offsets", Box::new(|d| d.ck_offsets = None)),
        ("checkpoint_state", Box::new(|d| d.ck_state = Some(up(DType::BF16, &[2, 2, 2, 16, 16])))),
        ("out", Box::new(|d| d.out = up(DType::F32, &[t, 2, 8]))),
    ];
    for (want, f) in &arg_cases {
        assert_eq!(arg_field(f.as_ref()), *want);
    }

    // A missing pool while the plan reads it.
    let plan = KdaPrefill::plan(b, &pr.params, &pr.batch()).unwrap();
    let mut d = Device::new(b, &pr, F32_RUN);
    let need = KdaPrefill::workspace_size(b, &plan);
    let mut ws = b.alloc_zeroed(need).unwrap();
    let args = KdaPrefillArgs { state: None, ..d.args() };
    let e = KdaPrefill::run(b, &plan, args, Some(&mut ws), b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("state"), "{e}");

    // The workspace holds the prepare pass's results: a short or missing one is refused.
    assert!(need > 0, "a prefill with tokens needs a workspace");
    let mut short = b.alloc_zeroed(need - 1).unwrap();
    let e = KdaPrefill::run(b, &plan, d.args(), Some(&mut short), b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("workspace"), "{e}");
    let e = KdaPrefill::run(b, &plan, d.args(), None, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("workspace"), "{e}");
}

