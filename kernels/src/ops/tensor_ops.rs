use crate::gpu_backend::{arg, blocks_for, dtype_code, GpuBackend};
use crate::runtime::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::ops::tensor_ops::{AddAssign, AddAssignArgs, CopyCast, CopyCastArgs, ElementwisePlan};
use kernel_api::{Error, Layout, Result};

const THREADS: u32 = 256;

/// Sizes and strides padded to rank 4 (leading size-1 dims), or `Unsupported` past rank 4.
fn rank4(field: &str, l: &Layout) -> Result<([i64; 4], [i64; 4])> {
    let r = l.shape.len();
    if r > 4 {
        return Err(Error::unsupported(field, format!("rank {r}: GPU elementwise kernels take rank <= 4")));
    }
    let mut n = [1i64; 4];
    let mut s = [0i64; 4];
    for i in 0..r {
        n[4 - r + i] = l.shape[i] as i64;
        s[4 - r + i] = l.strides[i] as i64;
    }
    Ok((n, s))
}

fn push_layouts(a: &mut KernelArgs, numel: usize, first: &Layout, second: &Layout, names: (&str, &str)) -> Result<()> {
    let (n, s0) = rank4(names.0, first)?;
    let (_, s1) = rank4(names.1, second)?;
    arg(a, numel as i64);
    for v in &n[1..] {
        arg(a, *v);
    }
    for v in s0.iter().chain(&s1) {
        arg(a, *v);
    }
    Ok(())
}

impl<R: Runtime> CopyCast for GpuBackend<R> {
    fn run(&self, plan: &ElementwisePlan, args: CopyCastArgs<'_, Self>, stream: &R::Stream) -> Result<()> {
        plan.check_copy(self, &args)?;
        if plan.numel == 0 {
            return Ok(());
        }
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(args.x.buf, &args.x.layout));
        arg(&mut a, dtype_code(args.x.layout.dtype));
        arg(&mut a, self.ptr(&*args.out.buf, &args.out.layout));
        arg(&mut a, dtype_code(args.out.layout.dtype));
        push_layouts(&mut a, plan.numel, &args.x.layout, &args.out.layout, ("x", "out"))?;
        self.launch("copy_cast", LaunchConfig::new(blocks_for(plan.numel, THREADS as usize), THREADS, 0), &mut a, stream)
    }
}

impl<R: Runtime> AddAssign for GpuBackend<R> {
    fn run(&self, plan: &ElementwisePlan, args: AddAssignArgs<'_, Self>, stream: &R::Stream) -> Result<()> {
        plan.check_add(self, &args)?;
        if plan.numel == 0 {
            return Ok(());
        }
        let mut a = KernelArgs::new();
        arg(&mut a, self.ptr(&*args.acc.buf, &args.acc.layout));
        arg(&mut a, dtype_code(args.acc.layout.dtype));
        arg(&mut a, self.ptr(args.x.buf, &args.x.layout));
        arg(&mut a, dtype_code(args.x.layout.dtype));
        push_layouts(&mut a, plan.numel, &args.acc.layout, &args.x.layout, ("acc", "x"))?;
        self.launch("add_assign", LaunchConfig::new(blocks_for(plan.numel, THREADS as usize), THREADS, 0), &mut a, stream)
    }
}
