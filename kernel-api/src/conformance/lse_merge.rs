//! Conformance tests of [`crate::ops::LseMerge`].

use super::{download_f32, upload_f32, TestRng};
use crate::backend::{Backend, BackendExt};
use crate::dtype::DType;
use crate::ops::{LseMerge, LseMergeArgs, LseMergeParams};
use crate::tolerance::{assert_close, Tolerance};


/// Attention of one query row over `keys` in f64: (output, natural-log LSE).
fn naive_attention(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], d: usize, scale: f64) -> (Vec<f64>, f64) {
    if keys.is_empty() {
        return (vec![0.0; d], f64::NEG_INFINITY);
    }
    let s: Vec<f64> = keys.iter().map(|k| q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale).collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut o = vec![0f64; d];
    for (wi, v) in w.iter().zip(values) {
        for i in 0..d {
            o[i] += wi / z * v[i] as f64;
        }
    }
    (o, m + z.ln())
}

struct Case {
    parts: usize,
    tokens: usize,
    heads: usize,
    d: usize,
    partial_out: Vec<f32>,
    partial_lse: Vec<f32>,
    want_out: Vec<f32>,
    want_lse: Vec<f32>,
}

/// Splits `n_keys` keys of random attention problems into `parts` contiguous ranges (some
/// possibly empty) and returns the per-part results plus the unsplit result.
fn split_case(rng: &mut TestRng, parts: usize, tokens: usize, heads: usize, d: usize, n_keys: usize) -> Case {
    let rows = tokens * heads;
    let mut po = vec![0f32; parts * rows * d];
    let mut pl = vec![f32::NEG_INFINITY; parts * rows];
    let mut wo = vec![0f32; rows * d];
    let mut wl = vec![0f32; rows];
    // Random cut points, sorted: parts may be empty.
    let mut cuts: Vec<usize> = (0..parts - 1).map(|_| rng.below(n_keys + 1)).collect();
    cuts.sort_unstable();
    cuts.insert(0, 0);
    cuts.push(n_keys);
    for r in 0..rows {
        let q = rng.normals(d, 1.0);
        let keys: Vec<Vec<f32>> = (0..n_keys).map(|_| rng.normals(d, 1.0)).collect();
        let vals: Vec<Vec<f32>> = (0..n_keys).map(|_| rng.normals(d, 1.0)).collect();
        let scale = 1.0 / (d as f64).sqrt();
        let (o, l) = naive_attention(&q, &keys, &vals, d, scale);
        for i in 0..d {
            wo[r * d + i] = o[i] as f32;
        }
        wl[r] = l as f32;
        for p in 0..parts {
            let (a, b) = (cuts[p], cuts[p + 1]);
            let (o, l) = naive_attention(&q, &keys[a..b], &vals[a..b], d, scale);
            for i in 0..d {
                po[(p * rows + r) * d + i] = o[i] as f32;
            }
            pl[p * rows + r] = l as f32;
        }
    }
    Case { parts, tokens, heads, d, partial_out: po, partial_lse: pl, want_out: wo, want_lse: wl }
}

fn run_case<B: Backend + LseMerge>(b: &B, c: &Case, in_dt: DType, out_dt: DType) -> (Vec<f32>, Vec<f32>) {
    let p = LseMergeParams { parts: c.parts, tokens: c.tokens, heads: c.heads, head_dim: c.d };
    let plan = LseMerge::plan(b, &p).expect("plan");
    let po = upload_f32(b, in_dt, &[c.parts, c.tokens, c.heads, c.d], &c.partial_out).unwrap();
    let pl = upload_f32(b, DType::F32, &[c.parts, c.tokens, c.heads], &c.partial_lse).unwrap();
    let mut out = b.zeros(out_dt, &[c.tokens, c.heads, c.d]).unwrap();
    let mut lse = b.zeros(DType::F32, &[c.tokens, c.heads]).unwrap();
    let args = LseMergeArgs { partial_out: po.as_ref(), partial_lse: pl.as_ref(), out: out.as_mut(), lse: Some(lse.as_mut()) };
    LseMerge::run(b, &plan, args, None, b.default_stream()).expect("run");
    (download_f32(b, &out).unwrap(), download_f32(b, &lse).unwrap())
}

