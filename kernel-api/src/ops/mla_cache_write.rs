//! MLA cache write: quantises one latent row per token and scatters it into the paged latent
//! cache (vLLM's `concat_and_cache_mla`; K3 is NoPE, so k_pe is stored unrotated).
//!
//! # Semantics
//!
//! Input row `n` of `kv` is the token's `dims.latent` post-RMSNorm latent `c` followed by its
//! `dims.rope` raw k_pe values. With `slot = slot_mapping[n]`:
//!
//! - `slot < 0`: a padding token (vLLM's -1); nothing is written;
//! - otherwise `page = slot / page_size`, `row = slot % page_size`, and the
//!   `format.bytes_per_token(dims)` bytes at `cache[page, row, ..]` become exactly
//!   [`crate::ops::kv_cache::encode_token`]`(format, dims, row_n, kv_scale)` of the row decoded to
//!   f32. Bit for bit, so a cache written by any backend is readable by every decode kernel:
//!   - `Bf16`: each value rounded to bf16 (round-half-even), little-endian;
//!   - `Fp8Flat(f)`: each value `x` stored as `fp8_f(x · (1/kv_scale))`, the reciprocal rounded
//!     once to f32, round-half-even, saturating to ±max finite;
//!   - `Fp8Tiled(f)`: per 128-wide latent tile a power-of-two f32 scale
//!     `2^ceil(log2(amax / fp8_max))` (1.0 for an all-zero tile), values `fp8_f(x / scale)`, then
//!     the scales, then the rope values as bf16 (K3: 512 + 16 + 128 = 656 bytes).
//!
//! Every other byte of the cache is left unchanged.
//!
//! # The flat fp8 scale
//!
//! `kv_scale` is one per-tensor scale for all `latent + rope` values. The rope part is *not*
//! normalised and can be far larger than the latent: a scale calibrated on the latent alone
//! saturates k_pe (vLLM #42956). Calibrate it over both parts, e.g. with
//! [`crate::ops::kv_cache::flat_fp8_scale`]. The other formats ignore `kv_scale`, but it must
//! still be finite and positive (pass 1.0) so that a mis-set value never passes silently.
//!
//! # Validation
//!
//! The plan takes the host copy of `slot_mapping` and rejects slots `>= num_pages · page_size`
//! and two tokens with the same non-negative slot (a write race on a GPU). The device tensor
//! must hold the same values; the CPU reference checks that, GPU kernels check each slot against
//! the cache ([device metadata](crate::ops#device-metadata)). Two tokens with one device slot are
//! a caller error GPU kernels do not look for (it would cost a pass over the batch per token):
//! both write the slot's row, each byte ending as one of the two tokens' bytes.

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::ops::kv_cache::{KvCacheFormat, KvDims};
use crate::tensor::{Dim, TensorMut, TensorRef};

/// Cache geometry and format.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaCacheWriteParams {
    /// Per-token dims (K3: 512 + 64; tiny: 64 + 16).
    pub dims: KvDims,
    /// Pages in the cache tensor.
    pub num_pages: usize,
    /// Token rows per page (1, 64, 128, ...).
    pub page_size: usize,
    pub format: KvCacheFormat,
    /// Flat fp8 per-tensor dequantisation scale (value = fp8 · kv_scale), calibrated over the
    /// latent AND rope dims; finite and > 0 for every format (ignored unless `Fp8Flat`).
    pub kv_scale: f32,
}

/// Host-side batch metadata: where each token goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaCacheWriteBatch {
    /// `[num_tokens]` slots `page · page_size + row`; negative = padding, skipped.
    pub slot_mapping: Vec<i64>,
}

/// Tensor arguments.
#[derive(Debug)]
pub struct MlaCacheWriteArgs<'a, B: Backend + ?Sized> {
    /// `[num_tokens, latent + rope]` bf16 or f32; rows may be strided, unit inner stride.
    pub kv: TensorRef<'a, B>,
    /// `[num_tokens]` i32 or i64, contiguous; same values as the plan's slot mapping.
    pub slot_mapping: TensorRef<'a, B>,
    /// Written in place. `[num_pages, page_size, bytes_per_token]` u8 for every format, or
    /// `[num_pages, page_size, latent + rope]` bf16 for `Bf16`; pages and rows may be strided,
    /// unit inner stride.
    pub cache: TensorMut<'a, B>,
}

/// A validated cache write.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaCacheWritePlan {
    pub params: MlaCacheWriteParams,
    pub batch: MlaCacheWriteBatch,
    /// `format.bytes_per_token(dims)`.
    pub bytes_per_token: usize,
    /// Tokens that are written (non-negative slots).
    pub written_tokens: usize,
}

