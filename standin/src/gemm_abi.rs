//! The attribute calls of cuBLASLt and hipBLASLt, written once: each library numbers the same
//! attributes differently ([`Abi`]), and values arrive as `(const void* buf, size_t size)`.

use crate::device::Device;
use crate::error::{invalid, Error, Kind, Result};
use crate::gemm::Elem;

/// A matmul-descriptor attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescAttr {
    ComputeType,
    ScaleType,
    PointerMode,
    TransA,
    TransB,
    Epilogue,
    BiasPointer,
    BiasDataType,
    /// A scale/aux pointer: accepted when null (the default), not emulated otherwise.
    NullOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutAttr {
    Type,
    Order,
    Rows,
    Cols,
    Ld,
    BatchCount,
    BatchOffset,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefAttr {
    SearchMode,
    MaxWorkspace,
    /// Alignment hints (cuBLASLt's MIN_ALIGNMENT_*): accepted, nothing depends on them here.
    Hint,
}

/// One library's numbering.
pub struct Abi {
    /// `cublasLt` / `hipblasLt`, for messages.
    pub name: &'static str,
    /// `cublasOperation_t` / `hipblasOperation_t`: N, T.
    pub op_n: i64,
    pub op_t: i64,
    /// The compute-type value for 32-bit float compute.
    pub compute_32f: i32,
    pub desc: fn(i32) -> Option<DescAttr>,
    pub layout: fn(i32) -> Option<LayoutAttr>,
    pub pref: fn(i32) -> Option<PrefAttr>,
}

/// The bytes of an attribute value as an integer (4- or 8-byte values).
///
/// # Safety
/// `buf` must hold `size` readable bytes.
unsafe fn value(buf: *const u8, size: usize) -> Result<i64> {
    if buf.is_null() {
        return Err(invalid("attribute buffer is null"));
    }
    // SAFETY: forwarded; unaligned reads of the caller's bytes.
    unsafe {
        match size {
            4 => Ok((buf as *const i32).read_unaligned() as i64),
            8 => Ok((buf as *const i64).read_unaligned()),
            other => Err(invalid(format!("attribute of {other} bytes (expected 4 or 8)"))),
        }
    }
}

fn unknown(abi: &Abi, what: &str, attr: i32) -> Error {
    Error::new(Kind::InvalidValue, format!("{} {what} attribute {attr} is not emulated by the stand-in", abi.name))
}

impl Abi {
    fn trans(&self, v: i64) -> Result<bool> {
        if v == self.op_n {
            Ok(false)
        } else if v == self.op_t {
            Ok(true)
        } else {
            Err(invalid(format!("operation {v} (the stand-in emulates N and T)")))
        }
    }

    /// `*MatmulDescSetAttribute`.
    ///
    /// # Safety
    /// `buf` must hold `size` readable bytes.
    pub unsafe fn set_desc(&self, dev: &Device, h: u64, attr: i32, buf: *const u8, size: usize) -> Result<()> {
        let a = (self.desc)(attr).ok_or_else(|| unknown(self, "matmul descriptor", attr))?;
        // SAFETY: forwarded.
        let v = unsafe { value(buf, size) }?;
        let trans = |v| self.trans(v);
        dev.desc_update(h, |d| {
            match a {
                DescAttr::ComputeType => d.compute_32f = v == self.compute_32f as i64,
                DescAttr::ScaleType => d.scale_f32 = Elem::from_raw(v as i32) == Elem::F32,
                DescAttr::PointerMode => d.device_pointer_mode = v != 0,
                DescAttr::TransA => d.trans_a = trans(v)?,
                DescAttr::TransB => d.trans_b = trans(v)?,
                DescAttr::Epilogue => match v {
                    1 => (d.bias, d.other_epilogue) = (false, None),
                    4 => (d.bias, d.other_epilogue) = (true, None),
                    other => d.other_epilogue = Some(other as u32),
                },
                DescAttr::BiasPointer => d.bias_ptr = v as u64,
                DescAttr::BiasDataType => d.bias_elem = Some(Elem::from_raw(v as i32)),
                DescAttr::NullOnly if v == 0 => {}
                DescAttr::NullOnly => return Err(invalid(format!("{} descriptor attribute {attr}: only null is emulated", self.name))),
            }
            Ok(())
        })
    }

    /// `*MatrixLayoutSetAttribute`.
    ///
    /// # Safety
    /// `buf` must hold `size` readable bytes.
    pub unsafe fn set_layout(&self, dev: &Device, h: u64, attr: i32, buf: *const u8, size: usize) -> Result<()> {
        let a = (self.layout)(attr).ok_or_else(|| unknown(self, "matrix layout", attr))?;
        // SAFETY: forwarded.
        let v = unsafe { value(buf, size) }?;
        dev.layout_update(h, |l| {
            match a {
                LayoutAttr::Type => l.elem = Elem::from_raw(v as i32),
                LayoutAttr::Order => l.row_major = v == 1,
                LayoutAttr::Rows => l.rows = v as u64,
                LayoutAttr::Cols => l.cols = v as u64,
                LayoutAttr::Ld => l.ld = v,
                LayoutAttr::BatchCount => l.batch = v as i32,
                LayoutAttr::BatchOffset if v == 0 => {}
                LayoutAttr::BatchOffset => return Err(invalid("strided batches are not emulated")),
            }
            Ok(())
        })
    }

    /// `*MatmulPreferenceSetAttribute`.
    ///
    /// # Safety
    /// `buf` must hold `size` readable bytes.
    pub unsafe fn set_pref(&self, dev: &Device, h: u64, attr: i32, buf: *const u8, size: usize) -> Result<()> {
        let a = (self.pref)(attr).ok_or_else(|| unknown(self, "preference", attr))?;
        // SAFETY: forwarded.
        let v = unsafe { value(buf, size) }?;
        dev.pref_update(h, |p| {
            if a == PrefAttr::MaxWorkspace {
                p.max_workspace = v as u64;
            }
            Ok(())
        })
    }
}

/// A host f32 scalar (alpha, beta: scale type 32F, host pointer mode).
///
/// # Safety
/// `p` must be null or point to an f32.
pub unsafe fn host_f32(p: *const u8, what: &str) -> Result<f32> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: forwarded.
    Ok(unsafe { (p as *const f32).read_unaligned() })
}
