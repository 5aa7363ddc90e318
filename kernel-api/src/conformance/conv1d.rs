//! Conformance tests of [`crate::ops::CausalConv1d`], plus the strided-view helpers the KDA
//! decode tests share.

use super::{round_through, TestRng};
use crate::backend::{Backend, DeviceTensor};
use crate::dtype::DType;
use crate::error::Error;
use crate::ops::{CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, ConvActivation, HostIndices};
use crate::tensor::{decode_f32, encode_f32, Layout};
use crate::tolerance::{assert_close, Tolerance};


// ---- strided views -------------------------------------------------------------------------

/// A layout of `shape` whose storage nests the dimensions in `order` (outermost first), e.g.
/// `[0, 2, 1]` stores a `[slots, D, W-1]` pool as `[slots, W-1, D]` (vLLM's conv-state layout).
pub(crate) fn layout_in_order(dtype: DType, shape: &[usize], order: &[usize]) -> Layout {
    let mut strides = vec![0; shape.len()];
    let mut s = 1;
    for &dim in order.iter().rev() {
        strides[dim] = s;
        s *= shape[dim];
    }
    Layout { dtype, shape: shape.to_vec(), strides, offset: 0 }
}

/// A `[rows, cols]` layout whose rows are `cols + pad` elements apart, starting at `offset`.
pub(crate) fn row_strided(dtype: DType, rows: usize, cols: usize, pad: usize, offset: usize) -> Layout {
    Layout { dtype, shape: vec![rows, cols], strides: vec![cols + pad, 1], offset }
}

/// Uploads `values` (logical row-major order) into a buffer shaped by `layout`. Bytes no element
/// covers hold 0x7F (≈ 3.4e38 as f32 or bf16), so a kernel reading them shows.
pub(crate) fn upload_view<B: Backend>(b: &B, layout: Layout, values: &[f32]) -> DeviceTensor<B> {
    let s = layout.dtype.size_bytes();
    let mut bytes = vec![0x7Fu8; layout.span_bytes().expect("test layout size")];
    let offs = layout.element_offsets();
    assert_eq!(offs.len(), values.len(), "test values do not match the layout");
    for (o, &v) in offs.into_iter().zip(values) {
        encode_f32(layout.dtype, v, &mut bytes[o * s..o * s + s]);
    }
    DeviceTensor { buf: b.upload(&bytes).expect("upload"), layout }
}

/// Downloads the buffer of `t` as raw bytes.
pub(crate) fn download_bytes<B: Backend>(b: &B, t: &DeviceTensor<B>) -> Vec<u8> {
    let mut bytes = vec![0u8; b.buffer_len(&t.buf)];
    b.download(&t.buf, &mut bytes).expect("download");
    bytes
}

/// Downloads the elements of a (possibly strided) tensor in logical order, decoded to f32.
pub(crate) fn download_view<B: Backend>(b: &B, t: &DeviceTensor<B>) -> Vec<f32> {
    let bytes = download_bytes(b, t);
    let s = t.layout.dtype.size_bytes();
    t.layout.element_offsets().into_iter().map(|o| decode_f32(t.layout.dtype, &bytes[o * s..o * s + s])).collect()
}

/// Uploads an index array.
pub(crate) fn upload_i64<B: Backend>(b: &B, dtype: DType, values: &[i64]) -> DeviceTensor<B> {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    upload_view(b, Layout::contiguous(dtype, &[values.len()]), &v)
}

/// The field an error names (panics on success: callers expect an error).
#[track_caller]
pub(crate) fn field_of<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(e) => e.field().map(str::to_string).unwrap_or_else(|| format!("<{e}>")),
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
    }
}

// ---- oracle --------------------------------------------------------------------------------

pub(crate) fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Pre-conv input of channel `c` at position `pos` of a sequence whose tokens are `x` (`[len, d]`)
/// and whose history is `hist` (`[d, w-1]`, oldest first, standing at positions -(w-1)..-1),
/// or 0 without history.
fn input_at(x: &[f32], hist: Option<&[f32]>, d: usize, w: usize, c: usize, pos: isize) -> f64 {
    if pos >= 0 {
        x[pos as usize * d + c] as f64
    } else {
        hist.map_or(0.0, |h| h[c * (w - 1) + (w as isize - 1 + pos) as usize] as f64)
    }
}

