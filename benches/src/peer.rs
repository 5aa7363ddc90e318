//! Side-by-side runs against a peer implementation on identical inputs (`k3-peer`).
//!
//! A case directory holds `case.json` (`{"op": ..., "params": {...}}`) and
//! `inputs.safetensors`, written by the Python side (`benches/peer/`), which also runs the peer
//! (FLA on a GPU, PyTorch eager on the CPU) on the same file. This side uploads the inputs,
//! runs the op once on them and writes its outputs (`k3.safetensors`: pure outputs and the
//! in-place tensors after that one run), then times `iters` further runs after `warmup` ones
//! (device events on GPU backends, the wall clock around a synchronised run on the CPU) and
//! writes `k3.json` (`{"us": median, "times_us": [...], "backend", "device", "bytes",
//! "flops"}`). In-place state keeps evolving during the timed runs; the work per run does not.
//!
//! Ops and tensor names (shapes as the op contracts give them; dims come from the shapes):
//! - `kda_prefill`: q, k, g_raw `[T,H,K]`, v `[T,H,V]`, beta `[T,H]`, a_log `[A]`, dt_bias
//!   `[H·K]`, cu_seqlens `[N+1]` i64, state `[N,H,K,V]` f32 (slot n = sequence n, read and
//!   written) -> out, state. Params: `lower_bound` (-5), `chunk_size` (64), `state_layout`
//!   (`k_major` | `v_major`).
//! - `kda_decode`: x_qkv `[B,3·H·K]`, conv_weight `[3·H·K,W]`, conv_state `[S,3·H·K,W-1]`,
//!   g_raw `[B,H,K]`, beta `[B,H]`, a_log, dt_bias, state_indices `[B]` i32, state
//!   `[S,H,K,V]`, optional output_gate `[B,H,V]` + norm_weight `[V]` (gated RMSNorm, eps
//!   `norm_eps`) -> out, state, conv_state. Params: `lower_bound`.
//! - `mla_decode`: q `[B,L,H,576]`, kv_cache `[P,page,576]` bf16, block_table `[B,pages]` i32,
//!   seq_lens `[B]` i32 -> out `[B,L,H,512]`, lse. Params: `softmax_scale` (1/√192).
//! - `moe`: the routed path router -> align -> gate/up (SiTU) -> down -> combine on x `[T,D]`
//!   with router_weight `[E,D]`, bias `[E]` f32 and MXFP4 experts w13 `[E,2N,D/2]` + s13
//!   `[E,2N,D/32]`, w2 `[E,D,N/2]` + s2 `[E,D,N/32]` (u8) -> out `[T,D]`, topk_ids,
//!   topk_weights. Params: `top_k`, `beta` (4), `linear_beta` (25).
//! - `gemm`: x `[M,K]`, w `[N,K]` -> out `[M,N]`.

