//! The host-side cases of issue 15, one test each: sizes checked before anything is allocated
//! or read, non-regular files refused, non-finite weights and logits refused, outputs that only
//! ever replace regular files, the tiny checkpoint made atomically, and messages that name the
//! tensor, file or field. The `k3` binary runs as a child under a memory cap and a timeout.

mod common;

use common::*;
use kernel_api::cpu::CpuBackend;
use model_k3::checkpoint::{shard_file_name, Checkpoint, INDEX_FILE};
use model_k3::inspect::inspect_dir;
use model_k3::model::ModelOptions;
use model_k3::runner::{load_model, parity, Generation};
use model_k3::tiny_folder::{ensure_tiny_checkpoint, tiny_state, Ensured, TinyState, COMPLETE_MARKER};
use model_k3::ModelError;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn field(e: &ModelError) -> String {
    match e {
        ModelError::Kernel(kernel_api::Error::InvalidInput { field, .. }) => field.clone(),
        other => panic!("expected an invalid-input error, got {other}"),
    }
}

fn load(dir: &Path) -> model_k3::Result<model_k3::model::K3Model<CpuBackend>> {
    load_model(dir, CpuBackend::new(), ModelOptions { num_pages: 4, max_seqs: 1, ..Default::default() }, &mut |_, _| {})
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---- limits before allocations -------------------------------------------------------------

#[test]
fn absurd_config_sizes_fail_fast_with_the_field_named() {
    for (key, value, want) in [
        ("num_experts", json!(1_000_000_000u64), "num_experts"),
        ("moe_intermediate_size", json!(1e9), "moe_intermediate_size"),
        ("moe_intermediate_size", json!(1_000_000_000u64), "moe_intermediate_size"),
        ("num_hidden_layers", json!(u64::MAX), "num_hidden_layers"),
        ("vocab_size", json!(1u64 << 40), "vocab_size"),
        ("max_position_embeddings", json!(-1), "max_position_embeddings"),
        ("bos_token_id", json!(1u64 << 33), "bos_token_id"),
    ] {
        let d = tiny("absurd");
        edit_config(&d, |t| t[key] = value.clone());
        let start = Instant::now();
        let e = inspect_dir(&d).unwrap_err();
        assert_eq!(field(&e), want, "{key} = {value}: {e}");
        let e = load(&d).err().unwrap();
        assert_eq!(field(&e), want, "{key} = {value}: {e}");
        assert!(start.elapsed() < Duration::from_secs(5), "{key}: {:?}", start.elapsed());
    }
    // Within every per-field limit, but asking for more tensors than any checkpoint may hold.
    let d = tiny("many-tensors");
    edit_config(&d, |t| {
        t["num_experts"] = json!(65536);
        t["num_hidden_layers"] = json!(64);
        t["linear_attn_config"]["kda_layers"] = json!((1..=62).collect::<Vec<_>>());
        t["linear_attn_config"]["full_attn_layers"] = json!([63, 64]);
    });
    let e = inspect_dir(&d).unwrap_err();
    assert_eq!(field(&e), "num_experts", "{e}");
    assert!(e.to_string().contains("MAX_TENSORS"), "{e}");
    // The binary: a named error, exit 2, well inside the memory cap.
    let d = tiny("absurd-bin");
    edit_config(&d, |t| t["num_experts"] = json!(1_000_000_000u64));
    for args in [vec!["inspect", s(&d)], vec!["run", "--model", s(&d), "--prompt-ids", "1,2"]] {
        let r = k3(&args, &[], T);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stderr.contains("num_experts") && r.secs < 10.0, "{args:?}: {r:?}");
    }
}

