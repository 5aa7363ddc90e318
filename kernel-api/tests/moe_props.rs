//! Properties of the MoE ops' validation on the CPU reference: random malformed descriptors and
//! corrupted index contents give a typed `Err` naming the field, never a panic; well-formed
//! calls succeed.

use kernel_api::cpu::CpuBackend;
use kernel_api::formats::{mxfp4_dequantize, mxfp4_quantize_rows};
use kernel_api::ops::{
    MoeActivationQuant, MoeAlign, MoeAlignArgs, MoeAlignParams, MoeGemmArgs, MoeGemmParams, MoeGemmStage, MoeGroupedGemm,
    MoeRouter, MoeRouterArgs, MoeRouterParams, MoeRouting, MoeWeightFormat,
};
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor, Result};
use proptest::prelude::*;

fn field<T>(r: Result<T>) -> Option<String> {
    r.err().map(|e| e.field().unwrap_or("<no field>").to_string())
}

fn i32_tensor(b: &CpuBackend, shape: &[usize], v: &[i32]) -> DeviceTensor<CpuBackend> {
    b.upload_tensor(&HostTensor::from_i32(shape, v).unwrap()).unwrap()
}

fn zeros(b: &CpuBackend, dt: DType, shape: &[usize]) -> DeviceTensor<CpuBackend> {
    b.zeros(dt, shape).unwrap()
}

fn router_params(tokens: usize, hidden: usize, experts: usize, top_k: usize) -> MoeRouterParams {
    MoeRouterParams::sigmoid(tokens, hidden, experts, top_k)
}

/// The router plan's validity written out independently of the library.
fn router_params_valid(p: &MoeRouterParams) -> bool {
    p.experts >= 1
        && p.hidden >= 1
        && p.top_k >= 1
        && p.top_k <= p.experts
        && p.n_group >= 1
        && p.experts.is_multiple_of(p.n_group)
        && p.topk_group >= 1
        && p.topk_group <= p.n_group
        && p.top_k <= p.topk_group * (p.experts / p.n_group)
        && p.routed_scaling_factor.is_finite()
}

/// Routes with ids pairs produced by the align op (valid index tensors for a GEMM).
struct AlignOut {
    sorted: Vec<i32>,
    blocks: Vec<i32>,
    used: i32,
}

fn align(b: &CpuBackend, r: &MoeRouting, ids: &[i32], map: Option<&[i32]>) -> Result<AlignOut> {
    let plan = MoeAlign::plan(b, &MoeAlignParams { routing: r.clone(), global_experts: map.map(<[i32]>::len) })?;
    let ids = i32_tensor(b, &[r.tokens, r.top_k], ids);
    let map = map.map(|m| i32_tensor(b, &[m.len()], m));
    let (mut s, mut e, mut u) =
        (zeros(b, DType::I32, &[plan.max_padded]), zeros(b, DType::I32, &[plan.num_blocks]), zeros(b, DType::I32, &[1]));
    let mut ws = b.alloc_zeroed(MoeAlign::workspace_size(b, &plan))?;
    let args = MoeAlignArgs {
        topk_ids: ids.as_ref(),
        expert_map: map.as_ref().map(DeviceTensor::as_ref),
        sorted_token_ids: s.as_mut(),
        expert_ids: e.as_mut(),
        num_tokens_post_padded: u.as_mut(),
    };
    MoeAlign::run(b, &plan, args, Some(&mut ws), b.default_stream())?;
    let dl =
        |t: &DeviceTensor<CpuBackend>| b.download_tensor(t).unwrap().to_i64().into_iter().map(|v| v as i32).collect::<Vec<_>>();
    Ok(AlignOut { sorted: dl(&s), blocks: dl(&e), used: dl(&u)[0] })
}

/// One corruption of a GEMM call: a tensor's shape or dtype, or an index value.
#[derive(Clone, Copy, Debug)]
enum GemmFault {
    None,
    InputRows,
    InputDtype,
    WeightCols,
    WeightExperts,
    ScaleCols,
    ScaleMissing,
    SortedLen,
    ExpertIdsDtype,
    UsedShape,
    OutCols,
    OutDtype,
    ExpertIdOutOfRange,
    SortedIdOutOfRange,
    DuplicatePair,
    UsedTooLarge,
    UsedNotMultiple,
}

