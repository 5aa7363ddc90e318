//! One decode step of the tiny model as a capturable sequence of op `run`s over pre-allocated
//! buffers, for the graph-capture tests of the GPU backends (`cuda_graph.rs`, `rocm_graph.rs`).
//!
//! The model runner allocates per step (outputs, metadata uploads), so it cannot be captured as
//! is. What is captured instead is the sequence of op `run`s a decode step is made of: reset of
//! the KDA conv / recurrent state pools from snapshots (D2D copies), fused KDA decode, MLA
//! decode over a paged bf16 latent cache, and the routed MoE path (router, align, MXFP4 gate-up
//! and down grouped GEMMs, combine). [`replays_bit_identically`] runs it eagerly once, then
//! replays the captured graph twice over poisoned outputs; every output and both state pools
//! must come back bit-identical to the eager run.
#![allow(dead_code)] // each test binary uses its backend's part

use k3_kernels::{GpuBackend, Runtime};
use kernel_api::conformance::{upload_f32, TestRng};
use kernel_api::ops::kv_cache::encode_token;
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, HostTensor};
use model_k3::config::{K3Config, TINY_CONFIG_JSON};

type T<R> = DeviceTensor<GpuBackend<R>>;
type Res<X> = kernel_api::Result<X>;

fn normal<R: Runtime>(b: &GpuBackend<R>, dt: DType, shape: &[usize], std: f32, seed: u64) -> T<R> {
    let n = shape.iter().product();
    upload_f32(b, dt, shape, &TestRng::new(seed).normals(n, std)).expect("upload")
}

fn bytes<R: Runtime>(b: &GpuBackend<R>, shape: &[usize], v: Vec<u8>) -> T<R> {
    b.upload_tensor(&HostTensor::from_bytes(DType::U8, shape, v).expect("bytes")).expect("upload")
}

fn i32s<R: Runtime>(b: &GpuBackend<R>, shape: &[usize], v: &[i32]) -> T<R> {
    b.upload_tensor(&HostTensor::from_i32(shape, v).expect("i32")).expect("upload")
}

/// Everything one step reads and writes, allocated up front.
pub struct Step<R: Runtime> {
    // KDA decode
    kda_plan: KdaDecodePlan,
    x_qkv: T<R>,
    conv_w: T<R>,
    conv0: T<R>,
    conv: T<R>,
    g: T<R>,
    beta: T<R>,
    a_log: T<R>,
    dt_bias: T<R>,
    idx: T<R>,
    state0: T<R>,
    state: T<R>,
    og: T<R>,
    nw: T<R>,
    kda_out: T<R>,
    // MLA decode
    mla_plan: MlaDecodePlan,
    q: T<R>,
    kv: T<R>,
    table: T<R>,
    lens: T<R>,
    mla_out: T<R>,
    mla_lse: T<R>,
    mla_ws: Option<R::Buffer>,
    kda_ws: Option<R::Buffer>,
    // MoE
    rplan: MoeRouterPlan,
    rws: Option<R::Buffer>,
    aplan: MoeAlignPlan,
    gplan: MoeGemmPlan,
    dplan: MoeGemmPlan,
    cplan: MoeCombinePlan,
    x: T<R>,
    router_w: T<R>,
    bias: T<R>,
    z: T<R>,
    w13: T<R>,
    s13: T<R>,
    w2: T<R>,
    s2: T<R>,
    ids: T<R>,
    weights: T<R>,
    sorted: T<R>,
    eids: T<R>,
    ntp: T<R>,
    aws: Option<R::Buffer>,
    a: T<R>,
    gws: Option<R::Buffer>,
    y: T<R>,
    dws: Option<R::Buffer>,
    moe_out: T<R>,
}

fn ws<R: Runtime>(b: &GpuBackend<R>, n: usize) -> Option<R::Buffer> {
    (n > 0).then(|| b.alloc_zeroed(n).expect("workspace"))
}