/// A size within the config limits that the checkpoint does not hold: `inspect` reports the
/// mismatch and `run` refuses before allocating anything for it.
#[test]
fn config_sizes_the_checkpoint_does_not_hold_are_refused_before_loading() {
    let d = tiny("big-inter");
    edit_config(&d, |t| t["moe_intermediate_size"] = json!(1 << 24));
    let r = inspect_dir(&d).unwrap();
    assert!(r.deviations.iter().any(|x| x.contains("experts.0.w1.weight_packed") && x.contains("16777216")), "{r}");
    let e = load(&d).err().unwrap();
    assert!(matches!(e, ModelError::Checkpoint { .. }) && e.to_string().contains("deviates"), "{e}");
    let r = k3(&["run", "--model", s(&d), "--prompt-ids", "1"], &[], T);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("deviates from its config"), "{r:?}");
}

#[test]
fn max_new_tokens_is_capped_by_the_context() {
    let d = tiny("max-new");
    for n in ["18446744073709551615", "10000000", "1048575"] {
        let r = k3(&["run", "--model", s(&d), "--prompt-ids", "1,2", "--max-new-tokens", n], &[], T);
        assert_eq!(r.code, Some(2), "{n}: {r:?}");
        assert!(r.stderr.contains("--max-new-tokens") && r.stderr.contains("1048576"), "{n}: {r:?}");
    }
    // The library refuses too (no allocation sized by the request).
    let mut m = load(&d).unwrap();
    let e = m.generate(0, &[1, 2], usize::MAX, 8).unwrap_err();
    assert_eq!(field(&e), "max_new_tokens", "{e}");
    // Logits of every position are held in memory for --logits-out: capped as well.
    edit_config(&d, |t| t["vocab_size"] = json!(1 << 24));
    let out = d.join("l.npy");
    let r = k3(&["run", "--model", s(&d), "--prompt-ids", "1", "--max-new-tokens", "100", "--logits-out", s(&out)], &[], T);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("--logits-out"), "{r:?}");
}

/// `--chunk 0` (it used to be accepted), a `--kv-scale` that is not finite and positive, and a
/// prompt token outside the vocabulary are refused naming the flag, from the config alone,
/// before the checkpoint is loaded (here there is nothing to load: only config.json exists).
#[test]
fn run_flags_are_checked_before_loading() {
    let d = tmp("flags");
    std::fs::write(d.join("config.json"), model_k3::config::TINY_CONFIG_JSON).unwrap();
    for (flag, value, prompt) in [("--chunk", "0", "1,2"), ("--kv-scale", "nan", "1,2"), ("--kv-scale", "-1", "1,2"), ("--max-new-tokens", "1", "1,512")] {
        let r = k3(&["run", "--model", s(&d), "--prompt-ids", prompt, &format!("{flag}={value}")], &[], T);
        assert_eq!(r.code, Some(2), "{flag} {value}: {r:?}");
        let named = if prompt.contains("512") { "--prompt-ids" } else { flag };
        assert!(r.stderr.contains(&format!("`{named}`")), "{flag} {value}: {r:?}");
    }
    let e = load(&tiny("chunk0")).unwrap().generate(0, &[1, 2], 1, 0).unwrap_err();
    assert_eq!(field(&e), "chunk", "{e}");
}

