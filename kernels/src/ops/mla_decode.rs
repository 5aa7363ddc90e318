//! Launchers of absorbed MLA decode (Gluon and asm style) and ragged absorbed prefill
//! (`csrc/ops/mla_decode.cu`, core in `csrc/ops/mla_attend.cuh`).
//!
//! - Gluon: one launch over (batch, head group x query row tile, split), then, with more than
//!   one split, `mla_decode_reduce` over the (batch, head group) entries.
//! - Asm: `mla_decode_asm_schedule` rebuilds the plan's partition in the workspace from the
//!   device `seq_lens` (in `run`, or once per step in `prepare_schedule`, which `run_prepared`
//!   then skips), `mla_decode_asm` runs one persistent block per resident block slot (compute
//!   units x `attention_resident_blocks`) over its items, `mla_decode_reduce` merges the split
//!   pairs.
//! - Prefill: one launch over (row tile, head group, sequence) reading the device `cu_seqlens_q`.
//!
//! bf16 queries run the `*_mma` kernels (QK^T and PV on tensor cores / MFMA). f32 queries (model-k3
//! passes its f32 activations) run the `*_mma_f32q` kernels: each query value as two bf16 planes,
//! hi = bf16(x) and lo = bf16(x - hi), |x - hi - lo| <= 2^-16 |x|, two MMAs per k-step, as P
//! goes through PV, which keeps the conformance suite's f32 tolerance (bf16 queries alone would
//! not). The `*_mma` kernels read queries and cache rows only in 16-byte transfers; inputs they
//! cannot (unaligned pointers, strides or dims, see `vector_kernel`) run `*_mma_unaligned` (bf16)
//! or the f32 SIMT kernels (f32). At warp 32 (CUDA) the `*_mma` kernels pipeline the KV tiles:
//! the cache rows as stored are copied by cp.async (k3::AsyncCopy) up to 64 KiB ahead of the tile
//! being multiplied, as far as the device's shared memory per block allows, and decoded at
//! fragment load (`kv_stages`: K3's fp8 caches 7 stages on H200 / B300, 3 within 48 KiB; bf16 4
//! and 2; the kernels take the count as an argument and the launch's dynamic shared memory holds
//! the stages); at warp 64 (AMD, synchronous copies) they stage one decoded bf16 tile.

