//! `k3-device-bench`: the K3 hot ops at production per-GPU shapes, timed with device events.
//!
//! ```text
//! k3-device-bench --backend cuda|rocm|simt32|simt64 [--smoke] [--json FILE | --out FILE]
//!                 [--warmup N] [--iters N] [--copy-gbs GB/S] [--hardware PART]
//!                 [--device-checks on|off|both]
//! k3-device-bench --table FILE [--hardware PART]     # the table of a report, floors recomputed
//! ```
//!
//! Ops (each through its trait's `plan` / `workspace_size` / `run`, as the conformance tests do):
//! KDA chunked prefill (1×8192 and 8×1024 tokens), fused KDA decode (batch 1, 64, 1024), absorbed
//! MLA decode (batch 1/16/64 at context 8k and 64k, bf16 and fp8-tiled caches), each at 12 and 96
//! heads (96 = the whole model, 12 = one GPU of TP8); the latent MoE's routed path (router,
//! align, MXFP4 grouped GEMMs gate-up and down, combine; 896 experts, top 16, latent 3584, expert
//! width 384 = 3072 / TP8) at 1, 64 and 1024 tokens, per stage and in total, the two GEMMs again
//! on f32 activations (model-k3's dtypes) beside them, and past 8 tokens
//! the router on the model's f32 x once per logits path (matrix units, CUDA cores); the bf16 dense GEMM
//! of the latent down/up projections and the per-GPU KDA projections at 1, 64 and 1024 tokens,
//! once per GEMM route of the backend (CUDA: cuBLASLt and the dialect's kernel; ROCm: hipBLASLt
//! and the dialect's kernel). The MLA fp8 cache is tiled in the device's own flavour (e4m3fnuz on
//! gfx942). `--smoke` scales
//! every shape down (heads 2, context 64, 8 experts) so the SIMT emulator finishes in seconds.
//!
//! Timing: `warmup` untimed runs, then `iters` runs each bracketed by two events on the default
//! stream (`Runtime::record_event` / `elapsed_ms`); the row reports the median.
//!
//! Bytes and FLOPs of a row are the op's own speed-of-light cost (`cost` on its params in
//! kernel-api, the model `k3 plan` uses too; counting rules in `kernel_api::cost`): what the op
//! must move at least (each tensor once; the MoE GEMMs count the experts the router actually
//! picked, read back from the device's `topk_ids`) and the FLOPs it must do, by math class.
//! Floors: each row's `floor_us` on the part the bench ran on (`kernel_api::hardware`, matched
//! from the device name, or `--hardware`) and `pct_floor` = floor / time (100 = speed of light).
//!
//! Bandwidth reference: `--copy-gbs` (bytes copied per second, as `copy_bandwidth` prints
//! `d2d_copy_gbs`), else measured here by a D2D copy (`Runtime::copy_d2d`, 1 GiB on a GPU). A row's
//! `pct_copy` is its `gbs` over the copy's traffic rate (2 × bytes copied per second, since a copy
//! reads and writes every byte).
//!
//! Device checks (`--device-checks`, default `on`; `k3_kernels::device_checks`): the ops whose
//! kernels bound-check device metadata (KDA prefill and decode, MLA decode, the MoE align and
//! grouped GEMMs) run with the checks on, off, or `both` (each case twice, a row pair whose
//! `device_checks` field says which); the other rows run with the checks on.
//!
//! Output: `{"schema": "k3-device-bench/1", ..., "hardware": {id, name, source}, "rows": [{op,
//! shape, dtype, us, tflops, gbs, bytes, flops, flops_by_class, pct_copy, floor_us, pct_floor,
//! bound, device_checks}]}` to the JSON file, and a table on stdout.

use k3_benches::calls::{experts_touched, moe_call, total, KdaDecodeCall, KdaPrefillCall, MlaDecodeCall, MoeCall, MoeInputs, MoePlans};
use k3_benches::sol;
use k3_kernels::{DeviceChecks, GpuBackend, Runtime};
use kernel_api::cost::Cost;
use kernel_api::hardware::Hardware;
use kernel_api::conformance::TestRng;
use kernel_api::ops::kv_cache::encode_token;
use kernel_api::ops::mla_decode::K3_SOFTMAX_SCALE;
use kernel_api::ops::*;
use kernel_api::tensor::encode_f32;
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, Error, HostTensor, Layout, Result};
use serde_json::{json, Value};
use std::path::PathBuf;

struct Opts {
    backend: String,
    smoke: bool,
    json: Option<PathBuf>,
    warmup: usize,
    iters: usize,
    copy_gbs: Option<f64>,
    hardware: Option<String>,
    table: Option<PathBuf>,
    /// Check modes the checked cases run under, in order.
    device_checks: Vec<DeviceChecks>,
}

fn usage() -> String {
    "usage: k3-device-bench --backend cuda|rocm|simt32|simt64 [--smoke] [--json FILE | --out FILE] [--warmup N] [--iters N] [--copy-gbs GB/S] [--hardware PART] [--device-checks on|off|both]\n       k3-device-bench --table FILE [--hardware PART]".into()
}

