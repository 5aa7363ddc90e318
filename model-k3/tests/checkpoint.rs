//! Tiny checkpoint generation, loading, inspection, and loader errors on corrupted inputs.

use model_k3::checkpoint::{shard_file_name, Checkpoint, INDEX_FILE};
use model_k3::inspect::inspect_dir;
use model_k3::tiny::write_tiny_checkpoint;
use model_k3::ModelError;
use std::path::{Path, PathBuf};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("k3-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn fresh(tag: &str, twin: bool) -> PathBuf {
    let d = tmpdir(tag);
    write_tiny_checkpoint(&d, 7, twin).unwrap();
    d
}

fn last_shard(d: &Path) -> PathBuf {
    d.join(shard_file_name(5, 6))
}

#[test]
fn tiny_checkpoint_layout_and_clean_inspection() {
    let d = fresh("clean", false);
    assert!(d.join(INDEX_FILE).exists());
    assert!(d.join("model-00001-of-000006.safetensors").exists());
    let ck = Checkpoint::open(&d).unwrap();
    assert!(ck.problems.is_empty(), "{:?}", ck.problems);
    assert!(ck.has_packed_experts());
    let bias = ck.entry("model.layers.1.block_sparse_moe.gate.e_score_correction_bias").unwrap();
    assert_eq!(bias.dtype, kernel_api::DType::F32);
    // Layer shards hold exactly their layer.
    let l2 = ck.entry("model.layers.2.self_attn.q_proj.weight").unwrap();
    assert_eq!(ck.shards[l2.shard].file_name, "model-00003-of-000006.safetensors");
    let r = inspect_dir(&d).unwrap();
    assert!(r.ok(), "{r}");
    assert!(r.quantized_fraction > 0.0);
    let twin = fresh("twin", true);
    let r = inspect_dir(&twin).unwrap();
    assert!(r.ok(), "{r}");
    assert!(!r.experts_mxfp4);
    let _ = std::fs::remove_dir_all(d);
    let _ = std::fs::remove_dir_all(twin);
}

#[test]
fn generation_is_deterministic_and_twin_is_exact() {
    let a = fresh("det-a", false);
    let b = fresh("det-b", false);
    for i in 0..6 {
        let f = shard_file_name(i, 6);
        assert_eq!(std::fs::read(a.join(&f)).unwrap(), std::fs::read(b.join(&f)).unwrap(), "{f}");
    }
    // The twin's bf16 expert weights equal the dequantised MXFP4 values exactly.
    let t = fresh("det-twin", true);
    let q = Checkpoint::open(&a).unwrap();
    let w = Checkpoint::open(&t).unwrap();
    let base = "model.layers.3.block_sparse_moe.experts.5.w2";
    let packed = q.bytes(q.entry(&format!("{base}.weight_packed")).unwrap());
    let scales = q.bytes(q.entry(&format!("{base}.weight_scale")).unwrap());
    let twin = w.bytes(w.entry(&format!("{base}.weight")).unwrap());
    let (rows, cols) = (64, 96);
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let code = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
            let mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
            let v = if code & 8 != 0 { -mag } else { mag } * 2f32.powi(scales[r * cols / 32 + c / 32] as i32 - 127);
            let i = 2 * (r * cols + c);
            let got = half::bf16::from_bits(u16::from_le_bytes([twin[i], twin[i + 1]])).to_f32();
            assert_eq!(got, v, "({r},{c})");
        }
    }
    for d in [a, b, t] {
        let _ = std::fs::remove_dir_all(d);
    }
}

