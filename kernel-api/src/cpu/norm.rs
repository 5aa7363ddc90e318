//! CPU norms: weighted RMSNorm, gated per-head RMSNorm, L2 norm (spec in [`crate::ops::norm`]).

use super::gemm::write_contiguous_f32;
use super::math::{l2_normalize, rms_inv, sigmoid};
use super::{read_f32, CpuBackend, CpuStream, HostBuffer};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{
    check_workspace, GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, GatedRmsNormPlan, L2Norm, L2NormArgs, L2NormParams,
    L2NormPlan, RmsNorm, RmsNormArgs, RmsNormParams, RmsNormPlan, RmsWeightOrder,
};
use half::{bf16, f16};

/// Rounds an f32 through `dtype` (the HF cast of the normalised value to the activation dtype).
fn round_through(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(v).to_f32(),
        DType::F16 => f16::from_f32(v).to_f32(),
        _ => v,
    }
}

impl RmsNorm for CpuBackend {
    fn supports(&self, _params: &RmsNormParams) -> Result<()> {
        Ok(())
    }

    fn run(&self, plan: &RmsNormPlan, mut args: RmsNormArgs<'_, Self>, workspace: Option<&mut HostBuffer>, _stream: &CpuStream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), RmsNorm::workspace_size(self, plan))?;
        let p = &plan.params;
        let x = read_f32(&args.x)?;
        let w = read_f32(&args.w)?;
        let act = args.x.layout.dtype;
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks_exact(p.d) {
            let r = rms_inv(row, p.eps);
            out.extend(row.iter().zip(&w).map(|(&xi, &wi)| match p.weight_order {
                RmsWeightOrder::F32 => (wi as f64 * xi as f64 * r as f64) as f32,
                // HF: `hidden_states * rsqrt(variance + eps)` is an fp32 product, cast to the
                // activation dtype, then multiplied by the weight.
                RmsWeightOrder::CastBeforeWeight => (wi as f64 * round_through(act, xi * r) as f64) as f32,
            }));
        }
        write_contiguous_f32(&mut args.out, &out)
    }
}

impl GatedRmsNorm for CpuBackend {
    fn supports(&self, _params: &GatedRmsNormParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &GatedRmsNormPlan,
        mut args: GatedRmsNormArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), GatedRmsNorm::workspace_size(self, plan))?;
        let dh = plan.params.head_dim;
        let o = read_f32(&args.o)?;
        let gate = read_f32(&args.gate)?;
        let w = read_f32(&args.w)?;
        let mut out = Vec::with_capacity(o.len());
        // One chunk is one (token, head): the mean runs over that head's dims only.
        for (oh, gh) in o.chunks_exact(dh).zip(gate.chunks_exact(dh)) {
            let r = rms_inv(oh, plan.params.eps) as f64;
            for ((&oi, &gi), &wi) in oh.iter().zip(gh).zip(&w) {
                out.push((wi as f64 * oi as f64 * r * sigmoid(gi) as f64) as f32);
            }
        }
        write_contiguous_f32(&mut args.out, &out)
    }
}

impl L2Norm for CpuBackend {
    fn supports(&self, _params: &L2NormParams) -> Result<()> {
        Ok(())
    }

    fn run(&self, plan: &L2NormPlan, mut args: L2NormArgs<'_, Self>, workspace: Option<&mut HostBuffer>, _stream: &CpuStream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), L2Norm::workspace_size(self, plan))?;
        let mut x = read_f32(&args.x)?;
        for row in x.chunks_exact_mut(plan.params.d) {
            l2_normalize(row, plan.params.eps);
        }
        write_contiguous_f32(&mut args.out, &x)
    }
}
