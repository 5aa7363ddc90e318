//! Conformance tests of [`crate::ops::MlaPrefill`].

use super::{download_f32, round_through, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{MlaPrefill, MlaPrefillArgs, MlaPrefillBatch, MlaPrefillKv, MlaPrefillParams};
use crate::tensor::{HostTensor, Layout, TensorRef};
use crate::tolerance::{assert_close, Tolerance};


/// One prefill problem with host values (already rounded through the input dtype).
struct Problem {
    heads: usize,
    dqk: usize,
    dv: usize,
    q_lens: Vec<usize>,
    /// Key lengths; `None` = self-attention.
    k_lens: Option<Vec<usize>>,
    causal: bool,
    in_dt: DType,
    /// `[Tq, H, dqk]`, `[Tk, H, dqk]`, `[Tk, H, dv]`, row-major.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Problem {
    fn new(rng: &mut TestRng, heads: usize, (dqk, dv): (usize, usize), q_lens: &[usize], k_lens: Option<&[usize]>, in_dt: DType) -> Self {
        let tq: usize = q_lens.iter().sum();
        let tk: usize = k_lens.map_or(tq, |l| l.iter().sum());
        // Scores ~ N(0, 2): softmaxes neither flat nor one-hot.
        let q = round_through(in_dt, &rng.normals(tq * heads * dqk, 1.4));
        let k = round_through(in_dt, &rng.normals(tk * heads * dqk, 1.0));
        let v = round_through(in_dt, &rng.normals(tk * heads * dv, 1.0));
        Problem { heads, dqk, dv, q_lens: q_lens.to_vec(), k_lens: k_lens.map(|l| l.to_vec()), causal: true, in_dt, q, k, v }
    }
    fn k_lens(&self) -> &[usize] {
        self.k_lens.as_deref().unwrap_or(&self.q_lens)
    }
    fn tq(&self) -> usize {
        self.q_lens.iter().sum()
    }
    fn tk(&self) -> usize {
        self.k_lens().iter().sum()
    }
    fn params(&self) -> MlaPrefillParams {
        MlaPrefillParams {
            heads: self.heads,
            qk_dim: self.dqk,
            v_dim: self.dv,
            softmax_scale: 1.0 / (self.dqk as f32).sqrt(),
            causal: self.causal,
        }
    }
    fn batch(&self) -> MlaPrefillBatch {
        match &self.k_lens {
            None => MlaPrefillBatch::from_seq_lens(&self.q_lens),
            Some(kl) => MlaPrefillBatch::with_kv_lens(&self.q_lens, kl),
        }
    }
}

/// f64 oracle straight from the definition: per sequence, head and query, a softmax over the
/// visible keys (bottom-right causal). Returns (out `[Tq, H, dv]`, lse `[Tq, H]`).
fn naive(pb: &Problem) -> (Vec<f32>, Vec<f32>) {
    let (h, dqk, dv) = (pb.heads, pb.dqk, pb.dv);
    let scale = 1.0 / (dqk as f64).sqrt();
    let mut out = vec![0f32; pb.tq() * h * dv];
    let mut lse = vec![f32::NEG_INFINITY; pb.tq() * h];
    let (mut q0, mut k0) = (0, 0);
    for (&lq, &lk) in pb.q_lens.iter().zip(pb.k_lens()) {
        for i in 0..lq {
            for hh in 0..h {
                let qv = &pb.q[((q0 + i) * h + hh) * dqk..][..dqk];
                let keys: Vec<usize> =
                    (0..lk).filter(|&j| !pb.causal || j as i64 <= i as i64 + lk as i64 - lq as i64).collect();
                if keys.is_empty() {
                    continue;
                }
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kv = &pb.k[((k0 + j) * h + hh) * dqk..][..dqk];
                        scale * qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                    })
                    .collect();
                let z: f64 = s.iter().map(|x| x.exp()).sum(); // scores are O(1): no shift needed
                let r = (q0 + i) * h + hh;
                for d in 0..dv {
                    let o: f64 = keys.iter().zip(&s).map(|(&j, x)| x.exp() / z * pb.v[((k0 + j) * h + hh) * dv + d] as f64).sum();
                    out[r * dv + d] = o as f32;
                }
                lse[r] = z.ln() as f32;
            }
        }
        q0 += lq;
        k0 += lk;
    }
    (out, lse)
}

