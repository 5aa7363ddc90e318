//! Launch-side helpers shared by the MLA families: cache format codes (`csrc/ops/mla_common.cuh`)
//! and cache layouts as byte strides.

use kernel_api::ops::kv_cache::{Fp8Flavor, KvCacheFormat};
use kernel_api::Layout;

/// `(kind, fnuz)` as the kernels take them: kind 0 = bf16, 1 = flat fp8, 2 = tile-scaled fp8.
pub(super) fn format_codes(f: KvCacheFormat) -> (i32, i32) {
    let fnuz = |fl: Fp8Flavor| i32::from(fl == Fp8Flavor::E4M3Fnuz);
    match f {
        KvCacheFormat::Bf16 => (0, 0),
        KvCacheFormat::Fp8Flat(fl) => (1, fnuz(fl)),
        KvCacheFormat::Fp8Tiled(fl) => (2, fnuz(fl)),
    }
}

/// Page and row strides of a `[pages, page_size, inner]` cache tensor in bytes (the kernels
/// address token rows by byte; the tensor may be u8 or bf16).
pub(super) struct ByteLayout {
    pub page_stride: i64,
    pub row_stride: i64,
}

impl ByteLayout {
    /// `l` has been checked as a rank-3 cache layout by the plan.
    pub fn of(l: &Layout) -> Self {
        let es = l.dtype.size_bytes() as i64;
        ByteLayout { page_stride: l.strides[0] as i64 * es, row_stride: l.strides[1] as i64 * es }
    }
}
