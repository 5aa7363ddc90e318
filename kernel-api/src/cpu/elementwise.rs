//! CPU elementwise ops: SiTU-GLU, sigmoid gate, embedding gather (spec in
//! [`crate::ops::elementwise`]).

use super::gemm::write_contiguous_f32;
use super::math::{sigmoid, situ};
use super::{read_f32, read_i64, CpuBackend, CpuStream, HostBuffer};
use crate::error::{Error, Result};
use crate::ops::elementwise::check_ids;
use crate::ops::{
    check_workspace, EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, EmbeddingGatherPlan, SigmoidGate,
    SigmoidGateArgs, SigmoidGateParams, SigmoidGatePlan, SituGlu, SituGluArgs, SituGluInput, SituGluParams, SituGluPlan,
};
use crate::tensor::{decode_f32, encode_f32};

impl SituGlu for CpuBackend {
    fn supports(&self, _params: &SituGluParams) -> Result<()> {
        Ok(())
    }

    fn run(&self, plan: &SituGluPlan, mut args: SituGluArgs<'_, Self>, workspace: Option<&mut HostBuffer>, _stream: &CpuStream) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), SituGlu::workspace_size(self, plan))?;
        let p = &plan.params;
        let (gate, up) = match &args.input {
            SituGluInput::Separate { gate, up } => (read_f32(gate)?, read_f32(up)?),
            SituGluInput::Fused(gu) => {
                // Each fused row is [gate (N) | up (N)].
                let gu = read_f32(gu)?;
                let (mut g, mut u) = (Vec::with_capacity(gu.len() / 2), Vec::with_capacity(gu.len() / 2));
                for row in gu.chunks_exact(2 * p.n) {
                    g.extend_from_slice(&row[..p.n]);
                    u.extend_from_slice(&row[p.n..]);
                }
                (g, u)
            }
        };
        let out: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| situ(g, u, p.beta, p.linear_beta)).collect();
        write_contiguous_f32(&mut args.out, &out)
    }
}

impl SigmoidGate for CpuBackend {
    fn supports(&self, _params: &SigmoidGateParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &SigmoidGatePlan,
        mut args: SigmoidGateArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), SigmoidGate::workspace_size(self, plan))?;
        let x = read_f32(&args.x)?;
        let g = read_f32(&args.g)?;
        let out: Vec<f32> = x.iter().zip(&g).map(|(&x, &g)| (x as f64 * sigmoid(g) as f64) as f32).collect();
        write_contiguous_f32(&mut args.out, &out)
    }
}

impl EmbeddingGather for CpuBackend {
    fn supports(&self, _params: &EmbeddingGatherParams) -> Result<()> {
        Ok(())
    }

    fn run(
        &self,
        plan: &EmbeddingGatherPlan,
        args: EmbeddingGatherArgs<'_, Self>,
        workspace: Option<&mut HostBuffer>,
        _stream: &CpuStream,
    ) -> Result<()> {
        plan.check_args(self, &args)?;
        check_workspace(self, workspace.as_deref(), EmbeddingGather::workspace_size(self, plan))?;
        let p = &plan.params;
        let ids = read_i64(&args.ids)?;
        // The device ids may differ from the host ids the plan checked: check again.
        check_ids(&ids, p.vocab)?;
        let table = &args.table.layout;
        let (t_dt, o_dt) = (table.dtype, args.out.layout.dtype);
        let (t_size, o_size) = (t_dt.size_bytes(), o_dt.size_bytes());
        let out_start = args.out.layout.offset * o_size;
        for (m, &id) in ids.iter().enumerate() {
            // Row `id` of the table: D elements with unit stride from index (id, 0).
            let src_start = table.index(&[id as usize, 0]) * t_size;
            let src = args.table.buf.0.get(src_start..src_start + p.d * t_size);
            let dst_start = out_start + m * p.d * o_size;
            let dst = args.out.buf.0.get_mut(dst_start..dst_start + p.d * o_size);
            let (Some(src), Some(dst)) = (src, dst) else {
                return Err(Error::invalid("table", format!("row {id} or output row {m} lies outside its buffer")));
            };
            if t_dt == o_dt {
                dst.copy_from_slice(src); // bit-exact copy, NaN payloads included
            } else {
                for (d, s) in dst.chunks_exact_mut(o_size).zip(src.chunks_exact(t_size)) {
                    encode_f32(o_dt, decode_f32(t_dt, s), d);
                }
            }
        }
        Ok(())
    }
}