impl<R: Runtime> Step<R> {
    pub fn new(b: &GpuBackend<R>, cfg: &K3Config, batch: usize) -> Self {
        let bf = DType::BF16;
        let mut rng = TestRng::new(7);
        // KDA decode at the tiny dims.
        let (h, kd, w) = (cfg.kda.num_heads, cfg.kda.head_dim, cfg.kda.conv_kernel);
        let slots = batch + 1;
        let kp = KdaDecodeParams {
            batch,
            heads: h,
            head_k: kd,
            head_v: kd,
            conv_width: w,
            state_slots: slots,
            state_layout: KdaStateLayout::KMajor,
            gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
            beta_sigmoid: true,
            qk_l2norm: true,
            scale: None,
            output_norm: KdaOutputNorm::GatedRmsNorm { eps: cfg.rms_norm_eps },
        };
        let d = kp.channels();
        let idx: Vec<i32> = (1..=batch as i32).rev().collect();
        let kda_plan = KdaDecode::plan(b, &kp, &KdaDecodeBatch { state_indices: &idx }).expect("kda plan");
        // MLA decode over a paged bf16 cache, a different length per sequence.
        let dims = KvDims { latent: cfg.mla.kv_lora_rank, rope: cfg.mla.qk_rope_head_dim };
        let (page, max_pages) = (64, 3);
        let num_pages = batch * max_pages;
        let cache = MlaPagedCache { dims, format: KvCacheFormat::Bf16, page_size: page, num_pages, kv_scale: 1.0 };
        let mp = MlaDecodeParams {
            cache,
            heads: cfg.mla.num_heads,
            q_len: 1,
            softmax_scale: cfg.mla.softmax_scale(),
            variant: MlaDecodeVariant::Auto,
            splits: MlaSplitPolicy::Auto,
        };
        let lens: Vec<i32> = (0..batch).map(|i| 1 + 37 * (i as i32 + 1) % (page * max_pages) as i32).collect();
        let table: Vec<i32> = (0..num_pages as i32).rev().collect();
        let mla_plan = MlaDecode::plan(b, &mp, &MlaDecodeBatch { seq_lens: &lens, block_table: &table, max_pages_per_seq: max_pages }).expect("mla plan");
        let bpt = cache.bytes_per_token();
        let mut kv_bytes = vec![0u8; num_pages * page * bpt];
        for tok in kv_bytes.chunks_mut(bpt) {
            encode_token(cache.format, dims, &rng.normals(dims.width(), 1.0), 1.0, tok).expect("encode");
        }
        // MoE routed path.
        let m = &cfg.moe;
        let (hid, l, n, e, k) = (cfg.hidden_size, m.latent_size, m.moe_intermediate_size, m.num_experts, m.top_k);
        let rp = MoeRouterParams {
            tokens: batch,
            hidden: hid,
            experts: e,
            top_k: k,
            n_group: m.num_expert_group,
            topk_group: m.topk_group,
            renormalize: m.renormalize,
            routed_scaling_factor: m.routed_scaling_factor,
            score: RouterScore::Sigmoid,
        };
        let rplan = MoeRouter::plan(b, &rp).expect("router plan");
        let routing = MoeRouting { tokens: batch, top_k: k, experts: e, block_m: 16 };
        let aplan = MoeAlign::plan(b, &MoeAlignParams { routing: routing.clone(), global_experts: None }).expect("align plan");
        let stage = |stage, kk, nn| MoeGemmParams { routing: routing.clone(), k: kk, n: nn, stage, weights: MoeWeightFormat::Mxfp4, activation_quant: None };
        let gplan = MoeGroupedGemm::plan(b, &stage(MoeGemmStage::GateUp { beta: cfg.situ_beta, linear_beta: cfg.situ_linear_beta }, l, n)).expect("gate-up plan");
        let dplan = MoeGroupedGemm::plan(b, &stage(MoeGemmStage::Down, n, l)).expect("down plan");
        let mut codes = |len: usize| (0..len).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
        let (c13, c2) = (codes(e * 2 * n * l / 2), codes(e * l * n / 2));
        let scales = |len: usize| (0..len).map(|i| 121 + (i % 2) as u8).collect::<Vec<u8>>();
        Step {
            x_qkv: normal(b, bf, &[batch, d], 1.0, 1),
            conv_w: normal(b, DType::F32, &[d, w], 0.5, 2),
            conv0: normal(b, DType::F32, &[slots, d, w - 1], 1.0, 3),
            conv: b.zeros(DType::F32, &[slots, d, w - 1]).expect("conv"),
            g: normal(b, bf, &[batch, h, kd], 1.0, 4),
            beta: normal(b, bf, &[batch, h], 1.0, 5),
            a_log: normal(b, DType::F32, &[h], 0.5, 6),
            dt_bias: normal(b, DType::F32, &[h * kd], 0.5, 7),
            idx: i32s(b, &[batch], &idx),
            state0: normal(b, DType::F32, &[slots, h, kd, kd], 0.1, 8),
            state: b.zeros(DType::F32, &[slots, h, kd, kd]).expect("state"),
            og: normal(b, bf, &[batch, h, kd], 1.0, 9),
            nw: normal(b, DType::F32, &[kd], 1.0, 10),
            kda_out: b.zeros(bf, &[batch, h, kd]).expect("kda out"),
            q: normal(b, bf, &[batch, 1, mp.heads, dims.width()], 1.0, 11),
            kv: bytes(b, &[num_pages, page, bpt], kv_bytes),
            table: i32s(b, &[batch, max_pages], &table),
            lens: i32s(b, &[batch], &lens),
            mla_out: b.zeros(bf, &[batch, 1, mp.heads, dims.latent]).expect("mla out"),
            mla_lse: b.zeros(DType::F32, &[batch, 1, mp.heads]).expect("lse"),
            mla_ws: ws(b, MlaDecode::workspace_size(b, &mla_plan)),
            kda_ws: ws(b, KdaDecode::workspace_size(b, &kda_plan)),
            rws: ws(b, MoeRouter::workspace_size(b, &rplan)),
            rplan,
            cplan: MoeCombine::plan(b, &MoeCombineParams { tokens: batch, top_k: k, hidden: l }).expect("combine plan"),
            x: normal(b, bf, &[batch, hid], 1.0, 12),
            router_w: normal(b, bf, &[e, hid], 0.1, 13),
            bias: normal(b, DType::F32, &[e], 0.05, 14),
            z: normal(b, bf, &[batch, l], 1.0, 15),
            w13: bytes(b, &[e, 2 * n, l / 2], c13),
            s13: bytes(b, &[e, 2 * n, l / 32], scales(e * 2 * n * l / 32)),
            w2: bytes(b, &[e, l, n / 2], c2),
            s2: bytes(b, &[e, l, n / 32], scales(e * l * n / 32)),
            ids: b.zeros(DType::I32, &[batch, k]).expect("ids"),
            weights: b.zeros(DType::F32, &[batch, k]).expect("weights"),
            sorted: b.zeros(DType::I32, &[aplan.max_padded]).expect("sorted"),
            eids: b.zeros(DType::I32, &[aplan.num_blocks]).expect("expert ids"),
            ntp: b.zeros(DType::I32, &[1]).expect("ntp"),
            aws: ws(b, MoeAlign::workspace_size(b, &aplan)),
            a: b.zeros(bf, &[batch * k, n]).expect("a"),
            gws: ws(b, MoeGroupedGemm::workspace_size(b, &gplan)),
            y: b.zeros(DType::F32, &[batch * k, l]).expect("y"),
            dws: ws(b, MoeGroupedGemm::workspace_size(b, &dplan)),
            moe_out: b.zeros(bf, &[batch, l]).expect("moe out"),
            kda_plan,
            mla_plan,
            aplan,
            gplan,
            dplan,
        }
    }