/// Device copies of a problem's inputs. With `strided`, q rows are padded and k, v are slices
/// of one fused `[Tk, H, dqk + dv]` projection (unit inner stride, strided heads and rows).
struct Inputs<B: Backend> {
    q: DeviceTensor<B>,
    kv: DeviceTensor<B>,
    k_layout: Layout,
    v_layout: Layout,
    cu: DeviceTensor<B>,
    cu_k: Option<DeviceTensor<B>>,
}

fn offsets_tensor<B: Backend>(b: &B, lens: &[usize], idx_dt: DType) -> DeviceTensor<B> {
    let mut cu = vec![0i64];
    for &l in lens {
        cu.push(cu[cu.len() - 1] + l as i64);
    }
    let host = match idx_dt {
        DType::I32 => HostTensor::from_i32(&[cu.len()], &cu.iter().map(|&x| x as i32).collect::<Vec<_>>()),
        _ => HostTensor::from_i64(&[cu.len()], &cu),
    };
    b.upload_tensor(&host.unwrap()).unwrap()
}

fn upload_inputs<B: Backend>(b: &B, pb: &Problem, strided: bool, idx_dt: DType) -> Inputs<B> {
    let (h, dqk, dv, tq, tk) = (pb.heads, pb.dqk, pb.dv, pb.tq(), pb.tk());
    let q = if strided {
        // Rows padded by 3 heads' worth of garbage: q is [Tq, H, dqk] inside [Tq, H + 3, dqk].
        let mut padded = vec![7.5f32; tq * (h + 3) * dqk];
        for t in 0..tq {
            padded[t * (h + 3) * dqk..][..h * dqk].copy_from_slice(&pb.q[t * h * dqk..][..h * dqk]);
        }
        let mut dt = upload_f32(b, pb.in_dt, &[tq, h + 3, dqk], &padded).unwrap();
        dt.layout = Layout { dtype: pb.in_dt, shape: vec![tq, h, dqk], strides: vec![(h + 3) * dqk, dqk, 1], offset: 0 };
        dt
    } else {
        upload_f32(b, pb.in_dt, &[tq, h, dqk], &pb.q).unwrap()
    };
    let (kv, k_layout, v_layout) = if strided {
        let w = dqk + dv;
        // At least one row so the v view's offset stays inside the buffer when Tk = 0.
        let mut fused = vec![0f32; tk.max(1) * h * w];
        for r in 0..tk * h {
            fused[r * w..][..dqk].copy_from_slice(&pb.k[r * dqk..][..dqk]);
            fused[r * w + dqk..][..dv].copy_from_slice(&pb.v[r * dv..][..dv]);
        }
        let kv = upload_f32(b, pb.in_dt, &[fused.len()], &fused).unwrap();
        let k_layout = Layout { dtype: pb.in_dt, shape: vec![tk, h, dqk], strides: vec![h * w, w, 1], offset: 0 };
        let v_layout = Layout { dtype: pb.in_dt, shape: vec![tk, h, dv], strides: vec![h * w, w, 1], offset: dqk };
        (kv, k_layout, v_layout)
    } else {
        // k then v back to back in one buffer: v at an offset.
        let mut both = pb.k.clone();
        both.extend_from_slice(&pb.v);
        let kv = upload_f32(b, pb.in_dt, &[both.len()], &both).unwrap();
        let k_layout = Layout::contiguous(pb.in_dt, &[tk, h, dqk]);
        let v_layout = Layout { offset: pb.k.len(), ..Layout::contiguous(pb.in_dt, &[tk, h, dv]) };
        (kv, k_layout, v_layout)
    };
    let cu = offsets_tensor(b, &pb.q_lens, idx_dt);
    let cu_k = pb.k_lens.as_ref().map(|kl| offsets_tensor(b, kl, idx_dt));
    Inputs { q, kv, k_layout, v_layout, cu, cu_k }
}