fn expect_checkpoint_error(d: &Path) -> String {
    match Checkpoint::open(d) {
        Err(e @ ModelError::Checkpoint { .. }) => e.to_string(),
        Err(e @ ModelError::Io { .. }) => e.to_string(),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

/// A truncated shard says so, with the expected and actual sizes; trailing data is told apart.
#[test]
fn truncated_shard_is_an_error() {
    let d = fresh("trunc", false);
    let p = last_shard(&d);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    let e = expect_checkpoint_error(&d);
    let want = format!("the header's tensors need {} bytes, the file has {} (100 bytes missing", bytes.len(), bytes.len() - 100);
    assert!(e.contains("model-00006-of-000006") && e.contains("truncated") && e.contains(&want), "{e}");
    let mut padded = bytes.clone();
    padded.extend_from_slice(&[0u8; 24]);
    std::fs::write(&p, &padded).unwrap();
    let e = expect_checkpoint_error(&d);
    assert!(e.contains("24 bytes of trailing data") && !e.contains("truncated"), "{e}");
    std::fs::write(&p, &bytes[..bytes.len() / 3]).unwrap();
    assert!(expect_checkpoint_error(&d).contains("truncated"));
    std::fs::write(&p, &bytes[..50]).unwrap();
    assert!(expect_checkpoint_error(&d).contains("truncated inside the header"));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn header_lying_about_sizes_is_an_error() {
    let d = fresh("lie", false);
    let p = last_shard(&d);
    let mut bytes = std::fs::read(&p).unwrap();
    // Claim a header longer than the file.
    bytes[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    expect_checkpoint_error(&d);
    // A header whose offsets do not match the shape: rewrite one shape inside the JSON.
    let d2 = fresh("lie2", false);
    let p = last_shard(&d2);
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let bad = header.replacen("[512,128]", "[512,127]", 1);
    assert_ne!(bad, header);
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(bad.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&p, &out).unwrap();
    // The message names the tensor whose entry no longer matches its data.
    let e = expect_checkpoint_error(&d2);
    assert!(e.contains("tensor `language_model.") && e.contains("[512, 127]") && e.contains("needs 130048 bytes"), "{e}");
    let _ = std::fs::remove_dir_all(d);
    let _ = std::fs::remove_dir_all(d2);
}

#[test]
fn index_pointing_to_missing_shard_is_an_error() {
    let d = fresh("noshard", false);
    std::fs::remove_file(d.join(shard_file_name(2, 6))).unwrap();
    let e = expect_checkpoint_error(&d);
    assert!(e.contains("model-00003-of-000006"), "{e}");
    let _ = std::fs::remove_dir_all(d);
}

/// Rewrites one tensor of a shard through the safetensors crate.
fn rewrite_shard(p: &Path, f: impl Fn(&str, safetensors::Dtype, &[usize], &[u8]) -> Option<(safetensors::Dtype, Vec<usize>, Vec<u8>)>) {
    let bytes = std::fs::read(p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, v) in st.tensors() {
        match f(&name, v.dtype(), v.shape(), v.data()) {
            Some((d, s, b)) => owned.push((name, d, s, b)),
            None => owned.push((name, v.dtype(), v.shape().to_vec(), v.data().to_vec())),
        }
    }
    let views: Vec<_> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, p).unwrap();
}

#[test]
fn bf16_router_bias_is_reported_by_inspect() {
    let d = fresh("bf16bias", false);
    let p = d.join(shard_file_name(1, 6));
    rewrite_shard(&p, |name, _, shape, data| {
        name.ends_with("e_score_correction_bias").then(|| {
            let b: Vec<u8> = data.chunks(4).flat_map(|c| half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_bits().to_le_bytes()).collect();
            (safetensors::Dtype::BF16, shape.to_vec(), b)
        })
    });
    // The index total_size is now stale too; both are deviations, not crashes.
    let r = inspect_dir(&d).unwrap();
    assert!(!r.ok());
    assert!(r.deviations.iter().any(|x| x.contains("e_score_correction_bias") && x.contains("bf16")), "{r}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn missing_tensor_is_reported_by_inspect() {
    let d = fresh("missing", false);
    let p = d.join(shard_file_name(0, 6));
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let keep: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        st.tensors().into_iter().filter(|(n, _)| !n.ends_with("layers.0.self_attn.dt_bias")).collect();
    let owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
        keep.iter().map(|(n, v)| (n.clone(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    drop(keep);
    let views: Vec<_> = owned
        .iter()
        .map(|(n, dt, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &p).unwrap();
    let r = inspect_dir(&d).unwrap();
    assert!(r.deviations.iter().any(|x| x.contains("missing") && x.contains("layers.0.self_attn.dt_bias")), "{r}");
    // The index still names it: an index/shard inconsistency is reported as well.
    assert!(r.deviations.iter().any(|x| x.contains("does not contain it")), "{r}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn weights_load_to_the_cpu_backend_and_refuse_a_bf16_router_bias() {
    let d = fresh("load", false);
    let ck = Checkpoint::open(&d).unwrap();
    let cpu = kernel_api::cpu::CpuBackend::new();
    let mut bytes = 0usize;
    let w = model_k3::weights::ModelWeights::load(&ck, &cpu, &mut |b| bytes += b).unwrap();
    assert_eq!(w.layers.len(), 5);
    assert!(bytes > 1_000_000);
    let p = d.join(shard_file_name(1, 6));
    rewrite_shard(&p, |name, _, shape, data| {
        name.ends_with("e_score_correction_bias").then(|| {
            let b: Vec<u8> = data.chunks(4).flat_map(|c| half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_bits().to_le_bytes()).collect();
            (safetensors::Dtype::BF16, shape.to_vec(), b)
        })
    });
    let ck = Checkpoint::open(&d).unwrap();
    match model_k3::weights::ModelWeights::load(&ck, &cpu, &mut |_| {}) {
        Err(ModelError::Tensor { name, why }) => assert!(name.ends_with("e_score_correction_bias") && why.contains("bf16"), "{name}: {why}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a bf16 router bias must be refused"),
    }
    let _ = std::fs::remove_dir_all(d);
}