const GEMM_FAULTS: [GemmFault; 17] = [
    GemmFault::None,
    GemmFault::InputRows,
    GemmFault::InputDtype,
    GemmFault::WeightCols,
    GemmFault::WeightExperts,
    GemmFault::ScaleCols,
    GemmFault::ScaleMissing,
    GemmFault::SortedLen,
    GemmFault::ExpertIdsDtype,
    GemmFault::UsedShape,
    GemmFault::OutCols,
    GemmFault::OutDtype,
    GemmFault::ExpertIdOutOfRange,
    GemmFault::SortedIdOutOfRange,
    GemmFault::DuplicatePair,
    GemmFault::UsedTooLarge,
    GemmFault::UsedNotMultiple,
];

/// Runs a GEMM stage with one fault; returns the error field (None = success) and the field
/// the fault must produce (None when the fault cannot be observed, e.g. no block is used).
fn gemm_with_fault(p: &MoeGemmParams, ids: &[i32], fault: GemmFault) -> (Option<String>, Option<&'static str>) {
    let b = CpuBackend::new();
    let r = &p.routing;
    let plan = MoeGroupedGemm::plan(&b, p).expect("valid params");
    let mut al = align(&b, r, ids, None).expect("valid ids");
    let pairs = r.tokens * r.top_k;
    let mx = p.weights == MoeWeightFormat::Mxfp4;
    let down = p.stage == MoeGemmStage::Down;
    let rows = plan.weight_rows;
    let in_rows = if down { pairs } else { r.tokens };
    let mut want: Option<&'static str> = None;
    let mut in_shape = [in_rows, p.k];
    let mut in_dt = DType::BF16;
    let mut w_shape = [r.experts, rows, if mx { p.k / 2 } else { p.k }];
    let mut s_shape = [r.experts, rows, p.k / 32];
    let mut has_scale = mx;
    let mut sorted_len = plan.max_padded;
    let mut eid_dt = DType::I32;
    let mut used_shape = vec![1];
    let mut out_shape = [pairs, p.n];
    let mut out_dt = DType::F32;
    let used = al.used as usize;
    match fault {
        GemmFault::None => {}
        GemmFault::InputRows => (in_shape[0], want) = (in_rows + 1, Some("input")),
        GemmFault::InputDtype => (in_dt, want) = (DType::F16, Some("input")),
        GemmFault::WeightCols => (w_shape[2], want) = (w_shape[2] + 1, Some("weight")),
        GemmFault::WeightExperts => (w_shape[0], want) = (r.experts + 1, Some("weight")),
        GemmFault::ScaleCols => {
            (s_shape[2], has_scale) = (s_shape[2] + 1, true);
            want = Some("weight_scale");
        }
        GemmFault::ScaleMissing => {
            has_scale = !mx;
            want = Some("weight_scale");
        }
        GemmFault::SortedLen => (sorted_len, want) = (plan.max_padded + 1, Some("sorted_token_ids")),
        GemmFault::ExpertIdsDtype => (eid_dt, want) = (DType::I64, Some("expert_ids")),
        GemmFault::UsedShape => (used_shape, want) = (vec![2], Some("num_tokens_post_padded")),
        GemmFault::OutCols => (out_shape[1], want) = (p.n + 1, Some("out")),
        GemmFault::OutDtype => (out_dt, want) = (DType::I32, Some("out")),
        GemmFault::ExpertIdOutOfRange if used > 0 => {
            al.blocks[0] = r.experts as i32;
            want = Some("expert_ids");
        }
        GemmFault::SortedIdOutOfRange if used > 0 => {
            al.sorted[0] = pairs as i32 + 1;
            want = Some("sorted_token_ids");
        }
        GemmFault::DuplicatePair if pairs >= 2 => {
            let first = al.sorted[0];
            let i = (1..used).find(|&i| al.sorted[i] != first).expect("a second slot in the used blocks");
            al.sorted[i] = first;
            want = Some("sorted_token_ids");
        }
        GemmFault::UsedTooLarge => {
            al.used = (plan.max_padded + r.block_m) as i32;
            want = Some("num_tokens_post_padded");
        }
        GemmFault::UsedNotMultiple if r.block_m > 1 => {
            al.used += 1;
            want = Some("num_tokens_post_padded");
        }
        _ => {}
    }
    let input = zeros(&b, in_dt, &in_shape);
    let weight = zeros(&b, if mx { DType::U8 } else { DType::BF16 }, &w_shape);
    let scale = has_scale.then(|| {
        b.upload_tensor(&HostTensor::from_bytes(DType::E8M0, &s_shape, vec![127; s_shape.iter().product()]).unwrap()).unwrap()
    });
    al.sorted.resize(sorted_len, pairs as i32);
    let sorted = i32_tensor(&b, &[sorted_len], &al.sorted);
    let blocks = match eid_dt {
        DType::I32 => i32_tensor(&b, &[al.blocks.len()], &al.blocks),
        _ => zeros(&b, eid_dt, &[al.blocks.len()]),
    };
    let used_t = i32_tensor(&b, &used_shape, &vec![al.used; used_shape[0]]);
    let router_w = down.then(|| zeros(&b, DType::F32, &[r.tokens, r.top_k]));
    let mut out = zeros(&b, out_dt, &out_shape);
    let args = MoeGemmArgs {
        input: input.as_ref(),
        weight: weight.as_ref(),
        weight_scale: scale.as_ref().map(DeviceTensor::as_ref),
        sorted_token_ids: sorted.as_ref(),
        expert_ids: blocks.as_ref(),
        num_tokens_post_padded: used_t.as_ref(),
        topk_weights: router_w.as_ref().map(DeviceTensor::as_ref),
        out: out.as_mut(),
    };
    (field(MoeGroupedGemm::run(&b, &plan, args, None, b.default_stream())), want)
}