use crate::calls::{experts_touched, moe_call, total, KdaDecodeCall, KdaPrefillCall, MlaDecodeCall, MoeCall, MoeInputs, MoePlans};
use k3_kernels::{GpuBackend, Runtime};
use kernel_api::conformance::AllOps;
use kernel_api::cost::Cost;
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::*;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, Error, HostTensor, Result};
use model_k3::op_cli::{read_safetensors, write_safetensors, StoredTensor};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Times a closure on a backend: `warmup` untimed runs, then one time per run in µs.
pub trait Timer: Backend {
    fn time_us(&self, warmup: usize, iters: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<Vec<f64>>;
}

impl Timer for CpuBackend {
    fn time_us(&self, warmup: usize, iters: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<Vec<f64>> {
        for _ in 0..warmup {
            f()?;
        }
        let s = self.default_stream();
        (0..iters)
            .map(|_| {
                let t = Instant::now();
                f()?;
                self.synchronize(s)?;
                Ok(t.elapsed().as_secs_f64() * 1e6)
            })
            .collect()
    }
}

impl<R: Runtime> Timer for GpuBackend<R> {
    fn time_us(&self, warmup: usize, iters: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<Vec<f64>> {
        let rt = self.runtime();
        let s = rt.default_stream();
        for _ in 0..warmup {
            f()?;
        }
        let (e0, e1) = (rt.create_event()?, rt.create_event()?);
        (0..iters)
            .map(|_| {
                rt.record_event(&e0, s)?;
                f()?;
                rt.record_event(&e1, s)?;
                rt.synchronize_event(&e1)?;
                Ok(rt.elapsed_ms(&e0, &e1)? as f64 * 1e3)
            })
            .collect()
    }
}

/// One case directory, read.
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    pub op: String,
    pub params: Value,
    pub inputs: BTreeMap<String, StoredTensor>,
}

fn file_err(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::invalid("--dir", format!("{}: {why}", path.display()))
}

impl Case {
    pub fn read(dir: &Path) -> Result<Case> {
        let meta = dir.join("case.json");
        let text = std::fs::read_to_string(&meta).map_err(|e| file_err(&meta, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| file_err(&meta, e))?;
        let op = v["op"].as_str().ok_or_else(|| file_err(&meta, "no string `op`"))?.to_string();
        let inputs = read_safetensors(&dir.join("inputs.safetensors")).map_err(|e| file_err(&dir.join("inputs.safetensors"), e))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Case { name, dir: dir.to_path_buf(), op, params: v["params"].clone(), inputs })
    }

    fn host(&self, name: &str) -> Result<&HostTensor> {
        self.inputs.get(name).map(|s| &s.tensor).ok_or_else(|| Error::invalid(name, format!("case {}: missing from inputs.safetensors", self.name)))
    }

    fn dims<const N: usize>(&self, name: &str) -> Result<[usize; N]> {
        let t = self.host(name)?;
        t.shape.as_slice().try_into().map_err(|_| Error::invalid(name, format!("case {}: expected {N} dims, got {:?}", self.name, t.shape)))
    }

    fn f32_param(&self, key: &str, default: f32) -> f32 {
        self.params[key].as_f64().map_or(default, |v| v as f32)
    }