/// Naive causal conv of one sequence: (out `[len, d]`, final history `[d, w-1]`).
fn oracle_conv(
    x: &[f32],
    hist: Option<&[f32]>,
    weight: &[f32],
    d: usize,
    w: usize,
    silu: bool,
) -> (Vec<f32>, Vec<f32>) {
    let len = x.len() / d;
    let mut out = vec![0f32; len * d];
    for t in 0..len {
        for c in 0..d {
            let mut acc = 0f64;
            for j in 0..w {
                acc +=
                    weight[c * w + j] as f64 * input_at(x, hist, d, w, c, t as isize + j as isize - (w as isize - 1));
            }
            out[t * d + c] = (if silu { silu64(acc) } else { acc }) as f32;
        }
    }
    let mut fin = vec![0f32; d * (w - 1)];
    for c in 0..d {
        for i in 0..w - 1 {
            fin[c * (w - 1) + i] = input_at(x, hist, d, w, c, len as isize - (w as isize - 1) + i as isize) as f32;
        }
    }
    (out, fin)
}

// ---- cases ---------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct ConvCase {
    d: usize,
    w: usize,
    lens: Vec<usize>,
    slots: usize,
    /// Pool slot per sequence.
    seq_slot: Vec<usize>,
    /// Whether the device gets explicit indices (else seq_slot[n] = n).
    explicit_indices: bool,
    silu: bool,
    read: bool,
    write: bool,
    x_dt: DType,
    state_dt: DType,
    out_dt: DType,
    cu_dt: DType,
    /// Row padding of x / out, and whether the pool / weight use transposed storage.
    pad: usize,
    sd_pool: bool,
    wd_weight: bool,
    x: Vec<f32>,
    weight: Vec<f32>,
    pool: Vec<f32>,
}

impl ConvCase {
    fn random(rng: &mut TestRng, d: usize, w: usize, lens: Vec<usize>) -> Self {
        let n = lens.len();
        let explicit_indices = rng.below(3) != 0;
        let slots = n + rng.below(3);
        let seq_slot: Vec<usize> =
            if explicit_indices { rng.permutation(slots).into_iter().take(n).collect() } else { (0..n).collect() };
        let pick = |r: &mut TestRng| if r.below(2) == 0 { DType::F32 } else { DType::BF16 };
        let x_dt = pick(rng);
        let state_dt = pick(rng);
        let out_dt = pick(rng);
        let t: usize = lens.iter().sum();
        ConvCase {
            d,
            w,
            slots,
            seq_slot,
            explicit_indices,
            silu: rng.below(2) == 0,
            read: rng.below(4) != 0,
            write: rng.below(4) != 0,
            x_dt,
            state_dt,
            out_dt,
            cu_dt: if rng.below(2) == 0 { DType::I32 } else { DType::I64 },
            pad: rng.below(3) * 2,
            sd_pool: rng.below(2) == 0,
            wd_weight: rng.below(2) == 0,
            x: round_through(x_dt, &rng.normals(t * d, 1.0)),
            weight: rng.normals(d * w, 0.5),
            pool: round_through(state_dt, &rng.normals(slots * d * (w - 1), 1.0)),
            lens,
        }
    }

    fn cu(&self) -> Vec<i64> {
        let mut cu = vec![0i64];
        for &l in &self.lens {
            cu.push(cu[cu.len() - 1] + l as i64);
        }
        cu
    }

    fn params(&self) -> CausalConv1dParams {
        CausalConv1dParams {
            dim: self.d,
            width: self.w,
            activation: if self.silu { ConvActivation::Silu } else { ConvActivation::Identity },
            read_initial_state: self.read,
            write_final_state: self.write,
            state_slots: self.slots,
        }
    }

    /// (outputs `[T, d]`, pool after the op) by the oracle.
    fn oracle(&self) -> (Vec<f32>, Vec<f32>) {
        let (d, h) = (self.d, self.w - 1);
        let mut out = Vec::new();
        let mut pool = self.pool.clone();
        let cu = self.cu();
        for (n, &s) in self.seq_slot.iter().enumerate() {
            let xs = &self.x[cu[n] as usize * d..cu[n + 1] as usize * d];
            let hist = &self.pool[s * d * h..(s + 1) * d * h];
            let (o, fin) = oracle_conv(xs, self.read.then_some(hist), &self.weight, d, self.w, self.silu);
            out.extend(o);
            if self.write && !xs.is_empty() {
                pool[s * d * h..(s + 1) * d * h].copy_from_slice(&round_through(self.state_dt, &fin));
            }
        }
        (out, pool)
    }