fn gemm_params() -> impl Strategy<Value = MoeGemmParams> {
    (1usize..4, 1usize..4, 1usize..5, 1usize..6, 1usize..3, 1usize..5, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(tokens, top_k, experts, block_m, k32, n, mx, down, quant)| MoeGemmParams {
            routing: MoeRouting { tokens, top_k: top_k.min(experts), experts, block_m },
            k: 32 * k32,
            n,
            stage: if down { MoeGemmStage::Down } else { MoeGemmStage::GateUp { beta: 4.0, linear_beta: Some(25.0) } },
            weights: if mx { MoeWeightFormat::Mxfp4 } else { MoeWeightFormat::Dense },
            activation_quant: quant.then_some(MoeActivationQuant::Mxfp8),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any router descriptor: the plan succeeds exactly when the params are valid.
    #[test]
    fn router_plan_accepts_exactly_valid_params(
        tokens in 0usize..5, hidden in 0usize..5, experts in 0usize..13, top_k in 0usize..14,
        n_group in 0usize..7, topk_group in 0usize..7,
        rsf in prop::sample::select(vec![1.0f32, 2.5, 0.0, f32::NAN, f32::INFINITY]),
    ) {
        let p = MoeRouterParams { routed_scaling_factor: rsf, n_group, topk_group, ..router_params(tokens, hidden, experts, top_k) };
        let b = CpuBackend::new();
        let plan = MoeRouter::plan(&b, &p);
        prop_assert_eq!(plan.is_ok(), router_params_valid(&p), "{:?}: {:?}", p, plan.as_ref().err());
        if let Err(e) = plan {
            prop_assert!(e.field().is_some_and(|f| f.starts_with("params.")), "{}", e);
        }
    }

    /// A router call with one tensor given the wrong dtype or shape fails naming that tensor.
    #[test]
    fn router_bad_tensor_names_the_field(
        which in 0usize..6, dtype_fault in any::<bool>(), tokens in 0usize..4, experts in 1usize..6,
    ) {
        let b = CpuBackend::new();
        let p = router_params(tokens, 8, experts, 1);
        let plan = MoeRouter::plan(&b, &p).unwrap();
        let names = ["x", "weight", "bias", "topk_ids", "topk_weights", "none"];
        let mut specs: [(DType, Vec<usize>); 5] = [
            (DType::BF16, vec![tokens, 8]),
            (DType::BF16, vec![experts, 8]),
            (DType::F32, vec![experts]),
            (DType::I32, vec![tokens, 1]),
            (DType::F32, vec![tokens, 1]),
        ];
        if which < 5 {
            if dtype_fault {
                specs[which].0 = if specs[which].0 == DType::I32 { DType::F32 } else { DType::I64 };
            } else {
                specs[which].1[0] += 1;
            }
        }
        let [x, w, bias, mut ids, mut wts] = specs.map(|(dt, s)| zeros(&b, dt, &s));
        let args = MoeRouterArgs {
            x: x.as_ref(),
            weight: w.as_ref(),
            bias: Some(bias.as_ref()),
            topk_ids: ids.as_mut(),
            topk_weights: wts.as_mut(),
        };
        let got = field(MoeRouter::run(&b, &plan, args, None, b.default_stream()));
        prop_assert_eq!(got.as_deref(), (which < 5).then_some(names[which]));
    }

    /// Align with arbitrary ids (some out of range, negative) and maps: an error exactly when an
    /// id or a map entry it reads is out of range, never a panic.
    #[test]
    fn align_rejects_exactly_out_of_range_ids(
        tokens in 0usize..6, top_k in 1usize..4, experts in 1usize..6, block_m in 1usize..5,
        raw in prop::collection::vec(-2i32..8, 24), map_raw in prop::option::of(prop::collection::vec(-2i32..6, 1..8)),
    ) {
        let b = CpuBackend::new();
        let r = MoeRouting { tokens, top_k, experts, block_m };
        let ids = &raw[..tokens * top_k];
        let bound = map_raw.as_ref().map_or(experts, Vec::len) as i32;
        // Pairs are read in order; the first bad one names the field.
        let want = ids.iter().find_map(|&i| {
            if i < 0 || i >= bound {
                return Some("topk_ids");
            }
            let m = map_raw.as_ref()?[i as usize];
            (m < -1 || m >= experts as i32).then_some("expert_map")
        });
        let got = field(align(&b, &r, ids, map_raw.as_deref()));
        prop_assert_eq!(got.as_deref(), want);
    }

    /// The GEMM plan: MX weights or MXFP8 activations need k % 32 == 0, nothing else about k.
    #[test]
    fn gemm_plan_checks_k(k in 1usize..100, mx in any::<bool>(), quant in any::<bool>(), block_m in 0usize..3) {
        let b = CpuBackend::new();
        let p = MoeGemmParams {
            routing: MoeRouting { tokens: 2, top_k: 1, experts: 2, block_m },
            k, n: 4, stage: MoeGemmStage::Down,
            weights: if mx { MoeWeightFormat::Mxfp4 } else { MoeWeightFormat::Dense },
            activation_quant: quant.then_some(MoeActivationQuant::Mxfp8),
        };
        let got = field(MoeGroupedGemm::plan(&b, &p));
        let want = if block_m == 0 {
            Some("params.routing.block_m")
        } else if (mx || quant) && k % 32 != 0 {
            Some("params.k")
        } else {
            None
        };
        prop_assert_eq!(got.as_deref(), want);
    }

    /// A GEMM call with one fault (a shape, a dtype, or a corrupted index value) fails naming the
    /// faulty field; the fault-free call succeeds.
    #[test]
    fn gemm_fault_names_the_field(p in gemm_params(), fault in prop::sample::select(GEMM_FAULTS.to_vec()), seed in any::<u64>()) {
        let r = &p.routing;
        let ids: Vec<i32> = (0..r.tokens * r.top_k).map(|i| ((seed >> (i % 60)) as usize % r.experts) as i32).collect();
        let (got, want) = gemm_with_fault(&p, &ids, fault);
        prop_assert_eq!(got.as_deref(), want, "{:?} {:?}", fault, p);
    }

    /// The MXFP4 row helpers reject inconsistent lengths without panicking.
    #[test]
    fn mxfp4_helpers_never_panic(rows in 0usize..4, cols in 0usize..80, np in 0usize..130, ns in 0usize..10) {
        let r = mxfp4_dequantize(&vec![0x2A; np], &vec![127; ns], rows, cols);
        let consistent = cols % 32 == 0 && np == rows * cols / 2 && ns == rows * cols / 32;
        prop_assert_eq!(r.is_ok(), consistent);
        let q = mxfp4_quantize_rows(&vec![0.5; np], rows, cols);
        prop_assert_eq!(q.is_ok(), cols % 32 == 0 && np == rows * cols);
    }
}

/// Worked bytes of k3-architecture.md 3.4 through the public helper.
#[test]
fn mxfp4_worked_bytes() {
    let mut packed = vec![0u8; 16];
    packed[..3].copy_from_slice(&[0x2A, 0x7F, 0xF1]);
    let v = mxfp4_dequantize(&packed, &[127], 1, 32).unwrap();
    assert_eq!(&v[..6], &[-1.0, 1.0, -6.0, 6.0, 0.5, -6.0]);
    let v = mxfp4_dequantize(&packed, &[120], 1, 32).unwrap();
    assert_eq!(&v[..6], &[-1.0 / 128.0, 1.0 / 128.0, -6.0 / 128.0, 6.0 / 128.0, 0.5 / 128.0, -6.0 / 128.0]);
}