/// Split-KV outputs merged by LSE equal attention over all keys (f64 oracle).
pub fn lse_merge_equals_unsplit_attention<B: Backend + LseMerge>(b: &B) {
    let mut rng = TestRng::new(11);
    // The last case has more parts than the GPU kernel's 128-part weight chunk and a head dim
    // over its 128-thread block (two dim batches, two weight chunks; 650 keys leave few parts
    // empty, so stale weights in either would show).
    for &(parts, tokens, heads, d, keys) in &[(1, 3, 2, 8, 5), (2, 2, 12, 16, 33), (4, 1, 3, 64, 70), (7, 2, 1, 32, 9), (130, 1, 2, 136, 650)] {
        let c = split_case(&mut rng, parts, tokens, heads, d, keys);
        let (o, l) = run_case(b, &c, DType::F32, DType::F32);
        assert_close("lse_merge out (f32)", &o, &c.want_out, Tolerance::F32);
        assert_close("lse_merge lse", &l, &c.want_lse, Tolerance::F32);
        let (o, l) = run_case(b, &c, DType::BF16, DType::BF16);
        assert_close("lse_merge out (bf16)", &o, &c.want_out, Tolerance::BF16);
        assert_close("lse_merge lse (bf16 parts)", &l, &c.want_lse, Tolerance::F32);
    }
}

/// Parts with lse = -inf contribute nothing; all parts empty gives out = 0, lse = -inf.
pub fn lse_merge_empty_parts<B: Backend + LseMerge>(b: &B) {
    let mut rng = TestRng::new(12);
    let (parts, tokens, heads, d) = (3, 2, 2, 4);
    let rows = tokens * heads;
    let mut c = split_case(&mut rng, parts, tokens, heads, d, 6);
    // Row 0: every part empty.
    for p in 0..parts {
        c.partial_lse[p * rows] = f32::NEG_INFINITY;
        for i in 0..d {
            c.partial_out[(p * rows) * d + i] = 123.0; // garbage that must be ignored
        }
    }
    let (o, l) = run_case(b, &c, DType::F32, DType::F32);
    assert!(o[..d].iter().all(|&x| x == 0.0), "all-empty row must be zero, got {:?}", &o[..d]);
    assert_eq!(l[0], f32::NEG_INFINITY, "all-empty row must have lse -inf");
    assert_close("lse_merge other rows", &o[d..], &c.want_out[d..], Tolerance::F32);
}

/// Mismatched shapes and dtypes are typed errors naming the field.
pub fn lse_merge_rejects_bad_shapes<B: Backend + LseMerge>(b: &B) {
    let p = LseMergeParams { parts: 2, tokens: 3, heads: 4, head_dim: 8 };
    let plan = LseMerge::plan(b, &p).unwrap();
    let po = b.zeros(DType::F32, &[2, 3, 4, 8]).unwrap();
    let bad_lse = b.zeros(DType::BF16, &[2, 3, 4]).unwrap();
    let mut out = b.zeros(DType::F32, &[3, 4, 8]).unwrap();
    let args = LseMergeArgs { partial_out: po.as_ref(), partial_lse: bad_lse.as_ref(), out: out.as_mut(), lse: None };
    let e = LseMerge::run(b, &plan, args, None, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("partial_lse"), "{e}");
    let lse = b.zeros(DType::F32, &[2, 3, 4]).unwrap();
    let mut small = b.zeros(DType::F32, &[3, 4, 7]).unwrap();
    let args = LseMergeArgs { partial_out: po.as_ref(), partial_lse: lse.as_ref(), out: small.as_mut(), lse: None };
    let e = LseMerge::run(b, &plan, args, None, b.default_stream()).unwrap_err();
    assert_eq!(e.field(), Some("out"), "{e}");
    assert!(LseMerge::plan(b, &LseMergeParams { parts: 0, ..p.clone() }).is_err());
}

