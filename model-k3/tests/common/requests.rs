//! One small, valid `k3 op` request per op (inputs and params), the seeds the bad-input
//! generators mutate. Shapes are tiny so that a mutation the op accepts runs in milliseconds
//! even on the emulator.

use kernel_api::conformance::TestRng;
use kernel_api::cpu::CpuBackend;
use kernel_api::{DType, HostTensor};
use model_k3::op_cli::run_op;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub struct Request {
    pub op: &'static str,
    pub inputs: BTreeMap<String, HostTensor>,
    pub params: Value,
}

/// The op family of `op` (as the issue counts them).
pub fn family(op: &str) -> &'static str {
    if op.starts_with("mla_") {
        "mla"
    } else if op.starts_with("kda_") || op == "causal_conv1d" {
        "kda"
    } else if op.starts_with("moe_") {
        "moe"
    } else {
        "dense"
    }
}

fn t(r: &mut TestRng, dtype: DType, shape: &[usize]) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32(dtype, shape, &r.normals(n, 1.0)).unwrap()
}

fn i32t(shape: &[usize], v: &[i32]) -> HostTensor {
    HostTensor::from_i32(shape, v).unwrap()
}

fn req(op: &'static str, inputs: Vec<(&str, HostTensor)>, params: Value) -> Request {
    Request { op, inputs: inputs.into_iter().map(|(n, t)| (n.to_string(), t)).collect(), params }
}

