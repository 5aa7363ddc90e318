//! Bad device metadata for the KDA ops: cu_seqlens, state indices and checkpoint offsets of the
//! chunked prefill; state indices of the fused decode; cu_seqlens and state indices of the
//! causal conv1d.

use super::{assert_rejected, cases, offsets, outside, run_synced, upload_i32, upload_index, Tally};
use crate::backend::{Backend, BackendExt, DeviceTensor};
use crate::conformance::{download_f32, upload_f32, TestRng};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{
    CausalConv1d, CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, ConvActivation, HostIndices, KdaCheckpointOffsets,
    KdaDecode, KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaGateMode, KdaOutputNorm, KdaPrefill, KdaPrefillArgs,
    KdaPrefillBatch, KdaPrefillParams, KdaStateLayout,
};

// ---- chunked prefill ---------------------------------------------------------------------------

/// A prefill batch: what the plan sees, and what the device tensors hold.
#[derive(Clone, Debug)]
struct Prefill {
    lens: Vec<usize>,
    slots: usize,
    /// Host state indices (the plan's).
    indices: Vec<i64>,
    /// Checkpoint entries per sequence (0: none) and the host offsets `[N, C]`.
    per_seq: usize,
    ck: Vec<i64>,
    device_cu: Vec<i64>,
    device_indices: Vec<i64>,
    device_ck: Vec<i64>,
    wide: bool,
}

impl Prefill {
    fn new(lens: &[usize], indices: &[i64], slots: usize) -> Self {
        let cu = offsets(lens);
        Prefill {
            lens: lens.to_vec(),
            slots,
            indices: indices.to_vec(),
            per_seq: 0,
            ck: Vec::new(),
            device_cu: cu,
            device_indices: indices.to_vec(),
            device_ck: Vec::new(),
            wide: false,
        }
    }

    /// Plans the host batch and runs with the device copies; one head, K = V = 16, chunks of 16,
    /// precomputed gates, the pool read and written.
    fn run<B: Backend + KdaPrefill>(&self, b: &B) -> Result<()> {
        let (h, kd, vd) = (1, 16, 16);
        let p = KdaPrefillParams {
            gate: KdaGateMode::Precomputed,
            chunk_size: 16,
            state_slots: self.slots,
            read_initial_state: true,
            write_final_state: true,
            state_layout: KdaStateLayout::KMajor,
            ..KdaPrefillParams::k3_defaults(h, kd, vd)
        };
        let cu = offsets(&self.lens);
        let n = self.lens.len();
        let t = *cu.last().unwrap_or(&0) as usize;
        let batch = KdaPrefillBatch {
            cu_seqlens: &cu,
            state_indices: Some(&self.indices),
            checkpoints: (self.per_seq > 0).then_some(KdaCheckpointOffsets { per_seq: self.per_seq, offsets: &self.ck }),
        };
        let plan = KdaPrefill::plan(b, &p, &batch).expect("plan of a valid batch");
        let act = |d: usize, v: f32| upload_f32(b, DType::F32, &[t, h, d], &vec![v; t * h * d]).expect("input");
        let (q, k, v, g) = (act(kd, 0.25), act(kd, 0.5), act(vd, 1.0), act(kd, -0.1));
        let beta = upload_f32(b, DType::F32, &[t, h], &vec![0.5; t * h]).expect("beta");
        let cu_t = upload_index(b, &[n + 1], &self.device_cu, self.wide);
        let idx_t = upload_index(b, &[n], &self.device_indices, self.wide);
        let mut pool = b.zeros(DType::F32, &[self.slots, h, kd, vd]).expect("pool");
        let ck_t: Option<DeviceTensor<B>> = (self.per_seq > 0).then(|| upload_index(b, &[n, self.per_seq], &self.device_ck, self.wide));
        let mut ck_state = (self.per_seq > 0).then(|| b.zeros(DType::F32, &[n, self.per_seq, h, kd, vd]).expect("checkpoint state"));
        let mut out = b.zeros(DType::F32, &[t, h, vd]).expect("out");
        let mut ws = b.workspace(KdaPrefill::workspace_size(b, &plan)).expect("workspace");
        run_synced(b, || {
            let args = KdaPrefillArgs {
                q: q.as_ref(),
                k: k.as_ref(),
                v: v.as_ref(),
                g_raw: g.as_ref(),
                beta: beta.as_ref(),
                a_log: None,
                dt_bias: None,
                cu_seqlens: cu_t.as_ref(),
                state_indices: Some(idx_t.as_ref()),
                state: Some(pool.as_mut()),
                checkpoint_offsets: ck_t.as_ref().map(DeviceTensor::as_ref),
                checkpoint_state: ck_state.as_mut().map(DeviceTensor::as_mut),
                out: out.as_mut(),
            };
            KdaPrefill::run(b, &plan, args, ws.as_mut(), b.default_stream())
        })
    }
}

