//! The speed-of-light model against published measurements (`kernel-anchors.md` in the project's
//! shared reference folder; each anchor names its source below).
//!
//! A floor must lie BELOW every measured time of the same shape on the same part (a floor above
//! a measurement means the byte or FLOP count is wrong), and for kernels that the anchors show
//! saturating HBM (large batches, all experts touched) it must lie within a stated factor of
//! the best measurement: a floor far below them would mean bytes the model forgot. Small
//! batches run into launch and latency floors (≈ 5-20 µs) the model does not contain, so for
//! them only the first check applies.

use kernel_api::cost::Cost;
use kernel_api::hardware::{by_id, Bound};
use kernel_api::ops::*;
use kernel_api::DType;

fn floor_us(hw: &str, cost: &Cost) -> f64 {
    by_id(hw, "hw").unwrap().floor(cost).seconds() * 1e6
}

/// `floor < measured`, and `measured / floor < factor` when a factor is given.
fn check(what: &str, floor: f64, measured: f64, factor: Option<f64>) {
    // One line per anchor (`-- --nocapture` shows them; BENCHMARKS.md lists them).
    println!("anchor | {what} | {measured} µs | {floor:.1} µs | {:.2} | {}", measured / floor, factor.map_or("below".into(), |f| format!("{f}x")));
    assert!(floor < measured, "{what}: floor {floor:.1} µs is not below the measured {measured} µs");
    if let Some(f) = factor {
        assert!(measured / floor < f, "{what}: measured {measured} µs is {:.2}x the floor {floor:.1} µs (limit {f}x)", measured / floor);
    }
}

fn kda_decode(batch: usize, heads: usize) -> Cost {
    // vLLM's fused_kda_decode: bf16 activations and conv state, fp32 recurrent state.
    KdaDecodeParams::k3(batch, heads).cost(DType::BF16, DType::BF16, DType::F32).unwrap()
}

#[test]
fn kda_decode_floor_is_the_fp32_state_stream() {
    // kernel-anchors §3.1 derived model: 2·128·128·4 B = 128 KiB per (sequence, head).
    let c = kda_decode(1024, 12);
    let state = 2 * 1024 * 12 * 128 * 128 * 4u64;
    assert!(c.bytes > state && (c.bytes as f64) < state as f64 * 1.05, "{} vs state {state}", c.bytes);
    assert_eq!(by_id("b300", "hw").unwrap().floor(&c).bound(), Bound::Memory);
}

#[test]
fn kda_decode_anchors() {
    // aiconfigurator kda_perf (vLLM fused_kda_decode / SGLang kda_fused_decode), kernel-anchors §3.1.
    // At batch 1024 both saturate ~70-75% of HBM: within 1.5x of the floor.
    check("B300 H12 bs1024 SGLang", floor_us("b300", &kda_decode(1024, 12)), 278.5, Some(1.5));
    check("B300 H12 bs1024 vLLM", floor_us("b300", &kda_decode(1024, 12)), 299.0, Some(1.5));
    check("H200 H12 bs1024 vLLM", floor_us("h200", &kda_decode(1024, 12)), 445.0, Some(1.5));
    check("GB300 H96 bs1024 vLLM", floor_us("gb300", &kda_decode(1024, 96)), 2186.0, Some(1.5));
    check("B300 H12 bs1", floor_us("b300", &kda_decode(1, 12)), 6.68, None);
    check("B300 H12 bs64", floor_us("b300", &kda_decode(64, 12)), 16.9, None);
}

#[test]
fn kda_prefill_anchors() {
    let mut p = KdaPrefillParams::k3_defaults(96, 128, 128);
    p.state_slots = 1;
    p.write_final_state = true;
    // FlashInfer cake_kda, H96 1x8192, bf16 state, Blackwell (flashinfer #4845, B200/B300/GB300
    // validation): 354 µs, the best published; FlashKDA on B300 999 µs (BENCHMARK_B300.md).
    // FlashKDA's K2 runs one CTA per (sequence, head): at most 3x from the floor.
    let c = p.cost(8192, 1, DType::BF16, DType::BF16).unwrap();
    check("cake_kda H96 1x8192 (B200 numbers)", floor_us("b200", &c), 354.0, Some(3.0));
    check("FlashKDA H96 1x8192 B300", floor_us("b300", &c), 999.0, None);
    check("FlashKDA (vLLM) H96 1x8192 H200", floor_us("h200", &c), 890.5, None);
    let mut p12 = KdaPrefillParams::k3_defaults(12, 128, 128);
    p12.state_slots = 1;
    p12.write_final_state = true;
    let c12 = p12.cost(8192, 1, DType::BF16, DType::BF16).unwrap();
    // H12 (TP8) is parallelism-bound (12 CTAs on 148 SMs): only below.
    check("FlashKDA (vLLM) H12 1x8192 B300", floor_us("b300", &c12), 512.9, None);
}