fn parse_args() -> std::result::Result<Opts, String> {
    let mut o = Opts {
        backend: String::new(),
        smoke: false,
        json: None,
        warmup: 0,
        iters: 0,
        copy_gbs: None,
        hardware: None,
        table: None,
        device_checks: vec![DeviceChecks::On],
    };
    let (mut warmup, mut iters) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{}", usage()));
        match a.as_str() {
            "--backend" => o.backend = val("--backend")?,
            "--smoke" => o.smoke = true,
            "--json" | "--out" => o.json = Some(PathBuf::from(val(&a)?)),
            "--warmup" => warmup = Some(val("--warmup")?.parse::<usize>().map_err(|e| format!("--warmup: {e}"))?),
            "--iters" => iters = Some(val("--iters")?.parse::<usize>().map_err(|e| format!("--iters: {e}"))?),
            "--copy-gbs" => {
                let v: f64 = val("--copy-gbs")?.parse().map_err(|e| format!("--copy-gbs: {e}"))?;
                if !(v.is_finite() && v > 0.0) {
                    return Err("--copy-gbs must be positive".into());
                }
                o.copy_gbs = Some(v)
            }
            "--hardware" => o.hardware = Some(val("--hardware")?),
            "--table" => o.table = Some(PathBuf::from(val("--table")?)),
            "--device-checks" => {
                o.device_checks = match val("--device-checks")?.as_str() {
                    "on" => vec![DeviceChecks::On],
                    "off" => vec![DeviceChecks::Off],
                    "both" => vec![DeviceChecks::On, DeviceChecks::Off],
                    other => return Err(format!("--device-checks: {other} (expected on, off or both)")),
                }
            }
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    if o.backend.is_empty() && o.table.is_none() {
        return Err(format!("--backend (or --table) is required\n{}", usage()));
    }
    o.warmup = warmup.unwrap_or(if o.smoke { 1 } else { 3 });
    o.iters = iters.unwrap_or(if o.smoke { 3 } else { 10 }).max(1);
    Ok(o)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let res = match o.backend.as_str() {
        _ if o.table.is_some() => print_table(&o),
        "simt32" | "simt64" => {
            let warp = if o.backend == "simt32" { 32 } else { 64 };
            k3_backend_simt::simt_backend(warp).and_then(|b| bench(&b, &o, &[("kernels", &|| ())]))
        }
        "cuda" => cuda(&o),
        "rocm" => rocm(&o),
        other => Err(Error::invalid("--backend", format!("{other} (expected cuda, rocm, simt32 or simt64)"))),
    };
    if let Err(e) = res {
        eprintln!("k3-device-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda")]
fn cuda(o: &Opts) -> Result<()> {
    use k3_backend_cuda::GemmRoute;
    let b = k3_backend_cuda::cuda_backend(0)?;
    let rt = b.runtime();
    let initial = rt.gemm_route();
    let routes: [(&str, &dyn Fn()); 2] =
        [("cublaslt", &|| rt.set_gemm_route(GemmRoute::BlasLt)), ("kernels", &|| rt.set_gemm_route(GemmRoute::Kernels))];
    let res = bench(&b, o, &routes);
    rt.set_gemm_route(initial);
    res
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &Opts) -> Result<()> {
    Err(Error::invalid("--backend", "cuda: this binary was built without the `cuda` feature of k3-benches"))
}

#[cfg(feature = "rocm")]
fn rocm(o: &Opts) -> Result<()> {
    use k3_backend_rocm::GemmRoute;
    let b = k3_backend_rocm::rocm_backend(0)?;
    let rt = b.runtime();
    let initial = rt.gemm_route();
    let routes: [(&str, &dyn Fn()); 2] =
        [("hipblaslt", &|| rt.set_gemm_route(GemmRoute::HipBlasLt)), ("kernels", &|| rt.set_gemm_route(GemmRoute::Kernels))];
    let res = bench(&b, o, &routes);
    rt.set_gemm_route(initial);
    res
}

#[cfg(not(feature = "rocm"))]
fn rocm(_: &Opts) -> Result<()> {
    Err(Error::invalid("--backend", "rocm: this binary was built without the `rocm` feature of k3-benches"))
}

type Dev<R> = DeviceTensor<GpuBackend<R>>;
/// One stage of the routed MoE path (`MoeCall::router`, ...).
type MoeStage<R> = fn(&mut MoeCall<GpuBackend<R>>, &GpuBackend<R>, &MoePlans) -> Result<()>;

/// `--table FILE`: prints a report's table (floors recomputed for `--hardware` when given).
fn print_table(o: &Opts) -> Result<()> {
    let path = o.table.as_deref().unwrap_or(std::path::Path::new(""));
    let text = std::fs::read_to_string(path).map_err(|e| Error::invalid("--table", format!("{}: {e}", path.display())))?;
    let report: Value = serde_json::from_str(&text).map_err(|e| Error::invalid("--table", format!("{}: not JSON: {e}", path.display())))?;
    if report["schema"] != "k3-device-bench/1" {
        return Err(Error::invalid("--table", format!("{}: not a k3-device-bench/1 report", path.display())));
    }
    let hw = o.hardware.as_deref().map(|id| kernel_api::hardware::by_id(id, "--hardware")).transpose()?;
    print!("{}", sol::table(&report, hw));
    Ok(())
}

/// One result row.
struct Row {
    op: String,
    shape: String,
    dtype: String,
    us: f64,
    cost: Cost,
    /// The backend's device-check mode when the row was timed.
    checks: DeviceChecks,
}

/// Everything a case needs: the backend, timing settings, the rows so far.
struct Bench<'a, R: Runtime> {
    b: &'a GpuBackend<R>,
    warmup: usize,
    iters: usize,
    rows: Vec<Row>,
}

impl<R: Runtime> Bench<'_, R> {
    /// Median device time of `f` in µs.
    fn time(&self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let rt = self.b.runtime();
        let s = rt.default_stream();
        for _ in 0..self.warmup {
            f()?;
        }
        let (e0, e1) = (rt.create_event()?, rt.create_event()?);
        let mut t = Vec::with_capacity(self.iters);
        for _ in 0..self.iters {
            rt.record_event(&e0, s)?;
            f()?;
            rt.record_event(&e1, s)?;
            rt.synchronize_event(&e1)?;
            t.push(rt.elapsed_ms(&e0, &e1)? as f64 * 1e3);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    }

    fn push(&mut self, op: &str, shape: String, dtype: &str, us: f64, cost: Result<Cost>) -> Result<()> {
        self.rows.push(Row { op: op.into(), shape, dtype: dtype.into(), us, cost: cost?, checks: self.b.device_checks() });
        Ok(())
    }
}

// ---- inputs ---------------------------------------------------------------------------------

/// Largest host pattern uploaded per tensor; bigger tensors repeat it on the device (D2D copies),
/// so multi-GiB state pools and caches cost no host time.
const PATTERN_BYTES: usize = 4 << 20;

/// A device tensor whose bytes repeat `pattern` (a whole number of elements).
fn tiled<R: Runtime>(b: &GpuBackend<R>, dtype: DType, shape: &[usize], pattern: &[u8]) -> Result<Dev<R>> {
    let layout = Layout::contiguous(dtype, shape);
    let total = layout.span_bytes().ok_or_else(|| Error::invalid("shape", "size overflows"))?;
    if total <= pattern.len() {
        let bytes = pattern[..total].to_vec();
        return b.upload_tensor(&HostTensor::from_bytes(dtype, shape, bytes)?);
    }
    // Repeat a small pattern (one cache page) up to ~PATTERN_BYTES so big tensors take few copies.
    let reps = (PATTERN_BYTES / pattern.len().max(1)).max(1).min(total.div_ceil(pattern.len().max(1)));
    let pattern = pattern.repeat(reps);
    let src = b.upload(&pattern)?;
    let mut buf = b.alloc_zeroed(total)?;
    let rt = b.runtime();
    let mut off = 0;
    while off < total {
        let n = pattern.len().min(total - off);
        rt.copy_d2d(&src, 0, &mut buf, off, n, rt.default_stream())?;
        off += n;
    }
    b.synchronize(b.default_stream())?;
    Ok(DeviceTensor { buf, layout })
}

/// N(0, std²) values stored as `dtype` (f32 / bf16).
fn normal<R: Runtime>(b: &GpuBackend<R>, dtype: DType, shape: &[usize], std: f32, seed: u64) -> Result<Dev<R>> {
    let n: usize = shape.iter().product();
    let es = dtype.size_bytes();
    let m = n.min(PATTERN_BYTES / es).max(1);
    let mut bytes = vec![0u8; m * es];
    for (v, out) in TestRng::new(seed).normals(m, std).into_iter().zip(bytes.chunks_mut(es)) {
        encode_f32(dtype, v, out);
    }
    tiled(b, dtype, shape, &bytes)
}

/// Bytes from `gen` (u8 tensors: MXFP4 codes and scales).
fn bytes_of<R: Runtime>(b: &GpuBackend<R>, shape: &[usize], mut gen: impl FnMut() -> u8) -> Result<Dev<R>> {
    let n: usize = shape.iter().product();
    let pattern: Vec<u8> = (0..n.clamp(1, PATTERN_BYTES)).map(|_| gen()).collect();
    tiled(b, DType::U8, shape, &pattern)
}

fn i32s<R: Runtime>(b: &GpuBackend<R>, shape: &[usize], v: &[i32]) -> Result<Dev<R>> {
    b.upload_tensor(&HostTensor::from_i32(shape, v)?)
}

/// A random permutation of `0..n` (+ `base`).
fn permutation(n: usize, base: i32, rng: &mut TestRng) -> Vec<i32> {
    let mut v: Vec<i32> = (0..n as i32).map(|i| i + base).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

fn ws<R: Runtime>(b: &GpuBackend<R>, bytes: usize) -> Result<Option<R::Buffer>> {
    b.workspace(bytes)
}

// ---- shapes ---------------------------------------------------------------------------------

struct Shapes {
    heads: Vec<usize>,
    kda_dim: usize,
    /// (sequences, tokens per sequence)
    kda_prefill: Vec<(usize, usize)>,
    kda_decode: Vec<usize>,
    mla_batch: Vec<usize>,
    mla_ctx: Vec<usize>,
    /// KV pipeline depths timed side by side (warp-32 devices: fp8 tiled cache, batch 1, the
    /// longest context, first head count).
    mla_kv_stages: Vec<usize>,
    /// (hidden, latent, expert width, experts, top_k)
    moe: (usize, usize, usize, usize, usize),
    moe_tokens: Vec<usize>,
    /// Dense projections (N, K, what) and their token counts M.
    gemm: Vec<(usize, usize, &'static str)>,
    gemm_tokens: Vec<usize>,
    copy_bytes: usize,
}

fn shapes(smoke: bool) -> Shapes {
    if smoke {
        Shapes {
            heads: vec![2],
            kda_dim: 32,
            kda_prefill: vec![(1, 64), (2, 32)],
            kda_decode: vec![1, 4],
            mla_batch: vec![1, 2],
            mla_ctx: vec![64],
            mla_kv_stages: vec![2, 3],
            moe: (64, 64, 32, 8, 2),
            moe_tokens: vec![1, 12],
            gemm: vec![(64, 128, "down"), (128, 64, "up")],
            gemm_tokens: vec![1, 8],
            copy_bytes: 1 << 20,
        }
    } else {
        Shapes {
            heads: vec![12, 96],
            kda_dim: 128,
            kda_prefill: vec![(1, 8192), (8, 1024)],
            kda_decode: vec![1, 64, 1024],
            mla_batch: vec![1, 16, 64],
            mla_ctx: vec![8192, 65536],
            mla_kv_stages: vec![2, 3, 4, 5, 6, 7],
            moe: (7168, 3584, 384, 896, 16),
            moe_tokens: vec![1, 64, 1024],
            gemm: vec![
                (3584, 7168, "latent down 7168->3584"),
                (7168, 3584, "latent up 3584->7168"),
                (1536, 7168, "KDA q/k/v per GPU at TP8 (12 heads x 128)"),
                (7168, 1536, "KDA o_proj per GPU at TP8"),
            ],
            gemm_tokens: vec![1, 64, 1024],
            copy_bytes: 1 << 30,
        }
    }
}

// ---- cases ----------------------------------------------------------------------------------

fn kda_prefill<R: Runtime>(c: &mut Bench<'_, R>, heads: usize, kd: usize, seqs: usize, len: usize) -> Result<()> {
    let b = c.b;
    let t = seqs * len;
    let mut p = KdaPrefillParams::k3_defaults(heads, kd, kd);
    p.state_slots = seqs;
    p.read_initial_state = true;
    p.write_final_state = true;
    let cu: Vec<i64> = (0..=seqs as i64).map(|i| i * len as i64).collect();
    let batch = KdaPrefillBatch { cu_seqlens: &cu, state_indices: None, checkpoints: None };
    let plan = KdaPrefill::plan(b, &p, &batch)?;
    let bf = DType::BF16;
    let mut call = KdaPrefillCall {
        q: normal(b, bf, &[t, heads, kd], 1.0, 1)?,
        k: normal(b, bf, &[t, heads, kd], 1.0, 2)?,
        v: normal(b, bf, &[t, heads, kd], 1.0, 3)?,
        g_raw: normal(b, bf, &[t, heads, kd], 1.0, 4)?,
        beta: normal(b, bf, &[t, heads], 1.0, 5)?,
        a_log: normal(b, DType::F32, &[heads], 0.5, 6)?,
        dt_bias: normal(b, DType::F32, &[heads * kd], 0.5, 7)?,
        cu_seqlens: b.upload_tensor(&HostTensor::from_i64(&[seqs + 1], &cu)?)?,
        state: normal(b, DType::F32, &[seqs, heads, kd, kd], 0.05, 8)?,
        out: b.zeros(bf, &[t, heads, kd])?,
        ws: ws(b, KdaPrefill::workspace_size(b, &plan))?,
    };
    let us = c.time(|| call.run(b, &plan))?;
    c.push("kda_prefill", format!("seqs={seqs} len={len} heads={heads} K=V={kd}"), "bf16 io, f32 state", us, p.cost(t, seqs, bf, DType::F32))
}

fn kda_decode<R: Runtime>(c: &mut Bench<'_, R>, heads: usize, kd: usize, batch: usize) -> Result<()> {
    let b = c.b;
    let (w_conv, slots) = (4, batch + 1);
    let p = KdaDecodeParams {
        batch,
        heads,
        head_k: kd,
        head_v: kd,
        conv_width: w_conv,
        state_slots: slots,
        state_layout: KdaStateLayout::KMajor,
        gate: KdaGateMode::LowerBound { lower_bound: -5.0 },
        beta_sigmoid: true,
        qk_l2norm: true,
        scale: None,
        output_norm: KdaOutputNorm::GatedRmsNorm { eps: 1e-5 },
    };
    let d = p.channels();
    let idx = permutation(batch, 1, &mut TestRng::new(11));
    let plan = KdaDecode::plan(b, &p, &KdaDecodeBatch { state_indices: &idx })?;
    let bf = DType::BF16;
    let mut call = KdaDecodeCall {
        x_qkv: normal(b, bf, &[batch, d], 1.0, 1)?,
        conv_weight: normal(b, DType::F32, &[d, w_conv], 0.5, 2)?,
        conv_state: normal(b, DType::F32, &[slots, d, w_conv - 1], 1.0, 3)?,
        g_raw: normal(b, bf, &[batch, heads, kd], 1.0, 4)?,
        beta: normal(b, bf, &[batch, heads], 1.0, 5)?,
        a_log: normal(b, DType::F32, &[heads], 0.5, 6)?,
        dt_bias: normal(b, DType::F32, &[heads * kd], 0.5, 7)?,
        state_indices: i32s(b, &[batch], &idx)?,
        state: normal(b, DType::F32, &[slots, heads, kd, kd], 0.05, 8)?,
        norm: Some((normal(b, bf, &[batch, heads, kd], 1.0, 9)?, normal(b, DType::F32, &[kd], 1.0, 10)?)),
        out: b.zeros(bf, &[batch, heads, kd])?,
        ws: ws(b, KdaDecode::workspace_size(b, &plan))?,
    };
    let us = c.time(|| call.run(b, &plan))?;
    c.push("kda_decode", format!("batch={batch} heads={heads} K=V={kd}"), "bf16 io, f32 state", us, p.cost(bf, DType::F32, DType::F32))
}

/// `stages`: the KV pipeline depth the row was timed at, fixed by the caller with
/// `GpuBackend::set_mla_kv_stages` (named in the row's shape; `None`: the default). `q_dt`: the
/// query's and output's dtype (f32: model-k3's, the `*_mma_f32q` kernels; named in the shape).
#[allow(clippy::too_many_arguments)]
fn mla_decode<R: Runtime>(
    c: &mut Bench<'_, R>,
    heads: usize,
    batch: usize,
    ctx: usize,
    format: KvCacheFormat,
    fname: &str,
    stages: Option<usize>,
    q_dt: DType,
) -> Result<()> {
    let b = c.b;
    let page = 64;
    let dims = KvDims::K3;
    let pages_per_seq = ctx.div_ceil(page);
    let num_pages = batch * pages_per_seq;
    let cache = MlaPagedCache { dims, format, page_size: page, num_pages, kv_scale: 1.0 / 64.0 };
    let p = MlaDecodeParams {
        cache,
        heads,
        q_len: 1,
        softmax_scale: K3_SOFTMAX_SCALE,
        variant: MlaDecodeVariant::Auto,
        splits: MlaSplitPolicy::Auto,
    };
    let mut rng = TestRng::new(21);
    let table = permutation(num_pages, 0, &mut rng);
    let lens = vec![ctx as i32; batch];
    let plan = MlaDecode::plan(b, &p, &MlaDecodeBatch { seq_lens: &lens, block_table: &table, max_pages_per_seq: pages_per_seq })?;
    // One page of encoded random tokens, repeated over the whole cache.
    let bpt = cache.bytes_per_token();
    let mut page_bytes = vec![0u8; page * bpt];
    for tok in page_bytes.chunks_mut(bpt) {
        encode_token(format, dims, &rng.normals(dims.width(), 1.0), cache.kv_scale, tok)?;
    }
    let kv = tiled(b, DType::U8, &[num_pages, page, bpt], &page_bytes)?;
    let mut call = MlaDecodeCall {
        q: normal(b, q_dt, &[batch, 1, heads, dims.width()], 1.0, 22)?,
        kv_cache: kv,
        block_table: i32s(b, &[batch, pages_per_seq], &table)?,
        seq_lens: i32s(b, &[batch], &lens)?,
        out: b.zeros(q_dt, &[batch, 1, heads, dims.latent])?,
        lse: b.zeros(DType::F32, &[batch, 1, heads])?,
        ws: ws(b, MlaDecode::workspace_size(b, &plan))?,
    };
    let us = c.time(|| call.run(b, &plan))?;
    let cost = p.cost(batch, batch as u64 * ctx as u64, q_dt, q_dt);
    let depth = stages.map(|s| format!(" kv_stages={s}")).unwrap_or_default();
    let query = if q_dt == DType::BF16 { String::new() } else { format!(" q={q_dt}") };
    c.push("mla_decode", format!("batch={batch} ctx={ctx} heads={heads} page={page} kernel={:?}{depth}{query}", plan.kernel), fname, us, cost)
}

fn moe<R: Runtime>(c: &mut Bench<'_, R>, t: usize, dims: (usize, usize, usize, usize, usize)) -> Result<()> {
    let b = c.b;
    let (hidden, l, n, e, k) = dims;
    let bf = DType::BF16;
    let mut rng = TestRng::new(31);
    let inputs = MoeInputs {
        x: normal(b, bf, &[t, hidden], 1.0, 32)?,
        router_weight: normal(b, bf, &[e, hidden], 0.03, 33)?,
        bias: normal(b, DType::F32, &[e], 0.05, 34)?,
        z: Some(normal(b, bf, &[t, l], 1.0, 35)?),
        w13: bytes_of(b, &[e, 2 * n, l / 2], || rng.next_u64() as u8)?,
        s13: bytes_of(b, &[e, 2 * n, l / 32], || 121 + rng.below(2) as u8)?,
        w2: bytes_of(b, &[e, l, n / 2], || rng.next_u64() as u8)?,
        s2: bytes_of(b, &[e, l, n / 32], || 121 + rng.below(2) as u8)?,
    };
    let plans = MoePlans::new(b, t, hidden, l, n, e, k, 4.0, Some(25.0))?;
    let mut call = moe_call(b, &plans, inputs, bf)?;

    // One pass to learn which experts the router picks (the weight bytes the GEMMs must read).
    call.router(b, &plans)?;
    b.synchronize(b.default_stream())?;
    let distinct = experts_touched(&b.download_tensor(&call.topk_ids)?, e);
    let costs = plans.costs(distinct, bf, bf)?;
    let shape = format!("tokens={t} hidden={hidden} latent={l} n={n} experts={e} top_k={k} picked={distinct}");
    let dt = "bf16 act, mxfp4 experts";
    let stages: [(&str, &str, MoeStage<R>); 5] = [
        ("moe_router", "bf16 x/weight, f32 scores", MoeCall::router),
        ("moe_align", "i32", MoeCall::align),
        ("moe_gemm_gate_up", dt, MoeCall::gate_up),
        ("moe_gemm_down", dt, MoeCall::down),
        ("moe_combine", "f32 in, bf16 out", MoeCall::combine),
    ];
    for ((op, dtype, stage), cost) in stages.into_iter().zip(costs) {
        let us = c.time(|| stage(&mut call, b, &plans))?;
        c.push(op, shape.clone(), dtype, us, Ok(cost))?;
    }
    let us = c.time(|| call.run(b, &plans))?;
    c.push("moe", shape, dt, us, total(&costs))?;

    // model-k3's dtypes: f32 activations into both GEMMs (at decode sizes the 16-row kernels'
    // f32-input form), on the same weights, side by side with the bf16 rows above.
    let mut inputs = call.inputs;
    inputs.x = normal(b, DType::F32, &[t, hidden], 1.0, 32)?;
    inputs.z = Some(normal(b, DType::F32, &[t, l], 1.0, 35)?);
    let mut call = moe_call(b, &plans, inputs, DType::F32)?;
    call.router(b, &plans)?;
    call.align(b, &plans)?;
    call.gate_up(b, &plans)?;
    b.synchronize(b.default_stream())?;
    let distinct = experts_touched(&b.download_tensor(&call.topk_ids)?, e);
    let costs = plans.costs(distinct, DType::F32, bf)?;
    let shape = format!("tokens={t} hidden={hidden} latent={l} n={n} experts={e} top_k={k} picked={distinct}");
    let dt = "f32 act, mxfp4 experts";
    let gemms: [(&str, MoeStage<R>, Cost); 2] =
        [("moe_gemm_gate_up", MoeCall::gate_up, costs[2]), ("moe_gemm_down", MoeCall::down, costs[3])];
    for (op, stage, cost) in gemms {
        let us = c.time(|| stage(&mut call, b, &plans))?;
        c.push(op, shape.clone(), dt, us, Ok(cost))?;
    }
    Ok(())
}

/// The router alone on the model's f32 x and bf16 weight, past one token tile, once per logits
/// path (`GpuBackend::set_router_matrix_units`: the matrix-unit kernel, the default, and the
/// CUDA-core one), side by side in one run.
fn router_paths<R: Runtime>(c: &mut Bench<'_, R>, t: usize, dims: (usize, usize, usize, usize, usize)) -> Result<()> {
    let b = c.b;
    let (hidden, _, _, e, k) = dims;
    let x = normal(b, DType::F32, &[t, hidden], 1.0, 36)?;
    let w = normal(b, DType::BF16, &[e, hidden], 0.03, 33)?;
    let bias = normal(b, DType::F32, &[e], 0.05, 34)?;
    let (mut ids, mut wts) = (b.zeros(DType::I32, &[t, k])?, b.zeros(DType::F32, &[t, k])?);
    let plan = MoeRouter::plan(b, &MoeRouterParams::sigmoid(t, hidden, e, k))?;
    let mut w_s = ws(b, MoeRouter::workspace_size(b, &plan))?;
    for (path, on) in [("matrix units", true), ("cuda cores", false)] {
        b.set_router_matrix_units(on);
        let us = c.time(|| {
            let args = MoeRouterArgs { x: x.as_ref(), weight: w.as_ref(), bias: Some(bias.as_ref()), topk_ids: ids.as_mut(), topk_weights: wts.as_mut() };
            MoeRouter::run(b, &plan, args, w_s.as_mut(), b.default_stream())
        });
        b.set_router_matrix_units(true);
        let shape = format!("tokens={t} hidden={hidden} experts={e} top_k={k} logits={path}");
        c.push("moe_router", shape, "f32 x, bf16 weight, f32 scores", us?, plan.params.cost(DType::F32, DType::BF16))?;
    }
    Ok(())
}

/// `out = x · Wᵀ` in bf16 through the contract's `Gemm`, once per route of the runtime (on
/// CUDA: cuBLASLt and the dialect's MMA kernel, side by side in one run).
fn dense_gemm<R: Runtime>(c: &mut Bench<'_, R>, m: usize, n: usize, k: usize, what: &str, routes: &[(&str, &dyn Fn())]) -> Result<()> {
    let b = c.b;
    let bf = DType::BF16;
    let x = normal(b, bf, &[m, k], 1.0, 41)?;
    let w = normal(b, bf, &[n, k], 1.0 / (k as f32).sqrt(), 42)?;
    let mut out = b.zeros(bf, &[m, n])?;
    let plan = Gemm::plan(b, &GemmParams::new(m, n, k, bf, bf, bf))?;
    for (route, select) in routes {
        select();
        let mut w_s = ws(b, Gemm::workspace_size(b, &plan))?;
        let us = c.time(|| {
            let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() };
            Gemm::run(b, &plan, args, w_s.as_mut(), b.default_stream())
        })?;
        c.push("dense_gemm", format!("M={m} N={n} K={k} ({what}) route={route}"), "bf16", us, plan.params.cost())?;
    }
    Ok(())
}

/// Bytes copied per second by one large D2D copy, timed with events.
fn copy_gbs<R: Runtime>(c: &Bench<'_, R>, bytes: usize) -> Result<f64> {
    let b = c.b;
    let src = b.alloc_zeroed(bytes)?;
    let mut dst = b.alloc_zeroed(bytes)?;
    let rt = b.runtime();
    let us = c.time(|| rt.copy_d2d(&src, 0, &mut dst, 0, bytes, rt.default_stream()))?;
    Ok(bytes as f64 / (us.max(1e-3) * 1e-6) / 1e9)
}

/// Runs every case; `gemm_routes` are (name, select) pairs the dense GEMM is timed under.
fn bench<R: Runtime>(b: &GpuBackend<R>, o: &Opts, gemm_routes: &[(&str, &dyn Fn())]) -> Result<()> {
    let sh = shapes(o.smoke);
    let hw = sol::resolve_hardware(o.hardware.as_deref(), &b.device_info().name)?;
    let mut c = Bench { b, warmup: o.warmup, iters: o.iters, rows: Vec::new() };
    let (copy, copy_source) = match o.copy_gbs {
        Some(v) => (v, "--copy-gbs"),
        None => (copy_gbs(&c, sh.copy_bytes)?, "measured: d2d copy"),
    };
    let mut failures = Vec::new();
    // The JSON is rewritten after every case, so a run cut short still reports what finished.
    let mut note = |c: &Bench<'_, R>, what: String, r: Result<()>| {
        if let Err(e) = r {
            eprintln!("{what}: {e}");
            failures.push(json!({"case": what, "error": e.to_string()}));
        }
        if let Some(path) = &o.json {
            if let Err(e) = write_report(path, &report(c, o, copy, copy_source, &hw, &failures)) {
                eprintln!("{e}");
            }
        }
    };
    let initial_checks = b.device_checks();
    // Each checked case once per requested mode (a row pair with `both`).
    let mut checked = |c: &mut Bench<'_, R>, what: String, case: &mut dyn FnMut(&mut Bench<'_, R>) -> Result<()>| {
        for &m in &o.device_checks {
            b.set_device_checks(m);
            let r = case(c);
            note(c, format!("{what} (device checks {m:?})"), r);
        }
        b.set_device_checks(initial_checks);
    };
    for &h in &sh.heads {
        for &(n, len) in &sh.kda_prefill {
            checked(&mut c, format!("kda_prefill h={h} {n}x{len}"), &mut |c| kda_prefill(c, h, sh.kda_dim, n, len));
        }
        for &bt in &sh.kda_decode {
            checked(&mut c, format!("kda_decode h={h} b={bt}"), &mut |c| kda_decode(c, h, sh.kda_dim, bt));
        }
        // The device's own fp8 flavour: e4m3fnuz on gfx942, e4m3fn elsewhere.
        let (fp8, fp8_name) = match b.device_info().fp8 {
            kernel_api::Fp8Native::Fnuz => (Fp8Flavor::E4M3Fnuz, "fp8 e4m3fnuz tiled cache"),
            _ => (Fp8Flavor::E4M3Fn, "fp8 e4m3 tiled cache"),
        };
        for &ctx in &sh.mla_ctx {
            for &bt in &sh.mla_batch {
                for (f, name) in [(KvCacheFormat::Bf16, "bf16 cache"), (KvCacheFormat::Fp8Tiled(fp8), fp8_name)] {
                    checked(&mut c, format!("mla_decode h={h} b={bt} ctx={ctx} {name}"), &mut |c| mla_decode(c, h, bt, ctx, f, name, None, DType::BF16));
                }
                // model-k3's f32 query (the `*_mma_f32q` kernels) beside the bf16 row above.
                let f = KvCacheFormat::Fp8Tiled(fp8);
                checked(&mut c, format!("mla_decode h={h} b={bt} ctx={ctx} {fp8_name} f32 q"), &mut |c| mla_decode(c, h, bt, ctx, f, fp8_name, None, DType::F32));
            }
        }
        // The KV pipeline's depth side by side (the default, ~64 KiB of tiles ahead, is an
        // estimate: BENCHMARKS.md "MLA round 5"). Only warp-32 devices pipeline.
        let longest = sh.mla_ctx.iter().copied().max().unwrap_or(0);
        if h == sh.heads[0] && b.device_info().warp_size == 32 {
            for &stages in &sh.mla_kv_stages {
                let f = KvCacheFormat::Fp8Tiled(fp8);
                checked(&mut c, format!("mla_decode h={h} b=1 ctx={longest} {fp8_name} kv_stages={stages}"), &mut |c| {
                    c.b.set_mla_kv_stages(Some(stages))?;
                    let r = mla_decode(c, h, 1, longest, f, fp8_name, Some(stages), DType::BF16);
                    c.b.set_mla_kv_stages(None)?;
                    r
                });
            }
        }
    }
    for &t in &sh.moe_tokens {
        checked(&mut c, format!("moe t={t}"), &mut |c| moe(c, t, sh.moe));
        if t > 8 {
            checked(&mut c, format!("moe_router t={t}, both logits paths"), &mut |c| router_paths(c, t, sh.moe));
        }
    }
    for &(n, k, what) in &sh.gemm {
        for &m in &sh.gemm_tokens {
            let r = dense_gemm(&mut c, m, n, k, what, gemm_routes);
            note(&c, format!("dense_gemm m={m} n={n} k={k}"), r);
        }
    }
    let failed = failures.len();
    let report = report(&c, o, copy, copy_source, &hw, &failures);
    if timing(b) == "emulated" {
        println!("NOTE: {} is an emulated device (SIMT emulator or k3 stand-in): these timings measure the emulator on the host CPU and mean nothing as GPU figures", b.device_info().name);
    }
    println!("median of {} runs after {} warmup; floors: {}", o.iters, o.warmup, hw.1);
    print!("{}", sol::table(&report, None));
    if let Some(path) = &o.json {
        write_report(path, &report)?;
        println!("report: {}", path.display());
    }
    if failed > 0 {
        return Err(Error::invalid("cases", format!("{failed} case(s) failed (listed in the report)")));
    }
    Ok(())
}