use super::mla_format::{format_codes, ByteLayout};
use crate::gpu_backend::{arg, dtype_code, to_i32, GpuBackend};
use crate::runtime::{DevicePtr, KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::check_workspace;
use kernel_api::ops::kv_cache::KvCacheFormat;
use kernel_api::ops::mla_decode::{
    MlaDecode, MlaDecodeArgs, MlaDecodeBatch, MlaDecodePlan, MlaKernel, MlaPagedCache, MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs, MlaPrefillAbsorbedParams,
    MlaPrefillAbsorbedPlan, MlaPreparedSchedule, HEAD_GROUP,
};
use kernel_api::ops::MlaDecodeParams;
use kernel_api::error::Reasons;
use kernel_api::{Backend, DType, Dim, Error, Result, TensorRef};
use std::sync::atomic::Ordering;

/// Threads of the attention kernels (`mla::kBlock`), rows per row tile (`mla::kRows`), tokens
/// per KV tile (`mla::kTile`) and the SIMT path's register budget.
const BLOCK: u32 = 256;
const ROWS: usize = 16;
const TILE: usize = 16;
const MMA_TILE: usize = 16;
const MAX_LATENT: usize = 512;
const MAX_WIDTH: usize = 576;
const SCHEDULE_THREADS: u32 = 256;
/// `mla::kReduceThreads`: threads of a reduce block, 4 latent dims each.
const REDUCE_THREADS: u32 = 64;
const MAX_GRID_YZ: usize = 65_535;

/// `mla::kv_pitch`: the staged KV row pitch in bf16s, `row_width` rounded up to 8 mod 64
/// (16-byte aligned rows four banks apart: conflict-free MMA fragment reads).
fn kv_pitch(row_width: usize) -> usize {
    row_width + (8 + 64 - row_width % 64) % 64
}

/// `mla::shared_bytes`: probabilities, tile multipliers and the bf16 raw KV tile.
fn shared_bytes(width: usize) -> u32 {
    (4 * ROWS * TILE + 4 * TILE * 5 + 2 * TILE * kv_pitch(width)) as u32
}

/// KV tile bytes the `*_mma` kernels' raw pipeline aims to keep in flight per block, ahead of the
/// tile being multiplied, where the device's shared memory per block allows. They hold one
/// block per SM (registers), so this is the SM's bytes in flight: by Little's law 64 KiB covers
/// ~1.8 µs of DRAM latency at an H200 SM's share of HBM (4.8 TB/s over 132 SMs = 36 KB/µs) and
/// ~1.2 µs at a B300's (8 TB/s over 148 SMs). An estimate, not a measurement (BENCHMARKS.md,
/// "MLA round 5").
const KV_AHEAD_BYTES: usize = 64 * 1024;
/// `mla::kMaxKvStages` at warp 32: the stages the kernels' wait covers (7 tiles ahead).
const MAX_KV_STAGES: usize = 8;

/// `Cache::kv_stages`, the stages of the `*_mma` kernels' raw pipeline (`mla::kRawStaging`: at
/// warp 32, where the copies are asynchronous: cp.async on CUDA, deferred in the emulator): one
/// tile multiplied and up to [`KV_AHEAD_BYTES`] of tiles ahead (at least one, at most
/// [`MAX_KV_STAGES`] - 1), as many of those as fit `limit` bytes of shared memory with the
/// `fixed` bytes the core needs beside them; or `forced` stages
/// ([`GpuBackend::set_mla_kv_stages`]), an error when they do not fit. K3's fp8 caches (656-byte
/// rows, 10.5 KB tiles): 7 stages where a block may have 227 KiB (H200, B300), 3 within 48 KiB
/// (the emulator's default); its bf16 cache (1168-byte pitch, 18.7 KB tiles): 4 and 2. None at
/// warp 64 (AMD, whose copy is synchronous): one decoded bf16 tile.
fn kv_stages(warp_size: u32, c: &MlaPagedCache, fixed: usize, bf16_tile: usize, limit: usize, forced: Option<usize>) -> Result<Option<usize>> {
    if warp_size != 32 {
        return Ok(None);
    }
    let tile = MMA_TILE * raw_pitch(c);
    let bytes = |stages: usize| fixed + bf16_tile.max(stages * tile);
    if let Some(n) = forced {
        if bytes(n) > limit {
            return Err(Error::unsupported(
                "kv_stages",
                format!("{n} stages of {tile}-byte KV tiles need {} bytes of shared memory; the device has {limit} per block", bytes(n)),
            ));
        }
        return Ok(Some(n));
    }
    let wanted = 1 + (KV_AHEAD_BYTES / tile).clamp(1, MAX_KV_STAGES - 1);
    // Two stages when not even those fit: the launch then fails its shared-memory check.
    Ok(Some((3..=wanted).rev().find(|&s| bytes(s) <= limit).unwrap_or(2)))
}

impl<R: Runtime> GpuBackend<R> {
    /// Fixes the stage count of the MLA `*_mma` kernels' KV pipeline (decode and absorbed
    /// prefill) for later launches; `None` returns to the default (about 64 KiB of tiles ahead,
    /// as many as the device's shared memory per block holds). For benchmarks that time depths
    /// side by side (`k3-device-bench`). Counts outside 2..=8 are refused here; a launch whose
    /// stages do not fit the device's shared memory fails with an error naming `kv_stages`. Only
    /// warp-32 devices pipeline: at warp 64 (AMD) the kernels stage one tile whatever this says.
    pub fn set_mla_kv_stages(&self, stages: Option<usize>) -> Result<()> {
        if let Some(n) = stages {
            if !(2..=MAX_KV_STAGES).contains(&n) {
                return Err(Error::invalid("kv_stages", format!("{n} is outside 2..={MAX_KV_STAGES}")));
            }
        }
        self.mla_kv_stages.store(stages.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// The stage count fixed by [`GpuBackend::set_mla_kv_stages`], if any.
    pub fn mla_kv_stages(&self) -> Option<usize> {
        Some(self.mla_kv_stages.load(Ordering::Relaxed)).filter(|&n| n != 0)
    }
}

/// `mla::raw_pitch(mla::raw_row_bytes(...))`: a cache row as stored, padded to 16 mod 128 bytes.
fn raw_pitch(c: &MlaPagedCache) -> usize {
    let (latent, rope) = (c.dims.latent, c.dims.rope);
    let bytes = match c.format {
        KvCacheFormat::Bf16 => 2 * (latent + rope),
        KvCacheFormat::Fp8Flat(_) => latent + rope,
        KvCacheFormat::Fp8Tiled(_) => latent + 4 * latent.div_ceil(128) + 2 * rope,
    };
    bytes + (16 + 128 - bytes % 128) % 128
}

/// Resident blocks per SM / CU of the `*_mma` attention kernels (bf16 queries) at their K3
/// launches, as benches/kernel-resources.json derives them from the binaries (registers, shared
/// memory and the card's limits; the unit test below fails when a regenerated report
/// disagrees): 1 on sm_90a / sm_100a / sm_103a (204-231 registers x 256 threads), 2 on gfx942
/// (VGPRs and 64 KiB of LDS) and gfx950 (VGPRs). Other devices take 1, one block per unit. The
/// f32-query and unaligned twins match it; the f32 SIMT kernels hold one block per CU on AMD.
fn attention_resident_blocks(arch: &str) -> u32 {
    match arch {
        "gfx942" | "gfx950" => 2,
        _ => 1,
    }
}

/// How an attention kernel family runs for given tensors (`GpuBackend::attention_core`).
struct AttentionCore {
    /// The kernel's name: the family with `_mma`, `_mma_unaligned`, `_mma_f32q` or nothing (f32
    /// SIMT core).
    name: String,
    /// Dynamic shared bytes of the launch.
    shared: u32,
    /// `Cache::kv_stages`: the raw pipeline's stages (1 where the core has none).
    kv_stages: i32,
}

/// Which attention core a launch uses: the tensor-core one for bf16 queries whose 16-padded row
/// fits (`vec`: the 16-byte `*_mma` form, raw pipeline stages at warp 32; else `*_mma_unaligned`,
/// one bf16 tile) and for f32 queries on the 16-byte path (`*_mma_f32q`: the query as bf16 hi +
/// lo planes, the `*_mma` staging), else the f32 SIMT one. Returns the kernel name suffix, the
/// dynamic shared bytes and the raw pipeline's stages. `limit`: the device's shared memory per
/// block; `forced`: [`GpuBackend::set_mla_kv_stages`].
fn core(q_dtype: DType, c: &MlaPagedCache, vec: bool, warp_size: u32, limit: usize, forced: Option<usize>) -> Result<(&'static str, u32, usize)> {
    let wpad = c.dims.latent.next_multiple_of(16) + c.dims.rope.next_multiple_of(16);
    let suffix = match q_dtype {
        DType::BF16 if vec => "_mma",
        DType::BF16 => "_mma_unaligned",
        DType::F32 if vec => "_mma_f32q",
        _ => "",
    };
    if suffix.is_empty() || wpad > MAX_WIDTH {
        return Ok(("", shared_bytes(c.dims.width()), 1));
    }
    // The MMA core's shared memory (mla_attend_mma.cuh): 8 warps' partial scores, P, alpha, l,
    // multipliers, then the KV area: the bf16 tile, or the raw stages, which also hold the bf16
    // query rows at first (at the area's end, so that the first stages' copies go out before
    // them).
    let fixed = 4 * 8 * ROWS * MMA_TILE + 4 * ROWS * MMA_TILE + 4 * ROWS * 2 + 4 * MMA_TILE * 5;
    let bf16_tile = 2 * MMA_TILE * kv_pitch(wpad);
    let (kv_area, stages) = match vec.then(|| kv_stages(warp_size, c, fixed, bf16_tile, limit, forced)).transpose()?.flatten() {
        Some(stages) => (bf16_tile.max(stages * MMA_TILE * raw_pitch(c)), stages),
        None => (bf16_tile, 1),
    };
    Ok((suffix, (fixed + kv_area) as u32, stages))
}

/// Whether the `*_mma` / `*_mma_f32q` kernels (16-byte query and cache loads, no bytewise path)
/// may run, else the `*_mma_unaligned` ones (bf16) or the SIMT ones (f32): the query rows (bf16
/// or f32) and every cache row start 16-byte aligned and latent, rope and (tile-scaled) the scale
/// block end on 16-byte boundaries (`mla::vector_path` on the device side; with latent <= 512 its
/// tile-scaled condition means 4 scale tiles, one 16-byte unit). K3's shapes (latent 512, rope
/// 64, contiguous bf16 tensors) always qualify.
fn vector_kernel(q: DevicePtr, q_dtype: DType, q_strides: &[usize], cache: DevicePtr, bl: &ByteLayout, c: &MlaPagedCache) -> bool {
    let (latent, rope) = (c.dims.latent, c.dims.rope);
    let scales_end = latent + 4 * latent.div_ceil(128);
    let cache_ok = latent % 16 == 0
        && rope % 16 == 0
        && (!matches!(c.format, KvCacheFormat::Fp8Tiled(_)) || scales_end % 16 == 0)
        && cache.0 % 16 == 0
        && bl.page_stride % 16 == 0
        && bl.row_stride % 16 == 0;
    let per_unit = 16 / q_dtype.size_bytes().max(1);
    let (dims, last) = q_strides.split_at(q_strides.len() - 1);
    let q_ok = q.0 % 16 == 0 && last == [1] && dims.iter().all(|&st| st % per_unit == 0);
    cache_ok && q_ok
}

impl<R: Runtime> GpuBackend<R> {
    /// How the kernel `family` (`mla_decode_gluon`, ...) runs for these tensors: its `_mma`,
    /// `_mma_unaligned` or f32 form, its dynamic shared bytes and KV stages.
    fn attention_core(&self, family: &str, q: &TensorRef<'_, Self>, c: &MlaPagedCache, cache: &TensorRef<'_, Self>) -> Result<AttentionCore> {
        let (qp, cp) = (self.ptr(q.buf, &q.layout), self.ptr(cache.buf, &cache.layout));
        let aligned = vector_kernel(qp, q.layout.dtype, &q.layout.strides, cp, &ByteLayout::of(&cache.layout), c);
        let info = self.device_info();
        let (suffix, shared, stages) = core(q.layout.dtype, c, aligned, info.warp_size, info.shared_mem_per_block, self.mla_kv_stages())?;
        Ok(AttentionCore { name: format!("{family}{suffix}"), shared, kv_stages: stages as i32 })
    }
}

fn cache_support(c: &MlaPagedCache, r: &mut Reasons) {
    r.require(c.dims.latent <= MAX_LATENT, "params.cache.dims.latent", format!("GPU MLA kernels take latent <= {MAX_LATENT}, got {}", c.dims.latent));
    r.require(c.dims.width() <= MAX_WIDTH, "params.cache.dims", format!("GPU MLA kernels take latent + rope <= {MAX_WIDTH}, got {}", c.dims.width()));
}

/// `(softmax temperature, output multiplier)`: the flat fp8 scale folded into both (the kernels
/// see the raw fp8 values).
fn scales(c: &MlaPagedCache, softmax_scale: f32) -> (f32, f32) {
    match c.format {
        KvCacheFormat::Fp8Flat(_) => (softmax_scale * c.kv_scale, c.kv_scale),
        _ => (softmax_scale, 1.0),
    }
}

/// The reduce grid: (entries, q_len x min(heads, ROWS) rows, latent chunks of 4 x REDUCE_THREADS
/// dims), so that batch 1 spreads over its heads and latent chunks instead of one block per head
/// group, and a group of fewer than ROWS heads (K3's 12 per GPU at TP8) launches no idle rows.
fn reduce_config(entries: u32, q_len: usize, heads: usize, latent: usize) -> LaunchConfig {
    let chunks = latent.div_ceil(4 * REDUCE_THREADS as usize).max(1) as u32;
    LaunchConfig::new((entries, (q_len * heads.min(ROWS)) as u32, chunks), REDUCE_THREADS, 0)
}

fn grid_dim(field: &str, n: usize) -> Result<u32> {
    if n > MAX_GRID_YZ {
        return Err(Error::unsupported(field, format!("{n} exceeds the grid's y/z limit {MAX_GRID_YZ}")));
    }
    Ok(n as u32)
}

impl<R: Runtime> GpuBackend<R> {
    /// Cache, block table and sequence lengths, then the bounds the kernels check the device
    /// metadata against (pages in the cache, block-table columns), in the order every attention
    /// kernel takes them.
    fn push_cache(
        &self,
        a: &mut KernelArgs,
        c: &MlaPagedCache,
        kv_stages: i32,
        cache: &TensorRef<'_, Self>,
        table: &TensorRef<'_, Self>,
        lens: &TensorRef<'_, Self>,
    ) -> Result<()> {
        let (kind, fnuz) = format_codes(c.format);
        let bl = ByteLayout::of(&cache.layout);
        arg(a, self.ptr(cache.buf, &cache.layout));
        arg(a, bl.page_stride);
        arg(a, bl.row_stride);
        arg(a, to_i32("params.cache.page_size", c.page_size)?);
        arg(a, kind);
        arg(a, fnuz);
        arg(a, to_i32("params.cache.dims.latent", c.dims.latent)?);
        arg(a, to_i32("params.cache.dims.rope", c.dims.rope)?);
        arg(a, kv_stages);
        arg(a, self.ptr(table.buf, &table.layout));
        arg(a, table.layout.strides[0] as i64);
        arg(a, table.layout.strides[1] as i64);
        arg(a, self.ptr(lens.buf, &lens.layout));
        arg(a, lens.layout.strides[0] as i64);
        arg(a, to_i32("params.cache.num_pages", c.num_pages)?);
        arg(a, to_i32("max_pages_per_seq", table.layout.shape[1])?);
        Ok(())
    }

    fn ws_ptr(&self, ws: Option<&R::Buffer>, byte: usize) -> DevicePtr {
        ws.map_or(DevicePtr(0), |b| self.runtime().device_ptr(b).offset(byte as u64))
    }
}

impl<R: Runtime> MlaDecode for GpuBackend<R> {
    /// Balances over the blocks the device holds at once, compute units x
    /// [`attention_resident_blocks`] (`Auto`; `ComputeUnits(n)` names that count itself): on
    /// MI300X / MI355X the asm partition runs 2 persistent blocks per CU (608 / 512, both
    /// resident) and Gluon's auto split fills the same count. The f32 SIMT forms hold one block
    /// per CU there and run those blocks in two rounds of half the work each.
    fn plan(&self, params: &MlaDecodeParams, batch: &MlaDecodeBatch<'_>) -> Result<MlaDecodePlan> {
        let info = self.device_info();
        let plan = MlaDecodePlan::new(params, batch, info.compute_units.saturating_mul(attention_resident_blocks(&info.arch)))?;
        MlaDecode::supports(self, params)?;
        Ok(plan)
    }

    fn supports(&self, p: &MlaDecodeParams) -> Result<()> {
        let mut r = Reasons::new();
        cache_support(&p.cache, &mut r);
        r.into_result()?;
        to_i32("params.heads", p.heads)?;
        Ok(())
    }

    fn run(&self, plan: &MlaDecodePlan, args: MlaDecodeArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        self.mla_decode(plan, args, ws, stream, ScheduleSource::Build)
    }

    fn prepare_schedule(&self, plan: &MlaDecodePlan, seq_lens: &TensorRef<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<MlaPreparedSchedule> {
        seq_lens.check(self, "seq_lens")?.dtype(&[DType::I32])?.shape(&[Dim::Is(plan.batch)])?;
        check_workspace(self, ws.as_deref(), MlaDecode::workspace_size(self, plan))?;
        MlaDecode::supports(self, &plan.params)?;
        let ws = ws.as_deref();
        if plan.kernel == MlaKernel::Asm && plan.batch > 0 {
            self.launch_asm_schedule(plan, seq_lens, ws, stream)?;
        }
        Ok(MlaPreparedSchedule::new(plan, self.ws_ptr(ws, 0).0))
    }

    fn run_prepared(
        &self,
        plan: &MlaDecodePlan,
        schedule: &MlaPreparedSchedule,
        args: MlaDecodeArgs<'_, Self>,
        ws: Option<&mut R::Buffer>,
        stream: &R::Stream,
    ) -> Result<()> {
        schedule.check(plan, self.ws_ptr(ws.as_deref(), 0).0)?;
        self.mla_decode(plan, args, ws, stream, ScheduleSource::Prepared)
    }
}

/// Whether a decode builds the asm schedule in the workspace or finds it there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ScheduleSource {
    Build,
    Prepared,
}

impl<R: Runtime> GpuBackend<R> {
    /// `mla_decode_asm_schedule`: rebuilds the plan's partition in the workspace from the device
    /// `seq_lens` (one block).
    fn launch_asm_schedule(&self, plan: &MlaDecodePlan, lens: &TensorRef<'_, Self>, ws: Option<&R::Buffer>, stream: &R::Stream) -> Result<()> {
        let s = &plan.schedule;
        let cus = s.cu_indptr.len().saturating_sub(1);
        let (items, cu_indptr, reduce_map) = plan.schedule_arrays();
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(lens.buf, &lens.layout));
        arg(&mut a, lens.layout.strides[0] as i64);
        arg(&mut a, to_i32("batch", plan.batch)?);
        arg(&mut a, to_i32("head groups", plan.head_groups)?);
        arg(&mut a, i64::try_from(s.quota).map_err(|_| Error::unsupported("plan.schedule.quota", "exceeds i64"))?);
        arg(&mut a, to_i32("compute units", cus)?);
        arg(&mut a, to_i32("work items", s.items.len())?);
        arg(&mut a, to_i32("reduce entries", s.reduce.len())?);
        arg(&mut a, self.ws_ptr(ws, items));
        arg(&mut a, self.ws_ptr(ws, cu_indptr));
        arg(&mut a, self.ws_ptr(ws, reduce_map));
        arg(&mut a, to_i32("params.q_len", plan.params.q_len)?);
        arg(&mut a, (plan.max_pages_per_seq as i64).saturating_mul(plan.params.cache.page_size as i64));
        arg(&mut a, plan.seq_lens.iter().map(|&l| l as i64).sum::<i64>());
        self.push_checks(&mut a, stream)?;
        self.launch("mla_decode_asm_schedule", LaunchConfig::new(1u32, SCHEDULE_THREADS, 0), &mut a, stream)
    }

    fn mla_decode(&self, plan: &MlaDecodePlan, args: MlaDecodeArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream, source: ScheduleSource) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MlaDecode::workspace_size(self, plan))?;
        MlaDecode::supports(self, &plan.params)?;
        let p = &plan.params;
        if plan.batch == 0 {
            return Ok(());
        }
        let ws = ws.as_deref();
        let s = &plan.schedule;
        let (latent, q_len) = (p.cache.dims.latent, p.q_len);
        let (score_scale, out_scale) = scales(&p.cache, p.softmax_scale);
        let lse_off = (plan.partial_lse_offset(0) / 4) as i64;
        let (q, out) = (&args.q, &args.out);

        // Arguments common to both attention kernels, up to and including `q_len`.
        let common = |a: &mut KernelArgs, kv_stages: i32| -> Result<()> {
            arg(a, self.ptr(q.buf, &q.layout));
            arg(a, dtype_code(q.layout.dtype));
            for &st in &q.layout.strides[..3] {
                arg(a, st as i64);
            }
            self.push_cache(a, &p.cache, kv_stages, &args.kv_cache, &args.block_table, &args.seq_lens)?;
            self.push_out(a, out.buf, &out.layout, args.lse.as_ref().map(|l| (&*l.buf, &l.layout)));
            arg(a, self.ws_ptr(ws, 0));
            arg(a, lse_off);
            arg(a, to_i32("params.heads", p.heads)?);
            arg(a, to_i32("params.q_len", q_len)?);
            Ok(())
        };
        let reduce = |meta: DevicePtr, splits: i32, entries: u32| -> Result<()> {
            let mut a = KernelArgs::new();
            arg(&mut a, self.ws_ptr(ws, 0));
            arg(&mut a, lse_off);
            arg(&mut a, meta);
            arg(&mut a, splits);
            arg(&mut a, to_i32("batch", plan.batch)?);
            arg(&mut a, to_i32("partial slots", s.num_partials)?);
            arg(&mut a, to_i32("params.heads", p.heads)?);
            arg(&mut a, to_i32("params.q_len", q_len)?);
            arg(&mut a, to_i32("params.cache.dims.latent", latent)?);
            self.push_out(&mut a, out.buf, &out.layout, args.lse.as_ref().map(|l| (&*l.buf, &l.layout)));
            self.push_checks(&mut a, stream)?;
            self.launch("mla_decode_reduce", reduce_config(entries, q_len, p.heads, latent), &mut a, stream)
        };
        let core = |family: &str| self.attention_core(family, q, &p.cache, &args.kv_cache);
        let batch = to_i32("batch", plan.batch)? as u32;

        match plan.kernel {
            MlaKernel::Gluon => {
                let k = core("mla_decode_gluon")?;
                let mut a = KernelArgs::new();
                common(&mut a, k.kv_stages)?;
                arg(&mut a, to_i32("params.splits", s.num_splits)?);
                arg(&mut a, score_scale);
                arg(&mut a, out_scale);
                self.push_checks(&mut a, stream)?;
                let grid = (batch, grid_dim("params.heads x params.q_len", plan.head_groups * q_len)?, grid_dim("params.splits", s.num_splits)?);
                self.launch(&k.name, LaunchConfig::new(grid, BLOCK, k.shared), &mut a, stream)?;
                if s.num_splits > 1 {
                    reduce(DevicePtr(0), s.num_splits as i32, to_i32("batch x head groups", plan.batch * plan.head_groups)? as u32)?;
                }
            }
            MlaKernel::Asm => {
                let cus = s.cu_indptr.len().saturating_sub(1);
                let (items, cu_indptr, reduce_map) = plan.schedule_arrays();
                let k = core("mla_decode_asm")?;
                if source == ScheduleSource::Build {
                    self.launch_asm_schedule(plan, &args.seq_lens, ws, stream)?;
                }

                let mut a = KernelArgs::new();
                common(&mut a, k.kv_stages)?;
                arg(&mut a, self.ws_ptr(ws, items));
                arg(&mut a, self.ws_ptr(ws, cu_indptr));
                arg(&mut a, to_i32("work items", s.items.len())?);
                arg(&mut a, to_i32("batch", plan.batch)?);
                arg(&mut a, to_i32("partial slots", s.num_partials)?);
                arg(&mut a, score_scale);
                arg(&mut a, out_scale);
                self.push_checks(&mut a, stream)?;
                self.launch(&k.name, LaunchConfig::new(cus as u32, BLOCK, k.shared), &mut a, stream)?;
                if !s.reduce.is_empty() {
                    reduce(self.ws_ptr(ws, reduce_map), 0, to_i32("reduce entries", s.reduce.len())? as u32)?;
                }
            }
        }
        Ok(())
    }
}