/// config.json, the index, a shard, and `k3 op --inputs/--params` replaced by `/dev/zero`, a
/// FIFO or a directory: an error at once naming what the file is (a FIFO used to hang, /dev/zero
/// to read 4 GB, a directory to say "No such device").
#[test]
fn non_regular_files_are_refused_at_once() {
    let base = tiny("nonreg");
    let shard = shard_file_name(2, 6);
    for target in ["config.json", INDEX_FILE, shard.as_str()] {
        for kind in ["dev-zero", "fifo", "dir"] {
            let d = tmp("nonreg-case").join("ckpt");
            std::fs::create_dir_all(&d).unwrap();
            for e in std::fs::read_dir(&base).unwrap() {
                let e = e.unwrap();
                std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
            }
            let p = d.join(target);
            std::fs::remove_file(&p).unwrap();
            let want = match kind {
                "dev-zero" => {
                    std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
                    "character device"
                }
                "fifo" => {
                    mkfifo(&p);
                    "FIFO"
                }
                _ => {
                    std::fs::create_dir(&p).unwrap();
                    "is a directory"
                }
            };
            let r = k3(&["inspect", s(&d)], &[], Duration::from_secs(20));
            assert_eq!(r.code, Some(2), "{target} as {kind}: {r:?}");
            assert!(r.stderr.contains(want) && r.stderr.contains(target) && r.secs < 10.0, "{target} as {kind}: {r:?}");
        }
    }
    // k3 op's inputs and params.
    let d = tmp("nonreg-op");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let out = d.join("out.safetensors");
    for (inputs, params, want) in [
        ("/dev/zero", None, "character device"),
        (s(&fifo), None, "FIFO"),
        (s(&d), None, "is a directory"),
        ("/dev/null", Some("/dev/zero"), "character device"),
        ("/dev/null", Some(s(&fifo)), "FIFO"),
        ("/dev/null", Some(s(&d)), "is a directory"),
    ] {
        let mut args = vec!["op", "rms_norm", "--inputs", inputs, "--outputs", s(&out)];
        if let Some(p) = params {
            args.extend(["--params", p]);
        }
        let r = k3(&args, &[], Duration::from_secs(20));
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stderr.contains(want) && r.secs < 10.0, "{args:?}: {r:?}");
    }
}

#[test]
fn oversized_text_files_are_refused_with_the_limit_named() {
    let d = tiny("big-config");
    let mut text = std::fs::read_to_string(d.join("config.json")).unwrap();
    text.push_str(&" ".repeat(2 << 20));
    std::fs::write(d.join("config.json"), text).unwrap();
    let e = inspect_dir(&d).unwrap_err();
    assert!(e.to_string().contains("CONFIG_FILE_MAX"), "{e}");
    let p = d.join("params.json");
    std::fs::write(&p, format!("{{\"eps\": 1e-5{}}}", " ".repeat(65 << 20))).unwrap();
    let e = model_k3::op_cli::read_params(Some(&p)).unwrap_err();
    assert!(e.to_string().contains("PARAMS_FILE_MAX"), "{e}");
}

// ---- non-finite weights and outputs ---------------------------------------------------------

const BF16_NAN: [u8; 2] = [0xC0, 0x7F];

#[test]
fn non_finite_weights_are_refused_with_the_tensor_named() {
    type Patch = fn(&mut [u8]);
    let cases: [(&str, Patch); 6] = [
        ("language_model.lm_head.weight", |b| b[200..202].copy_from_slice(&BF16_NAN)),
        ("language_model.model.embed_tokens.weight", |b| b[0..2].copy_from_slice(&[0x80, 0xFF])), // -inf
        ("language_model.model.layers.2.self_attn.q_proj.weight", |b| b[10..12].copy_from_slice(&BF16_NAN)),
        ("language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale", |b| b.fill(0xFF)),
        ("language_model.model.layers.4.block_sparse_moe.gate.e_score_correction_bias", |b| b[8..12].copy_from_slice(&f32::NAN.to_le_bytes())),
        ("language_model.model.layers.0.self_attn.A_log", |b| b[0..4].copy_from_slice(&f32::INFINITY.to_le_bytes())),
    ];
    for (tensor, patch) in cases {
        let d = tiny("nan");
        patch_tensor(&d, tensor, patch);
        assert!(inspect_dir(&d).unwrap().ok(), "headers are unchanged");
        match load(&d) {
            Err(ModelError::Tensor { name, why }) => assert!(name == tensor && why.contains("must be finite"), "{name}: {why}"),
            Err(e) => panic!("{tensor}: unexpected error {e}"),
            Ok(_) => panic!("{tensor}: a non-finite weight was loaded"),
        }
        // The demo never prints OK for such a checkpoint.
        let r = k3(&["demo", "--model", s(&d), "--max-new-tokens", "2"], &[], T);
        assert!(r.clean() && !r.ok() && !r.stdout.contains("-> OK"), "{tensor}: {r:?}");
        assert!(r.stderr.contains(tensor), "{tensor}: {r:?}");
    }
}

