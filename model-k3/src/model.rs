//! The K3 forward pass over `kernel-api` ops: embedding, Block Attention Residuals over the
//! block bank, KDA and gated NoPE MLA token mixers, dense SiTU MLP and the latent MoE, output
//! mix, final norm and lm_head (k3-architecture.md 2.2-2.6).
//!
//! One forward step takes a batch of sequences, each with the tokens to feed now. A step where
//! every sequence feeds exactly one token runs the decode ops (fused KDA decode, MLA decode);
//! any other step runs the prefill ops (causal conv1d + chunked KDA, absorbed MLA prefill over
//! the paged cache). Both paths read and write the same hybrid cache, so prefill, chunked
//! prefill and decode can be mixed freely per sequence.

use crate::cache::{PageAllocator, SequenceState, SlotAllocator};
use crate::config::{K3Config, KdaGate, MixerKind};
use crate::exec::{reshaped, strides_of, view, view_mut, Exec, ModelBackend};
use crate::weights::{ExpertMatrix, FfnWeights, KdaWeights, MixerWeights, MlaWeights, ModelWeights, MoeWeights, OutputGate};
use kernel_api::ops::kda_decode::KdaOutputNorm;
use kernel_api::ops::{
    CausalConv1dArgs, CausalConv1dBatch, CausalConv1dParams, KdaDecodeArgs, KdaDecodeBatch, KdaDecodeParams, KdaGateMode,
    KdaPrefillArgs, KdaPrefillBatch, KdaPrefillParams, KdaStateLayout, KvCacheFormat, KvDims, MlaCacheWriteArgs,
    MlaCacheWriteBatch, MlaCacheWriteParams, MlaDecodeArgs, MlaDecodeBatch, MlaDecodeParams, MlaDecodeVariant, MlaPagedCache,
    MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedBatch, MlaPrefillAbsorbedParams, MlaSplitPolicy,
};
use kernel_api::ops::conv1d::{ConvActivation, HostIndices};
use kernel_api::compose::latent_moe::situ_mlp;
use kernel_api::compose::{latent_moe_forward, ExpertWeights, LatentMoeConfig, LatentMoeWeights, SharedMlp};
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, Error, HostTensor, Result};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Cache and precision options of a model instance.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelOptions {
    pub kv_format: KvCacheFormat,
    /// Per-tensor scale of a flat fp8 cache (ignored otherwise).
    pub kv_scale: f32,
    pub page_size: usize,
    pub num_pages: usize,
    /// Live sequences at most (KDA slots = this + the null slot).
    pub max_seqs: usize,
    /// KDA recurrent state dtype (f32 or bf16).
    pub state_dtype: DType,
    /// KDA prefill chunk size (16, 32 or 64).
    pub kda_chunk: usize,
    /// MoE align block size.
    pub moe_block_m: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            kv_format: KvCacheFormat::Bf16,
            kv_scale: 1.0,
            page_size: 64,
            num_pages: 64,
            max_seqs: 8,
            state_dtype: DType::F32,
            kda_chunk: 64,
            moe_block_m: 16,
        }
    }
}

/// RMS of one intermediate activation of the last forward step (for tests and diagnostics).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerStat {
    pub layer: usize,
    pub what: &'static str,
    pub rms: f32,
}

/// Device state of the hybrid cache.
struct CachePools<B: Backend> {
    /// Per layer: the MLA latent pool `[pages, page_size, bytes_per_token]` (MLA layers only).
    mla: Vec<Option<DeviceTensor<B>>>,
    /// Per layer: KDA recurrent state pool `[slots, H, K, V]` and conv state `[slots, 3P, W-1]`.
    kda: Vec<Option<(DeviceTensor<B>, DeviceTensor<B>)>>,
}

/// A loaded model with its cache.
pub struct K3Model<B: ModelBackend> {
    pub backend: B,
    pub cfg: K3Config,
    pub weights: ModelWeights<B>,
    pub opts: ModelOptions,
    pools: CachePools<B>,
    pages: PageAllocator,
    slots: SlotAllocator,
    seqs: BTreeMap<u64, SequenceState>,
    /// When set, every forward step records intermediate RMS values here.
    stats: Option<RefCell<Vec<LayerStat>>>,
}