impl<R: Runtime> GpuBackend<R> {
    /// `out` (pointer, dtype, strides) and the optional `lse` (pointer or null, strides).
    fn push_out(&self, a: &mut KernelArgs, out_buf: &R::Buffer, out: &kernel_api::Layout, lse: Option<(&R::Buffer, &kernel_api::Layout)>) {
        arg(a, self.ptr(out_buf, out));
        arg(a, dtype_code(out.dtype));
        let rank = out.strides.len();
        for &st in &out.strides[..rank - 1] {
            arg(a, st as i64);
        }
        self.push_opt(a, lse, rank - 1);
    }
}

impl<R: Runtime> MlaPrefillAbsorbed for GpuBackend<R> {
    fn supports(&self, p: &MlaPrefillAbsorbedParams) -> Result<()> {
        let mut r = Reasons::new();
        cache_support(&p.cache, &mut r);
        r.into_result()?;
        to_i32("params.heads", p.heads)?;
        Ok(())
    }

    fn run(&self, plan: &MlaPrefillAbsorbedPlan, args: MlaPrefillAbsorbedArgs<'_, Self>, ws: Option<&mut R::Buffer>, stream: &R::Stream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, ws.as_deref(), MlaPrefillAbsorbed::workspace_size(self, plan))?;
        MlaPrefillAbsorbed::supports(self, &plan.params)?;
        let p = &plan.params;
        let max_q = plan.cu_seqlens_q.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        // At least one row tile: a batch without queries still has its device metadata checked.
        let row_tiles = (max_q * p.heads.min(HEAD_GROUP)).div_ceil(ROWS).max(1);
        if plan.batch == 0 {
            return Ok(());
        }
        let (score_scale, out_scale) = scales(&p.cache, p.softmax_scale);
        let q = &args.q;
        let k = self.attention_core("mla_prefill_absorbed", q, &p.cache, &args.kv_cache)?;
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(q.buf, &q.layout));
        arg(&mut a, dtype_code(q.layout.dtype));
        arg(&mut a, q.layout.strides[0] as i64);
        arg(&mut a, q.layout.strides[1] as i64);
        self.push_cache(&mut a, &p.cache, k.kv_stages, &args.kv_cache, &args.block_table, &args.seq_lens)?;
        arg(&mut a, self.ptr(args.cu_seqlens_q.buf, &args.cu_seqlens_q.layout));
        arg(&mut a, args.cu_seqlens_q.layout.strides[0] as i64);
        arg(&mut a, to_i32("q", args.q.layout.shape[0])?);
        arg(&mut a, to_i32("cu_seqlens_q", max_q)?);
        self.push_out(&mut a, &*args.out.buf, &args.out.layout, args.lse.as_ref().map(|l| (&*l.buf, &l.layout)));
        arg(&mut a, to_i32("params.heads", p.heads)?);
        arg(&mut a, i32::from(p.causal));
        arg(&mut a, score_scale);
        arg(&mut a, out_scale);
        self.push_checks(&mut a, stream)?;
        let grid = (
            to_i32("query row tiles", row_tiles)? as u32,
            grid_dim("params.heads", plan.head_groups)?,
            grid_dim("batch", plan.batch)?,
        );
        self.launch(&k.name, LaunchConfig::new(grid, BLOCK, k.shared), &mut a, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_resident_blocks, core};
    use kernel_api::ops::kv_cache::{Fp8Flavor, KvCacheFormat, KvDims};
    use kernel_api::ops::mla_decode::MlaPagedCache;
    use kernel_api::DType;

