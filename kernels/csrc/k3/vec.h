// 16-byte vector loads and stores: one 128-bit memory transaction per thread on GPUs (LDG.128 /
// global_load_dwordx4), plain struct copies in the SIMT build. The address must be 16-byte
// aligned; callers check alignment (or use them only on buffers they laid out) and keep a scalar
// tail. Included by k3/compat.h.
#ifndef K3_VEC_H
#define K3_VEC_H

K3_BEGIN

struct alignas(16) f32x4 {
  float v[4];
};

struct alignas(16) u32x4 {
  uint32_t v[4];
};

// 4 floats from a 16-byte aligned address.
K3_DEVICE f32x4 load_f32x4(const float* p) { return *reinterpret_cast<const f32x4*>(p); }
K3_DEVICE void store_f32x4(float* p, f32x4 x) { *reinterpret_cast<f32x4*>(p) = x; }

// 16 raw bytes (8 bf16, 16 fp8, 32 fp4 codes) from a 16-byte aligned address.
K3_DEVICE u32x4 load_16b(const void* p) { return *static_cast<const u32x4*>(p); }
K3_DEVICE void store_16b(void* p, u32x4 x) { *static_cast<u32x4*>(p) = x; }

// Whether a pointer can take a 16-byte vector access.
K3_DEVICE bool aligned16(const void* p) { return (reinterpret_cast<uint64_t>(p) & 15u) == 0; }

K3_END

#endif  // K3_VEC_H