/// Host metadata of one forward step.
struct Step {
    tokens: usize,
    decode: bool,
    cu_seqlens: Vec<i64>,
    /// Tokens in cache after this step, per sequence.
    seq_lens: Vec<i32>,
    block_table: Vec<i32>,
    max_pages: usize,
    slots: Vec<i32>,
    slot_mapping: Vec<i64>,
    token_ids: Vec<i64>,
}

/// Device copies of the step's index tensors.
struct StepTensors<B: Backend> {
    cu_seqlens_i64: DeviceTensor<B>,
    cu_seqlens_i32: DeviceTensor<B>,
    seq_lens: DeviceTensor<B>,
    block_table: DeviceTensor<B>,
    slots_i32: DeviceTensor<B>,
    slots_i64: DeviceTensor<B>,
    slot_mapping: DeviceTensor<B>,
    token_ids: DeviceTensor<B>,
}

const ACT: DType = DType::F32;

impl<B: ModelBackend> K3Model<B> {
    pub fn new(backend: B, cfg: K3Config, weights: ModelWeights<B>, opts: ModelOptions) -> Result<Self> {
        if !matches!(opts.state_dtype, DType::F32 | DType::BF16) {
            return Err(Error::invalid("state_dtype", format!("{} (expected f32 or bf16)", opts.state_dtype)));
        }
        let slots = opts.max_seqs + 1;
        let dims = KvDims { latent: cfg.mla.kv_lora_rank, rope: cfg.mla.qk_rope_head_dim };
        let mut pools = CachePools { mla: Vec::new(), kda: Vec::new() };
        for i in 0..cfg.num_layers {
            match cfg.mixers[i] {
                MixerKind::Mla => {
                    let bpt = opts.kv_format.bytes_per_token(dims);
                    pools.mla.push(Some(backend.zeros(DType::U8, &[opts.num_pages, opts.page_size, bpt])?));
                    pools.kda.push(None);
                }
                MixerKind::Kda => {
                    let (h, k) = (cfg.kda.num_heads, cfg.kda.head_dim);
                    let state = backend.zeros(opts.state_dtype, &[slots, h, k, k])?;
                    let conv = backend.zeros(ACT, &[slots, 3 * cfg.kda_width(), cfg.kda.conv_kernel - 1])?;
                    pools.kda.push(Some((state, conv)));
                    pools.mla.push(None);
                }
            }
        }
        Ok(K3Model {
            backend,
            pages: PageAllocator::new(opts.num_pages),
            slots: SlotAllocator::new(slots),
            cfg,
            weights,
            opts,
            pools,
            seqs: BTreeMap::new(),
            stats: None,
        })
    }

    /// Records intermediate RMS values of every following forward step (costs a download each).
    pub fn enable_stats(&mut self) {
        self.stats = Some(RefCell::new(Vec::new()));
    }

    /// The statistics of the last forward step.
    pub fn take_stats(&mut self) -> Vec<LayerStat> {
        self.stats.as_ref().map(|s| s.take()).unwrap_or_default()
    }

    pub fn free_pages(&self) -> usize {
        self.pages.free_count()
    }
    pub fn free_slots(&self) -> usize {
        self.slots.free_count()
    }
    pub fn sequence(&self, id: u64) -> Option<&SequenceState> {
        self.seqs.get(&id)
    }

    /// Starts a sequence (zeroing its KDA slot) or returns an error if the id is live.
    pub fn add_sequence(&mut self, id: u64) -> Result<()> {
        if self.seqs.contains_key(&id) {
            return Err(Error::invalid("sequence", format!("{id} is already live")));
        }
        let slot = self.slots.alloc()?;
        if let Err(e) = self.zero_slot(slot) {
            self.slots.release(slot);
            return Err(e);
        }
        self.seqs.insert(id, SequenceState { tokens: Vec::new(), pages: Vec::new(), slot });
        Ok(())
    }

    /// Frees a sequence's pages and slot.
    pub fn release(&mut self, id: u64) {
        if let Some(s) = self.seqs.remove(&id) {
            self.pages.release(&s.pages);
            self.slots.release(s.slot);
        }
    }

