//! Element types of tensors crossing the contract.

use std::fmt;

/// Element type of a tensor. fp8 flavours are distinct: e4m3fn (NVIDIA, gfx950) and e4m3fnuz
/// (gfx942) share bit patterns with different values and must never be conflated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    F32,
    F16,
    BF16,
    F8E4M3Fn,
    F8E4M3Fnuz,
    F8E5M2,
    /// Power-of-two scale byte (MX formats).
    E8M0,
    /// Two FP4 E2M1 codes in one byte, low nibble = even element. Shapes count bytes.
    F4E2M1x2,
    U8,
    I32,
    I64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3Fn,
        DType::F8E4M3Fnuz,
        DType::F8E5M2,
        DType::E8M0,
        DType::F4E2M1x2,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per stored element (for `F4E2M1x2` one element is one byte holding two values).
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::F8E4M3Fn
            | DType::F8E4M3Fnuz
            | DType::F8E5M2
            | DType::E8M0
            | DType::F4E2M1x2
            | DType::U8 => 1,
        }
    }

    /// Lower-case name as used in safetensors-like listings and error messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3Fn => "f8e4m3fn",
            DType::F8E4M3Fnuz => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::E8M0 => "e8m0",
            DType::F4E2M1x2 => "f4e2m1x2",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// Whether values of this type decode to real numbers element by element
    /// (`F4E2M1x2` packs two and is not).
    pub const fn is_scalar_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3Fn | DType::F8E4M3Fnuz | DType::F8E5M2 | DType::E8M0
        )
    }

    pub const fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
