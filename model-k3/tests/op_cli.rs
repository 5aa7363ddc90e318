//! `k3 op`: inputs and params are written with the safetensors crate and serde_json, the op runs
//! through the library entry point (and once through the real binary), and the outputs read
//! back with the safetensors crate must equal, bit for bit, the same op run directly through
//! kernel_api on the CPU backend (same backend, same inputs). Then the malformed cases: each
//! must be an error naming the op, tensor or key, never a panic.

use kernel_api::conformance::TestRng;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor};
use model_k3::op_cli::{run_op, run_op_files, op_names, OpError};
use safetensors::{Dtype as St, SafeTensors};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

// ---- files ---------------------------------------------------------------------------------

fn st_dtype(d: DType) -> St {
    match d {
        DType::F32 => St::F32,
        DType::BF16 => St::BF16,
        DType::F16 => St::F16,
        DType::I32 => St::I32,
        DType::I64 => St::I64,
        DType::F8E4M3Fn => St::F8_E4M3,
        DType::F4E2M1x2 => St::F4,
        _ => St::U8,
    }
}

/// A fresh directory per call (tests run in parallel).
fn tmp(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("k3-op-cli-{}-{name}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_inputs(path: &Path, tensors: &[(&str, &HostTensor)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, t)| {
            // safetensors F4 counts codes, two per byte.
            let mut shape = t.shape.clone();
            if t.dtype == DType::F4E2M1x2 {
                *shape.last_mut().unwrap() *= 2;
            }
            (n.to_string(), safetensors::tensor::TensorView::new(st_dtype(t.dtype), shape, &t.bytes).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// An outputs file as (safetensors dtype, shape, bytes) per name, plus its metadata.
type Read = (BTreeMap<String, (St, Vec<usize>, Vec<u8>)>, std::collections::HashMap<String, String>);

fn read_outputs(path: &Path) -> Read {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors = st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    (tensors, meta.metadata().clone().unwrap_or_default())
}

/// Runs `op` through files and the library entry point; returns the outputs file's tensors.
fn cli(op: &str, inputs: &[(&str, &HostTensor)], params: Value) -> BTreeMap<String, (St, Vec<usize>, Vec<u8>)> {
    let d = tmp(op);
    let (i, p, o) = (d.join("in.safetensors"), d.join("params.json"), d.join("out.safetensors"));
    write_inputs(&i, inputs);
    std::fs::write(&p, params.to_string()).unwrap();
    let outs = run_op_files(&CpuBackend::new(), op, &i, Some(&p), &o).unwrap_or_else(|e| panic!("{op}: {e}"));
    let (read, meta) = read_outputs(&o);
    assert_eq!(meta.get("k3.op").map(String::as_str), Some(op));
    assert_eq!(read.len(), outs.len());
    read
}

/// The outputs file holds exactly `want` (dtype, shape, bytes), in any order.
fn assert_outputs(got: &BTreeMap<String, (St, Vec<usize>, Vec<u8>)>, want: &[(&str, HostTensor)]) {
    let names: Vec<&String> = got.keys().collect();
    assert_eq!(got.len(), want.len(), "outputs {names:?}");
    for (name, w) in want {
        let (d, shape, bytes) = got.get(*name).unwrap_or_else(|| panic!("output `{name}` missing from {names:?}"));
        assert_eq!(*d, st_dtype(w.dtype), "{name} dtype");
        assert_eq!(shape, &w.shape, "{name} shape");
        assert!(bytes == &w.bytes, "{name}: bytes differ from the direct kernel_api run");
    }
}

// ---- data and direct runs ------------------------------------------------------------------

fn normal(rng: &mut TestRng, dtype: DType, shape: &[usize], std: f32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32(dtype, shape, &rng.normals(n, std)).unwrap()
}

fn i32t(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor::from_i32(shape, v).unwrap()
}

fn up(b: &CpuBackend, t: &HostTensor) -> DeviceTensor<CpuBackend> {
    b.upload_tensor(t).unwrap()
}

fn down(b: &CpuBackend, t: &DeviceTensor<CpuBackend>) -> HostTensor {
    b.download_tensor(t).unwrap()
}

fn ws(b: &CpuBackend, n: usize) -> Option<kernel_api::cpu::HostBuffer> {
    (n > 0).then(|| b.alloc_zeroed(n).unwrap())
}

// ---- one op each, compared with the direct run --------------------------------------------

#[test]
fn gemm_matches_direct_run() {
    let mut rng = TestRng::new(1);
    let x = normal(&mut rng, DType::BF16, &[5, 24], 1.0);
    let w = normal(&mut rng, DType::BF16, &[12, 24], 0.2);
    let bias = normal(&mut rng, DType::F32, &[12], 0.5);
    let got = cli("gemm", &[("x", &x), ("w", &w), ("bias", &bias)], json!({"out_dtypes": {"out": "f32"}}));

    let b = CpuBackend::new();
    let p = GemmParams { bias_dtype: Some(DType::F32), ..GemmParams::new(5, 12, 24, DType::BF16, DType::BF16, DType::F32) };
    let plan = Gemm::plan(&b, &p).unwrap();
    let (xd, wd, bd) = (up(&b, &x), up(&b, &w), up(&b, &bias));
    let mut out = b.zeros(DType::F32, &[5, 12]).unwrap();
    let args = GemmArgs { x: xd.as_ref(), w: wd.as_ref(), bias: Some(bd.as_ref()), out: out.as_mut() };
    Gemm::run(&b, &plan, args, None, b.default_stream()).unwrap();
    assert_outputs(&got, &[("out", down(&b, &out))]);
}

#[test]
fn rms_norm_matches_direct_run() {
    let mut rng = TestRng::new(2);
    let x = normal(&mut rng, DType::BF16, &[4, 32], 2.0);
    let w = normal(&mut rng, DType::BF16, &[32], 1.0);
    let got = cli("rms_norm", &[("x", &x), ("w", &w)], json!({"eps": 1e-5, "weight_order": "cast_before_weight"}));

    let b = CpuBackend::new();
    let p = RmsNormParams { m: 4, d: 32, eps: 1e-5, weight_order: RmsWeightOrder::CastBeforeWeight };
    let plan = RmsNorm::plan(&b, &p).unwrap();
    let (xd, wd) = (up(&b, &x), up(&b, &w));
    let mut out = b.zeros(DType::BF16, &[4, 32]).unwrap();
    RmsNorm::run(&b, &plan, RmsNormArgs { x: xd.as_ref(), w: wd.as_ref(), out: out.as_mut() }, None, b.default_stream()).unwrap();
    assert_outputs(&got, &[("out", down(&b, &out))]);
}

#[test]
fn attn_res_mix_matches_direct_run() {
    let mut rng = TestRng::new(3);
    let sources = normal(&mut rng, DType::F32, &[3, 4, 16], 1.0);
    let score = normal(&mut rng, DType::F32, &[16], 0.5);
    let got = cli(
        "attn_res_mix",
        &[("sources", &sources), ("score_vector", &score)],
        json!({"eps": 1e-5, "out_dtypes": {"out": "bf16"}}),
    );

    let b = CpuBackend::new();
    let plan = AttnResMix::plan(&b, &AttnResMixParams { sources: 3, m: 4, d: 16, eps: 1e-5 }).unwrap();
    let (sd, wd) = (up(&b, &sources), up(&b, &score));
    let mut out = b.zeros(DType::BF16, &[4, 16]).unwrap();
    let args = AttnResMixArgs { sources: sd.as_ref(), score_vector: wd.as_ref(), out: out.as_mut() };
    AttnResMix::run(&b, &plan, args, None, b.default_stream()).unwrap();
    assert_outputs(&got, &[("out", down(&b, &out))]);
}

/// A flat e4m3fnuz latent cache (u8 bytes, 0x80 = NaN avoided), page size 1, two sequences
/// through a scattered page table, q_len 2, split-KV with 2 splits (a workspace is needed).
#[test]
fn mla_decode_matches_direct_run() {
    let mut rng = TestRng::new(4);
    let (pages, heads, latent, rope, q_len) = (12, 3, 32, 8, 2);
    let bytes: Vec<u8> = (0..pages * (latent + rope)).map(|_| rng.below(256) as u8).map(|b| if b == 0x80 { 0 } else { b }).collect();
    let cache = HostTensor::from_bytes(DType::U8, &[pages, 1, latent + rope], bytes).unwrap();
    let q = normal(&mut rng, DType::BF16, &[2, q_len, heads, latent + rope], 1.0);
    let bt = i32t(&[2, 6], &[7, 2, 9, 0, 4, -1, 3, 11, 5, -1, -1, -1]);
    let sl = i32t(&[2], &[5, 3]);
    let params = json!({
        "cache": {"dims": {"latent": latent}, "format": "fp8-e4m3fnuz", "kv_scale": 0.05},
        "softmax_scale": 0.15, "variant": "gluon", "splits": {"num_splits": 2},
        "out_dtypes": {"out": "f32"}
    });
    let got = cli("mla_decode", &[("q", &q), ("kv_cache", &cache), ("block_table", &bt), ("seq_lens", &sl)], params);

    let b = CpuBackend::new();
    let p = MlaDecodeParams {
        cache: MlaPagedCache {
            dims: KvDims { latent, rope },
            format: KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fnuz),
            page_size: 1,
            num_pages: pages,
            kv_scale: 0.05,
        },
        heads,
        q_len,
        softmax_scale: 0.15,
        variant: MlaDecodeVariant::GluonStyle,
        splits: MlaSplitPolicy::NumSplits(2),
    };
    let (bt_host, sl_host) = ([7, 2, 9, 0, 4, -1, 3, 11, 5, -1, -1, -1], [5, 3]);
    let plan = MlaDecode::plan(&b, &p, &MlaDecodeBatch { seq_lens: &sl_host, block_table: &bt_host, max_pages_per_seq: 6 }).unwrap();
    assert!(MlaDecode::workspace_size(&b, &plan) > 0, "the split plan exercises the workspace");
    let (qd, cd, btd, sld) = (up(&b, &q), up(&b, &cache), up(&b, &bt), up(&b, &sl));
    let mut out = b.zeros(DType::F32, &[2, q_len, heads, latent]).unwrap();
    let mut lse = b.zeros(DType::F32, &[2, q_len, heads]).unwrap();
    let mut w = ws(&b, MlaDecode::workspace_size(&b, &plan));
    let args = MlaDecodeArgs {
        q: qd.as_ref(),
        kv_cache: cd.as_ref(),
        block_table: btd.as_ref(),
        seq_lens: sld.as_ref(),
        out: out.as_mut(),
        lse: Some(lse.as_mut()),
    };
    MlaDecode::run(&b, &plan, args, w.as_mut(), b.default_stream()).unwrap();
    assert_outputs(&got, &[("out", down(&b, &out)), ("lse", down(&b, &lse))]);
}

/// Two sequences (5 and 3 tokens) through pool slots 2 and 0, read and written in place, with a
/// checkpoint after token 3 of the first sequence (checkpoint_state allocated by the command).
#[test]
fn kda_prefill_matches_direct_run() {
    let mut rng = TestRng::new(5);
    let (t, h, k, v) = (8, 2, 8, 8);
    let q = normal(&mut rng, DType::BF16, &[t, h, k], 1.0);
    let kk = normal(&mut rng, DType::BF16, &[t, h, k], 1.0);
    let vv = normal(&mut rng, DType::BF16, &[t, h, v], 1.0);
    let g_raw = normal(&mut rng, DType::BF16, &[t, h, k], 1.0);
    let beta = normal(&mut rng, DType::F32, &[t, h], 1.0);
    let a_log = HostTensor::from_f32(DType::F32, &[4], &[0.3, -0.6, 0.0, 0.0]).unwrap();
    let dt_bias = normal(&mut rng, DType::F32, &[h * k], 0.5);
    let cu = i32t(&[3], &[0, 5, 8]);
    let idx = i32t(&[2], &[2, 0]);
    let state = normal(&mut rng, DType::F32, &[3, h, k, v], 0.3);
    let ckpt = HostTensor::from_i64(&[2, 1], &[3, -1]).unwrap();
    let inputs = [
        ("q", &q),
        ("k", &kk),
        ("v", &vv),
        ("g_raw", &g_raw),
        ("beta", &beta),
        ("a_log", &a_log),
        ("dt_bias", &dt_bias),
        ("cu_seqlens", &cu),
        ("state_indices", &idx),
        ("state", &state),
        ("checkpoint_offsets", &ckpt),
    ];
    let params = json!({
        "gate": {"lower_bound": -5.0}, "beta_sigmoid": true, "use_qk_l2norm": true, "q_scale": 0.25,
        "chunk_size": 16, "read_initial_state": true, "write_final_state": true
    });
    let got = cli("kda_prefill", &inputs, params);

    let b = CpuBackend::new();
    let p = KdaPrefillParams {
        a_log_len: 4,
        q_scale: 0.25,
        chunk_size: 16,
        state_slots: 3,
        read_initial_state: true,
        write_final_state: true,
        ..KdaPrefillParams::k3_defaults(h, k, v)
    };
    let batch = KdaPrefillBatch {
        cu_seqlens: &[0, 5, 8],
        state_indices: Some(&[2, 0]),
        checkpoints: Some(KdaCheckpointOffsets { per_seq: 1, offsets: &[3, -1] }),
    };
    let plan = KdaPrefill::plan(&b, &p, &batch).unwrap();
    let dev: Vec<DeviceTensor<CpuBackend>> = [&q, &kk, &vv, &g_raw, &beta, &a_log, &dt_bias, &cu, &idx, &ckpt].iter().map(|t| up(&b, t)).collect();
    let mut st = up(&b, &state);
    let mut cks = b.zeros(DType::F32, &[2, 1, h, k, v]).unwrap();
    let mut out = b.zeros(DType::BF16, &[t, h, v]).unwrap();
    let args = KdaPrefillArgs {
        q: dev[0].as_ref(),
        k: dev[1].as_ref(),
        v: dev[2].as_ref(),
        g_raw: dev[3].as_ref(),
        beta: dev[4].as_ref(),
        a_log: Some(dev[5].as_ref()),
        dt_bias: Some(dev[6].as_ref()),
        cu_seqlens: dev[7].as_ref(),
        state_indices: Some(dev[8].as_ref()),
        state: Some(st.as_mut()),
        checkpoint_offsets: Some(dev[9].as_ref()),
        checkpoint_state: Some(cks.as_mut()),
        out: out.as_mut(),
    };
    let mut ws = b.alloc_zeroed(KdaPrefill::workspace_size(&b, &plan)).unwrap();
    KdaPrefill::run(&b, &plan, args, Some(&mut ws), b.default_stream()).unwrap();
    let want_state = down(&b, &st);
    assert_ne!(want_state, state, "the pool was written");
    assert_outputs(&got, &[("out", down(&b, &out)), ("state", want_state), ("checkpoint_state", down(&b, &cks))]);
}

/// Three rows, one on the null slot 0; V-major bf16 recurrent pool, f32 conv pool, softplus gate,
/// gated RMSNorm output.
#[test]
fn kda_decode_matches_direct_run() {
    let mut rng = TestRng::new(6);
    let (bt, h, k, v, w, slots) = (3, 2, 8, 8, 4, 3);
    let d = h * (2 * k + v);
    let x = normal(&mut rng, DType::BF16, &[bt, d], 1.0);
    let conv_w = normal(&mut rng, DType::F32, &[d, w], 0.5);
    let conv_state = normal(&mut rng, DType::F32, &[slots, d, w - 1], 1.0);
    let g_raw = normal(&mut rng, DType::F32, &[bt, h, k], 1.0);
    let beta = normal(&mut rng, DType::F32, &[bt, h], 1.0);
    let a_log = HostTensor::from_f32(DType::F32, &[h], &[-0.5, 0.2]).unwrap();
    let idx = i32t(&[bt], &[2, 0, 1]);
    let rec = normal(&mut rng, DType::BF16, &[slots, h, v, k], 0.3);
    let og = normal(&mut rng, DType::F32, &[bt, h, v], 1.0);
    let nw = normal(&mut rng, DType::F32, &[v], 1.0);
    let inputs = [
        ("x_qkv", &x),
        ("conv_weight", &conv_w),
        ("conv_state", &conv_state),
        ("g_raw", &g_raw),
        ("beta", &beta),
        ("a_log", &a_log),
        ("state_indices", &idx),
        ("recurrent_state", &rec),
        ("output_gate", &og),
        ("norm_weight", &nw),
    ];
    let params = json!({
        "state_layout": "v_major", "gate": "softplus", "beta_sigmoid": true, "qk_l2norm": true,
        "output_norm": {"gated_rms_norm": {"eps": 1e-5}}, "out_dtypes": {"out": "f32"}
    });
    let got = cli("kda_decode", &inputs, params);

    let b = CpuBackend::new();
    let p = KdaDecodeParams {
        batch: bt,
        heads: h,
        head_k: k,
        head_v: v,
        conv_width: w,
        state_slots: slots,
        state_layout: KdaStateLayout::VMajor,
        gate: KdaGateMode::Softplus,
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
    };
    let plan = KdaDecode::plan(&b, &p, &KdaDecodeBatch { state_indices: &[2, 0, 1] }).unwrap();
    let dev: Vec<DeviceTensor<CpuBackend>> = [&x, &conv_w, &g_raw, &beta, &a_log, &idx, &og, &nw].iter().map(|t| up(&b, t)).collect();
    let (mut cs, mut rs) = (up(&b, &conv_state), up(&b, &rec));
    let mut out = b.zeros(DType::F32, &[bt, h, v]).unwrap();
    let args = KdaDecodeArgs {
        x_qkv: dev[0].as_ref(),
        conv_weight: dev[1].as_ref(),
        conv_state: cs.as_mut(),
        g_raw: dev[2].as_ref(),
        beta: dev[3].as_ref(),
        a_log: Some(dev[4].as_ref()),
        dt_bias: None,
        state_indices: dev[5].as_ref(),
        recurrent_state: rs.as_mut(),
        output_gate: Some(dev[6].as_ref()),
        norm_weight: Some(dev[7].as_ref()),
        out: out.as_mut(),
    };
    KdaDecode::run(&b, &plan, args, None, b.default_stream()).unwrap();
    assert_outputs(&got, &[("out", down(&b, &out)), ("conv_state", down(&b, &cs)), ("recurrent_state", down(&b, &rs))]);
}

#[test]
fn moe_router_matches_direct_run() {
    let mut rng = TestRng::new(7);
    let x = normal(&mut rng, DType::F32, &[6, 16], 1.0);
    let weight = normal(&mut rng, DType::BF16, &[8, 16], 0.5);
    let bias = normal(&mut rng, DType::F32, &[8], 0.1);
    let params = json!({"top_k": 3, "n_group": 2, "topk_group": 1, "renormalize": true, "routed_scaling_factor": 2.5});
    let got = cli("moe_router", &[("x", &x), ("weight", &weight), ("bias", &bias)], params);

    let b = CpuBackend::new();
    let p = MoeRouterParams { n_group: 2, routed_scaling_factor: 2.5, ..MoeRouterParams::sigmoid(6, 16, 8, 3) };
    let plan = MoeRouter::plan(&b, &p).unwrap();
    let (xd, wd, bd) = (up(&b, &x), up(&b, &weight), up(&b, &bias));
    let mut ids = b.zeros(DType::I32, &[6, 3]).unwrap();
    let mut wts = b.zeros(DType::F32, &[6, 3]).unwrap();
    let args = MoeRouterArgs { x: xd.as_ref(), weight: wd.as_ref(), bias: Some(bd.as_ref()), topk_ids: ids.as_mut(), topk_weights: wts.as_mut() };
    MoeRouter::run(&b, &plan, args, None, b.default_stream()).unwrap();
    assert_outputs(&got, &[("topk_ids", down(&b, &ids)), ("topk_weights", down(&b, &wts))]);
}

/// The reproduction workflow: moe_align's outputs file feeds moe_grouped_gemm (down stage,
/// MXFP4 weights). The GEMM output must equal the direct run on the same alignment.
#[test]
fn moe_grouped_gemm_matches_direct_run() {
    let mut rng = TestRng::new(8);
    let (tokens, top_k, experts, block_m, k, n) = (5, 2, 4, 4, 64, 16);
    let ids: Vec<i32> = (0..tokens * top_k).map(|i| ((i * 3 + i / 2) % experts) as i32).collect();
    let topk_ids = i32t(&[tokens, top_k], &ids);
    let aligned = cli("moe_align", &[("topk_ids", &topk_ids)], json!({"routing": {"experts": experts, "block_m": block_m}}));
    let host = |name: &str| {
        let (_, shape, bytes) = &aligned[name];
        HostTensor::from_bytes(DType::I32, shape, bytes.clone()).unwrap()
    };
    let (sorted, expert_ids, post) = (host("sorted_token_ids"), host("expert_ids"), host("num_tokens_post_padded"));

    let input = normal(&mut rng, DType::BF16, &[tokens * top_k, k], 1.0);
    let codes: Vec<u8> = (0..experts * n * k / 2).map(|_| rng.below(256) as u8).collect();
    let weight = HostTensor::from_bytes(DType::U8, &[experts, n, k / 2], codes).unwrap();
    let scales: Vec<u8> = (0..experts * n * k / 32).map(|_| 122 + rng.below(8) as u8).collect();
    let weight_scale = HostTensor::from_bytes(DType::U8, &[experts, n, k / 32], scales).unwrap();
    let topk_weights = HostTensor::from_f32(DType::F32, &[tokens, top_k], &rng.uniforms(tokens * top_k, 0.0, 1.0)).unwrap();
    let inputs = [
        ("input", &input),
        ("weight", &weight),
        ("weight_scale", &weight_scale),
        ("sorted_token_ids", &sorted),
        ("expert_ids", &expert_ids),
        ("num_tokens_post_padded", &post),
        ("topk_weights", &topk_weights),
    ];
    let got = cli("moe_grouped_gemm", &inputs, json!({"routing": {"block_m": block_m}, "stage": "down"}));
    // The same codes stored as safetensors F4 ([E, n, k] codes) read as packed f4e2m1x2.
    let weight_f4 = HostTensor { dtype: DType::F4E2M1x2, ..weight.clone() };
    let mut inputs_f4 = inputs;
    inputs_f4[1] = ("weight", &weight_f4);
    let got_f4 = cli("moe_grouped_gemm", &inputs_f4, json!({"routing": {"block_m": block_m}, "stage": "down"}));
    assert_eq!(got_f4, got);

    let b = CpuBackend::new();
    let routing = MoeRouting { tokens, top_k, experts, block_m };
    let p = MoeGemmParams { routing, k, n, stage: MoeGemmStage::Down, weights: MoeWeightFormat::Mxfp4, activation_quant: None };
    let plan = MoeGroupedGemm::plan(&b, &p).unwrap();
    let dev: Vec<DeviceTensor<CpuBackend>> =
        [&input, &weight, &weight_scale, &sorted, &expert_ids, &post, &topk_weights].iter().map(|t| up(&b, t)).collect();
    let mut out = b.zeros(DType::F32, &[tokens * top_k, n]).unwrap();
    let args = MoeGemmArgs {
        input: dev[0].as_ref(),
        weight: dev[1].as_ref(),
        weight_scale: Some(dev[2].as_ref()),
        sorted_token_ids: dev[3].as_ref(),
        expert_ids: dev[4].as_ref(),
        num_tokens_post_padded: dev[5].as_ref(),
        topk_weights: Some(dev[6].as_ref()),
        out: out.as_mut(),
    };
    MoeGroupedGemm::run(&b, &plan, args, None, b.default_stream()).unwrap();
    let want = down(&b, &out);
    assert!(want.to_f32().iter().any(|&x| x != 0.0));
    assert_outputs(&got, &[("out", want)]);
}

/// e4m3fnuz has no dtype in older safetensors readers: the bytes travel as U8 and the params
/// name their format. An fnuz output is written as U8 with its kernel dtype in the metadata.
#[test]
fn dtypes_override_reads_fnuz_bytes_and_writes_fnuz_as_u8() {
    let vals = [0.5f32, -1.25, 3.0, 240.0, 0.0, -0.015625];
    let fnuz = HostTensor::from_f32(DType::F8E4M3Fnuz, &[2, 3], &vals).unwrap();
    let as_u8 = HostTensor { dtype: DType::U8, ..fnuz.clone() };
    let got = cli("copy_cast", &[("x", &as_u8)], json!({"dtypes": {"x": "f8e4m3fnuz"}, "out_dtypes": {"out": "f32"}}));
    assert_outputs(&got, &[("out", HostTensor::from_f32(DType::F32, &[2, 3], &vals).unwrap())]);

    let x = HostTensor::from_f32(DType::F32, &[2, 3], &vals).unwrap();
    let d = tmp("fnuz-out");
    let (i, o) = (d.join("in.safetensors"), d.join("out.safetensors"));
    write_inputs(&i, &[("x", &x)]);
    let p = d.join("p.json");
    std::fs::write(&p, r#"{"out_dtypes": {"out": "f8e4m3fnuz"}}"#).unwrap();
    run_op_files(&CpuBackend::new(), "copy_cast", &i, Some(&p), &o).unwrap();
    let (read, meta) = read_outputs(&o);
    assert_eq!(read["out"], (St::U8, vec![2, 3], fnuz.bytes.clone()));
    assert_eq!(meta.get("k3.dtype.out").map(String::as_str), Some("f8e4m3fnuz"));
}

// ---- every op runs ----------------------------------------------------------------------------

fn f32t(rng: &mut TestRng, shape: &[usize]) -> HostTensor {
    normal(rng, DType::F32, shape, 1.0)
}

/// The ops not compared above, each on small valid inputs: the run succeeds and produces the
/// outputs the spec names, with the expected shapes and dtypes (their math is the conformance
/// suite's job; this checks the command's wiring of every params key and tensor).
#[test]
fn every_other_op_runs() {
    let mut r = TestRng::new(9);
    let b = CpuBackend::new();
    let m = |t: &[(&str, HostTensor)]| t.iter().map(|(n, t)| (n.to_string(), t.clone())).collect::<BTreeMap<_, _>>();
    let shapes = |outs: Vec<(String, HostTensor)>| outs.into_iter().map(|(n, t)| (n, t.dtype, t.shape)).collect::<Vec<_>>();
    let s = |n: &str, d: DType, sh: &[usize]| (n.to_string(), d, sh.to_vec());
    let ok = |op: &str, inputs: &BTreeMap<String, HostTensor>, params: Value| {
        shapes(run_op(&b, op, inputs, &params).unwrap_or_else(|e| panic!("{op}: {e}")))
    };

    let i = m(&[("o", f32t(&mut r, &[3, 2, 4])), ("gate", f32t(&mut r, &[3, 2, 4])), ("w", f32t(&mut r, &[4]))]);
    assert_eq!(ok("gated_rms_norm", &i, json!({"eps": 1e-5})), [s("out", DType::F32, &[3, 2, 4])]);
    let i = m(&[("x", normal(&mut r, DType::BF16, &[3, 8], 1.0))]);
    assert_eq!(ok("l2_norm", &i, json!({"eps": 1e-6, "out_dtypes": {"out": "f32"}})), [s("out", DType::F32, &[3, 8])]);
    let i = m(&[("gate_up", f32t(&mut r, &[3, 8]))]);
    assert_eq!(ok("situ_glu", &i, json!({"beta": 4.0, "linear_beta": 25.0})), [s("out", DType::F32, &[3, 4])]);
    let i = m(&[("gate", f32t(&mut r, &[3, 4])), ("up", f32t(&mut r, &[3, 4]))]);
    assert_eq!(ok("situ_glu", &i, json!({"beta": 4.0})), [s("out", DType::F32, &[3, 4])]);
    let i = m(&[("x", f32t(&mut r, &[3, 4])), ("g", f32t(&mut r, &[3, 4]))]);
    assert_eq!(ok("sigmoid_gate", &i, json!({})), [s("out", DType::F32, &[3, 4])]);
    let i = m(&[("table", normal(&mut r, DType::BF16, &[10, 4], 1.0)), ("ids", HostTensor::from_i64(&[3], &[9, 0, 4]).unwrap())]);
    assert_eq!(ok("embedding_gather", &i, json!({})), [s("out", DType::BF16, &[3, 4])]);
    let i = m(&[("acc", f32t(&mut r, &[2, 3])), ("x", normal(&mut r, DType::BF16, &[2, 3], 1.0))]);
    assert_eq!(ok("add_assign", &i, json!({})), [s("acc", DType::F32, &[2, 3])]);
    let i = m(&[("partial_out", f32t(&mut r, &[2, 3, 2, 4])), ("partial_lse", f32t(&mut r, &[2, 3, 2]))]);
    assert_eq!(ok("lse_merge", &i, json!({})), [s("out", DType::F32, &[3, 2, 4]), s("lse", DType::F32, &[3, 2])]);

    let i = m(&[
        ("q", f32t(&mut r, &[5, 2, 6])),
        ("k", f32t(&mut r, &[7, 2, 6])),
        ("v", f32t(&mut r, &[7, 2, 4])),
        ("cu_seqlens", i32t(&[3], &[0, 2, 5])),
        ("cu_seqlens_k", i32t(&[3], &[0, 3, 7])),
    ]);
    let out = ok("mla_prefill", &i, json!({"softmax_scale": 0.4, "causal": true}));
    assert_eq!(out, [s("out", DType::F32, &[5, 2, 4]), s("lse", DType::F32, &[5, 2])]);

    let (latent, rope) = (8, 4);
    let cache = HostTensor::zeros(DType::U8, &[3, 2, latent + 4 + 2 * rope]);
    let i = m(&[("kv", f32t(&mut r, &[3, latent + rope])), ("slot_mapping", i32t(&[3], &[5, -1, 0])), ("cache", cache.clone())]);
    let out = run_op(&b, "mla_cache_write", &i, &json!({"dims": {"latent": latent}, "format": "fp8-tiled-e4m3fn"})).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].0.as_str(), &out[0].1.shape), ("cache", &cache.shape));
    assert_ne!(out[0].1, cache, "slots 5 and 0 were written");

    let i = m(&[
        ("q", f32t(&mut r, &[3, 2, latent + rope])),
        ("kv_cache", normal(&mut r, DType::BF16, &[4, 1, latent + rope], 1.0)),
        ("cu_seqlens_q", i32t(&[3], &[0, 1, 3])),
        ("seq_lens", i32t(&[2], &[2, 2])),
        ("block_table", i32t(&[2, 2], &[3, 1, 0, 2])),
    ]);
    let params = json!({"cache": {"dims": {"latent": latent, "rope": rope}, "format": "bf16"}, "softmax_scale": 0.3, "causal": true});
    assert_eq!(ok("mla_prefill_absorbed", &i, params), [s("out", DType::F32, &[3, 2, latent]), s("lse", DType::F32, &[3, 2])]);

    let i = m(&[("g_raw", f32t(&mut r, &[3, 2, 4])), ("a_log", f32t(&mut r, &[2])), ("dt_bias", f32t(&mut r, &[8]))]);
    assert_eq!(ok("kda_gate", &i, json!({"mode": {"lower_bound": -5.0}})), [s("g_out", DType::F32, &[3, 2, 4])]);
    let i = m(&[("g_raw", f32t(&mut r, &[3, 2, 4]))]);
    assert_eq!(ok("kda_gate", &i, json!({"mode": "precomputed"})), [s("g_out", DType::F32, &[3, 2, 4])]);

    let i = m(&[
        ("x", f32t(&mut r, &[5, 6])),
        ("weight", f32t(&mut r, &[6, 4])),
        ("cu_seqlens", HostTensor::from_i64(&[3], &[0, 4, 5]).unwrap()),
        ("state_indices", i32t(&[2], &[1, 0])),
        ("conv_state", f32t(&mut r, &[2, 6, 3])),
    ]);
    let params = json!({"activation": "silu", "read_initial_state": true, "write_final_state": true});
    assert_eq!(ok("causal_conv1d", &i, params), [s("out", DType::F32, &[5, 6]), s("conv_state", DType::F32, &[2, 6, 3])]);

    let i = m(&[("topk_ids", i32t(&[2, 2], &[5, 1, 1, 3])), ("expert_map", i32t(&[6], &[-1, 0, -1, 1, -1, 2]))]);
    let out = ok("moe_align", &i, json!({"routing": {"experts": 3, "block_m": 2}}));
    assert_eq!(out, [s("sorted_token_ids", DType::I32, &[8]), s("expert_ids", DType::I32, &[4]), s("num_tokens_post_padded", DType::I32, &[1])]);

    let i = m(&[("y", f32t(&mut r, &[6, 4]))]);
    assert_eq!(ok("moe_combine", &i, json!({"top_k": 2, "out_dtypes": {"out": "bf16"}})), [s("out", DType::BF16, &[3, 4])]);

    // The gate/up stage with dense bf16 weights and MXFP8 activations, on a fresh alignment.
    let i = m(&[("topk_ids", i32t(&[2, 2], &[0, 1, 1, 0]))]);
    let al: BTreeMap<String, HostTensor> = run_op(&b, "moe_align", &i, &json!({"routing": {"experts": 2, "block_m": 2}})).unwrap().into_iter().collect();
    let mut i = al;
    i.insert("input".into(), f32t(&mut r, &[2, 32]));
    i.insert("weight".into(), normal(&mut r, DType::BF16, &[2, 8, 32], 0.2));
    let params = json!({"routing": {"top_k": 2, "block_m": 2}, "stage": {"gate_up": {"beta": 4.0, "linear_beta": 25.0}}, "activation_quant": "mxfp8"});
    assert_eq!(ok("moe_grouped_gemm", &i, params), [s("out", DType::F32, &[4, 4])]);
}

