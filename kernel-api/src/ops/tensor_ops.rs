//! Data movement and accumulation the model runner needs between the compute ops.
//!
//! - `CopyCast`: out = x element by element, any float layout (strides, offsets) to any float
//!   layout of the same shape, rounding once to the output dtype (round-half-even; fp8 outputs
//!   saturate). Used to take strided views (q/k/v out of a fused projection) contiguous and to
//!   change activation precision.
//! - `AddAssign`: acc += x elementwise (acc f32 or bf16; x any float dtype), the residual and
//!   AttnRes partial-sum update. The sum is computed in f32 and rounded once.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Float dtypes these ops read and write.
pub const FLOAT_DTYPES: &[DType] =
    &[DType::F32, DType::F16, DType::BF16, DType::F8E4M3Fn, DType::F8E4M3Fnuz, DType::F8E5M2];

/// Shape of an elementwise op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementwiseParams {
    pub shape: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementwisePlan {
    pub params: ElementwiseParams,
    pub numel: usize,
}

impl ElementwisePlan {
    pub fn new(p: &ElementwiseParams) -> Result<Self> {
        let numel = p.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        ensure(numel.is_some(), "params.shape", || format!("{:?} overflows usize", p.shape))?;
        ensure(!p.shape.is_empty(), "params.shape", || "rank must be at least 1".into())?;
        Ok(ElementwisePlan { params: p.clone(), numel: numel.unwrap_or(0) })
    }

    fn dims(&self) -> Vec<Dim> {
        self.params.shape.iter().map(|&d| Dim::Is(d)).collect()
    }
}

#[derive(Debug)]
pub struct CopyCastArgs<'a, B: Backend + ?Sized> {
    pub x: TensorRef<'a, B>,
    pub out: TensorMut<'a, B>,
}

#[derive(Debug)]
pub struct AddAssignArgs<'a, B: Backend + ?Sized> {
    /// Accumulator, f32 or bf16, updated in place.
    pub acc: TensorMut<'a, B>,
    pub x: TensorRef<'a, B>,
}

impl ElementwisePlan {
    pub fn check_copy<B: Backend + ?Sized>(&self, b: &B, a: &CopyCastArgs<'_, B>) -> Result<()> {
        let d = self.dims();
        a.x.check(b, "x")?.dtype(FLOAT_DTYPES)?.shape(&d)?;
        a.out.check(b, "out")?.dtype(FLOAT_DTYPES)?.shape(&d)?;
        Ok(())
    }
    pub fn check_add<B: Backend + ?Sized>(&self, b: &B, a: &AddAssignArgs<'_, B>) -> Result<()> {
        let d = self.dims();
        a.acc.check(b, "acc")?.dtype(&[DType::F32, DType::BF16])?.shape(&d)?;
        a.x.check(b, "x")?.dtype(FLOAT_DTYPES)?.shape(&d)?;
        Ok(())
    }
}

/// Strided copy with dtype conversion.
pub trait CopyCast: Backend {
    fn plan(&self, p: &ElementwiseParams) -> Result<ElementwisePlan> {
        ElementwisePlan::new(p)
    }
    fn run(&self, plan: &ElementwisePlan, args: CopyCastArgs<'_, Self>, stream: &Self::Stream) -> Result<()>;
}

/// In-place accumulation acc += x.
pub trait AddAssign: Backend {
    fn plan(&self, p: &ElementwiseParams) -> Result<ElementwisePlan> {
        ElementwisePlan::new(p)
    }
    fn run(&self, plan: &ElementwisePlan, args: AddAssignArgs<'_, Self>, stream: &Self::Stream) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl ElementwiseParams {
    /// `dst += src` over the shape: dst read and written, src read; one add per value.
    pub fn add_assign_cost(&self, dst: DType, src: DType) -> Result<Cost> {
        let n = self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(dim(d)));
        let Some(n) = n else { return CostBuilder::new("params.shape").bytes(&[u64::MAX, 2]).build() };
        CostBuilder::new("params").bytes(&[n, 2, elem_bytes(dst)]).bytes(&[n, elem_bytes(src)]).flops(MathClass::Vector, &[n]).build()
    }
}