/// Every op of `k3 op`, each with a valid request (checked by `valid_requests_run` in the
/// bad-input suite).
pub fn valid_requests() -> Vec<Request> {
    let mut r = TestRng::new(15);
    let f = DType::F32;
    let bf = DType::BF16;
    let (latent, rope) = (8, 4);
    let mut v = vec![
        req("gemm", vec![("x", t(&mut r, bf, &[3, 8])), ("w", t(&mut r, bf, &[4, 8])), ("bias", t(&mut r, f, &[4]))], json!({"out_dtypes": {"out": "f32"}})),
        req("rms_norm", vec![("x", t(&mut r, f, &[2, 8])), ("w", t(&mut r, f, &[8]))], json!({"eps": 1e-5})),
        req("gated_rms_norm", vec![("o", t(&mut r, f, &[2, 2, 4])), ("gate", t(&mut r, f, &[2, 2, 4])), ("w", t(&mut r, f, &[4]))], json!({"eps": 1e-5})),
        req("l2_norm", vec![("x", t(&mut r, bf, &[3, 8]))], json!({"eps": 1e-6})),
        req("attn_res_mix", vec![("sources", t(&mut r, f, &[3, 2, 8])), ("score_vector", t(&mut r, f, &[8]))], json!({"eps": 1e-5})),
        req("situ_glu", vec![("gate_up", t(&mut r, f, &[2, 8]))], json!({"beta": 4.0, "linear_beta": 25.0})),
        req("sigmoid_gate", vec![("x", t(&mut r, f, &[2, 4])), ("g", t(&mut r, f, &[2, 4]))], json!({})),
        req("embedding_gather", vec![("table", t(&mut r, bf, &[6, 4])), ("ids", i32t(&[3], &[5, 0, 2]))], json!({})),
        req("copy_cast", vec![("x", t(&mut r, f, &[2, 3]))], json!({"out_dtypes": {"out": "bf16"}})),
        req("add_assign", vec![("acc", t(&mut r, f, &[2, 3])), ("x", t(&mut r, bf, &[2, 3]))], json!({})),
        req("lse_merge", vec![("partial_out", t(&mut r, f, &[2, 3, 2, 4])), ("partial_lse", t(&mut r, f, &[2, 3, 2]))], json!({})),
        req(
            "mla_prefill",
            vec![
                ("q", t(&mut r, f, &[5, 2, 6])),
                ("k", t(&mut r, f, &[7, 2, 6])),
                ("v", t(&mut r, f, &[7, 2, 4])),
                ("cu_seqlens", i32t(&[3], &[0, 2, 5])),
                ("cu_seqlens_k", i32t(&[3], &[0, 3, 7])),
            ],
            json!({"softmax_scale": 0.4, "causal": true}),
        ),
        req(
            "mla_cache_write",
            vec![
                ("kv", t(&mut r, f, &[3, latent + rope])),
                ("slot_mapping", i32t(&[3], &[5, -1, 0])),
                ("cache", HostTensor::zeros(DType::U8, &[3, 2, latent + 4 + 2 * rope])),
            ],
            json!({"dims": {"latent": latent}, "format": "fp8-tiled-e4m3fn"}),
        ),
        req(
            "mla_decode",
            vec![
                ("q", t(&mut r, bf, &[2, 1, 3, latent + rope])),
                ("kv_cache", t(&mut r, bf, &[8, 1, latent + rope])),
                ("block_table", i32t(&[2, 5], &[4, 1, 2, 0, 6, 7, 3, 5, -1, -1])),
                ("seq_lens", i32t(&[2], &[5, 3])),
            ],
            json!({"cache": {"dims": {"latent": latent, "rope": rope}, "format": "bf16"}, "softmax_scale": 0.3, "splits": {"num_splits": 2}, "variant": "gluon"}),
        ),
        req(
            "mla_prefill_absorbed",
            vec![
                ("q", t(&mut r, f, &[3, 2, latent + rope])),
                ("kv_cache", t(&mut r, bf, &[4, 1, latent + rope])),
                ("cu_seqlens_q", i32t(&[3], &[0, 1, 3])),
                ("seq_lens", i32t(&[2], &[2, 2])),
                ("block_table", i32t(&[2, 2], &[3, 1, 0, 2])),
            ],
            json!({"cache": {"dims": {"latent": latent, "rope": rope}, "format": "bf16"}, "softmax_scale": 0.3, "causal": true}),
        ),
        req(
            "kda_gate",
            vec![("g_raw", t(&mut r, f, &[3, 2, 4])), ("a_log", t(&mut r, f, &[2])), ("dt_bias", t(&mut r, f, &[8]))],
            json!({"mode": {"lower_bound": -5.0}}),
        ),
        req(
            "kda_prefill",
            vec![
                ("q", t(&mut r, bf, &[8, 2, 8])),
                ("k", t(&mut r, bf, &[8, 2, 8])),
                ("v", t(&mut r, bf, &[8, 2, 8])),
                ("g_raw", t(&mut r, bf, &[8, 2, 8])),
                ("beta", t(&mut r, f, &[8, 2])),
                ("a_log", HostTensor::from_f32(f, &[4], &[0.3, -0.6, 0.0, 0.0]).unwrap()),
                ("dt_bias", t(&mut r, f, &[16])),
                ("cu_seqlens", i32t(&[3], &[0, 5, 8])),
                ("state_indices", i32t(&[2], &[2, 0])),
                ("state", t(&mut r, f, &[3, 2, 8, 8])),
            ],
            json!({"gate": {"lower_bound": -5.0}, "beta_sigmoid": true, "use_qk_l2norm": true, "q_scale": 0.25,
                   "chunk_size": 16, "read_initial_state": true, "write_final_state": true}),
        ),
        req(
            "kda_decode",
            vec![
                ("x_qkv", t(&mut r, bf, &[3, 2 * (2 * 8 + 8)])),
                ("conv_weight", t(&mut r, f, &[48, 4])),
                ("conv_state", t(&mut r, f, &[3, 48, 3])),
                ("g_raw", t(&mut r, f, &[3, 2, 8])),
                ("beta", t(&mut r, f, &[3, 2])),
                ("a_log", HostTensor::from_f32(f, &[2], &[-0.5, 0.2]).unwrap()),
                ("state_indices", i32t(&[3], &[2, 0, 1])),
                ("recurrent_state", t(&mut r, f, &[3, 2, 8, 8])),
            ],
            json!({"gate": "softplus", "beta_sigmoid": true, "qk_l2norm": true, "output_norm": "none"}),
        ),
        req(
            "causal_conv1d",
            vec![
                ("x", t(&mut r, f, &[5, 6])),
                ("weight", t(&mut r, f, &[6, 4])),
                ("cu_seqlens", HostTensor::from_i64(&[3], &[0, 4, 5]).unwrap()),
                ("state_indices", i32t(&[2], &[1, 0])),
                ("conv_state", t(&mut r, f, &[2, 6, 3])),
            ],
            json!({"activation": "silu", "read_initial_state": true, "write_final_state": true}),
        ),
        req(
            "moe_router",
            vec![("x", t(&mut r, f, &[4, 16])), ("weight", t(&mut r, bf, &[8, 16])), ("bias", t(&mut r, f, &[8]))],
            json!({"top_k": 3, "n_group": 2, "topk_group": 1, "renormalize": true}),
        ),
        req("moe_align", vec![("topk_ids", i32t(&[2, 2], &[5, 1, 1, 3])), ("expert_map", i32t(&[6], &[-1, 0, -1, 1, -1, 2]))], json!({"routing": {"experts": 3, "block_m": 2}})),
        req("moe_combine", vec![("y", t(&mut r, f, &[6, 4]))], json!({"top_k": 2})),
    ];
    // moe_grouped_gemm on moe_align's outputs (MXFP4 down projection).
    let (tokens, top_k, experts, block_m, k, n) = (3, 2, 4, 4, 64, 8);
    let ids: Vec<i32> = (0..tokens * top_k).map(|i| ((i * 3 + i / 2) % experts) as i32).collect();
    let align_in: BTreeMap<String, HostTensor> = [("topk_ids".to_string(), i32t(&[tokens, top_k], &ids))].into_iter().collect();
    let aligned = run_op(&CpuBackend::new(), "moe_align", &align_in, &json!({"routing": {"experts": experts, "block_m": block_m}})).unwrap();
    let mut inputs: Vec<(&str, HostTensor)> = aligned.iter().map(|(name, t)| (name.as_str(), t.clone())).collect();
    let codes: Vec<u8> = (0..experts * n * k / 2).map(|_| r.below(256) as u8).collect();
    let scales: Vec<u8> = (0..experts * n * k / 32).map(|_| 122 + r.below(8) as u8).collect();
    inputs.extend([
        ("input", t(&mut r, bf, &[tokens * top_k, k])),
        ("weight", HostTensor::from_bytes(DType::U8, &[experts, n, k / 2], codes).unwrap()),
        ("weight_scale", HostTensor::from_bytes(DType::U8, &[experts, n, k / 32], scales).unwrap()),
        ("topk_weights", HostTensor::from_f32(f, &[tokens, top_k], &r.uniforms(tokens * top_k, 0.0, 1.0)).unwrap()),
    ]);
    v.push(req("moe_grouped_gemm", inputs, json!({"routing": {"block_m": block_m}, "stage": "down"})));
    v
}