/// Runs the backend's prefill; returns (out, lse) decoded to f32.
fn run_problem<B: Backend + MlaPrefill>(b: &B, pb: &Problem, out_dt: DType, strided: bool, idx_dt: DType) -> (Vec<f32>, Vec<f32>) {
    let plan = MlaPrefill::plan(b, &pb.params(), &pb.batch()).expect("plan");
    let inp = upload_inputs(b, pb, strided, idx_dt);
    let mut out = b.zeros(out_dt, &[pb.tq(), pb.heads, pb.dv]).unwrap();
    let mut lse = b.zeros(DType::F32, &[pb.tq(), pb.heads]).unwrap();
    let args = MlaPrefillArgs {
        q: inp.q.as_ref(),
        k: TensorRef::new(&inp.kv.buf, inp.k_layout.clone()),
        v: TensorRef::new(&inp.kv.buf, inp.v_layout.clone()),
        cu_seqlens: inp.cu.as_ref(),
        cu_seqlens_k: inp.cu_k.as_ref().map(|t| t.as_ref()),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    let mut ws = b.alloc_zeroed(MlaPrefill::workspace_size(b, &plan)).unwrap();
    MlaPrefill::run(b, &plan, args, Some(&mut ws), b.default_stream()).expect("run");
    (download_f32(b, &out).unwrap(), download_f32(b, &lse).unwrap())
}

/// Output tolerance. The oracle sees the same rounded inputs, so only the algorithm (tiled
/// online softmax on GPUs vs the naive f64 sum) and the output rounding differ: F32_ALGO for f32
/// outputs, BF16 (one rounding plus a bf16 P matrix in GPU kernels) for bf16 outputs. The LSE is
/// f32 and well conditioned: F32 (1e-5).
fn out_tolerance(out_dt: DType) -> Tolerance {
    if out_dt == DType::BF16 {
        Tolerance::BF16
    } else {
        Tolerance::F32_ALGO
    }
}

fn check_problem<B: Backend + MlaPrefill>(b: &B, pb: &Problem, out_dt: DType, strided: bool, idx_dt: DType) {
    let what = format!(
        "mla_prefill h{} {}x{} q{:?} k{:?} causal {} {}->{} strided {strided} {idx_dt}",
        pb.heads, pb.dqk, pb.dv, pb.q_lens, pb.k_lens, pb.causal, pb.in_dt, out_dt
    );
    let (out, lse) = run_problem(b, pb, out_dt, strided, idx_dt);
    let (want_out, want_lse) = naive(pb);
    assert_close(&format!("{what}: out"), &out, &want_out, out_tolerance(out_dt));
    assert_close(&format!("{what}: lse"), &lse, &want_lse, Tolerance::F32);
}

/// Ragged causal (and non-causal, and separate-key) prefill equals the f64 oracle, for K3 and
/// tiny dims, many head counts, empty sequences, bf16/f32 I/O, i32/i64 offsets, strided k/v.
pub fn mla_prefill_matches_naive<B: Backend + MlaPrefill>(b: &B) {
    const TINY: (usize, usize) = (48, 16);
    const K3: (usize, usize) = (192, 128);
    let mut rng = TestRng::new(0x4d4c41);
    let (f32_, bf16_) = (DType::F32, DType::BF16);
    // (heads, dims, q lens, key lens, causal, in, out, strided, offsets dtype)
    #[allow(clippy::type_complexity)]
    let cases: &[(usize, (usize, usize), &[usize], Option<&[usize]>, bool, DType, DType, bool, DType)] = &[
        (1, TINY, &[5, 0, 7], None, true, f32_, f32_, false, DType::I64),
        (4, TINY, &[0, 9, 3, 0, 6], None, true, bf16_, bf16_, true, DType::I32),
        (12, K3, &[6, 0, 4], None, true, bf16_, f32_, true, DType::I64),
        (16, TINY, &[8, 1, 0], None, false, f32_, bf16_, true, DType::I32),
        (24, K3, &[5, 3], None, true, f32_, f32_, true, DType::I32),
        (16, K3, &[4], None, true, bf16_, bf16_, false, DType::I64),
        (24, TINY, &[2, 0, 6], None, true, bf16_, f32_, false, DType::I64),
        (2, TINY, &[0, 0], None, true, f32_, f32_, true, DType::I64), // no tokens at all
        // Separate keys: causal bottom-right (keys >= queries), and non-causal with an empty key side.
        (4, TINY, &[3, 0, 5], Some(&[7, 2, 5]), true, f32_, f32_, true, DType::I32),
        (12, K3, &[2, 3], Some(&[0, 4]), false, bf16_, f32_, true, DType::I64),
    ];
    for &(heads, dims, ql, kl, causal, in_dt, out_dt, strided, idx) in cases {
        let mut pb = Problem::new(&mut rng, heads, dims, ql, kl, in_dt);
        pb.causal = causal;
        check_problem(b, &pb, out_dt, strided, idx);
    }
    // Seeded random shapes: the property-test part, run on every backend.
    for _ in 0..6 {
        let heads = [1, 4, 12, 16, 24][rng.below(5)];
        let dims = if rng.below(3) == 0 { K3 } else { TINY };
        let lens: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(9)).collect();
        let in_dt = [f32_, bf16_][rng.below(2)];
        let out_dt = [f32_, bf16_][rng.below(2)];
        let mut pb = Problem::new(&mut rng, heads, dims, &lens, None, in_dt);
        pb.causal = rng.below(4) != 0;
        check_problem(b, &pb, out_dt, rng.below(2) == 0, [DType::I32, DType::I64][rng.below(2)]);
    }
}