impl MlaCacheWritePlan {
    /// Backend-independent validation of params and the host slot mapping.
    pub fn new(p: &MlaCacheWriteParams, batch: &MlaCacheWriteBatch) -> Result<Self> {
        ensure(p.dims.latent >= 1, "params.dims.latent", || "must be at least 1".into())?;
        ensure(p.page_size >= 1, "params.page_size", || "must be at least 1".into())?;
        ensure(p.num_pages >= 1, "params.num_pages", || "must be at least 1".into())?;
        ensure(p.kv_scale.is_finite() && p.kv_scale > 0.0, "params.kv_scale", || {
            format!("must be finite and positive, got {}", p.kv_scale)
        })?;
        // 3·latent + 2·rope + 4 bounds bytes_per_token of every format (it is computed unchecked).
        let bound = p.dims.latent.checked_mul(3).and_then(|l| l.checked_add(p.dims.rope.checked_mul(2)?)?.checked_add(4));
        ensure(bound.is_some(), "params.dims", || "bytes per token overflows".into())?;
        let bytes_per_token = p.format.bytes_per_token(p.dims);
        let slots = p.num_pages.checked_mul(p.page_size);
        let cache_bytes = slots.and_then(|s| s.checked_mul(bytes_per_token));
        let (Some(slots), Some(_)) = (slots, cache_bytes) else {
            return Err(Error::invalid("params.num_pages", "num_pages x page_size x bytes per token overflows"));
        };
        let mut used: Vec<(i64, usize)> = Vec::with_capacity(batch.slot_mapping.len());
        for (n, &s) in batch.slot_mapping.iter().enumerate() {
            if s < 0 {
                continue;
            }
            ensure(u64::try_from(s).is_ok_and(|s| s < slots as u64), "slot_mapping", || {
                format!("token {n}: slot {s} is outside the cache ({slots} slots = {} pages x {})", p.num_pages, p.page_size)
            })?;
            used.push((s, n));
        }
        used.sort_unstable();
        if let Some(w) = used.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::invalid(
                "slot_mapping",
                format!("tokens {} and {} both write slot {} (a write race on a GPU)", w[0].1, w[1].1, w[0].0),
            ));
        }
        Ok(MlaCacheWritePlan { params: p.clone(), batch: batch.clone(), bytes_per_token, written_tokens: used.len() })
    }

    /// Tokens in the batch (rows of `kv`).
    pub fn num_tokens(&self) -> usize {
        self.batch.slot_mapping.len()
    }

    /// Checks tensor arguments against the plan.
    pub fn check_args<B: Backend + ?Sized>(&self, b: &B, a: &MlaCacheWriteArgs<'_, B>) -> Result<()> {
        let p = &self.params;
        let n = self.num_tokens();
        a.kv.check(b, "kv")?
            .dtype(&[DType::F32, DType::BF16])?
            .shape(&[Dim::Is(n), Dim::Is(p.dims.width())])?
            .unit_inner_stride()?;
        a.slot_mapping.check(b, "slot_mapping")?.dtype(&[DType::I32, DType::I64])?.shape(&[Dim::Is(n)])?.contiguous()?;
        if a.slot_mapping.layout.dtype == DType::I32 {
            let fits = self.batch.slot_mapping.iter().all(|&s| i32::try_from(s).is_ok());
            ensure(fits, "slot_mapping", || "a slot does not fit i32; use i64".into())?;
        }
        let inner = match a.cache.layout.dtype {
            DType::U8 => self.bytes_per_token,
            DType::BF16 if p.format == KvCacheFormat::Bf16 => p.dims.width(),
            other => {
                return Err(Error::invalid(
                    "cache",
                    format!("dtype {other} not accepted for format {} (u8, or bf16 for the bf16 format)", p.format.name()),
                ))
            }
        };
        a.cache
            .check(b, "cache")?
            .shape(&[Dim::Is(p.num_pages), Dim::Is(p.page_size), Dim::Is(inner)])?
            .unit_inner_stride()?;
        Ok(())
    }
}

/// Quantise + scatter latent rows into the paged MLA cache.
pub trait MlaCacheWrite: Backend {
    /// Whether this backend can write this format and geometry (reasons if not).
    fn supports(&self, params: &MlaCacheWriteParams) -> Result<()>;
    fn plan(&self, params: &MlaCacheWriteParams, batch: &MlaCacheWriteBatch) -> Result<MlaCacheWritePlan> {
        let plan = MlaCacheWritePlan::new(params, batch)?;
        MlaCacheWrite::supports(self, params)?;
        Ok(plan)
    }
    fn workspace_size(&self, _plan: &MlaCacheWritePlan) -> usize {
        0
    }
    fn run(
        &self,
        plan: &MlaCacheWritePlan,
        args: MlaCacheWriteArgs<'_, Self>,
        workspace: Option<&mut Self::Buffer>,
        stream: &Self::Stream,
    ) -> Result<()>;
}

// ---- speed-of-light cost (see crate::cost) ----

use crate::cost::{dim, elem_bytes, Cost, CostBuilder, MathClass};

impl MlaCacheWriteParams {
    /// Writing `tokens` tokens given in dtype `input`: the inputs read, the encoded rows and the
    /// slot mapping; fp8 formats cost an amax, a scale and a conversion per value.
    pub fn cost(&self, tokens: usize, input: DType) -> Result<Cost> {
        let (t, width) = (dim(tokens), dim(self.dims.width()));
        let fp8 = !matches!(self.format, KvCacheFormat::Bf16) as u64;
        CostBuilder::new("params")
            .bytes(&[t, width, elem_bytes(input)])
            .bytes(&[t, dim(self.format.bytes_per_token(self.dims))])
            .bytes(&[t, 8])
            .flops(MathClass::Vector, &[fp8, t, width, 3])
            .build()
    }
}
