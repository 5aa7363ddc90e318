//! Tensor layouts, tensor arguments and host tensors.
//!
//! A tensor argument is a backend buffer plus a [`Layout`] (dtype, shape, strides in elements,
//! offset in elements). Plans validate layouts against the buffer length, so no backend reads or
//! writes outside a buffer.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::formats;
use half::{bf16, f16};

/// Dtype, shape and element strides of a tensor inside a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Strides in elements, one per dimension.
    pub strides: Vec<usize>,
    /// Offset of element (0, .., 0) from the start of the buffer, in elements.
    pub offset: usize,
}

impl Layout {
    /// Row-major contiguous layout at offset 0.
    pub fn contiguous(dtype: DType, shape: &[usize]) -> Self {
        let mut strides = vec![0; shape.len()];
        let mut s = 1usize;
        for i in (0..shape.len()).rev() {
            strides[i] = s;
            s = s.saturating_mul(shape[i]);
        }
        Layout { dtype, shape: shape.to_vec(), strides, offset: 0 }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements, `None` on overflow.
    pub fn numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    pub fn is_contiguous(&self) -> bool {
        *self == Layout { offset: self.offset, ..Layout::contiguous(self.dtype, &self.shape) }
    }

    /// Bytes from the buffer start to one past the last addressed element; `None` on overflow.
    /// An empty tensor spans `offset` elements.
    pub fn span_bytes(&self) -> Option<usize> {
        let n = self.numel()?;
        if n == 0 {
            return self.offset.checked_mul(self.dtype.size_bytes());
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)?.checked_mul(self.dtype.size_bytes())
    }

    /// Element index (in elements from the buffer start) of a multi-index. Caller guarantees
    /// the index is in range (validated layouts only).
    #[inline]
    pub fn index(&self, idx: &[usize]) -> usize {
        self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>()
    }

    /// Element offsets of every element in row-major logical order.
    pub fn element_offsets(&self) -> Vec<usize> {
        let n = self.numel().unwrap_or(0);
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        let rank = self.rank();
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            out.push(self.index(&idx));
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

/// One expected dimension in a shape check.
#[derive(Clone, Copy, Debug)]
pub enum Dim {
    /// Must equal this size.
    Is(usize),
    /// Any size.
    Any,
}

/// Validates one tensor's layout. Every check names the field.
pub struct Check<'a> {
    field: &'a str,
    layout: &'a Layout,
}

impl<'a> Check<'a> {
    pub fn new(field: &'a str, layout: &'a Layout) -> Self {
        Check { field, layout }
    }

    pub fn dtype(self, allowed: &[DType]) -> Result<Self> {
        if allowed.contains(&self.layout.dtype) {
            Ok(self)
        } else {
            let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
            Err(Error::invalid(
                self.field,
                format!("dtype {} not accepted (expected one of {})", self.layout.dtype, names.join(", ")),
            ))
        }
    }

    pub fn shape(self, dims: &[Dim]) -> Result<Self> {
        let l = self.layout;
        if l.strides.len() != l.shape.len() {
            return Err(Error::invalid(self.field, format!("{} strides for rank {}", l.strides.len(), l.shape.len())));
        }
        let ok = l.shape.len() == dims.len()
            && l.shape.iter().zip(dims).all(|(&s, d)| match d {
                Dim::Is(e) => s == *e,
                Dim::Any => true,
            });
        if ok {
            Ok(self)
        } else {
            let want: Vec<String> = dims
                .iter()
                .map(|d| match d {
                    Dim::Is(e) => e.to_string(),
                    Dim::Any => "_".into(),
                })
                .collect();
            Err(Error::invalid(self.field, format!("shape {:?} does not match [{}]", l.shape, want.join(", "))))
        }
    }

    pub fn contiguous(self) -> Result<Self> {
        if self.layout.is_contiguous() {
            Ok(self)
        } else {
            Err(Error::invalid(self.field, format!("must be contiguous (strides {:?})", self.layout.strides)))
        }
    }

    /// The innermost dimension must be unit-stride (rows may be strided).
    pub fn unit_inner_stride(self) -> Result<Self> {
        match self.layout.strides.last() {
            Some(1) | None => Ok(self),
            Some(s) => Err(Error::invalid(self.field, format!("innermost stride must be 1, got {s}"))),
        }
    }

    /// The layout must fit inside a buffer of `buf_len` bytes.
    pub fn fits(self, buf_len: usize) -> Result<Self> {
        match self.layout.span_bytes() {
            Some(n) if n <= buf_len => Ok(self),
            Some(n) => Err(Error::invalid(self.field, format!("layout spans {n} bytes but the buffer has {buf_len}"))),
            None => Err(Error::invalid(self.field, "layout size overflows usize".to_string())),
        }
    }

    pub fn size(&self, dim: usize) -> usize {
        self.layout.shape[dim]
    }
}

/// A read-only tensor argument: a backend buffer plus a layout.
#[derive(Debug)]
pub struct TensorRef<'a, B: Backend + ?Sized> {
    pub buf: &'a B::Buffer,
    pub layout: Layout,
}

impl<B: Backend + ?Sized> Clone for TensorRef<'_, B> {
    fn clone(&self) -> Self {
        TensorRef { buf: self.buf, layout: self.layout.clone() }
    }
}

