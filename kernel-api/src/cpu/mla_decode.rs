//! CPU reference of absorbed MLA decode and ragged prefill over the paged latent cache.
//!
//! Both ops go through one core, [`attend`]: a block of query rows of one sequence, the heads of
//! one head group, a key range of that sequence. Decode runs the plan's schedule item by item
//! (asm: compute unit by compute unit), parks split partials in the caller's workspace in the
//! plan's layout, then merges them by LSE following the reduce map, as a GPU would.

use super::math::lse_merge_weights;
use super::{read_f32, read_i64, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::check_workspace;
use crate::ops::kv_cache::decode_token;
use crate::ops::mla_decode::{
    MlaDecode, MlaDecodeArgs, MlaDecodeParams, MlaDecodePlan, MlaKernel, MlaPagedCache, MlaPrefillAbsorbed, MlaPrefillAbsorbedArgs,
    MlaPrefillAbsorbedParams, MlaPrefillAbsorbedPlan, MlaPreparedSchedule, MlaWorkItem, HEAD_GROUP,
};
use crate::dtype::DType;
use crate::tensor::{Dim, TensorRef};
use std::ops::Range;

/// Read access to the paged cache tensor's token rows.
struct PagedCache<'a> {
    bytes: &'a [u8],
    elem: usize,
    offset: usize,
    page_stride: usize,
    row_stride: usize,
    token_bytes: usize,
    desc: MlaPagedCache,
}

impl<'a> PagedCache<'a> {
    /// `t` has been checked against `desc` (`check_tensor`).
    fn new(t: &TensorRef<'a, CpuBackend>, desc: MlaPagedCache) -> Result<Self> {
        let l = &t.layout;
        match (l.strides.first(), l.strides.get(1)) {
            (Some(&page_stride), Some(&row_stride)) => Ok(PagedCache {
                bytes: &t.buf.0,
                elem: l.dtype.size_bytes(),
                offset: l.offset,
                page_stride,
                row_stride,
                token_bytes: desc.bytes_per_token(),
                desc,
            }),
            _ => Err(Error::invalid("kv_cache", "rank-3 layout expected")),
        }
    }

    /// Decodes keys `kv` of the sequence whose block-table row is `pages` into `out`
    /// (`kv.len()` rows of `latent + rope` values). Every page id read is range-checked.
    fn decode_range(&self, pages: &[i64], kv: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        let w = self.desc.dims.width();
        out.clear();
        out.resize(kv.len() * w, 0.0);
        let ps = self.desc.page_size;
        for (k, s) in kv.enumerate() {
            let page = pages.get(s / ps).copied().unwrap_or(-1);
            if page < 0 || page as usize >= self.desc.num_pages {
                return Err(Error::invalid("block_table", format!("page id {page} for token {s} is outside [0, {})", self.desc.num_pages)));
            }
            let start = (page as usize)
                .checked_mul(self.page_stride)
                .and_then(|x| x.checked_add(self.offset))
                .and_then(|x| x.checked_add((s % ps).checked_mul(self.row_stride)?))
                .and_then(|x| x.checked_mul(self.elem));
            let row = start.and_then(|st| self.bytes.get(st..st.checked_add(self.token_bytes)?));
            let row = row.ok_or_else(|| Error::invalid("kv_cache", format!("token row of page {page} is outside the buffer")))?;
            decode_token(self.desc.format, self.desc.dims, row, self.desc.kv_scale, &mut out[k * w..(k + 1) * w])?;
        }
        Ok(())
    }
}

/// The keys query row r of a block may see: `0..end(r)`.
#[derive(Clone, Copy)]
enum KeyLimit {
    /// Causal tail: row 0 sits at this position.
    CausalFrom(usize),
    /// Every row sees this many keys.
    All(usize),
}

impl KeyLimit {
    fn end(self, row: usize) -> usize {
        match self {
            KeyLimit::CausalFrom(p0) => p0 + row + 1,
            KeyLimit::All(n) => n,
        }
    }
}

/// The query rows of one sequence, `[rows, heads, latent + rope]`.
struct QueryBlock<'a> {
    q: &'a [f32],
    heads: usize,
    limit: KeyLimit,
}

/// One item's result: `out` `[rows, group heads, latent]`, `lse` `[rows, group heads]`.
struct Partial {
    out: Vec<f32>,
    lse: Vec<f32>,
}

/// The heads of head group `g`.
fn group_heads(g: usize, heads: usize) -> Range<usize> {
    g * HEAD_GROUP..((g + 1) * HEAD_GROUP).min(heads)
}