    /// The step: only stream-ordered work (D2D copies and op runs), so it can be captured.
    pub fn run(&mut self, b: &GpuBackend<R>) -> Res<()> {
        let s = b.default_stream();
        let rt = b.runtime();
        rt.copy_d2d(&self.conv0.buf, 0, &mut self.conv.buf, 0, b.buffer_len(&self.conv0.buf), s)?;
        rt.copy_d2d(&self.state0.buf, 0, &mut self.state.buf, 0, b.buffer_len(&self.state0.buf), s)?;
        let args = KdaDecodeArgs {
            x_qkv: self.x_qkv.as_ref(),
            conv_weight: self.conv_w.as_ref(),
            conv_state: self.conv.as_mut(),
            g_raw: self.g.as_ref(),
            beta: self.beta.as_ref(),
            a_log: Some(self.a_log.as_ref()),
            dt_bias: Some(self.dt_bias.as_ref()),
            state_indices: self.idx.as_ref(),
            recurrent_state: self.state.as_mut(),
            output_gate: Some(self.og.as_ref()),
            norm_weight: Some(self.nw.as_ref()),
            out: self.kda_out.as_mut(),
        };
        KdaDecode::run(b, &self.kda_plan, args, self.kda_ws.as_mut(), s)?;
        let args = MlaDecodeArgs {
            q: self.q.as_ref(),
            kv_cache: self.kv.as_ref(),
            block_table: self.table.as_ref(),
            seq_lens: self.lens.as_ref(),
            out: self.mla_out.as_mut(),
            lse: Some(self.mla_lse.as_mut()),
        };
        MlaDecode::run(b, &self.mla_plan, args, self.mla_ws.as_mut(), s)?;
        let args = MoeRouterArgs {
            x: self.x.as_ref(),
            weight: self.router_w.as_ref(),
            bias: Some(self.bias.as_ref()),
            topk_ids: self.ids.as_mut(),
            topk_weights: self.weights.as_mut(),
        };
        MoeRouter::run(b, &self.rplan, args, self.rws.as_mut(), s)?;
        let args = MoeAlignArgs {
            topk_ids: self.ids.as_ref(),
            expert_map: None,
            sorted_token_ids: self.sorted.as_mut(),
            expert_ids: self.eids.as_mut(),
            num_tokens_post_padded: self.ntp.as_mut(),
        };
        MoeAlign::run(b, &self.aplan, args, self.aws.as_mut(), s)?;
        let args = MoeGemmArgs {
            input: self.z.as_ref(),
            weight: self.w13.as_ref(),
            weight_scale: Some(self.s13.as_ref()),
            sorted_token_ids: self.sorted.as_ref(),
            expert_ids: self.eids.as_ref(),
            num_tokens_post_padded: self.ntp.as_ref(),
            topk_weights: None,
            out: self.a.as_mut(),
        };
        MoeGroupedGemm::run(b, &self.gplan, args, self.gws.as_mut(), s)?;
        let args = MoeGemmArgs {
            input: self.a.as_ref(),
            weight: self.w2.as_ref(),
            weight_scale: Some(self.s2.as_ref()),
            sorted_token_ids: self.sorted.as_ref(),
            expert_ids: self.eids.as_ref(),
            num_tokens_post_padded: self.ntp.as_ref(),
            topk_weights: Some(self.weights.as_ref()),
            out: self.y.as_mut(),
        };
        MoeGroupedGemm::run(b, &self.dplan, args, self.dws.as_mut(), s)?;
        MoeCombine::run(b, &self.cplan, MoeCombineArgs { y: self.y.as_ref(), out: self.moe_out.as_mut() }, None, s)
    }

