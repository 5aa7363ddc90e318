//! safetensors files <-> [`HostTensor`]s: the dtype mapping in both directions and the
//! `dtypes` override for formats without a safetensors dtype.

use super::OpError;
use crate::files::{read_regular, write_replacing};
use crate::st_header;
use kernel_api::{DType, HostTensor};
use safetensors::{Dtype as StDtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// One tensor of an inputs file: the kernel view and the safetensors dtype it was stored with
/// (so that an in-place tensor is written back the way it came).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTensor {
    pub tensor: HostTensor,
    pub stored_as: StDtype,
}

/// The kernel dtype of a safetensors dtype. `F4` (one element = one nibble) becomes packed
/// `F4E2M1x2` with the last dimension halved.
fn kernel_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::U8 => DType::U8,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::F8_E4M3 => DType::F8E4M3Fn,
        StDtype::F8_E4M3FNUZ => DType::F8E4M3Fnuz,
        StDtype::F8_E5M2 => DType::F8E5M2,
        StDtype::F8_E8M0 => DType::E8M0,
        StDtype::F4 => DType::F4E2M1x2,
        _ => return None,
    })
}

/// The safetensors dtype an output of kernel dtype `d` is written with. e4m3fnuz, e8m0 and
/// packed fp4 are written as `U8` (their bytes unchanged; the kernel dtype is in the file's
/// metadata) because not every safetensors reader knows their dtypes.
fn stored_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::F8E4M3Fn => StDtype::F8_E4M3,
        DType::F8E5M2 => StDtype::F8_E5M2,
        _ => StDtype::U8,
    }
}

/// A dtype from its `DType::name` spelling (the names `dtypes` and `out_dtypes` accept).
pub fn parse_dtype(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == s)
}

/// Reads every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, StoredTensor>, OpError> {
    let bytes = read_regular(path).map_err(|e| OpError::file(path, e.to_string()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
        OpError::file(path, format!("not a valid safetensors file: {}", st_header::diagnose(&bytes).unwrap_or_else(|| e.to_string())))
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let d = view.dtype();
        let dtype = kernel_dtype(d).ok_or_else(|| {
            OpError::file(
                path,
                format!("tensor `{name}`: safetensors dtype {d:?} has no kernel dtype (store it as one of BF16, F16, F32, U8, I32, I64, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E8M0, F4; other 1-byte formats as U8 with a `dtypes` override)"),
            )
        })?;
        let mut shape = view.shape().to_vec();
        if d == StDtype::F4 {
            match shape.last_mut() {
                Some(last) if *last % 2 == 0 => *last /= 2,
                _ => {
                    return Err(OpError::file(path, format!("tensor `{name}`: F4 needs an even last dimension to pack two codes per byte, shape {shape:?}")))
                }
            }
        }
        let tensor = HostTensor::from_bytes(dtype, &shape, view.data().to_vec())
            .map_err(|e| OpError::file(path, format!("tensor `{name}`: {e}")))?;
        out.insert(name, StoredTensor { tensor, stored_as: d });
    }
    Ok(out)
}

/// Writes tensors to a safetensors file. A tensor with a `stored_as` dtype (an in-place input)
/// is written back with it; others get their natural safetensors dtype (e4m3fnuz, e8m0 and
/// packed fp4 as `U8`). The metadata records the op and the
/// kernel dtype of every tensor (`k3.dtype.<name>`).
pub fn write_safetensors(path: &Path, op: &str, tensors: &[(String, HostTensor, Option<StDtype>)]) -> Result<(), OpError> {
    let mut metadata = HashMap::from([("k3.op".to_string(), op.to_string())]);
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t, stored_as) in tensors {
        let d = stored_as.unwrap_or_else(|| stored_dtype(t.dtype));
        let mut shape = t.shape.clone();
        if d == StDtype::F4 {
            if let Some(last) = shape.last_mut() {
                *last *= 2;
            }
        }
        let view = safetensors::tensor::TensorView::new(d, shape, &t.bytes)
            .map_err(|e| OpError::file(path, format!("tensor `{name}`: {e}")))?;
        metadata.insert(format!("k3.dtype.{name}"), t.dtype.name().to_string());
        views.push((name.clone(), view));
    }
    // Only a regular file is ever replaced, and only once the new one is complete.
    write_replacing(
        path,
        |tmp| safetensors::serialize_to_file(views, Some(metadata), tmp).map_err(|e| OpError::file(path, e.to_string())),
        |e| OpError::file(path, e.to_string()),
    )
}

/// Applies a `dtypes` override: the stored bytes are reinterpreted as `to` (same element size).
pub fn reinterpret(op: &'static str, name: &str, t: &HostTensor, to: DType) -> Result<HostTensor, OpError> {
    if t.dtype.size_bytes() != to.size_bytes() {
        return Err(OpError::tensor(
            op,
            name,
            format!(
                "`dtypes` override to {to} needs {}-byte elements but the file stores {} ({} bytes); store the raw bytes as U8",
                to.size_bytes(),
                t.dtype,
                t.dtype.size_bytes()
            ),
        ));
    }
    Ok(HostTensor { dtype: to, shape: t.shape.clone(), bytes: t.bytes.clone() })
}
