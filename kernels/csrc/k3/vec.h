// 16-byte vector loads and stores: one 128-bit memory transaction per thread on GPUs (LDG.128 /
// global_load_dwordx4), plain struct copies in the SIMT build. The address must be 16-byte
// aligned; callers check alignment (or use them only on buffers they laid out) and keep a scalar
// tail. Included by k3/compat.h (after k3/tensor.h and k3/convert_hw.h).
#ifndef K3_VEC_H
#define K3_VEC_H

K3_BEGIN

struct alignas(16) f32x4 {
  float v[4];
};

struct alignas(16) u32x4 {
  uint32_t v[4];
};

struct alignas(8) u32x2 {
  uint32_t v[2];
};

// 4 floats from a 16-byte aligned address.
K3_DEVICE f32x4 load_f32x4(const float* p) { return *reinterpret_cast<const f32x4*>(p); }
K3_DEVICE void store_f32x4(float* p, f32x4 x) { *reinterpret_cast<f32x4*>(p) = x; }

// 16 raw bytes (8 bf16, 16 fp8, 32 fp4 codes) from a 16-byte aligned address.
K3_DEVICE u32x4 load_16b(const void* p) { return *static_cast<const u32x4*>(p); }
K3_DEVICE void store_16b(void* p, u32x4 x) { *static_cast<u32x4*>(p) = x; }
// 8 raw bytes from an 8-byte aligned address (one 64-bit access).
K3_DEVICE u32x2 load_8b(const void* p) { return *static_cast<const u32x2*>(p); }

namespace detail {
// The bits of one value of an fp8 dtype (kF8E4M3Fn, kF8E4M3Fnuz, kF8E5M2) as store_f32 converts it.
// store_f32 keeps its own per-dtype cases: routing it through this helper changed what nvcc and
// clang made of nearly every kernel (e.g. 64 B of scratch in mla_prefill on sm_100a).
K3_DEVICE K3_AMD_INLINE uint32_t f8_bits(int dtype, float v) {
  return dtype == kF8E4M3Fn ? f32_to_e4m3fn(v) : (dtype == kF8E4M3Fnuz ? f32_to_e4m3fnuz(v) : f32_to_e5m2(v));
}

// Two values of a 16-bit float dtype (kF16 / kBF16) packed as store_f32 would store them, element 0
// low. bf16 rounds through pack_bf16x2_rn (the same bits as f32_to_bf16 for every non-NaN value).
K3_DEVICE K3_AMD_INLINE uint32_t half_pair_bits(int dtype, float lo, float hi) {
  return dtype == kBF16 ? pack_bf16x2_rn(lo, hi) : pack_halves(f32_to_f16_bits(lo), f32_to_f16_bits(hi));
}
}  // namespace detail

// Elements i..i+3 (store_f32x4) or i, i+1 (store_f32x2) of a `dtype` tensor (contiguous), each
// converted as store_f32 converts it, in one store of 4 (2) x the element size: 16 (8) B f32,
// 8 (4) B f16 / bf16, 4 (2) B fp8. That many bytes of alignment at element i are the caller's to
// guarantee (e.g. a base aligned to them, i and the row strides multiples of 4 (2)).
K3_AMD_INLINE K3_DEVICE void store_f32x4(void* base, int dtype, int64_t i, f32x4 x) {
  switch (dtype) {
    case kF32:
      store_f32x4(static_cast<float*>(base) + i, x);
      break;
    case kF16:
    case kBF16: {
      u32x2 w;
      for (int h = 0; h < 2; ++h) w.v[h] = detail::half_pair_bits(dtype, x.v[2 * h], x.v[2 * h + 1]);
      *reinterpret_cast<u32x2*>(static_cast<uint16_t*>(base) + i) = w;
      break;
    }
    case kF8E4M3Fn:
    case kF8E4M3Fnuz:
    case kF8E5M2: {
      uint32_t w = 0;
      for (int c = 0; c < 4; ++c) w |= detail::f8_bits(dtype, x.v[c]) << (8 * c);
      *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(base) + i) = w;
      break;
    }
    default:
      break;  // launchers never pass a non-float output code
  }
}

K3_AMD_INLINE K3_DEVICE void store_f32x2(void* base, int dtype, int64_t i, float lo, float hi) {
  switch (dtype) {
    case kF32: {
      const u32x2 w = {{float_as_uint(lo), float_as_uint(hi)}};
      *reinterpret_cast<u32x2*>(static_cast<float*>(base) + i) = w;
      break;
    }
    case kF16:
    case kBF16:
      *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(base) + i) = detail::half_pair_bits(dtype, lo, hi);
      break;
    case kF8E4M3Fn:
    case kF8E4M3Fnuz:
    case kF8E5M2:
      *reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(base) + i) =
          static_cast<uint16_t>(detail::f8_bits(dtype, lo) | (detail::f8_bits(dtype, hi) << 8));
      break;
    default:
      break;  // launchers never pass a non-float output code
  }
}

// Whether a pointer can take a 16-byte vector access.
K3_DEVICE bool aligned16(const void* p) { return (reinterpret_cast<uint64_t>(p) & 15u) == 0; }

K3_END

#endif  // K3_VEC_H
