//! Speed-of-light model, part 1: what an op must do at least.
//!
//! A [`Cost`] is the bytes an op must move between device memory and the chip (every input,
//! weight, state and cache read once, every output and updated state written once; caches and
//! reuse inside the chip are free) and the floating-point operations it must execute, split by
//! the units that execute them ([`MathClass`]). Each op family computes its cost from its params
//! with a `cost` method beside its contract (`GemmParams::cost`, `KdaDecodeParams::cost`, ...);
//! [`crate::hardware`] turns a cost into a time floor on a given GPU. `k3-device-bench` and
//! `k3 plan` both use these methods, so their byte counts cannot drift apart.
//!
//! Counting rules shared by every op:
//! - a multiply-add is 2 FLOPs; a transcendental (exp, sigmoid, rsqrt, tanh) or a compare is 1;
//! - a product runs on the matrix units in the class of its operands ([`matrix_class`]): bf16 or
//!   f16 x bf16/f16/fp8/fp4 (dequantised to bf16 on the way in) is [`MathClass::Bf16Matrix`],
//!   fp8 x fp8/fp4 is [`MathClass::Fp8Matrix`], fp4 x fp4 is [`MathClass::Fp4Matrix`]; an f32
//!   operand means f32 FMAs on the vector units ([`MathClass::Vector`]);
//! - elementwise work (norms, gates, activations, softmax) is [`MathClass::Vector`];
//! - integer metadata (indices, block tables) counts as bytes, not FLOPs.
//!
//! All arithmetic is checked: a shape whose cost does not fit a `u64` is an
//! [`Error::InvalidInput`] naming the params, never a wrapped number.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The execution units a FLOP needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathClass {
    /// bf16/f16 operands on the matrix units (tensor cores, MFMA), f32 accumulation.
    Bf16Matrix,
    /// fp8 operands (an fp8 x fp4 product runs at the fp8 rate on every part that has both).
    Fp8Matrix,
    /// fp4 operands on both sides (A4W4).
    Fp4Matrix,
    /// f32 FMAs and elementwise work on the vector units (CUDA cores, VALU).
    Vector,
}

impl MathClass {
    pub const ALL: [MathClass; 4] = [MathClass::Bf16Matrix, MathClass::Fp8Matrix, MathClass::Fp4Matrix, MathClass::Vector];

    /// Short name for reports (`bf16`, `fp8`, `fp4`, `vector`).
    pub const fn name(self) -> &'static str {
        match self {
            MathClass::Bf16Matrix => "bf16",
            MathClass::Fp8Matrix => "fp8",
            MathClass::Fp4Matrix => "fp4",
            MathClass::Vector => "vector",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// The matrix class of a product of `a` and `b` (see the module docs).
pub fn matrix_class(a: DType, b: DType) -> MathClass {
    let rank = |d: DType| match d {
        DType::BF16 | DType::F16 => Some(2u8),
        DType::F8E4M3Fn | DType::F8E4M3Fnuz | DType::F8E5M2 => Some(1),
        DType::F4E2M1x2 => Some(0),
        _ => None,
    };
    match (rank(a), rank(b)) {
        (Some(x), Some(y)) => match x.max(y) {
            2 => MathClass::Bf16Matrix,
            1 => MathClass::Fp8Matrix,
            _ => MathClass::Fp4Matrix,
        },
        _ => MathClass::Vector,
    }
}

/// Bytes moved and FLOPs executed by one op call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes read from and written to device memory.
    pub bytes: u64,
    /// FLOPs per class, indexed in [`MathClass::ALL`] order (use [`Cost::flops`]).
    pub flops_by_class: [u64; 4],
}

impl Cost {
    /// FLOPs of one class.
    pub fn flops(&self, class: MathClass) -> u64 {
        self.flops_by_class[class.index()]
    }

    /// FLOPs of every class together (saturating: for reports only).
    pub fn total_flops(&self) -> u64 {
        self.flops_by_class.iter().fold(0u64, |a, &f| a.saturating_add(f))
    }