/// The hostile run's kda_prefill cases: a state index of 100,000 or -1, a slot used twice, and
/// cu_seqlens `[0, 4, 100000]` / `[0, -100000, 10]` for a planned `[0, 4, 10]`.
pub fn kda_prefill_device_metadata_out_of_range<B: Backend + KdaPrefill>(b: &B) {
    let base = Prefill::new(&[4, 6], &[2, 0], 3);
    for wide in [false, true] {
        for idx in [[2, 100_000], [-1, 0], [2, 2]] {
            let pr = Prefill { device_indices: idx.to_vec(), wide, ..base.clone() };
            assert_rejected(pr.run(b), "state_indices", format!("device state_indices {idx:?}"));
        }
        for cu in [[0, 4, 100_000], [0, -100_000, 10], [1, 4, 10], [0, 4, 9]] {
            let pr = Prefill { device_cu: cu.to_vec(), wide, ..base.clone() };
            assert_rejected(pr.run(b), "cu_seqlens", format!("device cu_seqlens {cu:?}"));
        }
        // Checkpoint offsets that do not increase within 1..=len.
        for ck in [[3, 2, -1, -1], [0, -1, -1, -1], [5, -1, -1, -1], [-1, -1, 2, -7]] {
            let pr = Prefill { per_seq: 2, ck: vec![2, 4, 3, -1], device_ck: ck.to_vec(), wide, ..base.clone() };
            assert_rejected(pr.run(b), "checkpoint_offsets", format!("device checkpoint_offsets {ck:?}"));
        }
    }
    base.run(b).expect("the valid batch runs after the rejected ones");
}