/// The core of both ops: rows `rows` of `qb`, heads `heads`, over keys `kv` cut by each row's
/// limit. Scores and the softmax in f64; a row with no visible key gets out = 0, lse = -inf.
fn attend(
    cache: &PagedCache<'_>,
    pages: &[i64],
    qb: &QueryBlock<'_>,
    rows: Range<usize>,
    heads: Range<usize>,
    kv: Range<usize>,
    scale: f32,
) -> Result<Partial> {
    let (latent, w) = (cache.desc.dims.latent, cache.desc.dims.width());
    let gh = heads.len();
    let mut part = Partial { out: vec![0.0; rows.len() * gh * latent], lse: vec![f32::NEG_INFINITY; rows.len() * gh] };
    let hi = rows.clone().map(|r| qb.limit.end(r).min(kv.end)).max().unwrap_or(kv.start);
    if hi <= kv.start {
        return Ok(part);
    }
    let mut keys = Vec::new();
    cache.decode_range(pages, kv.start..hi, &mut keys)?;
    let mut scores = Vec::new();
    let mut acc = vec![0f64; latent];
    for (ri, r) in rows.enumerate() {
        let n = qb.limit.end(r).min(hi).saturating_sub(kv.start);
        if n == 0 {
            continue;
        }
        for (k, h) in heads.clone().enumerate() {
            let q =
                qb.q.get((r * qb.heads + h) * w..(r * qb.heads + h + 1) * w)
                    .ok_or_else(|| Error::invalid("q", "query row out of range"))?;
            scores.clear();
            scores.extend(
                keys.chunks_exact(w).take(n).map(|key| q.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64),
            );
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            acc.fill(0.0);
            let mut total = 0f64;
            for (s, key) in scores.iter().zip(keys.chunks_exact(w)) {
                let p = (s - m).exp();
                total += p;
                for (a, &c) in acc.iter_mut().zip(&key[..latent]) {
                    *a += p * c as f64;
                }
            }
            let o = (ri * gh + k) * latent;
            for (dst, a) in part.out[o..o + latent].iter_mut().zip(&acc) {
                *dst = (a / total) as f32;
            }
            part.lse[ri * gh + k] = (m + total.ln()) as f32;
        }
    }
    Ok(part)
}

/// Writes a partial for rows starting at absolute row `row0` of `[rows, heads, latent]` outputs.
fn place(out: &mut [f32], lse: &mut [f32], heads: usize, latent: usize, row0: usize, hs: Range<usize>, part: &Partial) -> Result<()> {
    let gh = hs.len();
    for r in 0..part.lse.len() / gh.max(1) {
        for (k, h) in hs.clone().enumerate() {
            let dst = ((row0 + r) * heads + h) * latent;
            let src = (r * gh + k) * latent;
            let o = out.get_mut(dst..dst + latent).ok_or_else(|| bad_plan("an item writes outside `out`"))?;
            o.copy_from_slice(&part.out[src..src + latent]);
            *lse.get_mut((row0 + r) * heads + h).ok_or_else(|| bad_plan("an item writes outside `lse`"))? = part.lse[r * gh + k];
        }
    }
    Ok(())
}

/// Plans have public fields; one edited into inconsistency is an error, not a panic.
fn bad_plan(why: &str) -> Error {
    Error::invalid("plan", why)
}

/// Checks that a device index tensor holds the values the plan was made from.
fn check_same(field: &str, device: &[i64], planned: &[u32]) -> Result<()> {
    match device.iter().zip(planned).position(|(&d, &p)| d != p as i64) {
        None if device.len() == planned.len() => Ok(()),
        at => Err(Error::invalid(
            field,
            format!("differs from the planned batch metadata (at {})", at.unwrap_or(device.len().min(planned.len()))),
        )),
    }
}

/// f32 little-endian stores and loads in the workspace, bounds-checked.
fn ws_store(ws: &mut [u8], byte: usize, v: &[f32]) -> Result<()> {
    let dst = ws.get_mut(byte..byte + 4 * v.len()).ok_or_else(|| Error::invalid("workspace", "partial slot outside the workspace"))?;
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
    Ok(())
}