    fn usize_param(&self, key: &str, default: usize) -> usize {
        self.params[key].as_u64().map_or(default, |v| v as usize)
    }
}

/// Named output tensors.
pub type Outputs = Vec<(String, HostTensor)>;

/// What a case run produced.
pub struct CaseResult {
    /// Outputs after the first run, with the safetensors dtype in-place tensors came with.
    pub outputs: Outputs,
    pub times_us: Vec<f64>,
    pub cost: Cost,
}

fn up<B: Backend + BackendExt>(b: &B, c: &Case, name: &str) -> Result<DeviceTensor<B>> {
    b.upload_tensor(c.host(name)?)
}

/// Runs `run` once on the mutable tensors `m` and reads the outputs with `read`, then times
/// `warmup` + `iters` more runs.
fn once_then_time<B: Timer, M>(
    b: &B,
    m: &mut M,
    mut run: impl FnMut(&mut M) -> Result<()>,
    read: impl FnOnce(&M) -> Result<Outputs>,
    warmup: usize,
    iters: usize,
) -> Result<(Outputs, Vec<f64>)> {
    run(m)?;
    b.synchronize(b.default_stream())?;
    let outputs = read(m)?;
    let times = b.time_us(warmup, iters, &mut || run(m))?;
    Ok((outputs, times))
}

/// Runs one case: once for the outputs, then `warmup` + `iters` timed runs.
pub fn run_case<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    match c.op.as_str() {
        "kda_prefill" => kda_prefill(b, c, warmup, iters),
        "kda_decode" => kda_decode(b, c, warmup, iters),
        "mla_decode" => mla_decode(b, c, warmup, iters),
        "moe" => moe(b, c, warmup, iters),
        "gemm" => gemm(b, c, warmup, iters),
        other => Err(Error::invalid("op", format!("case {}: unknown op `{other}` (kda_prefill, kda_decode, mla_decode, moe, gemm)", c.name))),
    }
}

fn layout_param(c: &Case) -> Result<KdaStateLayout> {
    match c.params["state_layout"].as_str().unwrap_or("k_major") {
        "k_major" => Ok(KdaStateLayout::KMajor),
        "v_major" => Ok(KdaStateLayout::VMajor),
        o => Err(Error::invalid("params.state_layout", format!("`{o}` (k_major or v_major)"))),
    }
}

fn kda_prefill<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    let [t, h, k] = c.dims("q")?;
    let [_, _, v] = c.dims("v")?;
    let cu = c.host("cu_seqlens")?.to_i64();
    let n = cu.len().saturating_sub(1);
    let mut p = KdaPrefillParams::k3_defaults(h, k, v);
    p.a_log_len = c.dims::<1>("a_log")?[0];
    p.gate = KdaGateMode::LowerBound { lower_bound: c.f32_param("lower_bound", -5.0) };
    p.chunk_size = c.usize_param("chunk_size", 64);
    p.state_layout = layout_param(c)?;
    p.state_slots = n;
    p.read_initial_state = true;
    p.write_final_state = true;
    let plan = KdaPrefill::plan(b, &p, &KdaPrefillBatch { cu_seqlens: &cu, state_indices: None, checkpoints: None })?;
    let io = c.host("q")?.dtype;
    let mut call = KdaPrefillCall {
        q: up(b, c, "q")?,
        k: up(b, c, "k")?,
        v: up(b, c, "v")?,
        g_raw: up(b, c, "g_raw")?,
        beta: up(b, c, "beta")?,
        a_log: up(b, c, "a_log")?,
        dt_bias: up(b, c, "dt_bias")?,
        cu_seqlens: up(b, c, "cu_seqlens")?,
        state: up(b, c, "state")?,
        out: b.zeros(io, &[t, h, v])?,
        ws: b.workspace(KdaPrefill::workspace_size(b, &plan))?,
    };
    let read = |call: &KdaPrefillCall<B>| Ok(vec![("out".into(), b.download_tensor(&call.out)?), ("state".into(), b.download_tensor(&call.state)?)]);
    let (outputs, times_us) = once_then_time(b, &mut call, |call| call.run(b, &plan), read, warmup, iters)?;
    Ok(CaseResult { outputs, times_us, cost: p.cost(t, n, io, c.host("state")?.dtype)? })
}

fn kda_decode<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    let [batch, h, k] = c.dims("g_raw")?;
    let [slots, _, _, _] = c.dims("state")?;
    let [_, w] = c.dims("conv_weight")?;
    let layout = layout_param(c)?;
    let v = match layout {
        KdaStateLayout::KMajor => c.dims::<4>("state")?[3],
        KdaStateLayout::VMajor => c.dims::<4>("state")?[2],
    };
    let gated = c.inputs.contains_key("output_gate");
    let p = KdaDecodeParams {
        batch,
        heads: h,
        head_k: k,
        head_v: v,
        conv_width: w,
        state_slots: slots,
        state_layout: layout,
        gate: KdaGateMode::LowerBound { lower_bound: c.f32_param("lower_bound", -5.0) },
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: if gated { KdaOutputNorm::GatedRmsNorm { eps: c.f32_param("norm_eps", 1e-5) } } else { KdaOutputNorm::None },
    };
    let idx: Vec<i32> = c.host("state_indices")?.to_i64().into_iter().map(|i| i as i32).collect();
    let plan = KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: &idx })?;
    let io = c.host("x_qkv")?.dtype;
    let norm = if gated { Some((up(b, c, "output_gate")?, up(b, c, "norm_weight")?)) } else { None };
    let mut call = KdaDecodeCall {
        x_qkv: up(b, c, "x_qkv")?,
        conv_weight: up(b, c, "conv_weight")?,
        conv_state: up(b, c, "conv_state")?,
        g_raw: up(b, c, "g_raw")?,
        beta: up(b, c, "beta")?,
        a_log: up(b, c, "a_log")?,
        dt_bias: up(b, c, "dt_bias")?,
        state_indices: up(b, c, "state_indices")?,
        state: up(b, c, "state")?,
        norm,
        out: b.zeros(io, &[batch, h, v])?,
        ws: b.workspace(KdaDecode::workspace_size(b, &plan))?,
    };
    let read = |call: &KdaDecodeCall<B>| {
        Ok(vec![
            ("out".into(), b.download_tensor(&call.out)?),
            ("state".into(), b.download_tensor(&call.state)?),
            ("conv_state".into(), b.download_tensor(&call.conv_state)?),
        ])
    };
    let (outputs, times_us) = once_then_time(b, &mut call, |call| call.run(b, &plan), read, warmup, iters)?;
    let cost = p.cost(io, c.host("conv_state")?.dtype, c.host("state")?.dtype)?;
    Ok(CaseResult { outputs, times_us, cost })
}