/// Random varlen batches with one of cu_seqlens, state_indices or checkpoint_offsets corrupted
/// with a value the contract can never accept.
pub fn kda_prefill_generated_bad_metadata<B: Backend + KdaPrefill>(b: &B) {
    let mut rng = TestRng::new(0x4DA1);
    let mut tally = Tally::new(b, "kda_prefill cu_seqlens / state_indices / checkpoint_offsets");
    for case in 0..cases(700) {
        let n = 1 + rng.below(3);
        let lens: Vec<usize> = (0..n).map(|_| rng.below(24)).collect();
        let slots = n + rng.below(3);
        let perm = rng.permutation(slots);
        let indices: Vec<i64> = perm[..n].iter().map(|&s| s as i64).collect();
        let mut pr = Prefill::new(&lens, &indices, slots);
        pr.wide = rng.below(2) == 1;
        let t = pr.device_cu[n];
        let field = match rng.below(3) {
            0 => {
                // Only values no valid cu_seqlens holds at that entry (checkpoints stay off: a
                // shortened sequence would also fail its checkpoints).
                let e = rng.below(n + 1);
                pr.device_cu[e] = match (e, rng.below(2)) {
                    (0, _) => outside(&mut rng, 0, 1, pr.wide),
                    (e, 0) if e == n => outside(&mut rng, t, t + 1, pr.wide),
                    (_, 0) => outside(&mut rng, 0, t + 1, pr.wide),
                    (e, _) => pr.device_cu[e - 1] - 1 - rng.below(4) as i64,
                };
                "cu_seqlens"
            }
            1 => {
                let s = rng.below(n);
                pr.device_indices[s] = if n > 1 && rng.below(2) == 0 {
                    pr.device_indices[(s + 1 + rng.below(n - 1)) % n] // a slot of another sequence
                } else {
                    outside(&mut rng, 0, slots as i64, pr.wide)
                };
                "state_indices"
            }
            _ => {
                let per_seq = 1 + rng.below(3);
                pr.per_seq = per_seq;
                pr.ck = vec![-1; n * per_seq];
                for (s, &len) in lens.iter().enumerate() {
                    // Valid host offsets: increasing, in 1..=len.
                    let mut last = 0;
                    for c in 0..per_seq {
                        if last < len && rng.below(2) == 0 {
                            last += 1 + rng.below(len - last);
                            pr.ck[s * per_seq + c] = last as i64;
                        }
                    }
                }
                pr.device_ck = pr.ck.clone();
                let s = rng.below(n);
                let c = rng.below(per_seq);
                let len = lens[s] as i64;
                let prev = pr.ck[s * per_seq..s * per_seq + c].iter().copied().filter(|&o| o != -1).max().unwrap_or(0);
                pr.device_ck[s * per_seq + c] = match rng.below(3) {
                    0 if prev > 0 => prev - rng.below(prev as usize) as i64, // does not increase
                    1 => len + 1 + rng.below(100) as i64,
                    _ => [0, -2, -1000, i32::MIN as i64][rng.below(4)],
                };
                "checkpoint_offsets"
            }
        };
        assert_rejected(pr.run(b), field, format!("case {case}: {pr:?}"));
        tally.cases += 1;
    }
}

// ---- fused decode ------------------------------------------------------------------------------

/// Plans a decode of `planned` slots (0 = null) over a pool of `slots`, runs it with `device`
/// slots, and returns the outcome with the output and both pools.
fn decode_with<B: Backend + KdaDecode>(b: &B, planned: &[i32], device: &[i32], slots: usize) -> (Result<()>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (bt, h, kd, vd, w) = (planned.len(), 1, 8, 8, 4);
    let p = KdaDecodeParams {
        batch: bt,
        heads: h,
        head_k: kd,
        head_v: vd,
        conv_width: w,
        state_slots: slots,
        state_layout: KdaStateLayout::KMajor,
        gate: KdaGateMode::Precomputed,
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: KdaOutputNorm::None,
    };
    let d = p.channels();
    let plan = KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: planned }).expect("plan of valid slots");
    let x = upload_f32(b, DType::F32, &[bt, d], &vec![0.5; bt * d]).expect("x");
    let cw = upload_f32(b, DType::F32, &[d, w], &vec![0.25; d * w]).expect("conv weight");
    let mut conv = upload_f32(b, DType::F32, &[slots, d, w - 1], &vec![1.0; slots * d * (w - 1)]).expect("conv state");
    let g = upload_f32(b, DType::F32, &[bt, h, kd], &vec![-0.1; bt * h * kd]).expect("g");
    let beta = upload_f32(b, DType::F32, &[bt, h], &vec![0.0; bt * h]).expect("beta");
    let idx = upload_i32(b, &[bt], device);
    let mut state = upload_f32(b, DType::F32, &[slots, h, kd, vd], &vec![0.5; slots * h * kd * vd]).expect("state");
    let mut out = upload_f32(b, DType::F32, &[bt, h, vd], &vec![7.0; bt * h * vd]).expect("out");
    let mut ws = b.workspace(KdaDecode::workspace_size(b, &plan)).expect("workspace");
    let r = run_synced(b, || {
        let args = KdaDecodeArgs {
            x_qkv: x.as_ref(),
            conv_weight: cw.as_ref(),
            conv_state: conv.as_mut(),
            g_raw: g.as_ref(),
            beta: beta.as_ref(),
            a_log: None,
            dt_bias: None,
            state_indices: idx.as_ref(),
            recurrent_state: state.as_mut(),
            output_gate: None,
            norm_weight: None,
            out: out.as_mut(),
        };
        KdaDecode::run(b, &plan, args, ws.as_mut(), b.default_stream())
    });
    let get = |t: &DeviceTensor<B>| download_f32(b, t).expect("download");
    (r, get(&out), get(&conv), get(&state))
}

