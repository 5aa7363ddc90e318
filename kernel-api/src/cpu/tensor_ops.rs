use super::{read_f32, write_f32, CpuBackend, CpuStream};
use crate::error::Result;
use crate::ops::tensor_ops::{AddAssign, AddAssignArgs, CopyCast, CopyCastArgs, ElementwisePlan};

impl CopyCast for CpuBackend {
    fn run(&self, plan: &ElementwisePlan, mut args: CopyCastArgs<'_, Self>, _stream: &CpuStream) -> Result<()> {
        plan.check_copy(self, &args)?;
        let v = read_f32(&args.x)?;
        write_f32(&mut args.out, &v)
    }
}

impl AddAssign for CpuBackend {
    fn run(&self, plan: &ElementwisePlan, mut args: AddAssignArgs<'_, Self>, _stream: &CpuStream) -> Result<()> {
        plan.check_add(self, &args)?;
        let x = read_f32(&args.x)?;
        let mut acc = read_f32(&args.acc.as_ref())?;
        for (a, b) in acc.iter_mut().zip(&x) {
            *a += *b;
        }
        write_f32(&mut args.acc, &acc)
    }
}
