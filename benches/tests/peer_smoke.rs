//! `k3-peer` on small cases of every op it runs, on the CPU reference and on the emulated GPU
//! kernels (simt32): both must write outputs and timings, and agree with each other.

use kernel_api::conformance::TestRng;
use kernel_api::tensor::encode_f32;
use kernel_api::tolerance::compare;
use kernel_api::{DType, HostTensor};
use model_k3::op_cli::{read_safetensors, write_safetensors};
use std::path::Path;
use std::process::Command;

fn normal(rng: &mut TestRng, dtype: DType, shape: &[usize], std: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut bytes = vec![0u8; n * dtype.size_bytes()];
    for (v, out) in rng.normals(n, std).into_iter().zip(bytes.chunks_mut(dtype.size_bytes())) {
        encode_f32(dtype, v, out);
    }
    HostTensor::from_bytes(dtype, shape, bytes).unwrap()
}

fn bytes(rng: &mut TestRng, shape: &[usize], f: impl Fn(u64) -> u8) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_bytes(DType::U8, shape, (0..n).map(|_| f(rng.next_u64())).collect()).unwrap()
}

fn write_case(root: &Path, name: &str, op: &str, params: &str, tensors: Vec<(&str, HostTensor)>) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("case.json"), format!(r#"{{"op": "{op}", "params": {params}}}"#)).unwrap();
    let t: Vec<_> = tensors.into_iter().map(|(n, t)| (n.to_string(), t, None)).collect();
    write_safetensors(&dir.join("inputs.safetensors"), op, &t).unwrap();
}

fn cases(root: &Path) {
    let mut r = TestRng::new(5);
    let (bf, f32) = (DType::BF16, DType::F32);
    let (t, h, k) = (24, 2, 32);
    write_case(root, "kda_prefill", "kda_prefill", r#"{"chunk_size": 16}"#, vec![
        ("q", normal(&mut r, bf, &[t, h, k], 1.0)),
        ("k", normal(&mut r, bf, &[t, h, k], 1.0)),
        ("v", normal(&mut r, bf, &[t, h, k], 1.0)),
        ("g_raw", normal(&mut r, bf, &[t, h, k], 1.0)),
        ("beta", normal(&mut r, bf, &[t, h], 1.0)),
        ("a_log", normal(&mut r, f32, &[h], 0.5)),
        ("dt_bias", normal(&mut r, f32, &[h * k], 0.5)),
        ("cu_seqlens", HostTensor::from_i64(&[3], &[0, 9, 24]).unwrap()),
        ("state", normal(&mut r, f32, &[2, h, k, k], 0.05)),
    ]);
    let (b, d) = (3, h * 3 * k);
    write_case(root, "kda_decode", "kda_decode", "{}", vec![
        ("x_qkv", normal(&mut r, bf, &[b, d], 1.0)),
        ("conv_weight", normal(&mut r, f32, &[d, 4], 0.5)),
        ("conv_state", normal(&mut r, f32, &[b + 1, d, 3], 1.0)),
        ("g_raw", normal(&mut r, bf, &[b, h, k], 1.0)),
        ("beta", normal(&mut r, bf, &[b, h], 1.0)),
        ("a_log", normal(&mut r, f32, &[h], 0.5)),
        ("dt_bias", normal(&mut r, f32, &[h * k], 0.5)),
        ("state_indices", HostTensor::from_i32(&[b], &[2, 3, 1]).unwrap()),
        ("state", normal(&mut r, f32, &[b + 1, h, k, k], 0.05)),
        ("output_gate", normal(&mut r, bf, &[b, h, k], 1.0)),
        ("norm_weight", normal(&mut r, f32, &[k], 1.0)),
    ]);
    write_case(root, "mla_decode", "mla_decode", r#"{"rope": 16}"#, vec![
        ("q", normal(&mut r, bf, &[2, 1, 3, 80], 1.0)),
        ("kv_cache", normal(&mut r, bf, &[4, 64, 80], 1.0)),
        ("block_table", HostTensor::from_i32(&[2, 2], &[3, 0, 2, 1]).unwrap()),
        ("seq_lens", HostTensor::from_i32(&[2], &[100, 64]).unwrap()),
    ]);
    let (tok, dm, n, e) = (4, 64, 32, 8);
    write_case(root, "moe", "moe", r#"{"top_k": 2}"#, vec![
        ("x", normal(&mut r, bf, &[tok, dm], 1.0)),
        ("router_weight", normal(&mut r, bf, &[e, dm], 0.1)),
        ("bias", normal(&mut r, f32, &[e], 0.05)),
        ("w13", bytes(&mut r, &[e, 2 * n, dm / 2], |v| v as u8)),
        ("s13", bytes(&mut r, &[e, 2 * n, dm / 32], |v| 121 + (v % 2) as u8)),
        ("w2", bytes(&mut r, &[e, dm, n / 2], |v| v as u8)),
        ("s2", bytes(&mut r, &[e, dm, n / 32], |v| 121 + (v % 2) as u8)),
    ]);
    write_case(root, "gemm", "gemm", "{}", vec![("x", normal(&mut r, bf, &[5, 64], 1.0)), ("w", normal(&mut r, bf, &[48, 64], 0.125))]);
}

fn run(root: &Path, backend: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_k3-peer")).args(["--backend", backend, "--warmup", "0", "--iters", "2", "--dir"]).arg(root).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "k3-peer {backend}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn cpu_and_simt32_run_every_case_and_agree() {
    let base = std::env::temp_dir().join(format!("k3-peer-smoke-{}", std::process::id()));
    let (cpu_dir, simt_dir) = (base.join("cpu"), base.join("simt32"));
    cases(&cpu_dir);
    cases(&simt_dir);
    run(&cpu_dir, "cpu");
    let lines = run(&simt_dir, "simt32");
    for case in ["kda_prefill", "kda_decode", "mla_decode", "moe", "gemm"] {
        assert!(lines.contains(&format!("{case}: {case}")), "{lines}");
        let timing: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(simt_dir.join(case).join("k3.json")).unwrap()).unwrap();
        assert!(timing["us"].as_f64().is_some_and(|v| v > 0.0) && timing["bytes"].as_u64().is_some_and(|v| v > 0), "{timing}");
        let a = read_safetensors(&cpu_dir.join(case).join("k3.safetensors")).unwrap();
        let b = read_safetensors(&simt_dir.join(case).join("k3.safetensors")).unwrap();
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{case}");
        for (name, t) in &a {
            let c = compare(&b[name].tensor.to_f32(), &t.tensor.to_f32());
            // bf16 outputs differ by their rounding (kernel-api tolerance for bf16: 8e-3).
            assert!(c.rel_rmse < 8e-3, "{case}.{name}: rel RMSE {:.2e}", c.rel_rmse);
        }
    }
    // In-place pools come back updated; routing ids match exactly.
    let ids = |dir: &Path| read_safetensors(&dir.join("moe").join("k3.safetensors")).unwrap()["topk_ids"].tensor.to_i64();
    assert_eq!(ids(&cpu_dir), ids(&simt_dir));
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn bad_case_directories_are_errors_not_panics() {
    let dir = std::env::temp_dir().join(format!("k3-peer-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_k3-peer")).args(["--backend", "cpu", "--dir"]).arg(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--dir") && !err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
