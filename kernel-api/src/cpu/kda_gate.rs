use super::{read_f32, write_f32, CpuBackend, CpuStream, HostBuffer};
use crate::error::Result;
use crate::ops::{check_workspace, kda_gate_value, KdaGate, KdaGateArgs, KdaGateParams, KdaGatePlan};

impl KdaGate for CpuBackend {
    fn supports(&self, _params: &KdaGateParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &KdaGatePlan,
        mut args: KdaGateArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), KdaGate::workspace_size(self, plan))?;
        let p = &plan.params;
        let raw = read_f32(&args.g_raw)?;
        let channels = p.heads * p.head_dim;
        // Precomputed mode reads neither tensor; zeros stand in for them.
        let a_log = match &args.a_log {
            Some(t) if p.mode.uses_gate_params() => read_f32(t)?,
            _ => vec![0.0; p.heads],
        };
        let dt_bias = match &args.dt_bias {
            Some(t) if p.mode.uses_gate_params() => read_f32(t)?,
            _ => vec![0.0; channels],
        };
        let g: Vec<f32> = raw
            .iter()
            .enumerate()
            .map(|(e, &f)| {
                let c = e % channels; // channel h·K + i of token e / channels
                kda_gate_value(p.mode, f, a_log[c / p.head_dim], dt_bias[c])
            })
            .collect();
        write_f32(&mut args.g_out, &g)
    }
}
