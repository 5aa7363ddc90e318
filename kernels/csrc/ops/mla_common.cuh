// Shared by the MLA kernels: cache format codes, the fp8 flavour switch and the tile scale of the
// tile-scaled cache (kernel-api ops/kv_cache.rs), bit-exact with the Rust codec.
#ifndef K3_OPS_MLA_COMMON_CUH
#define K3_OPS_MLA_COMMON_CUH

// Most threads per block a kernel is launched with, so that the compiler may use the register
// file of a 256-thread block (HIP otherwise assumes 1024 threads and spills to scratch). The
// dialect has no spelling for it yet.
#if K3_TARGET_CUDA
#define MLA_MAX_THREADS(n) __launch_bounds__(n, 1)
#elif K3_TARGET_HIP
#define MLA_MAX_THREADS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#else
#define MLA_MAX_THREADS(n)
#endif

// The MMA kernels on AMD: two waves per SIMD (two 256-thread blocks per CU), so the register
// allocator keeps VGPRs + AGPRs <= 256 instead of taking the file for one wave. They fit because
// the cores read their thread index through k3::thread_idx_x_unhoisted(): with the plain index,
// LLVM computed the lane-derived offsets of every tile loop (token slot, unit offsets, staging
// addresses) once in the prologue and held them across the kernel, up to 60 VGPRs; the f32-query
// and unaligned kernels ran one wave per SIMD (asm f32q on gfx942: 80 B of scratch at two).
#if K3_TARGET_HIP
#define MLA_MMA_TWO_WAVES __attribute__((amdgpu_waves_per_eu(2)))
#else
#define MLA_MMA_TWO_WAVES
#endif

// The MLA kernel bodies and attention cores are K3_AMD_INLINE: as calls (clang's choice) they went
// through a scratch stack of 232-280 B per MMA kernel on gfx942/gfx950.

namespace mla {

// Cache format codes as the launchers pass them (kernels/src/ops/mla_*.rs).
constexpr int kFormatBf16 = 0;   // latent + rope bf16 values
constexpr int kFormatFlat = 1;   // every value fp8, one per-tensor scale
constexpr int kFormatTiled = 2;  // latent fp8 in 128-tiles + f32 pow-2 scales + rope bf16
constexpr int kScaleTile = 128;

K3_DEVICE uint8_t encode_fp8(float x, int fnuz) { return fnuz ? k3::f32_to_e4m3fnuz(x) : k3::f32_to_e4m3fn(x); }
K3_DEVICE float decode_fp8(uint8_t b, int fnuz) { return fnuz ? k3::e4m3fnuz_to_f32(b) : k3::e4m3fn_to_f32(b); }

// The tile scale for ratio = amax / fp8_max: 2^ceil(log2 ratio) clamped to [2^-127, 2^127]
// (E8M0 with ScaleRounding::Up), or 1 for a zero, underflowed or non-finite ratio.
K3_DEVICE float tile_scale(float ratio) {
  if (!(ratio > 0.0f) || !(ratio < k3::uint_as_float(0x7f800000u))) return 1.0f;
  const uint32_t u = k3::float_as_uint(ratio);
  const uint32_t ef = u >> 23;
  const uint32_t m = u & 0x7fffffu;
  int k;
  bool inexact;
  if (ef != 0) {
    k = static_cast<int>(ef) - 127;
    inexact = m != 0;
  } else {  // subnormal: m * 2^-149
    int msb = 0;
    while ((m >> (msb + 1)) != 0) ++msb;
    k = msb - 149;
    inexact = (m & (m - 1u)) != 0;
  }
  int e = k + (inexact ? 1 : 0);
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return e == -127 ? k3::uint_as_float(1u << 22) : k3::uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

}  // namespace mla

#endif  // K3_OPS_MLA_COMMON_CUH
