//! Op families whose GPU kernels are not written yet: every backend must implement every trait
//! (the conformance suite and the model runner are generic over all of them), so these answer
//! `supports` with `Unsupported` and the reason, and `run` refuses the same way. A family moves
//! out of this file when its kernels and launcher land.

use crate::gpu_backend::GpuBackend;
use crate::runtime::Runtime;
use kernel_api::ops::*;
use kernel_api::{Error, Result};

fn no_kernel(op: &str) -> Error {
    Error::unsupported(op, "no GPU kernel for this op yet (it runs on the CPU reference backend)")
}

macro_rules! pending {
    ($($tr:ident, $params:ty, $plan:ty, $args:ident, $op:literal;)*) => {$(
        impl<R: Runtime> $tr for GpuBackend<R> {
            fn supports(&self, _p: &$params) -> Result<()> {
                Err(no_kernel($op))
            }
            fn run(&self, _plan: &$plan, _args: $args<'_, Self>, _ws: Option<&mut R::Buffer>, _s: &R::Stream) -> Result<()> {
                Err(no_kernel($op))
            }
        }
    )*};
}

pending! {
    MlaPrefill, MlaPrefillParams, MlaPrefillPlan, MlaPrefillArgs, "mla_prefill";
    MlaCacheWrite, MlaCacheWriteParams, MlaCacheWritePlan, MlaCacheWriteArgs, "mla_cache_write";
    MlaDecode, MlaDecodeParams, MlaDecodePlan, MlaDecodeArgs, "mla_decode";
    MlaPrefillAbsorbed, MlaPrefillAbsorbedParams, MlaPrefillAbsorbedPlan, MlaPrefillAbsorbedArgs, "mla_prefill_absorbed";
}