fn mla_decode(batch: usize, ctx: usize, heads: usize, q_len: usize, format: KvCacheFormat) -> Cost {
    let cache = MlaPagedCache { dims: KvDims::K3, format, page_size: 64, num_pages: batch * ctx.div_ceil(64), kv_scale: 1.0 };
    let p = MlaDecodeParams {
        cache,
        heads,
        q_len,
        softmax_scale: mla_decode::K3_SOFTMAX_SCALE,
        variant: MlaDecodeVariant::Auto,
        splits: MlaSplitPolicy::Auto,
    };
    p.cost(batch, (batch * ctx) as u64, DType::BF16, DType::BF16).unwrap()
}

#[test]
fn mla_decode_anchors() {
    // vLLM #41778 (kernel-anchors §4.3): Blackwell, flat fp8 KV, 16 heads, q_len 4, kv 80k;
    // TOKENSPEED_MLA 610 µs at bs64 and 2693 µs at bs256 (≈ 4.8 TB/s), trtllm-gen 1420 / 4855.
    let flat = KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn);
    let c64 = mla_decode(64, 80_000, 16, 4, flat);
    check("tokenspeed bs64", floor_us("b200", &c64), 610.0, Some(2.0));
    check("tokenspeed bs256", floor_us("b200", &mla_decode(256, 80_000, 16, 4, flat)), 2693.0, Some(2.0));
    check("trtllm-gen bs64", floor_us("b200", &c64), 1420.0, None);
    // AITER Gluon bf16, bs1 h16 ctx16384 q_len 1, MI350 (MI355X numbers): 50.2 µs (aiter #3890).
    check("gluon bs1", floor_us("mi355x", &mla_decode(1, 16384, 16, 1, KvCacheFormat::Bf16)), 50.2, None);
    // The K3 TP8 shape at 64k context streams the 656-byte tiled cache: memory-bound everywhere.
    let k3 = mla_decode(64, 65536, 12, 1, KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn));
    assert_eq!(k3.bytes / (64 * 65536), 656, "one cached token = 656 B, read once for all 12 heads");
    for hw in ["h200", "b300", "mi355x"] {
        assert_eq!(by_id(hw, "hw").unwrap().floor(&k3).bound(), Bound::Memory, "{hw}");
    }
}

/// Gate-up plus down of the K3 TP8 routed experts (latent 3584, width 384, 896 experts, top-16,
/// MXFP4 weights) with uniformly random routing.
fn moe_experts(tokens: usize, act: Option<MoeActivationQuant>) -> Cost {
    let routing = MoeRouting { tokens, top_k: 16, experts: 896, block_m: 16 };
    let touched = routing.expected_experts_touched();
    let stage = |stage, k, n| MoeGemmParams { routing: routing.clone(), k, n, stage, weights: MoeWeightFormat::Mxfp4, activation_quant: act };
    let gu = stage(MoeGemmStage::GateUp { beta: 4.0, linear_beta: Some(25.0) }, 3584, 384).cost(touched, DType::BF16, DType::BF16, DType::BF16).unwrap();
    let dn = stage(MoeGemmStage::Down, 384, 3584).cost(touched, DType::BF16, DType::BF16, DType::F32).unwrap();
    gu.checked_add(&dn).unwrap()
}

#[test]
fn moe_expert_bytes_match_the_checkpoint_layout() {
    // kernel-anchors §5: 2.19 MB per expert at TP8 (gate+up 3584x768, down 384x3584, fp4 codes
    // and E8M0 scales); all 896 ≈ 1.96 GB per layer and rank.
    let one = moe_experts(1, None);
    let weights = 16 * (768 * (3584 / 2 + 3584 / 32) + 3584 * (384 / 2 + 384 / 32)) as u64;
    assert_eq!(weights, 16 * 2_193_408);
    // Plus activations: the f32 down output of 16 pairs (229 KB) dominates them.
    assert!(one.bytes > weights && one.bytes < weights + 300_000, "{}", one.bytes);
    let routing = MoeRouting { tokens: 4096, top_k: 16, experts: 896, block_m: 16 };
    assert_eq!(routing.expected_experts_touched(), 896);
    assert_eq!(MoeRouting { tokens: 1, ..routing.clone() }.expected_experts_touched(), 16);
    assert_eq!(MoeRouting { tokens: 0, ..routing }.expected_experts_touched(), 0);
}