    /// Runs the op on `b`: (outputs, pool after the op).
    fn run<B: Backend + CausalConv1d>(&self, b: &B) -> (Vec<f32>, Vec<f32>) {
        let (d, w, t) = (self.d, self.w, self.x.len() / self.d);
        let cu = self.cu();
        let cu32: Vec<i32> = cu.iter().map(|&v| v as i32).collect();
        let idx: Vec<i32> = self.seq_slot.iter().map(|&s| s as i32).collect();
        let batch = CausalConv1dBatch {
            cu_seqlens: if self.cu_dt == DType::I32 { HostIndices::I32(&cu32) } else { HostIndices::I64(&cu) },
            state_indices: self.explicit_indices.then_some(&idx[..]),
        };
        let plan = CausalConv1d::plan(b, &self.params(), &batch).expect("plan");
        let x = upload_view(b, row_strided(self.x_dt, t, d, self.pad, 1), &self.x);
        let wl = if self.wd_weight {
            layout_in_order(DType::F32, &[d, w], &[1, 0])
        } else {
            Layout::contiguous(DType::F32, &[d, w])
        };
        let weight = upload_view(b, wl, &self.weight);
        let cu_t = upload_i64(b, self.cu_dt, &cu);
        let idx_t = upload_i64(b, DType::I32, &idx.iter().map(|&v| v as i64).collect::<Vec<_>>());
        let pool_shape = [self.slots, d, w - 1];
        let order: &[usize] = if self.sd_pool { &[0, 2, 1] } else { &[0, 1, 2] };
        let mut pool = upload_view(b, layout_in_order(self.state_dt, &pool_shape, order), &self.pool);
        let mut out = upload_view(b, row_strided(self.out_dt, t, d, self.pad, 0), &vec![0.0; t * d]);
        let args = CausalConv1dArgs {
            x: x.as_ref(),
            weight: weight.as_ref(),
            cu_seqlens: cu_t.as_ref(),
            state_indices: self.explicit_indices.then(|| idx_t.as_ref()),
            conv_state: Some(pool.as_mut()),
            out: out.as_mut(),
        };
        CausalConv1d::run(b, &plan, args, None, b.default_stream()).expect("run");
        (download_view(b, &out), download_view(b, &pool))
    }
}

/// Output tolerance: the conv is a W-term dot product; the f64 oracle sees the same rounded
/// inputs, so an f32 output only carries f32 rounding (F32) and a bf16 output one bf16 rounding.
fn out_tol(dt: DType) -> Tolerance {
    Tolerance::for_dtype(dt)
}

/// Varlen conv vs the naive oracle: empty sequences, sequences shorter than W-1, sequences
/// longer than a GPU time tile, every state
/// flag combination, f32/bf16 inputs, states and outputs, strided rows, transposed pool and
/// weight storage, i32/i64 offsets, explicit or implicit state indices. The pool is compared
/// exactly (it only moves inputs, rounded once to its dtype).
pub fn conv1d_matches_oracle_varlen<B: Backend + CausalConv1d>(b: &B) {
    let mut rng = TestRng::new(31);
    let shapes: &[(usize, usize, &[usize])] = &[
        (3, 4, &[5]),
        (8, 4, &[0, 1, 2, 7, 0]),
        (17, 4, &[3, 0, 9]),
        (6, 2, &[1, 4]),
        (5, 3, &[0, 0]),
        (12, 4, &[2, 1, 1, 6]),
        // Long sequences: GPU kernels tile time (the SIMT/CUDA kernel in chunks of 64 tokens),
        // so chunk boundaries, a chunk reaching back into x, and the final state of a
        // multi-chunk sequence must be covered too.
        (5, 4, &[130, 0, 64, 3]),
    ];
    for _round in 0..4 {
        for &(d, w, lens) in shapes {
            let c = ConvCase::random(&mut rng, d, w, lens.to_vec());
            let (want_out, want_pool) = c.oracle();
            let (out, pool) = c.run(b);
            assert_close(&format!("conv1d out {c:?}"), &out, &want_out, out_tol(c.out_dt));
            assert_eq!(pool, want_pool, "conv1d state pool (read {}, write {}, lens {:?})", c.read, c.write, c.lens);
        }
    }
}

