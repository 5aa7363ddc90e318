//! A device schedule built once and reused by every MLA layer of a decode step
//! ([`MlaDecode::prepare_schedule`](super::MlaDecode::prepare_schedule) /
//! [`MlaDecode::run_prepared`](super::MlaDecode::run_prepared)), after FlashInfer's plan/run
//! split with a caller-owned workspace.
//!
//! The receipt holds an exact copy of what the device schedule is a function of (kernel, batch,
//! head groups, q_len, page-table capacity, the host sequence lengths, the partition and where it
//! sits in the workspace), plus the identity of the workspace it was written into. `run_prepared`
//! compares both with its plan and workspace, so a schedule built for other sequence lengths,
//! another partition or another buffer is rejected before anything launches: it cannot be reused
//! by mistake. (Rewriting the workspace's schedule bytes between the two calls is the caller's
//! error that no host check sees; the kernels bound-check every schedule entry they read,
//! k3/checks.h, so it is reported, never an out-of-bounds access.)

use super::{MlaDecodePlan, MlaKernel, MlaSchedule};
use crate::error::{Error, Result};

/// Everything the device schedule of a plan is built from, and the schedule itself.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ScheduleKey {
    kernel: MlaKernel,
    batch: usize,
    head_groups: usize,
    q_len: usize,
    /// Tokens the page table holds per sequence (`max_pages_per_seq · page_size`).
    capacity: usize,
    seq_lens: Vec<u32>,
    schedule: MlaSchedule,
    /// Byte offset of the schedule in the workspace.
    offset: usize,
}

impl ScheduleKey {
    fn of(plan: &MlaDecodePlan) -> Self {
        ScheduleKey {
            kernel: plan.kernel,
            batch: plan.batch,
            head_groups: plan.head_groups,
            q_len: plan.params.q_len,
            capacity: plan.max_pages_per_seq.saturating_mul(plan.params.cache.page_size),
            seq_lens: plan.seq_lens.clone(),
            schedule: plan.schedule.clone(),
            offset: plan.schedule_offset(),
        }
    }
}

/// Receipt of [`MlaDecode::prepare_schedule`](super::MlaDecode::prepare_schedule): the device
/// schedule of one plan, written into one workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaPreparedSchedule {
    key: ScheduleKey,
    workspace: u64,
}

impl MlaPreparedSchedule {
    /// For backends: the receipt of `plan`'s schedule written into the workspace whose identity
    /// is `workspace` (its device address; 0 for none).
    pub fn new(plan: &MlaDecodePlan, workspace: u64) -> Self {
        MlaPreparedSchedule { key: ScheduleKey::of(plan), workspace }
    }

    /// Whether the prepared schedule is the one `plan` needs, in the workspace `workspace`
    /// (same identity as given to [`Self::new`]); an `InvalidInput` naming `schedule` if not.
    pub fn check(&self, plan: &MlaDecodePlan, workspace: u64) -> Result<()> {
        let want = ScheduleKey::of(plan);
        if self.key != want {
            let why = if self.key.seq_lens != want.seq_lens {
                "was prepared for other sequence lengths (plan and prepare the schedule again for this step)"
            } else {
                "was prepared for another plan (batch, head groups, q_len, page table or partition differ)"
            };
            return Err(Error::invalid("schedule", why));
        }
        if self.workspace != workspace {
            return Err(Error::invalid("schedule", "was prepared in another workspace buffer (pass the one prepare_schedule wrote)"));
        }
        Ok(())
    }
}