/// Chunked prefill: for the last 17 of 37 tokens, one causal pass equals the LSE merge (done
/// here, in f64) of a non-causal pass of those queries over keys 0..20 and a causal pass over
/// keys 20..37. A second sequence without context (9 tokens, split at 0) checks that an empty
/// key side gives lse = -inf and out = 0 and merges away.
pub fn mla_prefill_chunked_split_identity<B: Backend + MlaPrefill>(b: &B) {
    let mut rng = TestRng::new(2017);
    for &(heads, dims) in &[(4usize, (48usize, 16usize)), (2, (192, 128))] {
        let (dqk, dv) = dims;
        // Full problem: sequences of 37 and 9 tokens.
        let full = Problem::new(&mut rng, heads, dims, &[37, 9], None, DType::F32);
        let (full_out, full_lse) = run_problem(b, &full, DType::F32, false, DType::I64);
        let (want_out, want_lse) = naive(&full);
        assert_close("split identity: full pass vs oracle", &full_out, &want_out, Tolerance::F32_ALGO);
        assert_close("split identity: full lse vs oracle", &full_lse, &want_lse, Tolerance::F32);

        // Rows of the full problem: token t of the whole batch.
        let rows = |v: &[f32], per: usize, ts: &[usize]| -> Vec<f32> {
            ts.iter().flat_map(|&t| v[t * heads * per..(t + 1) * heads * per].to_vec()).collect()
        };
        let chunk_tokens: Vec<usize> = (20..37).chain(37..46).collect();
        let ctx_tokens: Vec<usize> = (0..20).collect();
        let chunk_q = rows(&full.q, dqk, &chunk_tokens);
        let chunk_k = rows(&full.k, dqk, &chunk_tokens);
        let chunk_v = rows(&full.v, dv, &chunk_tokens);

        let mut ctx = Problem::new(&mut rng, heads, dims, &[17, 9], Some(&[20, 0]), DType::F32);
        ctx.causal = false;
        ctx.q = chunk_q.clone();
        ctx.k = rows(&full.k, dqk, &ctx_tokens);
        ctx.v = rows(&full.v, dv, &ctx_tokens);
        let (ctx_out, ctx_lse) = run_problem(b, &ctx, DType::F32, true, DType::I32);

        let mut own = Problem::new(&mut rng, heads, dims, &[17, 9], None, DType::F32);
        own.q = chunk_q;
        own.k = chunk_k;
        own.v = chunk_v;
        let (own_out, own_lse) = run_problem(b, &own, DType::F32, true, DType::I64);

        // Sequence 2 has no context: its rows are exactly empty.
        for r in 17 * heads..26 * heads {
            assert_eq!(ctx_lse[r], f32::NEG_INFINITY, "row {r} of an empty key side must have lse -inf");
            assert!(ctx_out[r * dv..(r + 1) * dv].iter().all(|&x| x == 0.0), "row {r} of an empty key side must be 0");
        }

        let mut merged = vec![0f32; own_out.len()];
        let mut merged_lse = vec![0f32; own_lse.len()];
        for r in 0..own_lse.len() {
            let (l1, l2) = (ctx_lse[r] as f64, own_lse[r] as f64);
            let m = l1.max(l2);
            let (w1, w2) = ((l1 - m).exp(), (l2 - m).exp());
            let z = w1 + w2;
            for d in 0..dv {
                merged[r * dv + d] = ((w1 * ctx_out[r * dv + d] as f64 + w2 * own_out[r * dv + d] as f64) / z) as f32;
            }
            merged_lse[r] = (m + z.ln()) as f32;
        }
        // Same f32 results re-associated: F32_ALGO for outputs, F32 for the LSE.
        assert_close("split identity: merged out", &merged, &rows(&full_out, dv, &chunk_tokens), Tolerance::F32_ALGO);
        assert_close("split identity: merged lse", &merged_lse, &rows(&full_lse, 1, &chunk_tokens), Tolerance::F32);
    }
}