/// Prefill in two chunks (the first writes the state, the second reads it) equals one pass,
/// for split points anywhere, including empty first or second chunks and chunks shorter than
/// W-1. Inputs are stored in the state dtype, so the state carries them exactly.
pub fn conv1d_two_chunks_equal_one_pass<B: Backend + CausalConv1d>(b: &B) {
    let mut rng = TestRng::new(32);
    for &(d, w, dt) in &[(5, 4, DType::F32), (9, 4, DType::BF16), (4, 3, DType::F32)] {
        let lens = vec![6, 1, 0, 4, 3];
        let mut whole = ConvCase::random(&mut rng, d, w, lens.clone());
        (whole.read, whole.write, whole.x_dt, whole.state_dt, whole.out_dt) = (true, true, dt, dt, DType::F32);
        whole.x = round_through(dt, &whole.x);
        whole.pool = round_through(dt, &whole.pool);
        let (out_whole, pool_whole) = whole.run(b);

        let cuts: Vec<usize> = lens.iter().map(|&l| rng.below(l + 1)).collect();
        let cu = whole.cu();
        let mut first = whole.clone();
        let mut second = whole.clone();
        first.lens = cuts.clone();
        second.lens = lens.iter().zip(&cuts).map(|(l, c)| l - c).collect();
        first.x.clear();
        second.x.clear();
        for n in 0..lens.len() {
            let (s, e, m) = (cu[n] as usize, cu[n + 1] as usize, cu[n] as usize + cuts[n]);
            first.x.extend_from_slice(&whole.x[s * d..m * d]);
            second.x.extend_from_slice(&whole.x[m * d..e * d]);
        }
        let (out1, pool1) = first.run(b);
        second.pool = pool1;
        let (out2, pool2) = second.run(b);

        // Reassemble the chunk outputs in the one-pass token order.
        let mut joined = Vec::new();
        let (mut o1, mut o2) = (0, 0);
        for n in 0..lens.len() {
            joined.extend_from_slice(&out1[o1 * d..(o1 + cuts[n]) * d]);
            joined.extend_from_slice(&out2[o2 * d..(o2 + lens[n] - cuts[n]) * d]);
            o1 += cuts[n];
            o2 += lens[n] - cuts[n];
        }
        // Same dot products over the same values: only accumulation order may differ.
        assert_close("conv1d two chunks vs one pass", &joined, &out_whole, Tolerance::F32);
        assert_eq!(pool2, pool_whole, "conv1d final state after two chunks (cuts {cuts:?})");
    }
}

