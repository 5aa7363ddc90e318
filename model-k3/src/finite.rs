//! The loader's check that every weight is finite, fused with the copy out of the memory-mapped
//! shard: each block is scanned while it is in cache and then copied, so the payload is read
//! from memory once. A NaN or infinity in a weight makes every logit NaN downstream (greedy
//! decoding would then report token 0 forever), so it is refused at load with the tensor named.
//!
//! What is non-finite per stored dtype: f32, f16, bf16 and fp8 e5m2 with an all-ones exponent;
//! fp8 e4m3fn `S.1111.111` (its only NaN; it has no infinity); an MXFP4 scale byte (E8M0, the
//! `weight_scale` tensors) 0xFF, E8M0's NaN. Integer tensors and packed E2M1 codes have no
//! non-finite values.

use kernel_api::DType;

/// Bytes scanned and copied per step (fits L2 with room for the copy).
const BLOCK: usize = 64 << 10;

/// How one element's bytes are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Float(DType),
    /// E8M0 scale bytes stored as U8.
    E8m0,
    /// Nothing to check (integers, packed E2M1 codes).
    Unchecked,
}

impl Encoding {
    /// The encoding of a checkpoint tensor: MXFP4 scales are U8 tensors named `*.weight_scale`.
    pub fn of(name: &str, dtype: DType) -> Encoding {
        match dtype {
            DType::U8 if name.ends_with(".weight_scale") => Encoding::E8m0,
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3Fn | DType::F8E5M2 => Encoding::Float(dtype),
            _ => Encoding::Unchecked,
        }
    }

    fn size(self) -> usize {
        match self {
            Encoding::Float(d) => d.size_bytes(),
            _ => 1,
        }
    }
}

/// Whether one element is non-finite.
#[inline(always)]
fn bad(enc: Encoding, e: &[u8]) -> bool {
    match enc {
        Encoding::Float(DType::F32) => u32::from_le_bytes([e[0], e[1], e[2], e[3]]) & 0x7F80_0000 == 0x7F80_0000,
        Encoding::Float(DType::BF16) => u16::from_le_bytes([e[0], e[1]]) & 0x7F80 == 0x7F80,
        Encoding::Float(DType::F16) => u16::from_le_bytes([e[0], e[1]]) & 0x7C00 == 0x7C00,
        Encoding::Float(DType::F8E4M3Fn) => e[0] & 0x7F == 0x7F,
        Encoding::Float(DType::F8E5M2) => e[0] & 0x7C == 0x7C,
        Encoding::E8m0 => e[0] == 0xFF,
        _ => false,
    }
}

/// Index of the first non-finite element of `bytes`. The common all-finite case is one
/// branch-free pass per block (which the compiler vectorises); only a block that has a bad
/// element is searched again.
pub fn first_nonfinite(enc: Encoding, bytes: &[u8]) -> Option<usize> {
    let size = enc.size();
    if enc == Encoding::Unchecked {
        return None;
    }
    let mut base = 0;
    for block in bytes.chunks(BLOCK) {
        if let Some(i) = first_in_block(enc, block) {
            return Some(base + i);
        }
        base += block.len() / size;
    }
    None
}

fn first_in_block(enc: Encoding, block: &[u8]) -> Option<usize> {
    // One monomorphic loop per encoding, so each is vectorised on its own.
    fn any<const N: usize>(block: &[u8], f: impl Fn(&[u8]) -> bool) -> bool {
        block.chunks_exact(N).fold(false, |acc, e| acc | f(e))
    }
    let found = match enc {
        Encoding::Float(DType::F32) => any::<4>(block, |e| bad(enc, e)),
        Encoding::Float(DType::BF16) | Encoding::Float(DType::F16) => any::<2>(block, |e| bad(enc, e)),
        _ => any::<1>(block, |e| bad(enc, e)),
    };
    if !found {
        return None;
    }
    block.chunks_exact(enc.size()).position(|e| bad(enc, e))
}

/// What a non-finite element of `enc` is, for messages.
pub fn describe(enc: Encoding, element: &[u8]) -> String {
    let hex: String = element.iter().rev().map(|b| format!("{b:02x}")).collect();
    match enc {
        Encoding::E8m0 => "0xff, the E8M0 NaN scale".to_string(),
        Encoding::Float(d) => {
            let v = kernel_api::tensor::decode_f32(d, element);
            format!("{v} (bits 0x{hex})")
        }
        Encoding::Unchecked => format!("0x{hex}"),
    }
}

/// Copies `src` into a new vector, checking it block by block on the way; `Err(i)` is the index
/// of the first non-finite element. The allocation is fallible (an error, not an abort).
pub fn copy_checked(enc: Encoding, src: &[u8]) -> Result<Vec<u8>, CopyError> {
    let mut out = Vec::new();
    out.try_reserve_exact(src.len()).map_err(|_| CopyError::Alloc(src.len()))?;
    let size = enc.size();
    for (b, block) in src.chunks(BLOCK).enumerate() {
        if enc != Encoding::Unchecked {
            if let Some(i) = first_in_block(enc, block) {
                return Err(CopyError::NonFinite(b * (BLOCK / size) + i));
            }
        }
        out.extend_from_slice(block);
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyError {
    /// Index of the first non-finite element.
    NonFinite(usize),
    /// Bytes that could not be allocated.
    Alloc(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_nonfinite_element_of_each_encoding() {
        let cases: [(Encoding, Vec<u8>, usize); 7] = [
            (Encoding::Float(DType::F32), f32::NAN.to_le_bytes().to_vec(), 4),
            (Encoding::Float(DType::F32), f32::NEG_INFINITY.to_le_bytes().to_vec(), 4),
            (Encoding::Float(DType::BF16), vec![0x80, 0x7F], 2), // +inf
            (Encoding::Float(DType::F16), vec![0x01, 0xFC], 2),  // NaN
            (Encoding::Float(DType::F8E4M3Fn), vec![0xFF], 1),
            (Encoding::Float(DType::F8E5M2), vec![0x7C], 1),
            (Encoding::E8m0, vec![0xFF], 1),
        ];
        for (enc, bad_elem, size) in cases {
            // Past the first block, so the block offset arithmetic is exercised too.
            let n = 3 * BLOCK / size + 5;
            let mut bytes = vec![0u8; n * size];
            let at = BLOCK / size + 7;
            bytes[at * size..(at + 1) * size].copy_from_slice(&bad_elem);
            assert_eq!(first_nonfinite(enc, &bytes), Some(at), "{enc:?}");
            assert_eq!(copy_checked(enc, &bytes), Err(CopyError::NonFinite(at)), "{enc:?}");
            bytes[at * size..(at + 1) * size].fill(0);
            assert_eq!(first_nonfinite(enc, &bytes), None, "{enc:?}");
            assert_eq!(copy_checked(enc, &bytes).unwrap(), bytes);
        }
    }

    #[test]
    fn largest_finite_values_pass() {
        assert_eq!(first_nonfinite(Encoding::Float(DType::F32), &f32::MAX.to_le_bytes()), None);
        assert_eq!(first_nonfinite(Encoding::Float(DType::BF16), &0x7F7Fu16.to_le_bytes()), None);
        assert_eq!(first_nonfinite(Encoding::Float(DType::F8E4M3Fn), &[0x7E, 0xFE]), None); // ±448
        assert_eq!(first_nonfinite(Encoding::E8m0, &[0xFE]), None); // 2^127
        assert_eq!(first_nonfinite(Encoding::of("x.weight_packed", DType::U8), &[0xFF]), None);
    }
}
