//! CPU reference of [`MlaCacheWrite`]: each row goes through the shared per-token codec
//! ([`encode_token`]) and its bytes are copied to the slot's cache row.

use super::{read_f32, read_i64, CpuBackend, CpuStream, HostBuffer};
use crate::error::{ensure, Error, Result};
use crate::ops::kv_cache::encode_token;
use crate::ops::{check_workspace, MlaCacheWrite, MlaCacheWriteArgs, MlaCacheWriteParams, MlaCacheWritePlan};

impl MlaCacheWrite for CpuBackend {
    fn supports(&self, _params: &MlaCacheWriteParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &MlaCacheWritePlan,
        args: MlaCacheWriteArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), MlaCacheWrite::workspace_size(self, plan))?;
        let p = &plan.params;
        let slots = read_i64(&args.slot_mapping)?;
        ensure(slots == plan.batch.slot_mapping, "slot_mapping", || {
            "device values differ from the planned slot mapping".into()
        })?;
        let width = p.dims.width();
        let kv = read_f32(&args.kv)?;
        let cache = args.cache;
        let elem = cache.layout.dtype.size_bytes();
        let mut token = vec![0u8; plan.bytes_per_token];
        for (n, &slot) in slots.iter().enumerate() {
            let Ok(slot) = usize::try_from(slot) else {
                continue; // negative slot: padding token
            };
            let (page, row) = (slot / p.page_size, slot % p.page_size);
            ensure(page < p.num_pages, "slot_mapping", || format!("token {n}: slot {slot} is outside the cache"))?;
            encode_token(p.format, p.dims, &kv[n * width..(n + 1) * width], p.kv_scale, &mut token)?;
            // Unit inner stride (checked): the token's bytes are contiguous from element (page, row, 0).
            let start = cache.layout.index(&[page, row, 0]) * elem;
            let dst = cache
                .buf
                .0
                .get_mut(start..start + plan.bytes_per_token)
                .ok_or_else(|| Error::invalid("cache", format!("token {n}: row of slot {slot} is outside the buffer")))?;
            dst.copy_from_slice(&token);
        }
        Ok(())
    }
}