// ---- the real binary ------------------------------------------------------------------------

#[test]
fn binary_writes_the_same_outputs_and_fails_with_a_named_error() {
    let mut rng = TestRng::new(10);
    let x = normal(&mut rng, DType::F32, &[3, 16], 1.0);
    let w = normal(&mut rng, DType::F32, &[16], 1.0);
    let want = cli("rms_norm", &[("x", &x), ("w", &w)], json!({"eps": 1e-6}));
    let d = tmp("binary");
    let (i, p, o) = (d.join("in.safetensors"), d.join("params.json"), d.join("out.safetensors"));
    write_inputs(&i, &[("x", &x), ("w", &w)]);
    std::fs::write(&p, r#"{"eps": 1e-6}"#).unwrap();
    let k3 = env!("CARGO_BIN_EXE_k3");
    let run = std::process::Command::new(k3)
        .args(["op", "rms_norm", "--inputs"])
        .arg(&i)
        .arg("--params")
        .arg(&p)
        .arg("--outputs")
        .arg(&o)
        .args(["--backend", "cpu"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(read_outputs(&o).0, want);

    let bad = std::process::Command::new(k3).args(["op", "rms_nrom", "--inputs"]).arg(&i).arg("--outputs").arg(&o).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown op `rms_nrom`"), "{}", String::from_utf8_lossy(&bad.stderr));
    let bad = std::process::Command::new(k3)
        .args(["op", "rms_norm", "--inputs"])
        .arg(&i)
        .arg("--outputs")
        .arg(&o)
        .args(["--backend", "tpu"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("backend `tpu`"));
}

// ---- malformed requests -----------------------------------------------------------------------

fn rms_inputs() -> BTreeMap<String, HostTensor> {
    let mut rng = TestRng::new(11);
    [("x".to_string(), f32t(&mut rng, &[2, 4])), ("w".to_string(), f32t(&mut rng, &[4]))].into_iter().collect()
}

fn err(op: &str, inputs: &BTreeMap<String, HostTensor>, params: Value) -> OpError {
    match run_op(&CpuBackend::new(), op, inputs, &params) {
        Ok(_) => panic!("{op} with {params} succeeded"),
        Err(e) => e,
    }
}

#[test]
fn unknown_op_is_named() {
    let e = err("rms_nrom", &rms_inputs(), json!({}));
    assert!(matches!(e, OpError::UnknownOp { .. }), "{e}");
    assert_eq!(e.subject(), Some("rms_nrom"));
}

#[test]
fn missing_and_unknown_tensors_are_named() {
    let mut i = rms_inputs();
    i.remove("w");
    let e = err("rms_norm", &i, json!({"eps": 1e-5}));
    assert!(matches!(&e, OpError::Tensor { name, .. } if name == "w"), "{e}");
    assert!(e.to_string().contains("op `rms_norm`"), "{e}");

    let mut i = rms_inputs();
    i.insert("bogus".into(), HostTensor::zeros(DType::F32, &[1]));
    let e = err("rms_norm", &i, json!({"eps": 1e-5}));
    assert_eq!(e.subject(), Some("bogus"), "{e}");

    let mut i = rms_inputs();
    i.insert("out".into(), HostTensor::zeros(DType::F32, &[2, 4]));
    let e = err("rms_norm", &i, json!({"eps": 1e-5}));
    assert_eq!(e.subject(), Some("out"), "{e}");
    assert!(e.to_string().contains("out_dtypes"), "{e}");
}

#[test]
fn wrong_dtypes_are_named() {
    let mut i = rms_inputs();
    i.insert("x".into(), HostTensor::from_i32(&[2, 4], &[1; 8]).unwrap());
    let e = err("rms_norm", &i, json!({"eps": 1e-5}));
    assert!(matches!(&e, OpError::Kernel { .. }), "{e}");
    assert_eq!(e.subject(), Some("x"), "{e}");

    // Host metadata must be an index type.
    let i: BTreeMap<String, HostTensor> =
        [("table", HostTensor::zeros(DType::F32, &[4, 2])), ("ids", HostTensor::zeros(DType::F32, &[2]))].into_iter().map(|(n, t)| (n.into(), t)).collect();
    assert_eq!(err("embedding_gather", &i, json!({})).subject(), Some("ids"));

    // The page table of mla_decode is i32 only.
    let i: BTreeMap<String, HostTensor> = [
        ("q", HostTensor::zeros(DType::F32, &[1, 1, 1, 12])),
        ("kv_cache", HostTensor::zeros(DType::BF16, &[2, 1, 12])),
        ("block_table", HostTensor::from_i64(&[1, 2], &[0, 1]).unwrap()),
        ("seq_lens", HostTensor::from_i32(&[1], &[2]).unwrap()),
    ]
    .into_iter()
    .map(|(n, t)| (n.into(), t))
    .collect();
    let params = json!({"cache": {"dims": {"latent": 8}, "format": "bf16"}, "softmax_scale": 0.1});
    assert_eq!(err("mla_decode", &i, params).subject(), Some("block_table"));

    // A dtypes override must keep the element size; an unknown output dtype is named.
    let e = err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "dtypes": {"x": "bf16"}}));
    assert_eq!(e.subject(), Some("x"), "{e}");
    let e = err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "out_dtypes": {"out": "f64"}}));
    assert_eq!(e.subject(), Some("out_dtypes.out"), "{e}");
    let e = err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "out_dtypes": {"lse": "f32"}}));
    assert_eq!(e.subject(), Some("out_dtypes.lse"), "{e}");
}