/// A writable tensor argument.
#[derive(Debug)]
pub struct TensorMut<'a, B: Backend + ?Sized> {
    pub buf: &'a mut B::Buffer,
    pub layout: Layout,
}

impl<'a, B: Backend + ?Sized> TensorRef<'a, B> {
    pub fn new(buf: &'a B::Buffer, layout: Layout) -> Self {
        TensorRef { buf, layout }
    }
    /// Validation entry point; also checks the layout fits the buffer.
    pub fn check<'s>(&'s self, backend: &B, field: &'s str) -> Result<Check<'s>> {
        Check::new(field, &self.layout).fits(backend.buffer_len(self.buf))
    }
    /// The buffer and the layout, borrowed.
    pub fn parts(&self) -> (&B::Buffer, &Layout) {
        (self.buf, &self.layout)
    }
}

impl<'a, B: Backend + ?Sized> TensorMut<'a, B> {
    pub fn new(buf: &'a mut B::Buffer, layout: Layout) -> Self {
        TensorMut { buf, layout }
    }
    pub fn check<'s>(&'s self, backend: &B, field: &'s str) -> Result<Check<'s>> {
        Check::new(field, &self.layout).fits(backend.buffer_len(self.buf))
    }
    /// Reborrows as a read-only argument.
    pub fn as_ref(&self) -> TensorRef<'_, B> {
        TensorRef { buf: &*self.buf, layout: self.layout.clone() }
    }
    pub fn reborrow(&mut self) -> TensorMut<'_, B> {
        TensorMut { buf: &mut *self.buf, layout: self.layout.clone() }
    }
    /// The buffer (read-only) and the layout, borrowed.
    pub fn parts(&self) -> (&B::Buffer, &Layout) {
        (&*self.buf, &self.layout)
    }
}

/// An owned, contiguous tensor in host memory: the currency of tests, the `k3 op` command and
/// uploads to any backend. Bytes are little-endian.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Bytes of a `dtype` tensor of `shape`; `None` when the size overflows usize.
fn byte_size(dtype: DType, shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d))
}