    /// Sum of two costs, `None` on overflow.
    pub fn checked_add(&self, o: &Cost) -> Option<Cost> {
        let mut c = Cost { bytes: self.bytes.checked_add(o.bytes)?, ..Cost::default() };
        for i in 0..4 {
            c.flops_by_class[i] = self.flops_by_class[i].checked_add(o.flops_by_class[i])?;
        }
        Some(c)
    }

    /// `n` repetitions of this cost, `None` on overflow.
    pub fn checked_mul(&self, n: u64) -> Option<Cost> {
        let mut c = Cost { bytes: self.bytes.checked_mul(n)?, ..Cost::default() };
        for i in 0..4 {
            c.flops_by_class[i] = self.flops_by_class[i].checked_mul(n)?;
        }
        Some(c)
    }
}

/// Accumulates a cost from products of dimensions with checked arithmetic; the first overflow
/// turns [`CostBuilder::build`] into an error naming `field`.
#[derive(Clone, Debug)]
pub struct CostBuilder {
    field: &'static str,
    cost: Option<Cost>,
}

fn product(factors: &[u64]) -> Option<u64> {
    factors.iter().try_fold(1u64, |a, &f| a.checked_mul(f))
}

impl CostBuilder {
    /// A zero cost; `field` names the params in the overflow error.
    pub fn new(field: &'static str) -> Self {
        CostBuilder { field, cost: Some(Cost::default()) }
    }

    /// Adds the product of `factors` to the bytes.
    pub fn bytes(mut self, factors: &[u64]) -> Self {
        self.cost = self.cost.and_then(|mut c| {
            c.bytes = c.bytes.checked_add(product(factors)?)?;
            Some(c)
        });
        self
    }

    /// Adds the product of `factors` to the FLOPs of `class`.
    pub fn flops(mut self, class: MathClass, factors: &[u64]) -> Self {
        self.cost = self.cost.and_then(|mut c| {
            let slot = &mut c.flops_by_class[class.index()];
            *slot = slot.checked_add(product(factors)?)?;
            Some(c)
        });
        self
    }

    pub fn build(self) -> Result<Cost> {
        self.cost.ok_or_else(|| Error::invalid(self.field, "the op's byte or FLOP count overflows u64 (shape too large to model)"))
    }
}

/// Bytes of one element of `d` as a `u64` factor.
pub fn elem_bytes(d: DType) -> u64 {
    d.size_bytes() as u64
}

/// A `usize` dimension as a `u64` factor.
pub fn dim(x: usize) -> u64 {
    x as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_widest_operand() {
        assert_eq!(matrix_class(DType::BF16, DType::BF16), MathClass::Bf16Matrix);
        assert_eq!(matrix_class(DType::BF16, DType::F4E2M1x2), MathClass::Bf16Matrix, "W4A16 dequantises to bf16");
        assert_eq!(matrix_class(DType::F8E4M3Fn, DType::F4E2M1x2), MathClass::Fp8Matrix);
        assert_eq!(matrix_class(DType::F4E2M1x2, DType::F4E2M1x2), MathClass::Fp4Matrix);
        assert_eq!(matrix_class(DType::F32, DType::BF16), MathClass::Vector);
    }

    #[test]
    fn builder_sums_products_and_reports_overflow_by_field() {
        let c = CostBuilder::new("params").bytes(&[2, 3]).bytes(&[4]).flops(MathClass::Vector, &[5, 5]).build().unwrap();
        assert_eq!(c.bytes, 10);
        assert_eq!(c.flops(MathClass::Vector), 25);
        assert_eq!(c.total_flops(), 25);
        let e = CostBuilder::new("params.tokens").bytes(&[u64::MAX, 2]).flops(MathClass::Vector, &[1]).build().unwrap_err();
        assert_eq!(e.field(), Some("params.tokens"));
        assert!(CostBuilder::new("x").bytes(&[u64::MAX]).bytes(&[1]).build().is_err(), "overflow in the sum");
        assert_eq!(c.checked_mul(u64::MAX), None);
        assert_eq!(c.checked_add(&c).unwrap().bytes, 20);
    }
}