/// A negative device slot, one past the pool, 100,000, and a slot used by two rows. The null
/// slot 0 may repeat: such rows touch no pool.
pub fn kda_decode_device_state_indices<B: Backend + KdaDecode>(b: &B) {
    for device in [[1, -1, 3], [1, 5, 3], [100_000, 2, 3], [1, i32::MIN, 3], [2, 2, 3], [3, 2, 3]] {
        assert_rejected(decode_with(b, &[1, 2, 3], &device, 5).0, "state_indices", format!("device state_indices {device:?}"));
    }
    let (r, out, conv, state) = decode_with(b, &[1, 2, 3], &[0, 0, 3], 5);
    r.expect("null slots may repeat");
    let (_, ref_out, ref_conv, ref_state) = decode_with(b, &[0, 0, 3], &[0, 0, 3], 5);
    assert_eq!((out, conv, state), (ref_out, ref_conv, ref_state), "device null slots act as planned null slots");
}

/// Random decode batches (null rows included) with one slot out of the pool or repeated.
pub fn kda_decode_generated_bad_state_indices<B: Backend + KdaDecode>(b: &B) {
    let mut rng = TestRng::new(0x4DA2);
    let mut tally = Tally::new(b, "kda_decode state_indices");
    for case in 0..cases(1400) {
        let bt = 1 + rng.below(6);
        let slots = bt + 1 + rng.below(3);
        let perm = rng.permutation(slots - 1);
        let planned: Vec<i32> = (0..bt).map(|r| if rng.below(4) == 0 { 0 } else { perm[r] as i32 + 1 }).collect();
        let mut device = planned.clone();
        let r = rng.below(bt);
        let live: Vec<usize> = (0..bt).filter(|&o| o != r && planned[o] != 0).collect();
        device[r] = if !live.is_empty() && rng.below(2) == 0 {
            planned[live[rng.below(live.len())]] // another row's slot
        } else {
            outside(&mut rng, 0, slots as i64, false) as i32
        };
        let (res, ..) = decode_with(b, &planned, &device, slots);
        assert_rejected(res, "state_indices", format!("case {case}: planned {planned:?} device {device:?} ({slots} slots)"));
        tally.cases += 1;
    }
}

// ---- causal conv1d -----------------------------------------------------------------------------

/// Plans a conv1d of `lens` with `indices` over `slots` and runs it with the device copies.
fn conv1d_with<B: Backend + CausalConv1d>(b: &B, lens: &[usize], indices: &[i32], slots: usize, cu: &[i64], device: &[i32], wide: bool) -> Result<()> {
    let (d, w) = (4, 4);
    let p = CausalConv1dParams { dim: d, width: w, activation: ConvActivation::Silu, read_initial_state: true, write_final_state: true, state_slots: slots };
    let host_cu = offsets(lens);
    let host_cu32: Vec<i32> = host_cu.iter().map(|&x| x as i32).collect();
    let cu_host = if wide { HostIndices::I64(&host_cu) } else { HostIndices::I32(&host_cu32) };
    let plan = CausalConv1d::plan(b, &p, &CausalConv1dBatch { cu_seqlens: cu_host, state_indices: Some(indices) }).expect("plan of a valid batch");
    let t = *host_cu.last().unwrap_or(&0) as usize;
    let n = lens.len();
    let x = upload_f32(b, DType::F32, &[t, d], &vec![0.5; t * d]).expect("x");
    let wt = upload_f32(b, DType::F32, &[d, w], &vec![0.25; d * w]).expect("weight");
    let cu_t = upload_index(b, &[n + 1], cu, wide);
    let idx = upload_i32(b, &[n], device);
    let mut state = upload_f32(b, DType::F32, &[slots, d, w - 1], &vec![1.0; slots * d * (w - 1)]).expect("state");
    let mut out = b.zeros(DType::F32, &[t, d]).expect("out");
    run_synced(b, || {
        let args = CausalConv1dArgs {
            x: x.as_ref(),
            weight: wt.as_ref(),
            cu_seqlens: cu_t.as_ref(),
            state_indices: Some(idx.as_ref()),
            conv_state: Some(state.as_mut()),
            out: out.as_mut(),
        };
        CausalConv1d::run(b, &plan, args, None, b.default_stream())
    })
}