    /// K3's caches (latent 512, rope 64): the stages and dynamic shared bytes of the `*_mma`
    /// kernels on a device with 227 KiB per block (H200), at the emulator's default 48 KiB (the
    /// shapes of MLA round 4), at warp 64, and for the unaligned form.
    #[test]
    fn kv_stages_follow_the_shared_memory_per_block() {
        let cache = |format| MlaPagedCache { dims: KvDims { latent: 512, rope: 64 }, format, page_size: 64, num_pages: 1, kv_scale: 1.0 };
        let (fp8, tiled, bf16) = (
            cache(KvCacheFormat::Fp8Flat(Fp8Flavor::E4M3Fn)),
            cache(KvCacheFormat::Fp8Tiled(Fp8Flavor::E4M3Fn)),
            cache(KvCacheFormat::Bf16),
        );
        let h200 = 227 * 1024;
        let auto = |q, c: &MlaPagedCache, vec, warp, limit| core(q, c, vec, warp, limit, None).unwrap();
        // 9664 fixed bytes + stages x 16 rows x pitch (656 B fp8, 1168 B bf16).
        assert_eq!(auto(DType::BF16, &fp8, true, 32, h200), ("_mma", 9664 + 7 * 10496, 7));
        assert_eq!(auto(DType::BF16, &tiled, true, 32, h200), ("_mma", 9664 + 7 * 10496, 7));
        assert_eq!(auto(DType::BF16, &bf16, true, 32, h200), ("_mma", 9664 + 4 * 18688, 4));
        assert_eq!(auto(DType::BF16, &fp8, true, 32, 48 * 1024), ("_mma", 41152, 3));
        assert_eq!(auto(DType::BF16, &bf16, true, 32, 48 * 1024), ("_mma", 47040, 2));
        // Between the two: as many stages as fit.
        assert_eq!(auto(DType::BF16, &fp8, true, 32, 64 * 1024).2, 5);
        // Warp 64 and the unaligned form stage one bf16 tile.
        assert_eq!(auto(DType::BF16, &fp8, true, 64, h200), ("_mma", 9664 + 18688, 1));
        assert_eq!(auto(DType::BF16, &fp8, false, 32, h200), ("_mma_unaligned", 9664 + 18688, 1));
        // f32 queries: the MMA core's staging on the 16-byte path, else the SIMT core.
        assert_eq!(auto(DType::F32, &fp8, true, 32, h200), ("_mma_f32q", 9664 + 7 * 10496, 7));
        assert_eq!(auto(DType::F32, &bf16, true, 64, h200), ("_mma_f32q", 9664 + 18688, 1));
        assert_eq!(auto(DType::F32, &fp8, false, 32, h200).0, "");
        assert_eq!(auto(DType::F32, &fp8, false, 32, h200).2, 1);
        // Fixed stages (GpuBackend::set_mla_kv_stages): taken as they are where they fit, an
        // error naming kv_stages where they do not, ignored at warp 64 and off the 16-byte path.
        assert_eq!(core(DType::BF16, &fp8, true, 32, h200, Some(2)).unwrap(), ("_mma", 9664 + 2 * 10496, 2));
        assert_eq!(core(DType::BF16, &bf16, true, 32, h200, Some(8)).unwrap(), ("_mma", 9664 + 8 * 18688, 8));
        let err = core(DType::BF16, &fp8, true, 32, 48 * 1024, Some(5)).unwrap_err().to_string();
        assert!(err.contains("kv_stages") && err.contains("62144"), "{err}");
        assert_eq!(core(DType::BF16, &fp8, true, 64, 48 * 1024, Some(5)).unwrap().2, 1);
        assert_eq!(core(DType::BF16, &fp8, false, 32, 48 * 1024, Some(5)).unwrap().2, 1);
    }

    /// The table agrees with the resource report: every K3 launch of the `*_mma` attention
    /// kernels there (bf16 and f32 queries) has the resident blocks the table gives its target.
    #[test]
    fn attention_resident_blocks_match_the_report() {
        for kernel in ["mla_decode_asm_mma", "mla_decode_gluon_mma", "mla_decode_asm_mma_f32q"] {
            let launches = crate::ops::report_resident_blocks(kernel);
            for (target, resident) in &launches {
                assert_eq!(*resident as u32, attention_resident_blocks(target), "{kernel} on {target}");
            }
            assert!(launches.len() >= 5, "{kernel}: launches on the five report targets, found {}", launches.len());
        }
    }
}