    /// Every tensor the step writes.
    fn outputs(&mut self) -> Vec<(&'static str, &mut T<R>)> {
        vec![
            ("conv_state", &mut self.conv),
            ("recurrent_state", &mut self.state),
            ("kda_out", &mut self.kda_out),
            ("mla_out", &mut self.mla_out),
            ("mla_lse", &mut self.mla_lse),
            ("topk_ids", &mut self.ids),
            ("topk_weights", &mut self.weights),
            ("moe_act", &mut self.a),
            ("moe_y", &mut self.y),
            ("moe_out", &mut self.moe_out),
        ]
    }

    pub fn snapshot(&mut self, b: &GpuBackend<R>) -> Vec<(&'static str, Vec<u8>)> {
        b.synchronize(b.default_stream()).expect("sync");
        self.outputs().into_iter().map(|(n, t)| (n, b.download_tensor(t).expect("download").bytes)).collect()
    }

    /// Overwrites every output (0x7f bytes: large finite bf16/f32, out-of-range ids) so a replay
    /// that skipped a write cannot match.
    pub fn poison(&mut self, b: &GpuBackend<R>) {
        let s = b.default_stream();
        for (_, t) in self.outputs() {
            b.runtime().memset(&mut t.buf, 0x7f, s).expect("memset");
        }
        b.synchronize(s).expect("sync");
    }
}

/// Eager step, capture (through `begin` / `end`), then two replays over poisoned outputs, each
/// compared byte for byte with the eager outputs.
pub fn replays_bit_identically<R: Runtime, G>(
    b: &GpuBackend<R>,
    begin: impl Fn(&R::Stream) -> Res<()>,
    end: impl Fn(&R::Stream) -> Res<G>,
    replay: impl Fn(&G, &R::Stream) -> Res<()>,
) {
    let cfg = K3Config::from_json_str(TINY_CONFIG_JSON).expect("tiny config");
    let mut step = Step::new(b, &cfg, 4);
    step.run(b).expect("eager step");
    let eager = step.snapshot(b);

    let s = b.default_stream();
    begin(s).expect("begin capture");
    let captured = step.run(b);
    let graph = end(s);
    captured.expect("ops while capturing");
    let graph = graph.expect("end capture");
    for n in 0..2 {
        step.poison(b);
        replay(&graph, s).expect("replay");
        for ((name, want), (_, got)) in eager.iter().zip(step.snapshot(b)) {
            assert!(*want == got, "replay {n}: {name} differs from the eager step");
        }
    }
}
