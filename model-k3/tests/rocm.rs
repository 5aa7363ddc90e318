//! The tiny model on the ROCm backend, for what only the model level shows (a HIP device, or the
//! emulator-backed stand-in as gfx942 / gfx950; skips with a printed reason without one):
//!
//! - the router's `e_score_correction_bias` stays fp32 from the checkpoint to the kernel: the
//!   device tensor is f32 and byte-identical to the checkpoint's (the kernel side is
//!   `backend-rocm/tests/known_gaps.rs`);
//! - `--kv-cache-dtype fp8-tiled` resolves to the device's flavour (e4m3fnuz on gfx942, e4m3fn
//!   on gfx950), and the model with that cache matches the CPU reference with the same cache.
#![cfg(feature = "rocm")]

use k3_backend_rocm::{rocm_backend, RocmBackend};
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::KvCacheFormat;
use kernel_api::{Backend, BackendExt, DType, Error, Tolerance};
use model_k3::checkpoint::Checkpoint;
use model_k3::kv_default::resolve_kv_cache_dtype;
use model_k3::model::ModelOptions;
use model_k3::runner::load_model;
use model_k3::tiny::write_tiny_checkpoint;
use model_k3::weights::{FfnWeights, ModelWeights};
use std::path::PathBuf;

/// The same fp8 cache format on both sides, written from activations that differ by f32
/// summation order only (~1e-7 per op): a value that close to an e4m3 rounding midpoint takes
/// the neighbouring code on one side (one e4m3 step is ~6% of the value), and a near-tied
/// expert choice can flip (model.rs's `ROUTED`). Measured through the stand-in: rel RMSE
/// 2.7e-4 (gfx942, tiled e4m3fnuz). Limit 5e-3, as `ROUTED`; a flavour mix-up (2x values)
/// or a wrong tile scale is far above it.
const SAME_FP8_CACHE: Tolerance = Tolerance { rel_rmse: 5e-3, abs_floor: 1e-6 };

fn device() -> Option<RocmBackend> {
    match rocm_backend(0) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { why }) => {
            println!("skipped: no HIP device: {why}");
            None
        }
        Err(e) => panic!("the probe must answer Ok or Unavailable, got {e}"),
    }
}

fn tiny(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("k3-rocm-{tag}-{}", std::process::id()));
    write_tiny_checkpoint(&dir, 7, false).expect("tiny checkpoint");
    dir
}

#[test]
fn router_bias_stays_f32_from_checkpoint_to_device() {
    let Some(b) = device() else { return };
    let dir = tiny("bias");
    let ck = Checkpoint::open(&dir).expect("open");
    let w = ModelWeights::load(&ck, &b, &mut |_| {}).expect("load on rocm");
    let mut moe_layers = 0;
    for (i, layer) in w.layers.iter().enumerate() {
        let FfnWeights::Moe(m) = &layer.ffn else { continue };
        let name = format!("model.layers.{i}.block_sparse_moe.gate.e_score_correction_bias");
        let entry = ck.entry(&name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(entry.dtype, DType::F32, "{name} in the checkpoint");
        assert_eq!(m.bias.layout.dtype, DType::F32, "{name} on the device");
        let on_device = b.download_tensor(&m.bias).expect("download").bytes;
        assert!(on_device == ck.bytes(entry), "{name}: device bytes differ from the checkpoint's");
        moe_layers += 1;
    }
    assert!(moe_layers > 0, "the tiny model has MoE layers");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fp8_kv_cache_in_the_devices_flavour_matches_the_cpu_reference() {
    let Some(b) = device() else { return };
    let fmt = resolve_kv_cache_dtype("fp8-tiled", b.device_info()).expect("fp8-tiled");
    let want = if b.device_info().arch == "gfx942" { "fp8-tiled-e4m3fnuz" } else { "fp8-tiled-e4m3fn" };
    assert_eq!(fmt.name(), want, "{}", b.device_info().arch);
    assert!(matches!(fmt, KvCacheFormat::Fp8Tiled(_)));
    let dir = tiny("fp8");
    let opts = ModelOptions { kv_format: fmt, num_pages: 4, max_seqs: 1, ..Default::default() };
    let prompt = [1u32, 17, 42, 99, 256, 311, 7];
    let mut m = load_model(&dir, b, opts.clone(), &mut |_, _| {}).expect("load on rocm");
    let g = m.generate(0, &prompt, 4, 64).expect("generate on rocm");
    let mut r = load_model(&dir, CpuBackend::new(), opts, &mut |_, _| {}).expect("load on cpu");
    let rg = r.generate(0, &prompt, 4, 64).expect("generate on cpu");
    kernel_api::tolerance::assert_close(&format!("logits with {}", fmt.name()), &g.logits, &rg.logits, SAME_FP8_CACHE);
    let _ = std::fs::remove_dir_all(&dir);
}