    fn zero_slot(&mut self, slot: u32) -> Result<()> {
        let ex = Exec::new(&self.backend, ACT);
        for (state, conv) in self.pools.kda.iter_mut().flatten() {
            for t in [state, conv] {
                let per: usize = t.layout.shape[1..].iter().product();
                let shape = t.layout.shape[1..].to_vec();
                let zeros = ex.zeros(t.dtype(), &shape)?;
                let strides = strides_of(&shape);
                ex.copy(zeros.as_ref(), view_mut(t, &shape, &strides, slot as usize * per))?;
            }
        }
        Ok(())
    }

    /// Feeds `tokens` to each listed sequence and returns the logits of every fed position,
    /// `[total_tokens, vocab]` f32, in batch order.
    pub fn forward(&mut self, batch: &[(u64, &[u32])]) -> Result<HostTensor> {
        let step = self.plan_step(batch)?;
        let logits = self.forward_step(&step)?;
        for (id, toks) in batch {
            if let Some(s) = self.seqs.get_mut(id) {
                s.tokens.extend_from_slice(toks);
            }
        }
        self.backend.download_tensor(&logits)
    }

    fn plan_step(&mut self, batch: &[(u64, &[u32])]) -> Result<Step> {
        if batch.is_empty() {
            return Err(Error::invalid("batch", "no sequences"));
        }
        let ps = self.opts.page_size;
        let mut cu = vec![0i64];
        let mut seq_lens = Vec::new();
        let mut slots = Vec::new();
        let mut slot_mapping = Vec::new();
        let mut token_ids = Vec::new();
        let mut tables: Vec<Vec<u32>> = Vec::new();
        for (i, (id, toks)) in batch.iter().enumerate() {
            if toks.is_empty() {
                return Err(Error::invalid(format!("batch[{i}].tokens"), "no tokens to feed"));
            }
            if batch[..i].iter().any(|(o, _)| o == id) {
                return Err(Error::invalid(format!("batch[{i}]"), format!("sequence {id} appears twice")));
            }
            if let Some(&bad) = toks.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(Error::invalid(format!("batch[{i}].tokens"), format!("token {bad} >= vocab {}", self.cfg.vocab_size)));
            }
            let s = self.seqs.get_mut(id).ok_or_else(|| Error::invalid(format!("batch[{i}]"), format!("sequence {id} is not live")))?;
            let start = s.tokens.len();
            let end = start + toks.len();
            let need = end.div_ceil(ps);
            if need > s.pages.len() {
                let new = self.pages.alloc(need - s.pages.len())?;
                s.pages.extend(new);
            }
            for pos in start..end {
                slot_mapping.push(s.pages[pos / ps] as i64 * ps as i64 + (pos % ps) as i64);
            }
            token_ids.extend(toks.iter().map(|&t| t as i64));
            cu.push(cu[i] + toks.len() as i64);
            seq_lens.push(end as i32);
            slots.push(s.slot as i32);
            tables.push(s.pages.clone());
        }
        let max_pages = tables.iter().map(|t| t.len()).max().unwrap_or(1).max(1);
        let mut block_table = Vec::with_capacity(batch.len() * max_pages);
        for t in &tables {
            block_table.extend(t.iter().map(|&p| p as i32));
            block_table.extend(std::iter::repeat_n(0, max_pages - t.len()));
        }
        Ok(Step {
            tokens: token_ids.len(),
            decode: batch.iter().all(|(_, t)| t.len() == 1),
            cu_seqlens: cu,
            seq_lens,
            block_table,
            max_pages,
            slots,
            slot_mapping,
            token_ids,
        })
    }

    fn upload_step(&self, s: &Step) -> Result<StepTensors<B>> {
        let b = &self.backend;
        let n = s.seq_lens.len();
        let cu32: Vec<i32> = s.cu_seqlens.iter().map(|&x| x as i32).collect();
        let slots64: Vec<i64> = s.slots.iter().map(|&x| x as i64).collect();
        Ok(StepTensors {
            cu_seqlens_i64: b.upload_tensor(&HostTensor::from_i64(&[n + 1], &s.cu_seqlens)?)?,
            cu_seqlens_i32: b.upload_tensor(&HostTensor::from_i32(&[n + 1], &cu32)?)?,
            seq_lens: b.upload_tensor(&HostTensor::from_i32(&[n], &s.seq_lens)?)?,
            block_table: b.upload_tensor(&HostTensor::from_i32(&[n, s.max_pages], &s.block_table)?)?,
            slots_i32: b.upload_tensor(&HostTensor::from_i32(&[n], &s.slots)?)?,
            slots_i64: b.upload_tensor(&HostTensor::from_i64(&[n], &slots64)?)?,
            slot_mapping: b.upload_tensor(&HostTensor::from_i64(&[s.tokens], &s.slot_mapping)?)?,
            token_ids: b.upload_tensor(&HostTensor::from_i64(&[s.tokens], &s.token_ids)?)?,
        })
    }

    fn forward_step(&mut self, s: &Step) -> Result<DeviceTensor<B>> {
        let st = self.upload_step(s)?;
        let K3Model { backend, cfg, weights, opts, pools, stats, .. } = self;
        if let Some(s) = stats.as_ref() {
            s.borrow_mut().clear();
        }
        let ex = Exec::new(&*backend, ACT);
        let cx = Ctx { b: &*backend, cfg: &*cfg, opts: &*opts, stats: stats.as_ref(), layer: std::cell::Cell::new(0), ex, mla_decode: RefCell::new(None) };
        let (t, d) = (s.tokens, cfg.hidden_size);
        let eps = cfg.rms_norm_eps;
        let n_src = (0..cfg.num_layers).filter(|&l| cfg.is_block_start(l)).count() + 1;
        let ex = cx.exec();
        // The block bank: snapshots in slots 0..n, the running partial sum p in slot n.
        let mut bank = ex.zeros(ACT, &[n_src, t, d])?;
        let h = ex.embed(&weights.embed, &st.token_ids, &s.token_ids)?;
        ex.copy(h.as_ref(), view_mut(&mut bank, &[t, d], &[d, 1], 0))?;
        let mut n = 0usize;
        let mut p_empty = false;
        for l in 0..cfg.num_layers {
            cx.layer.set(l);
            let lw = &weights.layers[l];
            let x_a = if n == 0 {
                None
            } else {
                Some(ex.attn_res_mix(view(&bank, &[n + 1, t, d], &[t * d, d, 1], 0), &lw.attn_res_score, eps)?)
            };
            let x_norm = match &x_a {
                Some(x) => ex.rms_norm(x.as_ref(), &lw.input_norm, eps)?,
                None => ex.rms_norm(view(&bank, &[t, d], &[d, 1], n * t * d), &lw.input_norm, eps)?,
            };
            if cfg.is_block_start(l) {
                n += 1;
                p_empty = true;
            }
            let a = match (&lw.mixer, &mut pools.kda[l], &mut pools.mla[l]) {
                (MixerWeights::Kda(w), Some(pool), _) => cx.kda_layer(pool, w, &x_norm, s, &st)?,
                (MixerWeights::Mla(w), _, Some(pool)) => cx.mla_layer(pool, w, &x_norm, s, &st)?,
                _ => return Err(Error::invalid("layer", format!("{l} has no cache pool for its mixer"))),
            };
            cx.record("mixer.out", &a)?;
            let p_off = n * t * d;
            if p_empty {
                ex.copy(a.as_ref(), view_mut(&mut bank, &[t, d], &[d, 1], p_off))?;
                p_empty = false;
            } else {
                ex.add_assign(view_mut(&mut bank, &[t, d], &[d, 1], p_off), a.as_ref())?;
            }
            let x_f = ex.attn_res_mix(view(&bank, &[n + 1, t, d], &[t * d, d, 1], 0), &lw.mlp_res_score, eps)?;
            let x_f = ex.rms_norm(x_f.as_ref(), &lw.post_norm, eps)?;
            let f = match &lw.ffn {
                FfnWeights::Dense(w) => cx.mlp(w, &x_f)?,
                FfnWeights::Moe(w) => cx.moe(w, &x_f)?,
            };
            cx.record("ffn.out", &f)?;
            ex.add_assign(view_mut(&mut bank, &[t, d], &[d, 1], n * t * d), f.as_ref())?;
        }
        let y = ex.attn_res_mix(view(&bank, &[n + 1, t, d], &[t * d, d, 1], 0), &weights.out_res_score, eps)?;
        let y = ex.rms_norm(y.as_ref(), &weights.final_norm, eps)?;
        ex.gemm(y.as_ref(), &weights.lm_head)
    }
}