/// `emulated` when the device is the SIMT emulator or a driver stand-in running on it (its
/// timings are the host CPU's, meaningless as GPU figures), else `device`.
fn timing<R: Runtime>(b: &GpuBackend<R>) -> &'static str {
    let info = b.device_info();
    if info.kind == kernel_api::BackendKind::Simt || info.name.starts_with("k3 stand-in") {
        "emulated"
    } else {
        "device"
    }
}

/// The JSON report of the rows so far.
fn report<R: Runtime>(c: &Bench<'_, R>, o: &Opts, copy: f64, copy_source: &str, hw: &(Option<&Hardware>, String), failures: &[Value]) -> Value {
    let rows: Vec<Value> = c
        .rows
        .iter()
        .map(|r| {
            let mut v = sol::row_json(&r.op, &r.shape, &r.dtype, r.us, &r.cost, hw.0, 2.0 * copy);
            v["device_checks"] = json!(checks_name(r.checks));
            v
        })
        .collect();
    json!({
        "schema": "k3-device-bench/1",
        "backend": c.b.name(),
        "device": c.b.device_info().name,
        "arch": c.b.device_info().arch,
        "timing": timing(c.b),
        "smoke": o.smoke,
        "warmup": o.warmup,
        "iters": o.iters,
        "copy_gbs": copy,
        "copy_source": copy_source,
        "bytes_model": "each op's speed-of-light cost (kernel_api::cost): inputs read + outputs written + weights read (MoE: picked experts only) + state/cache read and written; pct_copy = gbs / (2 * copy_gbs); pct_floor = floor_us / us",
        "hardware": hw.0.map(|h| json!({"id": h.id, "name": h.name, "source": hw.1})),
        "hardware_note": hw.1,
        "failures": failures,
        "rows": rows,
    })
}