/// Finite weights whose product overflows: the logits are infinite or NaN, and `run` reports an
/// error naming the position instead of tokens `0,0`.
#[test]
fn non_finite_logits_are_an_error_naming_the_position() {
    let d = tiny("inf-logits");
    // bf16 max (0x7F7F) everywhere in lm_head: each logit sums 128 products of ~1 x 3.4e38.
    patch_tensor(&d, "language_model.lm_head.weight", |b| b.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&[0x7F, 0x7F])));
    let e = load(&d).unwrap().generate(0, &[1, 2, 3], 2, 8).unwrap_err();
    assert!(matches!(e, ModelError::NonFinite { position: 0, .. }), "{e}");
    let r = k3(&["run", "--model", s(&d), "--prompt-ids", "1,2,3"], &[], T);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("non-finite logits") && r.stderr.contains("position 0") && !r.stdout.contains("tokens:"), "{r:?}");
}

#[test]
fn parity_fails_when_either_side_is_non_finite() {
    let g = |logits: Vec<f32>| Generation { tokens: vec![0, 0], logits, vocab: 2, reused: 0, positions: 2 };
    let tol = kernel_api::Tolerance::F32_ALGO;
    assert!(parity(&g(vec![1.0, 2.0, 3.0, 4.0]), &g(vec![1.0, 2.0, 3.0, 4.0]), tol).ok);
    let nan = g(vec![f32::NAN; 4]);
    let p = parity(&nan, &nan, tol);
    assert!(!p.ok && p.nonfinite == (4, 4), "{p:?}");
    assert!(!parity(&g(vec![1.0, f32::INFINITY, 3.0, 4.0]), &g(vec![1.0, 2.0, 3.0, 4.0]), tol).ok);
    assert!(!parity(&g(vec![1.0, 2.0, 3.0, 4.0]), &g(vec![1.0, 2.0, f32::NAN, 4.0]), tol).ok);
}

/// A config with fewer layers than the checkpoint holds: `inspect` flags the extra tensors and
/// `run` refuses (it used to run the first layers silently).
#[test]
fn run_refuses_what_inspect_reports() {
    let d = tiny("fewer-layers");
    edit_config(&d, |t| {
        t["num_hidden_layers"] = json!(4);
        t["linear_attn_config"]["full_attn_layers"] = json!([4]);
    });
    let r = inspect_dir(&d).unwrap();
    assert!(r.deviations.iter().any(|x| x.contains("unexpected tensor") && x.contains("layers.4.")), "{r}");
    let e = load(&d).err().unwrap();
    assert!(e.to_string().contains("unexpected tensor"), "{e}");
    let r = k3(&["run", "--model", s(&d), "--prompt-ids", "1,2"], &[], T);
    assert!(r.code == Some(2) && r.stderr.contains("unexpected tensor"), "{r:?}");
}

// ---- files ----------------------------------------------------------------------------------

fn rms_files(d: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let x = kernel_api::HostTensor::zeros(kernel_api::DType::F32, &[2, 4]);
    let w = kernel_api::HostTensor::zeros(kernel_api::DType::F32, &[4]);
    let i = d.join("in.safetensors");
    let views = vec![
        ("x".to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, x.shape.clone(), &x.bytes).unwrap()),
        ("w".to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, w.shape.clone(), &w.bytes).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, &i).unwrap();
    let p = d.join("p.json");
    std::fs::write(&p, r#"{"eps": 1e-5}"#).unwrap();
    (i, p)
}