#[test]
fn missing_unknown_and_mistyped_keys_are_named() {
    assert_eq!(err("rms_norm", &rms_inputs(), json!({})).subject(), Some("eps"));
    assert_eq!(err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "epss": 1})).subject(), Some("epss"));
    assert_eq!(err("rms_norm", &rms_inputs(), json!({"eps": "small"})).subject(), Some("eps"));
    assert_eq!(err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "m": -2})).subject(), Some("m"));
    assert_eq!(err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "weight_order": "hf"})).subject(), Some("weight_order"));
    assert_eq!(err("rms_norm", &rms_inputs(), json!([1, 2])).subject(), Some("."));
    // A dimension that would allocate an absurd output is refused before allocating.
    let e = err("rms_norm", &rms_inputs(), json!({"eps": 1e-5, "m": 1u64 << 40}));
    assert_eq!(e.subject(), Some("out"), "{e}");
    // A value the plan rejects names the params field.
    assert_eq!(err("rms_norm", &rms_inputs(), json!({"eps": 0.0})).subject(), Some("params.eps"));

    let i: BTreeMap<String, HostTensor> = [
        ("q", HostTensor::zeros(DType::F32, &[1, 1, 1, 12])),
        ("kv_cache", HostTensor::zeros(DType::BF16, &[2, 1, 12])),
        ("block_table", HostTensor::from_i32(&[1, 2], &[0, 1]).unwrap()),
        ("seq_lens", HostTensor::from_i32(&[1], &[2]).unwrap()),
    ]
    .into_iter()
    .map(|(n, t)| (n.into(), t))
    .collect();
    let e = err("mla_decode", &i, json!({"cache": {"dims": {}, "format": "bf16"}, "softmax_scale": 0.1}));
    assert_eq!(e.subject(), Some("cache.dims.latent"), "{e}");
    let e = err("mla_decode", &i, json!({"cache": {"dims": {"latent": 8, "ropee": 4}, "format": "bf16"}, "softmax_scale": 0.1}));
    assert_eq!(e.subject(), Some("cache.dims.ropee"), "{e}");
    let e = err("mla_decode", &i, json!({"cache": {"dims": {"latent": 8}, "format": "fp9"}, "softmax_scale": 0.1}));
    assert_eq!(e.subject(), Some("cache.format"), "{e}");
    let e = err("mla_decode", &i, json!({"cache": {"dims": {"latent": 8}, "format": "fp8-e4m3fn"}, "softmax_scale": 0.1}));
    assert_eq!(e.subject(), Some("cache.kv_scale"), "{e}");
    let e = err("mla_decode", &i, json!({"cache": {"dims": {"latent": 8}, "format": "bf16"}, "softmax_scale": 0.1, "splits": 3}));
    assert_eq!(e.subject(), Some("splits"), "{e}");
    // Host metadata given in the params overrides the tensor: an out-of-range page is caught.
    let e = err("mla_decode", &i, json!({"cache": {"dims": {"latent": 8}, "format": "bf16"}, "softmax_scale": 0.1, "block_table": [[0, 7]]}));
    assert_eq!(e.subject(), Some("batch.block_table"), "{e}");
}