/// Malformed offsets, indices, widths, dtypes and shapes are typed errors naming the field.
pub fn conv1d_rejects_bad_input<B: Backend + CausalConv1d>(b: &B) {
    let p = CausalConv1dParams {
        dim: 4,
        width: 4,
        activation: ConvActivation::Silu,
        read_initial_state: true,
        write_final_state: true,
        state_slots: 3,
    };
    let plan_err = |p: &CausalConv1dParams, cu: &[i64], idx: Option<&[i32]>| {
        field_of(CausalConv1d::plan(b, p, &CausalConv1dBatch { cu_seqlens: HostIndices::I64(cu), state_indices: idx }))
    };
    assert_eq!(plan_err(&p, &[1, 3], None), "cu_seqlens");
    assert_eq!(plan_err(&p, &[0, 3, 2], None), "cu_seqlens");
    assert_eq!(plan_err(&p, &[], None), "cu_seqlens");
    assert_eq!(plan_err(&p, &[0, 1, 2], Some(&[0, 3])), "state_indices");
    assert_eq!(plan_err(&p, &[0, 1, 2], Some(&[-1, 1])), "state_indices");
    assert_eq!(plan_err(&p, &[0, 1, 2], Some(&[1, 1])), "state_indices");
    assert_eq!(plan_err(&p, &[0, 1, 2], Some(&[1])), "state_indices");
    assert_eq!(plan_err(&p, &[0, 1, 2, 3, 4], None), "params.state_slots");
    assert_eq!(plan_err(&CausalConv1dParams { width: 0, ..p.clone() }, &[0, 1], None), "params.width");
    assert_eq!(plan_err(&CausalConv1dParams { dim: 0, ..p.clone() }, &[0, 1], None), "params.dim");

    let cu = [0i64, 2, 5];
    let idx = [2i32, 0];
    let plan =
        CausalConv1d::plan(b, &p, &CausalConv1dBatch { cu_seqlens: HostIndices::I64(&cu), state_indices: Some(&idx) })
            .expect("valid plan");
    let t =
        |dt: DType, shape: &[usize]| upload_view(b, Layout::contiguous(dt, shape), &vec![0.0; shape.iter().product()]);
    let x = t(DType::BF16, &[5, 4]);
    let weight = t(DType::F32, &[4, 4]);
    let cu_t = upload_i64(b, DType::I64, &cu);
    let idx_t = upload_i64(b, DType::I32, &[2, 0]);
    let mut pool = t(DType::F32, &[3, 4, 3]);
    let mut out = t(DType::F32, &[5, 4]);
    macro_rules! run_with {
        ($($f:ident : $v:expr),*) => {{
            #[allow(unused_mut)]
            let mut a = CausalConv1dArgs {
                x: x.as_ref(), weight: weight.as_ref(), cu_seqlens: cu_t.as_ref(),
                state_indices: Some(idx_t.as_ref()), conv_state: Some(pool.as_mut()), out: out.as_mut(),
            };
            $(a.$f = $v;)*
            field_of(CausalConv1d::run(b, &plan, a, None, b.default_stream()))
        }};
    }
    let bad_w = t(DType::F32, &[4, 5]);
    assert_eq!(run_with!(weight: bad_w.as_ref()), "weight");
    let bad_wdt = t(DType::BF16, &[4, 4]);
    assert_eq!(run_with!(weight: bad_wdt.as_ref()), "weight");
    let bad_x = t(DType::F32, &[5, 3]);
    assert_eq!(run_with!(x: bad_x.as_ref()), "x");
    let bad_xt = t(DType::F32, &[6, 4]);
    assert_eq!(run_with!(x: bad_xt.as_ref()), "x");
    let bad_xdt = t(DType::F16, &[5, 4]);
    assert_eq!(run_with!(x: bad_xdt.as_ref()), "x");
    let x_col = upload_view(b, layout_in_order(DType::F32, &[5, 4], &[1, 0]), &[0.0; 20]);
    assert_eq!(run_with!(x: x_col.as_ref()), "x");
    let cu32 = upload_i64(b, DType::I32, &cu);
    assert_eq!(run_with!(cu_seqlens: cu32.as_ref()), "cu_seqlens");
    assert_eq!(run_with!(state_indices: None), "state_indices");
    assert_eq!(run_with!(conv_state: None), "conv_state");
    let mut bad_pool = t(DType::F32, &[3, 4, 4]);
    assert_eq!(run_with!(conv_state: Some(bad_pool.as_mut())), "conv_state");
    let mut bad_pool_dt = t(DType::I32, &[3, 4, 3]);
    assert_eq!(run_with!(conv_state: Some(bad_pool_dt.as_mut())), "conv_state");
    let mut bad_out = t(DType::F32, &[5, 5]);
    assert_eq!(run_with!(out: bad_out.as_mut()), "out");
    let mut out_rows_alias = upload_view(b, row_strided(DType::F32, 5, 4, 0, 0), &[0.0; 20]);
    out_rows_alias.layout.strides[0] = 0;
    assert_eq!(run_with!(out: out_rows_alias.as_mut()), "out");
    // The unmodified arguments run.
    let a = CausalConv1dArgs {
        x: x.as_ref(),
        weight: weight.as_ref(),
        cu_seqlens: cu_t.as_ref(),
        state_indices: Some(idx_t.as_ref()),
        conv_state: Some(pool.as_mut()),
        out: out.as_mut(),
    };
    CausalConv1d::run(b, &plan, a, None, b.default_stream()).expect("valid arguments run");
}