/// What a layer needs besides its weights and its cache pool.
struct Ctx<'a, B: ModelBackend> {
    b: &'a B,
    cfg: &'a K3Config,
    opts: &'a ModelOptions,
    stats: Option<&'a RefCell<Vec<LayerStat>>>,
    layer: std::cell::Cell<usize>,
    /// One op runner for the whole step, so its GEMM workspace is allocated once per step.
    ex: Exec<'a, B>,
    /// The step's MLA decode plan, workspace and device schedule, prepared by the first MLA
    /// layer and reused by the others (the schedule launch runs once per step, not per layer).
    mla_decode: RefCell<Option<MlaStepDecode<B>>>,
}

/// What every MLA layer of a decode step shares (see [`kernel_api::ops::MlaPreparedSchedule`]).
struct MlaStepDecode<B: Backend> {
    plan: kernel_api::ops::MlaDecodePlan,
    ws: B::Buffer,
    schedule: kernel_api::ops::MlaPreparedSchedule,
}

impl<'a, B: ModelBackend> Ctx<'a, B> {
    fn exec(&self) -> &Exec<'a, B> {
        &self.ex
    }

    /// Records the RMS of `t` when statistics are on.
    fn record(&self, what: &'static str, t: &DeviceTensor<B>) -> Result<()> {
        if let Some(s) = self.stats {
            let v = self.b.download_tensor(t)?.to_f32();
            let rms = (v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>() / v.len().max(1) as f64).sqrt() as f32;
            s.borrow_mut().push(LayerStat { layer: self.layer.get(), what, rms });
        }
        Ok(())
    }

    fn mlp(&self, w: &crate::weights::DenseMlpWeights<B>, x: &DeviceTensor<B>) -> Result<DeviceTensor<B>> {
        let shared = SharedMlp { gate: w.gate.as_ref(), up: w.up.as_ref(), down: w.down.as_ref() };
        situ_mlp(self.b, x.as_ref(), &shared, self.cfg.situ_beta, self.cfg.situ_linear_beta, ACT)
    }

    fn kda_gate_mode(&self) -> KdaGateMode {
        match self.cfg.kda.gate {
            KdaGate::LowerBound(lb) => KdaGateMode::LowerBound { lower_bound: lb },
            KdaGate::Softplus => KdaGateMode::Softplus,
        }
    }

    fn kda_layer(&self, pool: &mut (DeviceTensor<B>, DeviceTensor<B>), w: &KdaWeights<B>, x: &DeviceTensor<B>, s: &Step, st: &StepTensors<B>) -> Result<DeviceTensor<B>> {
        let ex = self.exec();
        let (t, h, k) = (s.tokens, self.cfg.kda.num_heads, self.cfg.kda.head_dim);
        let p = h * k;
        let width = self.cfg.kda.conv_kernel;
        let slots = self.opts.max_seqs + 1;
        let qkv = ex.gemm(x.as_ref(), &w.qkv)?;
        let f = ex.gemm(ex.gemm(x.as_ref(), &w.f_a)?.as_ref(), &w.f_b)?;
        let beta = ex.gemm(x.as_ref(), &w.b)?;
        let gate = match &w.output_gate {
            OutputGate::FullRank(g) => ex.gemm(x.as_ref(), g)?,
            OutputGate::LowRank { a, b } => ex.gemm(ex.gemm(x.as_ref(), a)?.as_ref(), b)?,
        };
        let hk = [t, h, k];
        let hk_strides = [p, k, 1];
        let (state, conv_state) = (&mut pool.0, &mut pool.1);
        if s.decode {
            let params = KdaDecodeParams {
                batch: t,
                heads: h,
                head_k: k,
                head_v: k,
                conv_width: width,
                state_slots: slots,
                state_layout: KdaStateLayout::KMajor,
                gate: self.kda_gate_mode(),
                beta_sigmoid: true,
                qk_l2norm: true,
                scale: None,
                output_norm: KdaOutputNorm::GatedRmsNorm { eps: self.cfg.rms_norm_eps },
            };
            let plan = kernel_api::ops::KdaDecode::plan(self.b, &params, &KdaDecodeBatch { state_indices: &s.slots })?;
            let mut out = ex.zeros(ACT, &[t, h, k])?;
            let args = KdaDecodeArgs {
                x_qkv: qkv.as_ref(),
                conv_weight: w.conv.as_ref(),
                conv_state: conv_state.as_mut(),
                g_raw: view(&f, &hk, &hk_strides, 0),
                beta: beta.as_ref(),
                a_log: Some(w.a_log.as_ref()),
                dt_bias: Some(w.dt_bias.as_ref()),
                state_indices: st.slots_i32.as_ref(),
                recurrent_state: state.as_mut(),
                output_gate: Some(view(&gate, &hk, &hk_strides, 0)),
                norm_weight: Some(w.o_norm.as_ref()),
                out: out.as_mut(),
            };
            let mut ws = self.b.workspace(kernel_api::ops::KdaDecode::workspace_size(self.b, &plan))?;
            kernel_api::ops::KdaDecode::run(self.b, &plan, args, ws.as_mut(), self.b.default_stream())?;
            return ex.gemm(reshaped(&out, &[t, p]), &w.o);
        }
        // Prefill: causal conv over the fused q|k|v projection, then the chunked delta rule.
        let cparams = CausalConv1dParams {
            dim: 3 * p,
            width,
            activation: ConvActivation::Silu,
            read_initial_state: true,
            write_final_state: true,
            state_slots: slots,
        };
        let cbatch = CausalConv1dBatch { cu_seqlens: HostIndices::I64(&s.cu_seqlens), state_indices: Some(&s.slots) };
        let cplan = kernel_api::ops::CausalConv1d::plan(self.b, &cparams, &cbatch)?;
        let mut u = ex.zeros(ACT, &[t, 3 * p])?;
        let cargs = CausalConv1dArgs {
            x: qkv.as_ref(),
            weight: w.conv.as_ref(),
            cu_seqlens: st.cu_seqlens_i64.as_ref(),
            state_indices: Some(st.slots_i32.as_ref()),
            conv_state: Some(conv_state.as_mut()),
            out: u.as_mut(),
        };
        kernel_api::ops::CausalConv1d::run(self.b, &cplan, cargs, None, self.b.default_stream())?;
        let mut params = KdaPrefillParams::k3_defaults(h, k, k);
        params.gate = self.kda_gate_mode();
        params.a_log_len = w.a_log.layout.shape[0];
        params.chunk_size = self.opts.kda_chunk;
        params.state_layout = KdaStateLayout::KMajor;
        params.state_slots = slots;
        params.read_initial_state = true;
        params.write_final_state = true;
        let slots64: Vec<i64> = s.slots.iter().map(|&x| x as i64).collect();
        let batch = KdaPrefillBatch { cu_seqlens: &s.cu_seqlens, state_indices: Some(&slots64), checkpoints: None };
        let plan = kernel_api::ops::KdaPrefill::plan(self.b, &params, &batch)?;
        let mut o = ex.zeros(ACT, &[t, h, k])?;
        let qkv_strides = [3 * p, k, 1];
        let args = KdaPrefillArgs {
            q: view(&u, &hk, &qkv_strides, 0),
            k: view(&u, &hk, &qkv_strides, p),
            v: view(&u, &hk, &qkv_strides, 2 * p),
            g_raw: view(&f, &hk, &hk_strides, 0),
            beta: beta.as_ref(),
            a_log: Some(w.a_log.as_ref()),
            dt_bias: Some(w.dt_bias.as_ref()),
            cu_seqlens: st.cu_seqlens_i64.as_ref(),
            state_indices: Some(st.slots_i64.as_ref()),
            state: Some(state.as_mut()),
            checkpoint_offsets: None,
            checkpoint_state: None,
            out: o.as_mut(),
        };
        let mut ws = self.b.alloc_zeroed(kernel_api::ops::KdaPrefill::workspace_size(self.b, &plan))?;
        kernel_api::ops::KdaPrefill::run(self.b, &plan, args, Some(&mut ws), self.b.default_stream())?;
        self.record("kda.o_pre_norm", &o)?;
        let y = ex.gated_rms_norm(o.as_ref(), view(&gate, &hk, &hk_strides, 0), &w.o_norm, self.cfg.rms_norm_eps)?;
        ex.gemm(reshaped(&y, &[t, p]), &w.o)
    }

    fn mla_layer(&self, pool: &mut DeviceTensor<B>, w: &MlaWeights<B>, x: &DeviceTensor<B>, s: &Step, st: &StepTensors<B>) -> Result<DeviceTensor<B>> {
        let ex = self.exec();
        let m = &self.cfg.mla;
        let (t, h) = (s.tokens, m.num_heads);
        let (nope, rope, lat, vd, qk) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim, m.qk_head_dim());
        let width = lat + rope;
        let eps = self.cfg.mla_norm_eps;
        let cq = ex.rms_norm(ex.gemm(x.as_ref(), &w.q_a)?.as_ref(), &w.q_a_norm, eps)?;
        let q = ex.gemm(cq.as_ref(), &w.q_b)?;
        let a = ex.gemm(x.as_ref(), &w.kv_a)?;
        // Cache row = [RMSNorm(latent) | raw k_pe].
        let c = ex.rms_norm(view(&a, &[t, lat], &[width, 1], 0), &w.kv_a_norm, eps)?;
        let mut row = ex.zeros(ACT, &[t, width])?;
        ex.copy(c.as_ref(), view_mut(&mut row, &[t, lat], &[width, 1], 0))?;
        ex.copy(view(&a, &[t, rope], &[width, 1], lat), view_mut(&mut row, &[t, rope], &[width, 1], lat))?;
        let dims = KvDims { latent: lat, rope };
        let cache = MlaPagedCache {
            dims,
            format: self.opts.kv_format,
            page_size: self.opts.page_size,
            num_pages: self.opts.num_pages,
            kv_scale: self.opts.kv_scale,
        };
        let wparams = MlaCacheWriteParams {
            dims,
            num_pages: self.opts.num_pages,
            page_size: self.opts.page_size,
            format: self.opts.kv_format,
            kv_scale: self.opts.kv_scale,
        };
        let wplan = kernel_api::ops::MlaCacheWrite::plan(self.b, &wparams, &MlaCacheWriteBatch { slot_mapping: s.slot_mapping.clone() })?;
        let wargs = MlaCacheWriteArgs { kv: row.as_ref(), slot_mapping: st.slot_mapping.as_ref(), cache: pool.as_mut() };
        kernel_api::ops::MlaCacheWrite::run(self.b, &wplan, wargs, None, self.b.default_stream())?;

        // Absorbed query: q_hat_h = W_UK^h^T q_nope_h, followed by q_pe_h.
        let mut q_abs = ex.zeros(ACT, &[t, h, width])?;
        for hh in 0..h {
            let qn = view(&q, &[t, nope], &[h * qk, 1], hh * qk);
            let qh = ex.gemm(qn, &w.w_uk_t[hh])?;
            ex.copy(qh.as_ref(), view_mut(&mut q_abs, &[t, lat], &[h * width, 1], hh * width))?;
            ex.copy(view(&q, &[t, rope], &[h * qk, 1], hh * qk + nope), view_mut(&mut q_abs, &[t, rope], &[h * width, 1], hh * width + lat))?;
        }
        let mut ctx = ex.zeros(ACT, &[t, h, lat])?;
        if s.decode {
            let params = MlaDecodeParams {
                cache,
                heads: h,
                q_len: 1,
                softmax_scale: m.softmax_scale(),
                variant: MlaDecodeVariant::Auto,
                splits: MlaSplitPolicy::Auto,
            };
            let batch = MlaDecodeBatch { seq_lens: &s.seq_lens, block_table: &s.block_table, max_pages_per_seq: s.max_pages };
            let plan = kernel_api::ops::MlaDecode::plan(self.b, &params, &batch)?;
            let mut shared = self.mla_decode.borrow_mut();
            // A layer whose plan differs (another cache geometry) prepares its own; its schedule
            // check would refuse the other's anyway.
            let d = match shared.take() {
                Some(d) if d.plan == plan => shared.insert(d),
                _ => {
                    let mut ws = self.b.alloc_zeroed(kernel_api::ops::MlaDecode::workspace_size(self.b, &plan))?;
                    let stream = self.b.default_stream();
                    let schedule = kernel_api::ops::MlaDecode::prepare_schedule(self.b, &plan, &st.seq_lens.as_ref(), Some(&mut ws), stream)?;
                    shared.insert(MlaStepDecode { plan, ws, schedule })
                }
            };
            let args = MlaDecodeArgs {
                q: view(&q_abs, &[t, 1, h, width], &[h * width, h * width, width, 1], 0),
                kv_cache: pool.as_ref(),
                block_table: st.block_table.as_ref(),
                seq_lens: st.seq_lens.as_ref(),
                out: view_mut(&mut ctx, &[t, 1, h, lat], &[h * lat, h * lat, lat, 1], 0),
                lse: None,
            };
            kernel_api::ops::MlaDecode::run_prepared(self.b, &d.plan, &d.schedule, args, Some(&mut d.ws), self.b.default_stream())?;
        } else {
            let cu32: Vec<i32> = s.cu_seqlens.iter().map(|&x| x as i32).collect();
            let params = MlaPrefillAbsorbedParams { cache, heads: h, softmax_scale: m.softmax_scale(), causal: true };
            let batch = MlaPrefillAbsorbedBatch {
                cu_seqlens_q: &cu32,
                seq_lens: &s.seq_lens,
                block_table: &s.block_table,
                max_pages_per_seq: s.max_pages,
            };
            let plan = kernel_api::ops::MlaPrefillAbsorbed::plan(self.b, &params, &batch)?;
            let ws_bytes = kernel_api::ops::MlaPrefillAbsorbed::workspace_size(self.b, &plan);
            let mut ws = self.b.alloc_zeroed(ws_bytes)?;
            let args = MlaPrefillAbsorbedArgs {
                q: q_abs.as_ref(),
                kv_cache: pool.as_ref(),
                cu_seqlens_q: st.cu_seqlens_i32.as_ref(),
                seq_lens: st.seq_lens.as_ref(),
                block_table: st.block_table.as_ref(),
                out: ctx.as_mut(),
                lse: None,
            };
            kernel_api::ops::MlaPrefillAbsorbed::run(self.b, &plan, args, Some(&mut ws), self.b.default_stream())?;
        }
        // o_h = W_UV^h c_hat_h, then the sigmoid output gate, then W_o.
        let mut o = ex.zeros(ACT, &[t, h * vd])?;
        for hh in 0..h {
            let oh = ex.gemm(view(&ctx, &[t, lat], &[h * lat, 1], hh * lat), &w.w_uv[hh])?;
            ex.copy(oh.as_ref(), view_mut(&mut o, &[t, vd], &[h * vd, 1], hh * vd))?;
        }
        let o = match &w.g {
            Some(g) => ex.sigmoid_gate(o.as_ref(), ex.gemm(x.as_ref(), g)?.as_ref())?,
            None => o,
        };
        ex.gemm(o.as_ref(), &w.o)
    }

    fn moe(&self, w: &MoeWeights<B>, x: &DeviceTensor<B>) -> Result<DeviceTensor<B>> {
        let mc = &self.cfg.moe;
        let cfg = LatentMoeConfig {
            hidden: self.cfg.hidden_size,
            latent: mc.latent_size,
            intermediate: mc.moe_intermediate_size,
            experts: mc.num_experts,
            top_k: mc.top_k,
            n_group: mc.num_expert_group,
            topk_group: mc.topk_group,
            renormalize: mc.renormalize,
            routed_scaling_factor: mc.routed_scaling_factor,
            situ_beta: self.cfg.situ_beta,
            situ_linear_beta: self.cfg.situ_linear_beta,
            norm_eps: self.cfg.rms_norm_eps,
            block_m: self.opts.moe_block_m,
            activation_quant: None,
            act_dtype: ACT,
        };
        fn experts<B: ModelBackend>(m: &ExpertMatrix<B>) -> ExpertWeights<'_, B> {
            match m {
                ExpertMatrix::Bf16(t) => ExpertWeights { weight: t.as_ref(), scale: None },
                ExpertMatrix::Mxfp4 { packed, scales } => ExpertWeights { weight: packed.as_ref(), scale: Some(scales.as_ref()) },
            }
        }
        let weights = LatentMoeWeights {
            router: w.router.as_ref(),
            bias: w.bias.as_ref(),
            latent_down: w.latent_down.as_ref(),
            latent_norm: w.latent_norm.as_ref().map(|n| n.as_ref()),
            latent_up: w.latent_up.as_ref(),
            shared: w.shared.as_ref().map(|s| SharedMlp { gate: s.gate.as_ref(), up: s.up.as_ref(), down: s.down.as_ref() }),
            w13: experts(&w.w13),
            w2: experts(&w.w2),
        };
        latent_moe_forward(self.b, &cfg, &weights, x.as_ref())
    }
}