#[test]
fn bad_files_are_named() {
    let d = tmp("bad-files");
    let (i, p, o) = (d.join("in.safetensors"), d.join("params.json"), d.join("out.safetensors"));
    let x = HostTensor::zeros(DType::F32, &[2, 4]);
    let w = HostTensor::zeros(DType::F32, &[4]);
    write_inputs(&i, &[("x", &x), ("w", &w)]);
    std::fs::write(&p, "{\"eps\": 1e-5,,}").unwrap();
    let b = CpuBackend::new();
    let e = run_op_files(&b, "rms_norm", &i, Some(&p), &o).unwrap_err();
    assert!(matches!(&e, OpError::File { path, why } if path == &p && why.contains("invalid JSON")), "{e}");

    let garbage = d.join("garbage.safetensors");
    std::fs::write(&garbage, [0xffu8; 20]).unwrap();
    let e = run_op_files(&b, "rms_norm", &garbage, None, &o).unwrap_err();
    assert!(matches!(&e, OpError::File { path, .. } if path == &garbage), "{e}");
    let e = run_op_files(&b, "rms_norm", &d.join("absent.safetensors"), None, &o).unwrap_err();
    assert!(matches!(&e, OpError::File { .. }), "{e}");

    // A safetensors dtype without a kernel dtype (F64) names the tensor.
    let f64_in = d.join("f64.safetensors");
    let bytes = vec![0u8; 32];
    let v = safetensors::tensor::TensorView::new(St::F64, vec![4], &bytes).unwrap();
    safetensors::serialize_to_file(vec![("x".to_string(), v)], None, &f64_in).unwrap();
    let e = run_op_files(&b, "l2_norm", &f64_in, None, &o).unwrap_err();
    assert!(e.to_string().contains("tensor `x`") && e.to_string().contains("F64"), "{e}");
}

/// Every op, fed the tensors it asks for one at a time as rank-0 placeholders: each request is
/// an error (a missing tensor, then a shape or key error), never a panic.
#[test]
fn every_op_rejects_incomplete_requests() {
    let b = CpuBackend::new();
    for op in op_names() {
        let mut inputs = BTreeMap::new();
        let mut asked = Vec::new();
        loop {
            match run_op(&b, op, &inputs, &json!({})) {
                Ok(_) => panic!("{op} ran on placeholders {asked:?}"),
                Err(OpError::Tensor { name, why, .. }) if why.starts_with("missing") => {
                    assert!(!asked.contains(&name), "{op} asked for `{name}` twice");
                    inputs.insert(name.clone(), HostTensor::zeros(DType::I32, &[]));
                    asked.push(name);
                }
                Err(e) => {
                    assert!(e.subject().is_some(), "{op}: {e}");
                    break;
                }
            }
        }
        assert!(!asked.is_empty(), "{op} asked for no tensor");
    }
}