/// `--outputs` and `--logits-out` replace only regular files (or what a link to one points at);
/// a FIFO, a directory, a device or a link to one is refused, before any work, and left as it was.
#[test]
fn outputs_only_replace_regular_files() {
    let d = tmp("outputs");
    let (i, p) = rms_files(&d);
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let dir = d.join("a-dir");
    std::fs::create_dir(&dir).unwrap();
    let to_null = d.join("to-null");
    std::os::unix::fs::symlink("/dev/null", &to_null).unwrap();
    let to_dir = d.join("to-dir");
    std::os::unix::fs::symlink(&dir, &to_dir).unwrap();
    let ckpt = tiny("outputs-ckpt");
    for (out, want) in [(&fifo, "FIFO"), (&dir, "is a directory"), (&to_null, "character device"), (&to_dir, "directory")] {
        let r = k3(&["op", "rms_norm", "--inputs", s(&i), "--params", s(&p), "--outputs", s(out)], &[], T);
        assert_eq!(r.code, Some(2), "{out:?}: {r:?}");
        assert!(r.stderr.contains(want) && r.stderr.contains("refusing"), "{out:?}: {r:?}");
        // Refused before the model is loaded, not after generating.
        let r = k3(&["run", "--model", s(&ckpt), "--prompt-ids", "1", "--max-new-tokens", "1", "--logits-out", s(out)], &[], T);
        assert_eq!(r.code, Some(2), "{out:?}: {r:?}");
        assert!(r.stderr.contains(want) && !r.stdout.contains("tokens:"), "{out:?}: {r:?}");
    }
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo_like());
    assert!(std::fs::metadata(&dir).unwrap().is_dir() && std::fs::read_dir(&dir).unwrap().next().is_none());
    assert_eq!(std::fs::read_link(&to_null).unwrap(), Path::new("/dev/null"));
    // A regular file is replaced; through a link, the link stays and its target is replaced.
    let real = d.join("real.safetensors");
    std::fs::write(&real, b"old").unwrap();
    let link = d.join("link.safetensors");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let r = k3(&["op", "rms_norm", "--inputs", s(&i), "--params", s(&p), "--outputs", s(&link)], &[], T);
    assert!(r.ok(), "{r:?}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(std::fs::read(&real).unwrap().len() > 100);
    // No temporary file is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains(".k3-")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}
impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_fifo()
    }
}

#[test]
fn tiny_checkpoint_is_made_atomically_and_remade_when_half_made() {
    let d = tmp("tiny-atomic").join("tiny-k3");
    assert_eq!(ensure_tiny_checkpoint(&d, 7, false).unwrap(), Ensured::Made(tensor_count()));
    assert!(d.join(COMPLETE_MARKER).exists());
    assert_eq!(ensure_tiny_checkpoint(&d, 7, false).unwrap(), Ensured::Existing);
    let parent = d.parent().unwrap();
    let names: Vec<String> = std::fs::read_dir(parent).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["tiny-k3"], "only the checkpoint folder is left");

    // Half-made the way a killed writer of the old, in-place kind left it: config and the
    // first shards, no index, no marker. Also: every file but the marker, one shard cut short.
    let half = |dir: &Path| {
        std::fs::remove_file(dir.join(COMPLETE_MARKER)).unwrap();
        std::fs::remove_file(dir.join(INDEX_FILE)).unwrap();
        std::fs::remove_file(dir.join(shard_file_name(5, 6))).unwrap();
    };
    let cut = |dir: &Path| {
        std::fs::remove_file(dir.join(COMPLETE_MARKER)).unwrap();
        let p = dir.join(shard_file_name(3, 6));
        let b = std::fs::read(&p).unwrap();
        std::fs::write(&p, &b[..b.len() / 2]).unwrap();
    };
    for make_half in [half, cut] {
        make_half(&d);
        assert!(matches!(tiny_state(&d).unwrap(), TinyState::HalfMade(_)));
        match ensure_tiny_checkpoint(&d, 7, false).unwrap() {
            Ensured::Remade { why, tensors } => assert!(!why.is_empty() && tensors == tensor_count()),
            other => panic!("expected a remake, got {other:?}"),
        }
        assert!(inspect_dir(&d).unwrap().ok());
    }
    // The demo says so.
    half(&d);
    let r = k3(&["demo", "--model", s(&d), "--max-new-tokens", "1"], &[], T);
    assert!(r.ok() && r.stdout.contains("half-made"), "{r:?}");

    // A folder holding anything else is not touched.
    let foreign = tmp("tiny-foreign").join("mine");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "keep").unwrap();
    assert_eq!(ensure_tiny_checkpoint(&foreign, 7, false).unwrap(), Ensured::NotTiny);
    assert!(model_k3::tiny::write_tiny_checkpoint(&foreign, 7, false).is_err());
    assert_eq!(std::fs::read_to_string(foreign.join("notes.txt")).unwrap(), "keep");
}