fn ws_load(ws: &[u8], byte: usize, n: usize) -> Result<Vec<f32>> {
    let src = ws.get(byte..byte + 4 * n).ok_or_else(|| Error::invalid("workspace", "partial slot outside the workspace"))?;
    Ok(src.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Partial slot `[q_len, HEAD_GROUP, latent]` (padded rows) / `[q_len, HEAD_GROUP]` <-> compact
/// partial.
fn store_slot(ws: &mut [u8], plan: &MlaDecodePlan, slot: usize, part: &Partial, gh: usize) -> Result<()> {
    let (latent, pitch) = (plan.params.cache.dims.latent, plan.partial_row_pitch());
    for r in 0..plan.params.q_len {
        for k in 0..gh {
            let row = r * HEAD_GROUP + k;
            ws_store(ws, plan.partial_out_offset(slot) + 4 * row * pitch, &part.out[(r * gh + k) * latent..(r * gh + k + 1) * latent])?;
            ws_store(ws, plan.partial_lse_offset(slot) + 4 * row, &part.lse[r * gh + k..r * gh + k + 1])?;
        }
    }
    Ok(())
}

fn load_slot(ws: &[u8], plan: &MlaDecodePlan, slot: usize, gh: usize) -> Result<Partial> {
    let (latent, pitch, q_len) = (plan.params.cache.dims.latent, plan.partial_row_pitch(), plan.params.q_len);
    let mut part = Partial { out: Vec::with_capacity(q_len * gh * latent), lse: Vec::with_capacity(q_len * gh) };
    for r in 0..q_len {
        for k in 0..gh {
            let row = r * HEAD_GROUP + k;
            part.out.extend(ws_load(ws, plan.partial_out_offset(slot) + 4 * row * pitch, latent)?);
            part.lse.extend(ws_load(ws, plan.partial_lse_offset(slot) + 4 * row, 1)?);
        }
    }
    Ok(part)
}

/// The LSE merge of the reduce step, row by row.
fn merge(parts: &[Partial], latent: usize) -> Partial {
    let rows = parts.first().map_or(0, |p| p.lse.len());
    let mut m = Partial { out: vec![0.0; rows * latent], lse: vec![f32::NEG_INFINITY; rows] };
    for r in 0..rows {
        let lses: Vec<f32> = parts.iter().map(|p| p.lse[r]).collect();
        if let Some((weights, lse)) = lse_merge_weights(&lses) {
            for i in 0..latent {
                m.out[r * latent + i] = parts.iter().zip(&weights).map(|(p, wt)| wt * p.out[r * latent + i] as f64).sum::<f64>() as f32;
            }
            m.lse[r] = lse;
        }
    }
    m
}

/// The items in the order the schedule runs them: asm compute unit by compute unit (checking
/// `cu_indptr` covers every item once), Gluon in grid order.
fn execution_order(plan: &MlaDecodePlan) -> Result<Vec<&MlaWorkItem>> {
    let s = &plan.schedule;
    if plan.kernel == MlaKernel::Gluon {
        return Ok(s.items.iter().collect());
    }
    let mut order = Vec::with_capacity(s.items.len());
    for w in s.cu_indptr.windows(2) {
        let items = s.items.get(w[0] as usize..w[1] as usize).ok_or_else(|| Error::invalid("plan", "cu_indptr out of range"))?;
        order.extend(items);
    }
    if order.len() != s.items.len() {
        return Err(Error::invalid("plan", "cu_indptr does not cover every work item once"));
    }
    Ok(order)
}

impl MlaDecode for CpuBackend {
    fn supports(&self, _params: &MlaDecodeParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MlaDecodePlan,
        mut args: MlaDecodeArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MlaDecode::workspace_size(self, plan))?;
        let p = &plan.params;
        let (heads, latent, q_len, w) = (p.heads, p.cache.dims.latent, p.q_len, p.cache.dims.width());
        let q = read_f32(&args.q)?;
        check_same("seq_lens", &read_i64(&args.seq_lens)?, &plan.seq_lens)?;
        let table = read_i64(&args.block_table)?;
        let cache = PagedCache::new(&args.kv_cache, p.cache)?;
        let maxp = plan.max_pages_per_seq;
        let mut out = vec![0f32; plan.batch * q_len * heads * latent];
        let mut lse = vec![f32::NEG_INFINITY; plan.batch * q_len * heads];
        let mut no_ws = Vec::new();
        let ws: &mut [u8] = match workspace {
            Some(b) => &mut b.0,
            None => &mut no_ws,
        };

        for it in execution_order(plan)? {
            let (b, g) = (it.batch as usize, it.head_group as usize);
            let seq_len = *plan.seq_lens.get(b).ok_or_else(|| bad_plan("work item batch out of range"))? as usize;
            let first = seq_len.checked_sub(q_len).ok_or_else(|| bad_plan("seq_len shorter than q_len"))?;
            let q_block =
                q.get(b * q_len * heads * w..(b + 1) * q_len * heads * w).ok_or_else(|| bad_plan("work item batch out of range"))?;
            let pages = table.get(b * maxp..(b + 1) * maxp).ok_or_else(|| bad_plan("work item batch out of range"))?;
            let qb = QueryBlock { q: q_block, heads, limit: KeyLimit::CausalFrom(first) };
            let hs = group_heads(g, heads);
            let part = attend(&cache, pages, &qb, 0..q_len, hs.clone(), it.kv_start as usize..it.kv_end as usize, p.softmax_scale)?;
            match it.partial {
                None => place(&mut out, &mut lse, heads, latent, b * q_len, hs, &part)?,
                Some(slot) => store_slot(ws, plan, slot as usize, &part, hs.len())?,
            }
        }
        for e in &plan.schedule.reduce {
            let hs = group_heads(e.head_group as usize, heads);
            let parts = e.partials.clone().map(|s| load_slot(ws, plan, s as usize, hs.len())).collect::<Result<Vec<_>>>()?;
            let merged = merge(&parts, latent);
            place(&mut out, &mut lse, heads, latent, e.batch as usize * q_len, hs, &merged)?;
        }

        write_f32(&mut args.out, &out)?;
        if let Some(l) = args.lse.as_mut() {
            write_f32(l, &lse)?;
        }
        Ok(())
    }

    /// Nothing to write (the reference executes the host schedule); checks what a GPU backend
    /// reads, so the receipt means the same on every backend.
    fn prepare_schedule(
        &self,
        plan: &MlaDecodePlan,
        seq_lens: &TensorRef<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<MlaPreparedSchedule> {
        seq_lens.check(self, "seq_lens")?.dtype(&[DType::I32])?.shape(&[Dim::Is(plan.batch)])?;
        check_same("seq_lens", &read_i64(seq_lens)?, &plan.seq_lens)?;
        check_workspace(self, workspace.as_deref(), MlaDecode::workspace_size(self, plan))?;
        Ok(MlaPreparedSchedule::new(plan, workspace_identity(workspace.as_deref())))
    }

    fn run_prepared(
        &self,
        plan: &MlaDecodePlan,
        schedule: &MlaPreparedSchedule,
        args: MlaDecodeArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        stream: &CpuStream,
    ) -> Result<()> {
        schedule.check(plan, workspace_identity(workspace.as_deref()))?;
        MlaDecode::run(self, plan, args, workspace, stream)
    }
}

/// The workspace's address (0 without one): what a prepared schedule is bound to.
fn workspace_identity(ws: Option<&HostBuffer>) -> u64 {
    ws.map_or(0, |b| b.0.as_ptr() as u64)
}

impl MlaPrefillAbsorbed for CpuBackend {
    fn supports(&self, _params: &MlaPrefillAbsorbedParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MlaPrefillAbsorbedPlan,
        mut args: MlaPrefillAbsorbedArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MlaPrefillAbsorbed::workspace_size(self, plan))?;
        let p = &plan.params;
        let (heads, latent, w) = (p.heads, p.cache.dims.latent, p.cache.dims.width());
        let q = read_f32(&args.q)?;
        check_same("cu_seqlens_q", &read_i64(&args.cu_seqlens_q)?, &plan.cu_seqlens_q)?;
        check_same("seq_lens", &read_i64(&args.seq_lens)?, &plan.seq_lens)?;
        let table = read_i64(&args.block_table)?;
        let cache = PagedCache::new(&args.kv_cache, p.cache)?;
        let maxp = plan.max_pages_per_seq;
        let mut out = vec![0f32; plan.total_q * heads * latent];
        let mut lse = vec![f32::NEG_INFINITY; plan.total_q * heads];

        for it in &plan.items {
            let b = it.batch as usize;
            let (q0, q1) = match (plan.cu_seqlens_q.get(b), plan.cu_seqlens_q.get(b + 1)) {
                (Some(&a), Some(&e)) if a <= e && a <= it.q_start && it.q_start <= it.q_end && it.q_end <= e => (a as usize, e as usize),
                _ => return Err(bad_plan("work item rows outside its sequence")),
            };
            let seq_len = *plan.seq_lens.get(b).ok_or_else(|| bad_plan("work item batch out of range"))? as usize;
            let limit = match p.causal {
                true => {
                    KeyLimit::CausalFrom(seq_len.checked_sub(q1 - q0).ok_or_else(|| bad_plan("seq_len shorter than the causal block"))?)
                }
                false => KeyLimit::All(seq_len),
            };
            let q_block = q.get(q0 * heads * w..q1 * heads * w).ok_or_else(|| bad_plan("query rows outside `q`"))?;
            let pages = table.get(b * maxp..(b + 1) * maxp).ok_or_else(|| bad_plan("work item batch out of range"))?;
            let qb = QueryBlock { q: q_block, heads, limit };
            let hs = group_heads(it.head_group as usize, heads);
            let rows = it.q_start as usize - q0..it.q_end as usize - q0;
            let part = attend(&cache, pages, &qb, rows, hs.clone(), 0..seq_len, p.softmax_scale)?;
            place(&mut out, &mut lse, heads, latent, it.q_start as usize, hs, &part)?;
        }

        write_f32(&mut args.out, &out)?;
        if let Some(l) = args.lse.as_mut() {
            write_f32(l, &lse)?;
        }
        Ok(())
    }
}