#[test]
fn moe_anchors() {
    let a8 = Some(MoeActivationQuant::Mxfp8);
    // AITER FlyDSL a8w4, K3 TP8 (kimik3_a8w4_tuned_fmoe.csv, MI355X), kernel-anchors §5.3: the
    // best published K3 MoE kernel, ≈ 80% of HBM from 64 tokens on.
    check("aiter a8w4 t64", floor_us("mi355x", &moe_experts(64, a8)), 221.6, Some(1.5));
    check("aiter a8w4 t256", floor_us("mi355x", &moe_experts(256, a8)), 308.9, Some(1.5));
    check("aiter a8w4 t1024", floor_us("mi355x", &moe_experts(1024, a8)), 339.2, Some(1.5));
    check("aiter a8w4 t1", floor_us("mi355x", &moe_experts(1, a8)), 17.7, None);
    check("aiter a16w4 t256", floor_us("mi355x", &moe_experts(256, None)), 368.1, Some(1.6));
    // FlashInfer trtllm-gen w4a8 on B300, TP8 (aiconfigurator moe_perf, kernel-anchors §5.2).
    check("trtllm-gen w4a8 t64", floor_us("b300", &moe_experts(64, a8)), 447.0, Some(3.0));
    check("trtllm-gen w4a8 t1024", floor_us("b300", &moe_experts(1024, a8)), 705.0, Some(3.0));
    check("trtllm-gen w4a8 t1", floor_us("b300", &moe_experts(1, a8)), 31.7, None);
    // At 32768 tokens: 3151 µs measured (1374 TFLOPS). The contract's f32 per-pair down output
    // ([pairs, 3584], 7.5 GB here; AITER accumulates top-k atomically instead) keeps this
    // memory-bound in the model.
    check("aiter a8w4 t32768", floor_us("mi355x", &moe_experts(32768, a8)), 3151.0, None);
}

#[test]
fn gemm_anchor() {
    // KDA input projection at TP8 on B300, N 6288 K 7168 bf16: ~19 µs for M <= 64 (CEverTrying
    // roofline ANALYSIS.md, kernel-anchors §1.1): weight streaming at ~60% of HBM.
    let c = GemmParams::new(64, 6288, 7168, DType::BF16, DType::BF16, DType::BF16).cost().unwrap();
    check("kda in-proj M64 B300", floor_us("b300", &c), 19.0, Some(2.0));
    // M 65536: 1.29 PFLOPS measured = 57% of the 2.25 PF dense peak.
    let big = GemmParams::new(65536, 6288, 7168, DType::BF16, DType::BF16, DType::BF16).cost().unwrap();
    let measured_us = 2.0 * 65536.0 * 6288.0 * 7168.0 / 1.29e15 * 1e6;
    check("kda in-proj M65536 B300", floor_us("b300", &big), measured_us, Some(2.0));
}

#[test]
fn huge_shapes_are_errors_not_wrapped_numbers() {
    let e = GemmParams::new(usize::MAX, usize::MAX, 2, DType::BF16, DType::BF16, DType::BF16).cost().unwrap_err();
    assert_eq!(e.field(), Some("params"));
    let mut p = KdaPrefillParams::k3_defaults(96, 128, 128);
    p.state_slots = 1;
    assert!(p.cost(usize::MAX, 1, DType::BF16, DType::F32).is_err());
    let k3 = MlaPrefillParams::k3(12);
    assert!(k3.cost(1, 1 << 40, 1 << 40, DType::BF16).is_err());
    assert!(k3.cost(usize::MAX, usize::MAX, usize::MAX, DType::BF16).is_err());
    let cache = MlaPagedCache { dims: KvDims::K3, format: KvCacheFormat::Bf16, page_size: 1, num_pages: 1, kv_scale: 1.0 };
    let mla = MlaDecodeParams { cache, heads: 12, q_len: 16, softmax_scale: 0.07, variant: MlaDecodeVariant::Auto, splits: MlaSplitPolicy::Auto };
    assert!(mla.cost(usize::MAX, u64::MAX, DType::BF16, DType::BF16).is_err());
    let dec = KdaDecodeParams { batch: usize::MAX, ..KdaDecodeParams::k3(1, 12) };
    assert!(dec.cost(DType::BF16, DType::BF16, DType::F32).is_err());
    let r = MoeRouting { tokens: usize::MAX, top_k: 16, experts: 896, block_m: 16 };
    let g = MoeGemmParams { routing: r.clone(), k: 3584, n: 384, stage: MoeGemmStage::Down, weights: MoeWeightFormat::Mxfp4, activation_quant: None };
    assert!(g.cost(896, DType::BF16, DType::BF16, DType::F32).is_err());
    assert!(MoeAlignParams { routing: r, global_experts: None }.cost().is_err());
    // Causal pairs: query i of 3 sees 5 - 3 + i + 1 keys: 3 + 4 + 5 = 12.
    let c = MlaPrefillParams { heads: 1, qk_dim: 1, v_dim: 1, softmax_scale: 1.0, causal: true }.cost(1, 3, 5, DType::BF16).unwrap();
    assert_eq!(c.flops(kernel_api::cost::MathClass::Bf16Matrix), 12 * 2 * 2);
}