impl HostTensor {
    /// Zeros of a shape known to fit memory (a shape whose size overflows usize panics here
    /// rather than wrap to a smaller buffer; sizes from input files go through `from_bytes`).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Self {
        let bytes = byte_size(dtype, shape).unwrap_or_else(|| panic!("HostTensor::zeros: shape {shape:?} of {dtype} overflows usize"));
        HostTensor { dtype, shape: shape.to_vec(), bytes: vec![0; bytes] }
    }

    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: Vec<u8>) -> Result<Self> {
        if byte_size(dtype, shape) != Some(bytes.len()) {
            return Err(Error::invalid("bytes", format!("{} bytes for shape {shape:?} of {dtype}", bytes.len())));
        }
        Ok(HostTensor { dtype, shape: shape.to_vec(), bytes })
    }

    /// Encodes f32 values into a float dtype with round-to-nearest-even (fp8 saturating to the
    /// largest finite value). Index dtypes take the values as integers.
    pub fn from_f32(dtype: DType, shape: &[usize], values: &[f32]) -> Result<Self> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(values.len()) || byte_size(dtype, shape).is_none() {
            return Err(Error::invalid("values", format!("{} values for shape {:?}", values.len(), shape)));
        }
        let mut bytes = vec![0u8; values.len() * dtype.size_bytes()];
        for (i, &v) in values.iter().enumerate() {
            encode_f32(dtype, v, &mut bytes[i * dtype.size_bytes()..(i + 1) * dtype.size_bytes()]);
        }
        Ok(HostTensor { dtype, shape: shape.to_vec(), bytes })
    }

    pub fn from_i32(shape: &[usize], values: &[i32]) -> Result<Self> {
        Self::from_bytes(DType::I32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    pub fn from_i64(shape: &[usize], values: &[i64]) -> Result<Self> {
        Self::from_bytes(DType::I64, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    pub fn layout(&self) -> Layout {
        Layout::contiguous(self.dtype, &self.shape)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Decodes every element to f32 (index types converted as integers).
    pub fn to_f32(&self) -> Vec<f32> {
        let s = self.dtype.size_bytes();
        self.bytes.chunks_exact(s).map(|c| decode_f32(self.dtype, c)).collect()
    }

    /// Decodes index tensors (i32 / i64) to i64.
    pub fn to_i64(&self) -> Vec<i64> {
        let s = self.dtype.size_bytes();
        self.bytes.chunks_exact(s).map(|c| decode_i64(self.dtype, c)).collect()
    }
}

/// Decodes one element at the start of `b` to f32.
#[inline]
pub fn decode_f32(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        DType::F8E4M3Fn => formats::F8E4M3Fn::from_bits(b[0]).to_f32(),
        DType::F8E4M3Fnuz => formats::F8E4M3Fnuz::from_bits(b[0]).to_f32(),
        DType::F8E5M2 => formats::F8E5M2::from_bits(b[0]).to_f32(),
        DType::E8M0 => formats::E8M0::from_bits(b[0]).to_f32(),
        DType::U8 | DType::F4E2M1x2 => b[0] as f32,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32,
    }
}

/// Decodes one integer element (i32, i64 or u8) to i64; floats are truncated.
#[inline]
pub fn decode_i64(dtype: DType, b: &[u8]) -> i64 {
    match dtype {
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        DType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        DType::U8 => b[0] as i64,
        other => decode_f32(other, b) as i64,
    }
}

/// Encodes one f32 into `out` (`dtype.size_bytes()` bytes) with round-to-nearest-even;
/// fp8 saturates to the largest finite value (SATFINITE), as GPU kernels do.
#[inline]
pub fn encode_f32(dtype: DType, v: f32, out: &mut [u8]) {
    use formats::Saturation::Finite;
    match dtype {
        DType::F32 => out[..4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
        DType::F8E4M3Fn => out[0] = formats::F8E4M3Fn::from_f32(v, Finite).to_bits(),
        DType::F8E4M3Fnuz => out[0] = formats::F8E4M3Fnuz::from_f32(v, Finite).to_bits(),
        DType::F8E5M2 => out[0] = formats::F8E5M2::from_f32(v, Finite).to_bits(),
        DType::E8M0 => out[0] = formats::E8M0::from_f32(v, formats::ScaleRounding::Nearest).to_bits(),
        DType::U8 | DType::F4E2M1x2 => out[0] = v.clamp(0.0, 255.0) as u8,
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&(v as i64).to_le_bytes()),
    }
}