fn checks_name(m: DeviceChecks) -> &'static str {
    match m {
        DeviceChecks::On => "on",
        DeviceChecks::Off => "off",
    }
}

fn write_report(path: &std::path::Path, report: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(|e| Error::invalid("--json", e.to_string()))?;
    std::fs::write(path, text).map_err(|e| Error::invalid("--json", format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator's timings are labelled as such in the report.
    #[test]
    fn emulated_devices_label_their_timings() {
        let b = k3_backend_simt::simt_backend(64).expect("simt64");
        assert_eq!(timing(&b), "emulated");
    }

    /// Tensors larger than the host pattern are filled by repeated D2D copies: every byte must
    /// continue the pattern, across copy boundaries and in the partial last copy.
    #[test]
    fn tiled_fill_repeats_the_pattern_over_several_copies() {
        let b = k3_backend_simt::simt_backend(32).expect("simt32");
        let pattern = [3u8, 1, 4, 1, 5, 9, 2];
        let n = 2 * PATTERN_BYTES + 12_345;
        let t = tiled(&b, DType::U8, &[n], &pattern).expect("tiled");
        let got = b.download_tensor(&t).expect("download").bytes;
        assert_eq!(got.len(), n);
        let bad = got.iter().enumerate().position(|(i, &v)| v != pattern[i % pattern.len()]);
        assert_eq!(bad, None, "first wrong byte");
    }
}