fn mla_decode<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    let [batch, q_len, h, width] = c.dims("q")?;
    let [pages, page, _] = c.dims("kv_cache")?;
    let [_, per_seq] = c.dims("block_table")?;
    let rope = c.usize_param("rope", 64);
    let dims = KvDims { latent: width.saturating_sub(rope), rope };
    let cache = MlaPagedCache { dims, format: KvCacheFormat::Bf16, page_size: page, num_pages: pages, kv_scale: 1.0 };
    let p = MlaDecodeParams {
        cache,
        heads: h,
        q_len,
        softmax_scale: c.f32_param("softmax_scale", mla_decode::K3_SOFTMAX_SCALE),
        variant: MlaDecodeVariant::Auto,
        splits: MlaSplitPolicy::Auto,
    };
    let lens: Vec<i32> = c.host("seq_lens")?.to_i64().into_iter().map(|v| v as i32).collect();
    let table: Vec<i32> = c.host("block_table")?.to_i64().into_iter().map(|v| v as i32).collect();
    let plan = MlaDecode::plan(b, &p, &MlaDecodeBatch { seq_lens: &lens, block_table: &table, max_pages_per_seq: per_seq })?;
    let io = c.host("q")?.dtype;
    let mut call = MlaDecodeCall {
        q: up(b, c, "q")?,
        kv_cache: up(b, c, "kv_cache")?,
        block_table: up(b, c, "block_table")?,
        seq_lens: up(b, c, "seq_lens")?,
        out: b.zeros(io, &[batch, q_len, h, dims.latent])?,
        lse: b.zeros(DType::F32, &[batch, q_len, h])?,
        ws: b.workspace(MlaDecode::workspace_size(b, &plan))?,
    };
    let read = |call: &MlaDecodeCall<B>| Ok(vec![("out".into(), b.download_tensor(&call.out)?), ("lse".into(), b.download_tensor(&call.lse)?)]);
    let (outputs, times_us) = once_then_time(b, &mut call, |call| call.run(b, &plan), read, warmup, iters)?;
    let kv_tokens = lens.iter().map(|&l| l.max(0) as u64).sum();
    Ok(CaseResult { outputs, times_us, cost: p.cost(batch, kv_tokens, io, io)? })
}

