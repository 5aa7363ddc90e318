use super::{read_i64, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::{check_workspace, MoeAlign, MoeAlignArgs, MoeAlignParams, MoeAlignPlan};
use crate::tensor::TensorMut;

/// Writes i32 values (logical row-major order). `write_f32` would lose ids above 2^24.
pub(super) fn write_i32(t: &mut TensorMut<'_, CpuBackend>, values: &[i32]) -> Result<()> {
    let offs = t.layout.element_offsets();
    if offs.len() != values.len() || t.layout.dtype.size_bytes() != 4 {
        return Err(Error::invalid(
            "output",
            format!("{} i32 values for {} x {} elements", values.len(), offs.len(), t.layout.dtype),
        ));
    }
    for (o, v) in offs.into_iter().zip(values) {
        let dst = t.buf.0.get_mut(o * 4..o * 4 + 4).ok_or_else(|| Error::invalid("output", "element outside the buffer"))?;
        dst.copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// Local expert of every pair (`None` = dropped by the expert map), range-checked.
fn local_experts(ids: &[i64], map: Option<&[i64]>, local: usize) -> Result<Vec<Option<usize>>> {
    ids.iter()
        .enumerate()
        .map(|(p, &id)| {
            let bound = map.map_or(local, <[i64]>::len);
            let e = usize::try_from(id)
                .ok()
                .filter(|&e| e < bound)
                .ok_or_else(|| Error::invalid("topk_ids", format!("pair {p} names expert {id}, outside 0..{bound}")))?;
            let Some(map) = map else { return Ok(Some(e)) };
            match map[e] {
                -1 => Ok(None),
                m if m >= 0 && (m as usize) < local => Ok(Some(m as usize)),
                m => Err(Error::invalid("expert_map", format!("entry {e} is {m}, outside -1..{local}"))),
            }
        })
        .collect()
}

impl MoeAlign for CpuBackend {
    fn supports(&self, _params: &MoeAlignParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MoeAlignPlan,
        mut args: MoeAlignArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        // Re-derived so that a hand-built plan cannot bypass validation.
        let plan = &MoeAlignPlan::new(&plan.params)?;
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MoeAlign::workspace_size(self, plan))?;
        let r = &plan.params.routing;
        let ids = read_i64(&args.topk_ids)?;
        let map = args.expert_map.as_ref().map(read_i64).transpose()?;
        let experts = local_experts(&ids, map.as_deref(), r.experts)?;

        // Stable bucket sort: pairs in ascending order within each expert.
        let mut buckets: Vec<Vec<i32>> = vec![Vec::new(); r.experts];
        let mut unserved = Vec::new();
        for (p, e) in experts.iter().enumerate() {
            // p < max_padded <= i32::MAX (plan)
            match e {
                Some(e) => buckets[*e].push(p as i32),
                None => unserved.push(p as i32),
            }
        }
        let sentinel = ids.len() as i32;
        let mut sorted = vec![sentinel; plan.max_padded];
        let mut block_expert = vec![-1i32; plan.num_blocks];
        let mut pos = 0usize;
        for (e, bucket) in buckets.iter().enumerate() {
            let run = bucket.len().div_ceil(r.block_m) * r.block_m;
            // pos + run <= P + E·(block_m - 1) <= max_padded, so these slices are in range.
            sorted[pos..pos + bucket.len()].copy_from_slice(bucket);
            block_expert[pos / r.block_m..(pos + run) / r.block_m].fill(e as i32);
            pos += run;
        }
        // Served runs <= P_served + E·(block_m - 1), so the unserved pairs fit before max_padded.
        sorted[pos..pos + unserved.len()].copy_from_slice(&unserved);
        write_i32(&mut args.sorted_token_ids, &sorted)?;
        write_i32(&mut args.expert_ids, &block_expert)?;
        write_i32(&mut args.num_tokens_post_padded, &[pos as i32])
    }
}