fn tensor_count() -> usize {
    let cfg = model_k3::config::K3Config::from_json_str(model_k3::config::TINY_CONFIG_JSON).unwrap();
    model_k3::inventory::expected_tensors(&cfg, model_k3::inventory::ExpertStorage::Mxfp4).len()
}

/// Two `k3 demo` started together in an empty folder both succeed (one used to fail with
/// "neither model.safetensors.index.json nor model.safetensors found").
#[test]
fn two_demos_started_together_both_succeed() {
    for trial in 0..3 {
        let cwd = tmp("two-demos");
        let spawn = || {
            let cwd = cwd.clone();
            std::thread::spawn(move || k3_in(Some(&cwd), &["demo", "--max-new-tokens", "1"], &[], Duration::from_secs(120)))
        };
        let (a, b) = (spawn(), spawn());
        for r in [a.join().unwrap(), b.join().unwrap()] {
            assert!(r.ok() && r.stdout.contains("-> OK"), "trial {trial}: {r:?}");
        }
        let ck = Checkpoint::open(&cwd.join("tiny-k3")).unwrap();
        assert!(ck.problems.is_empty());
    }
}

// ---- messages (truncated shards and header edits: tests/checkpoint.rs) ----------------------

#[test]
fn config_values_are_reported_under_their_own_name() {
    for (key, value) in [
        ("num_experts", json!(0)),
        ("activation_situ_beta", json!(0.0)),
        ("activation_situ_beta", json!(-2.0)),
        ("activation_situ_linear_beta", json!(-1.0)),
        ("rms_norm_eps", json!(1e300)),
        ("routed_scaling_factor", json!(0)),
        ("num_expert_group", json!("8")),
    ] {
        let d = tiny("cfg-field");
        edit_config(&d, |t| t[key] = value.clone());
        let e = inspect_dir(&d).unwrap_err();
        assert_eq!(field(&e), key, "{key} = {value}: {e}");
    }
}

/// The cost of the loader's finiteness check, for the record (run it in release:
/// `cargo test --release -p model-k3 --test hardening -- --ignored --nocapture finite_check_cost`):
/// the whole tiny-checkpoint load against the check alone over the same bytes, and the check's
/// throughput on a 256 MiB bf16 buffer (the figure to scale to a large checkpoint).
#[test]
#[ignore]
fn finite_check_cost() {
    use model_k3::finite::{first_nonfinite, Encoding};
    let d = tiny("finite-cost");
    let ck = Checkpoint::open(&d).unwrap();
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        model_k3::weights::ModelWeights::load(&ck, &CpuBackend::new(), &mut |_| {}).unwrap();
    }
    let load = t.elapsed().as_secs_f64() / reps as f64;
    let t = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..reps {
        for e in ck.tensors.values() {
            let b = ck.bytes(e);
            bytes += b.len();
            assert_eq!(first_nonfinite(Encoding::of(&e.name, e.dtype), b), None);
        }
    }
    let check = t.elapsed().as_secs_f64() / reps as f64;
    println!("tiny checkpoint: load {:.2} ms, finiteness check alone {:.3} ms ({:.1}% of the load) over {} bytes", load * 1e3, check * 1e3, 100.0 * check / load, bytes / reps);
    let big = vec![0x3Fu8; 256 << 20];
    for (name, enc) in [("bf16", Encoding::Float(kernel_api::DType::BF16)), ("f32", Encoding::Float(kernel_api::DType::F32)), ("e8m0", Encoding::E8m0)] {
        let t = Instant::now();
        for _ in 0..4 {
            assert_eq!(first_nonfinite(enc, std::hint::black_box(&big)), None);
        }
        let s = t.elapsed().as_secs_f64() / 4.0;
        println!("{name}: check {:.2} GB/s on one core", big.len() as f64 / s / 1e9);
    }
    // What the loader does per tensor: the copy out of the shard, with and without the check.
    let enc = Encoding::Float(kernel_api::DType::BF16);
    let time = |f: &dyn Fn() -> usize| {
        let t = Instant::now();
        let n: usize = (0..4).map(|_| f()).sum();
        assert!(n > 0);
        t.elapsed().as_secs_f64() / 4.0
    };
    let plain = time(&|| std::hint::black_box(big.to_vec()).len());
    let fused = time(&|| std::hint::black_box(model_k3::finite::copy_checked(enc, &big).unwrap()).len());
    println!("256 MiB bf16 copy: plain {:.1} ms ({:.2} GB/s), checked {:.1} ms ({:+.0}%)", plain * 1e3, big.len() as f64 / plain / 1e9, fused * 1e3, 100.0 * (fused / plain - 1.0));
}

