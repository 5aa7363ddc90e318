//! safetensors header checks with precise messages. The `safetensors` crate decides whether a
//! file is valid; when it is not, [`diagnose`] says why in terms a user can act on: a truncated
//! file (expected and actual size), trailing data, or the tensor whose header entry no longer
//! matches its data (the crate's messages name neither the sizes nor the tensor).

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::SafeTensors;

/// The format's cap on the header length (the crate's `MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;

/// Parses the header of a whole safetensors file held in `bytes`: (header length, metadata).
pub fn read_metadata(bytes: &[u8]) -> Result<(usize, Metadata), String> {
    SafeTensors::read_metadata(bytes).map_err(|e| diagnose(bytes).unwrap_or_else(|| format!("bad safetensors header: {e}")))
}

/// Why `bytes` is not a valid safetensors file, when that can be said more precisely than the
/// crate does; `None` leaves the crate's message (a JSON syntax error, say).
pub fn diagnose(bytes: &[u8]) -> Option<String> {
    let len = bytes.len() as u64;
    let Some(n) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())) else {
        return Some(format!("truncated: {len} bytes, fewer than the 8-byte header length field"));
    };
    if n > MAX_HEADER {
        return Some(format!("the header length field says {n} bytes, over the format's limit of {MAX_HEADER} (not a safetensors file, or corrupt)"));
    }
    if 8 + n > len {
        return Some(format!("truncated inside the header: the header is {n} bytes but the file holds {} after the length field", len - 8));
    }
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n as usize]).ok()?;
    let mut entries = Vec::new();
    for (name, v) in header.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo = match serde_json::from_value(v.clone()) {
            Ok(i) => i,
            Err(e) => return Some(format!("tensor `{name}`: bad header entry: {e}")),
        };
        let (s, e) = info.data_offsets;
        let bits = info.shape.iter().try_fold(info.dtype.bitsize() as u128, |a, &d| a.checked_mul(d as u128));
        let need = match bits {
            Some(b) if b % 8 == 0 => b / 8,
            Some(_) => return Some(format!("tensor `{name}`: shape {:?} of {:?} is not a whole number of bytes", info.shape, info.dtype)),
            None => return Some(format!("tensor `{name}`: shape {:?} overflows", info.shape)),
        };
        if e < s || (e - s) as u128 != need {
            return Some(format!(
                "tensor `{name}`: shape {:?} of {:?} needs {need} bytes but its data_offsets [{s}, {e}] hold {}",
                info.shape,
                info.dtype,
                e as i128 - s as i128
            ));
        }
        entries.push((s, e, name.clone()));
    }
    entries.sort();
    let mut end = 0usize;
    for (s, e, name) in &entries {
        if *s > end {
            return Some(format!("a gap of {} bytes before tensor `{name}`: it starts at {s}, the tensors before it end at {end}", s - end));
        }
        if *s < end {
            return Some(format!("tensor `{name}` (data_offsets [{s}, {e}]) overlaps the tensors before it, which end at {end}"));
        }
        end = *e;
    }
    let need = 8 + n + end as u64;
    if len < need {
        let cut = entries.iter().find(|(_, e, _)| 8 + n + *e as u64 > len).map(|(_, _, n)| n.as_str()).unwrap_or("");
        return Some(format!(
            "truncated: the header's tensors need {need} bytes, the file has {len} ({} bytes missing, from tensor `{cut}` on)",
            need - len
        ));
    }
    if len > need {
        return Some(format!("{} bytes of trailing data after the last tensor: the header's tensors end at byte {need}, the file has {len}", len - need));
    }
    None
}
