//! What the vendor-BLAS hooks of the GPU backends share (cuBLASLt on CUDA, hipBLASLt on ROCm;
//! both are "Lt" libraries with the same column-major matmul-descriptor API): which operand
//! sets they are given, the byte span of a strided operand, the pointer alignment their
//! algorithm filters use, and the workspace a plan offers for a shape.
//!
//! Both backends compute the row-major `out[M,N] = x[M,K] · W[N,K]ᵀ (+ bias[N])` as the
//! column-major `outᵀ[N,M] = op(W)·xᵀ` with `TRANSA = T`: the "TN" layout every Lt kernel
//! family supports.

use kernel_api::error::Reasons;
use kernel_api::ops::gemm::GemmParams;
use kernel_api::{DType, Result};

/// The most workspace a plan offers an Lt library: NVIDIA's recommendation for the fastest
/// cuBLASLt algorithms on Hopper and Blackwell, also enough for every hipBLASLt kernel.
pub const LT_WORKSPACE_MAX_BYTES: usize = 32 << 20;
/// The least: room for scratch that does not grow with the output (tile semaphores, stream-K
/// fix-up slots).
pub const LT_WORKSPACE_MIN_BYTES: usize = 1 << 20;
/// Split-K slices whose f32 partial outputs the workspace holds.
pub const LT_SPLIT_K_SLICES: usize = 16;

/// The workspace a plan offers for `p`: room for [`LT_SPLIT_K_SLICES`] f32 partial outputs of
/// `M × N` (what split-K, the main user of Lt workspace, stores), rounded up to a power of two
/// and kept within [`LT_WORKSPACE_MIN_BYTES`, `LT_WORKSPACE_MAX_BYTES`]. The library is asked
/// for algorithms within exactly this size, so a shape never gets an algorithm whose scratch
/// does not fit; a decode GEMM (M = 1) no longer reserves 32 MiB. The factor and the floor are
/// not tuned on a GPU (none was available): they bound the allocation, not correctness.
pub fn lt_workspace_bytes(p: &GemmParams) -> usize {
    let partials = p.m.saturating_mul(p.n).saturating_mul(4).saturating_mul(LT_SPLIT_K_SLICES);
    partials.clamp(LT_WORKSPACE_MIN_BYTES, LT_WORKSPACE_MAX_BYTES).next_power_of_two().min(LT_WORKSPACE_MAX_BYTES)
}

/// One GEMM as an Lt library sees it: the contract's params and the operands' row strides.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LtGemm {
    pub params: GemmParams,
    /// Elements between rows of `x` (≥ K).
    pub x_row_stride: usize,
    /// Elements between rows of `W` (≥ K).
    pub w_row_stride: usize,
}

impl LtGemm {
    /// From the contract's params with dense rows.
    pub fn from_params(p: &GemmParams) -> Self {
        LtGemm { params: p.clone(), x_row_stride: p.k, w_row_stride: p.k }
    }

    /// Whether the Lt path takes this combination (the reasons if not): bf16 × bf16 → bf16 or
    /// f32, f32 × f32 → f32, f32 accumulation, a bias of the output's dtype (the bias epilogue
    /// reads it so). `library` names the library in the reasons.
    pub fn supports(&self, library: &str) -> Result<()> {
        let mut r = Reasons::new();
        let p = &self.params;
        let dts = (p.x_dtype, p.w_dtype, p.out_dtype);
        r.require(
            matches!(dts, (DType::BF16, DType::BF16, DType::BF16 | DType::F32) | (DType::F32, DType::F32, DType::F32)),
            "dtypes",
            format!("the {library} path takes bf16 x bf16 -> bf16/f32 or f32 x f32 -> f32, not {dts:?}"),
        );
        if let Some(b) = p.bias_dtype {
            r.require(b == p.out_dtype, "params.bias_dtype", format!("{b} bias with {} output: {library}'s bias epilogue takes the output dtype", p.out_dtype));
        }
        r.require(self.x_row_stride >= p.k, "x_row_stride", "below K");
        r.require(self.w_row_stride >= p.k, "w_row_stride", "below K");
        r.into_result()
    }
}

/// Bytes spanned by `rows` rows of `cols` elements with a row stride (elements), or `None` on
/// overflow.
pub fn operand_span(rows: usize, cols: usize, stride: usize, elem: usize) -> Option<usize> {
    if rows == 0 {
        return Some(0);
    }
    (rows - 1).checked_mul(stride)?.checked_add(cols)?.checked_mul(elem)
}

/// Largest power of two (≤ 256) dividing the address: what the Lt libraries' alignment filters
/// use (0, no pointer, counts as fully aligned).
pub fn pointer_alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_combinations_and_spans() {
        let g = |x, w, o, b| LtGemm::from_params(&GemmParams { bias_dtype: b, ..GemmParams::new(2, 3, 4, x, w, o) });
        assert!(g(DType::BF16, DType::BF16, DType::BF16, None).supports("lib").is_ok());
        assert!(g(DType::BF16, DType::BF16, DType::F32, Some(DType::F32)).supports("lib").is_ok());
        assert!(g(DType::F32, DType::F32, DType::F32, None).supports("lib").is_ok());
        let e = g(DType::BF16, DType::F32, DType::F32, None).supports("hipBLASLt").unwrap_err();
        assert!(matches!(e, kernel_api::Error::Unsupported { .. }) && e.to_string().contains("hipBLASLt"), "{e}");
        assert!(g(DType::BF16, DType::BF16, DType::BF16, Some(DType::F32)).supports("lib").is_err());
        assert_eq!(operand_span(3, 4, 10, 2), Some((2 * 10 + 4) * 2));
        assert_eq!(operand_span(0, 4, 10, 2), Some(0));
        assert_eq!(operand_span(usize::MAX, 4, 10, 2), None);
        assert_eq!(pointer_alignment(0x1000), 256);
        assert_eq!(pointer_alignment(0x1002), 2);
    }

    #[test]
    fn workspace_follows_the_output_within_bounds() {
        let ws = |m, n| lt_workspace_bytes(&GemmParams::new(m, n, 64, DType::BF16, DType::BF16, DType::BF16));
        // Decode: M = 1 against a 7168-wide output is 7168 · 4 · 16 = 458752 B -> the 1 MiB floor.
        assert_eq!(ws(1, 7168), LT_WORKSPACE_MIN_BYTES);
        assert_eq!(ws(0, 7168), LT_WORKSPACE_MIN_BYTES);
        // 64 × 3584 · 4 · 16 = 14.7 MB -> 16 MiB.
        assert_eq!(ws(64, 3584), 16 << 20);
        // Prefill-sized outputs and overflowing products stop at 32 MiB.
        assert_eq!(ws(1024, 7168), LT_WORKSPACE_MAX_BYTES);
        assert_eq!(ws(usize::MAX, usize::MAX), LT_WORKSPACE_MAX_BYTES);
        for (m, n) in [(1, 1), (7, 9), (100, 1000), (5000, 5000)] {
            assert!(ws(m, n).is_power_of_two(), "{m}x{n}");
        }
    }
}