/// Malformed params, offsets and tensors give `InvalidInput` naming the field.
pub fn mla_prefill_rejects_bad_input<B: Backend + MlaPrefill>(b: &B) {
    let p = MlaPrefillParams { heads: 2, qk_dim: 8, v_dim: 4, softmax_scale: 0.35, causal: true };
    let good = MlaPrefillBatch::from_seq_lens(&[3, 0, 2]);
    let field = |r: Result<crate::ops::MlaPrefillPlan>| r.expect_err("must be rejected").field().map(str::to_owned);
    let with_cu = |cu: Vec<i64>, total: usize| MlaPrefillBatch { total_tokens: total, cu_seqlens: cu, kv: None };

    assert_eq!(field(MlaPrefill::plan(b, &MlaPrefillParams { heads: 0, ..p.clone() }, &good)).as_deref(), Some("params.heads"));
    assert_eq!(field(MlaPrefill::plan(b, &MlaPrefillParams { qk_dim: 0, ..p.clone() }, &good)).as_deref(), Some("params.qk_dim"));
    assert_eq!(field(MlaPrefill::plan(b, &MlaPrefillParams { v_dim: 0, ..p.clone() }, &good)).as_deref(), Some("params.v_dim"));
    for s in [0.0, f32::NAN, f32::INFINITY, -1.0] {
        let bad = MlaPrefillParams { softmax_scale: s, ..p.clone() };
        assert_eq!(field(MlaPrefill::plan(b, &bad, &good)).as_deref(), Some("params.softmax_scale"), "scale {s}");
    }
    for (cu, total, why) in [
        (vec![0, 3, 2, 5], 5, "decreasing"),
        (vec![0, 3, 5], 6, "not ending at total_tokens"),
        (vec![1, 3, 5], 5, "not starting at 0"),
        (vec![], 0, "empty"),
        (vec![0, -1, 5], 5, "negative"),
    ] {
        assert_eq!(field(MlaPrefill::plan(b, &p, &with_cu(cu, total))).as_deref(), Some("cu_seqlens"), "{why}");
    }
    // Causal with fewer keys than queries, and a key side with a different batch size.
    let short = MlaPrefillBatch::with_kv_lens(&[3, 2], &[3, 1]);
    assert_eq!(field(MlaPrefill::plan(b, &p, &short)).as_deref(), Some("cu_seqlens_k"));
    let mut mismatch = MlaPrefillBatch::with_kv_lens(&[3, 2], &[4, 4]);
    mismatch.kv = Some(MlaPrefillKv { total_kv_tokens: 8, cu_seqlens_k: vec![0, 8] });
    assert_eq!(field(MlaPrefill::plan(b, &p, &mismatch)).as_deref(), Some("cu_seqlens_k"));

    // Tensor arguments against a good plan.
    let plan = MlaPrefill::plan(b, &p, &good).unwrap();
    let t = 5;
    let z = |dt: DType, shape: &[usize]| b.zeros(dt, shape).unwrap();
    let q = z(DType::F32, &[t, 2, 8]);
    let k = z(DType::F32, &[t, 2, 8]);
    let v = z(DType::F32, &[t, 2, 4]);
    let cu = b.upload_tensor(&HostTensor::from_i64(&[4], &[0, 3, 3, 5]).unwrap()).unwrap();
    let run_with = |q: &DeviceTensor<B>, k: &DeviceTensor<B>, v: &DeviceTensor<B>, cu: &DeviceTensor<B>, out_dt: DType, out_shape: &[usize], lse_dt: DType| {
        let mut out = z(out_dt, out_shape);
        let mut lse = z(lse_dt, &[t, 2]);
        let args = MlaPrefillArgs {
            q: q.as_ref(),
            k: k.as_ref(),
            v: v.as_ref(),
            cu_seqlens: cu.as_ref(),
            cu_seqlens_k: None,
            out: out.as_mut(),
            lse: Some(lse.as_mut()),
        };
        MlaPrefill::run(b, &plan, args, None, b.default_stream())
    };
    let err = |r: Result<()>| r.expect_err("must be rejected").field().map(str::to_owned);
    assert!(run_with(&q, &k, &v, &cu, DType::F32, &[t, 2, 4], DType::F32).is_ok(), "the good arguments must run");
    let q16 = z(DType::F16, &[t, 2, 8]);
    assert_eq!(err(run_with(&q16, &k, &v, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("q"));
    let kbf = z(DType::BF16, &[t, 2, 8]);
    assert_eq!(err(run_with(&q, &kbf, &v, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("k"), "k dtype != q dtype");
    let v_wide = z(DType::F32, &[t, 2, 5]);
    assert_eq!(err(run_with(&q, &k, &v_wide, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("v"));
    let q_short = z(DType::F32, &[t - 1, 2, 8]);
    assert_eq!(err(run_with(&q_short, &k, &v, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("q"));
    assert_eq!(err(run_with(&q, &k, &v, &cu, DType::F32, &[t, 2, 8], DType::F32)).as_deref(), Some("out"));
    assert_eq!(err(run_with(&q, &k, &v, &cu, DType::I32, &[t, 2, 4], DType::F32)).as_deref(), Some("out"));
    assert_eq!(err(run_with(&q, &k, &v, &cu, DType::F32, &[t, 2, 4], DType::BF16)).as_deref(), Some("lse"));
    let cu_f32 = upload_f32(b, DType::F32, &[4], &[0.0, 3.0, 3.0, 5.0]).unwrap();
    assert_eq!(err(run_with(&q, &k, &v, &cu_f32, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("cu_seqlens"));
    let cu_len = b.upload_tensor(&HostTensor::from_i64(&[3], &[0, 3, 5]).unwrap()).unwrap();
    assert_eq!(err(run_with(&q, &k, &v, &cu_len, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("cu_seqlens"));
    // A non-unit inner stride on k.
    let mut k_strided = z(DType::F32, &[t, 2, 16]);
    k_strided.layout = Layout { dtype: DType::F32, shape: vec![t, 2, 8], strides: vec![32, 16, 2], offset: 0 };
    assert_eq!(err(run_with(&q, &k_strided, &v, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("k"));
    // A layout that does not fit its buffer.
    let mut v_oob = z(DType::F32, &[t, 2, 4]);
    v_oob.layout.offset = 1;
    assert_eq!(err(run_with(&q, &k, &v_oob, &cu, DType::F32, &[t, 2, 4], DType::F32)).as_deref(), Some("v"));
    // Key offsets passed to a self-attention plan.
    let mut out = z(DType::F32, &[t, 2, 4]);
    let args = MlaPrefillArgs {
        q: q.as_ref(),
        k: k.as_ref(),
        v: v.as_ref(),
        cu_seqlens: cu.as_ref(),
        cu_seqlens_k: Some(cu.as_ref()),
        out: out.as_mut(),
        lse: None,
    };
    assert_eq!(err(MlaPrefill::run(b, &plan, args, None, b.default_stream())).as_deref(), Some("cu_seqlens_k"));
}