/// A device copy of the batch metadata the plan never saw (`k3 op` takes the device tensor from
/// the inputs file and the host copy from the params): the CPU backend finds it in `run`, the
/// emulator's kernels at the next synchronising call (the device checks). `k3 op` exits 2 naming
/// the tensor and writes no outputs file.
#[test]
fn device_metadata_errors_surface_in_k3_op() {
    use kernel_api::{DType, HostTensor};
    let d = tmp("device-metadata");
    let mut r = kernel_api::conformance::TestRng::new(3);
    let (latent, rope, heads) = (8, 4, 3);
    let q = HostTensor::from_f32(DType::F32, &[2, 1, heads, latent + rope], &r.normals(2 * heads * (latent + rope), 1.0)).unwrap();
    let cache = HostTensor::from_f32(DType::BF16, &[8, 1, latent + rope], &r.normals(8 * (latent + rope), 1.0)).unwrap();
    let table = HostTensor::from_i32(&[2, 5], &[4, 1, 2, 0, 100_000, 7, 3, 5, -1, -1]).unwrap();
    let lens = HostTensor::from_i32(&[2], &[5, 3]).unwrap();
    let st = |t: &HostTensor| match t.dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::BF16 => safetensors::Dtype::BF16,
        _ => safetensors::Dtype::I32,
    };
    let tensors = [("q", &q), ("kv_cache", &cache), ("block_table", &table), ("seq_lens", &lens)];
    let views: Vec<_> = tensors.iter().map(|(n, t)| (n.to_string(), safetensors::tensor::TensorView::new(st(t), t.shape.clone(), &t.bytes).unwrap())).collect();
    let inputs = d.join("in.safetensors");
    safetensors::serialize_to_file(views, None, &inputs).unwrap();
    let params = d.join("p.json");
    let p = json!({"cache": {"dims": {"latent": latent, "rope": rope}, "format": "bf16"}, "softmax_scale": 0.3, "block_table": [[4, 1, 2, 0, 6], [7, 3, 5, -1, -1]]});
    std::fs::write(&params, p.to_string()).unwrap();
    let out = d.join("out.safetensors");
    for backend in ["cpu", "simt32", "simt64"] {
        let r = k3(&["op", "mla_decode", "--inputs", s(&inputs), "--params", s(&params), "--outputs", s(&out), "--backend", backend], &[], T);
        assert_eq!(r.code, Some(2), "{backend}: {r:?}");
        assert!(r.stderr.contains("`block_table`") && r.stderr.contains("100000"), "{backend}: {r:?}");
        assert!(!out.exists(), "{backend}: an outputs file was written");
    }
}