fn moe<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    let [t, d] = c.dims("x")?;
    let [e, two_n, _] = c.dims("w13")?;
    let top_k = c.usize_param("top_k", 2);
    let plans = MoePlans::new(b, t, d, d, two_n / 2, e, top_k, c.f32_param("beta", 4.0), Some(c.f32_param("linear_beta", 25.0)))?;
    let io = c.host("x")?.dtype;
    let inputs = MoeInputs {
        x: up(b, c, "x")?,
        z: None,
        router_weight: up(b, c, "router_weight")?,
        bias: up(b, c, "bias")?,
        w13: up(b, c, "w13")?,
        s13: up(b, c, "s13")?,
        w2: up(b, c, "w2")?,
        s2: up(b, c, "s2")?,
    };
    let mut call = moe_call(b, &plans, inputs, io)?;
    let read = |m: &MoeCall<B>| {
        Ok(vec![
            ("out".into(), b.download_tensor(&m.out)?),
            ("topk_ids".into(), b.download_tensor(&m.topk_ids)?),
            ("topk_weights".into(), b.download_tensor(&m.topk_weights)?),
        ])
    };
    let (outputs, times_us) = once_then_time(b, &mut call, |m| m.run(b, &plans), read, warmup, iters)?;
    let touched = experts_touched(&outputs[1].1, e);
    let cost = total(&plans.costs(touched, io, c.host("router_weight")?.dtype)?)?;
    Ok(CaseResult { outputs, times_us, cost })
}

fn gemm<B: AllOps + Timer>(b: &B, c: &Case, warmup: usize, iters: usize) -> Result<CaseResult> {
    let [m, k] = c.dims("x")?;
    let [n, _] = c.dims("w")?;
    let (xd, wd) = (c.host("x")?.dtype, c.host("w")?.dtype);
    let p = GemmParams::new(m, n, k, xd, wd, xd);
    let plan = Gemm::plan(b, &p)?;
    let (x, w) = (up(b, c, "x")?, up(b, c, "w")?);
    let mut bufs = (b.zeros(xd, &[m, n])?, b.workspace(Gemm::workspace_size(b, &plan))?);
    let run = |(out, ws): &mut (DeviceTensor<B>, Option<B::Buffer>)| Gemm::run(b, &plan, GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() }, ws.as_mut(), b.default_stream());
    let read = |(out, _): &(DeviceTensor<B>, Option<B::Buffer>)| Ok(vec![("out".into(), b.download_tensor(out)?)]);
    let (outputs, times_us) = once_then_time(b, &mut bufs, run, read, warmup, iters)?;
    Ok(CaseResult { outputs, times_us, cost: p.cost()? })
}

/// Median of the times (µs).
pub fn median(times: &[f64]) -> f64 {
    let mut t = times.to_vec();
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs every case directory under `dir` (or only `only`), writing `k3.safetensors` and
/// `k3.json` into each; returns one summary line per case. A failing case is reported in its
/// `k3.json` (`"error"`) and the run goes on.
pub fn run_dir<B: AllOps + Timer>(b: &B, dir: &Path, warmup: usize, iters: usize, only: Option<&str>) -> Result<Vec<String>> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| file_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.json").is_file())
        .collect();
    cases.sort();
    if cases.is_empty() {
        return Err(file_err(dir, "holds no case directories (each needs a case.json)"));
    }
    let mut lines = Vec::new();
    for path in cases {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let res = Case::read(&path).and_then(|c| run_case(b, &c, warmup, iters).map(|r| (c, r)));
        let (report, line) = match res {
            Ok((c, r)) => {
                let tensors: Vec<_> = r.outputs.iter().map(|(n, t)| (n.clone(), t.clone(), c.inputs.get(n).map(|s| s.stored_as))).collect();
                write_safetensors(&path.join("k3.safetensors"), &c.op, &tensors).map_err(|e| file_err(&path, e))?;
                let us = median(&r.times_us);
                let line = format!("{name}: {} {:.1} µs (median of {})", c.op, us, r.times_us.len());
                (json!({"op": c.op, "us": us, "times_us": r.times_us, "backend": b.name(), "device": b.device_info().name, "bytes": r.cost.bytes, "flops": r.cost.total_flops()}), line)
            }
            Err(e) => (json!({"error": e.to_string(), "backend": b.name()}), format!("{name}: FAILED: {e}")),
        };
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path.join("k3.json"), text).map_err(|e| file_err(&path, e))?;
        lines.push(line);
    }
    Ok(lines)
}