/// Negative, past-the-pool and repeated device slots, and cu_seqlens past the tokens, negative,
/// decreasing, not starting at 0 or not ending at T.
pub fn conv1d_device_metadata_out_of_range<B: Backend + CausalConv1d>(b: &B) {
    let (lens, idx) = ([4usize, 6], [2i32, 0]);
    let cu = offsets(&lens);
    for device in [[2, -1], [3, 0], [100_000, 0], [2, 2]] {
        assert_rejected(conv1d_with(b, &lens, &idx, 3, &cu, &device, false), "state_indices", format!("device state_indices {device:?}"));
    }
    for wide in [false, true] {
        for bad in [[0, 4, 100_000], [0, -100_000, 10], [0, 7, 5], [2, 4, 10], [0, 4, 9]] {
            assert_rejected(conv1d_with(b, &lens, &idx, 3, &bad, &idx, wide), "cu_seqlens", format!("device cu_seqlens {bad:?}"));
        }
    }
    conv1d_with(b, &lens, &idx, 3, &cu, &idx, false).expect("the valid batch runs after the rejected ones");
}

/// Random varlen batches with one cu_seqlens entry or state index corrupted.
pub fn conv1d_generated_bad_metadata<B: Backend + CausalConv1d>(b: &B) {
    let mut rng = TestRng::new(0x4DA3);
    let mut tally = Tally::new(b, "causal_conv1d cu_seqlens / state_indices");
    for case in 0..cases(1400) {
        let n = 1 + rng.below(4);
        let lens: Vec<usize> = (0..n).map(|_| rng.below(40)).collect();
        let slots = n + rng.below(3);
        let perm = rng.permutation(slots);
        let idx: Vec<i32> = perm[..n].iter().map(|&s| s as i32).collect();
        let mut cu = offsets(&lens);
        let mut device = idx.clone();
        let wide = rng.below(2) == 1;
        let t = cu[n];
        let field = if rng.below(2) == 0 {
            let e = rng.below(n + 1);
            cu[e] = match (e, rng.below(2)) {
                (0, _) => outside(&mut rng, 0, 1, wide),
                (e, 0) if e == n => outside(&mut rng, t, t + 1, wide),
                (_, 0) => outside(&mut rng, 0, t + 1, wide),
                (e, _) => cu[e - 1] - 1 - rng.below(4) as i64,
            };
            "cu_seqlens"
        } else {
            let s = rng.below(n);
            device[s] = if n > 1 && rng.below(2) == 0 {
                idx[(s + 1 + rng.below(n - 1)) % n]
            } else {
                outside(&mut rng, 0, slots as i64, false) as i32
            };
            "state_indices"
        };
        let r = conv1d_with(b, &lens, &idx, slots, &cu, &device, wide);
        assert_rejected(r, field, format!("case {case}: lens {lens:?} slots {idx:?}: device cu {cu:?} slots {device:?}"));
        tally.cases += 1;
    }
}
