// Scalar math with one spelling on every target. CUDA/NVRTC have the C math functions as device
// builtins; the HIP build uses -nogpuinc (no math headers), so it calls the clang builtins that
// the AMDGPU backend lowers itself; the SIMT build uses the host <cmath>.
// Included by k3/compat.h.
#ifndef K3_MATH_H
#define K3_MATH_H

#if K3_TARGET_SIMT
#include <cmath>
#endif

K3_BEGIN

#if K3_TARGET_SIMT
K3_DEVICE float exp_f32(float x) { return std::exp(x); }
K3_DEVICE float log_f32(float x) { return std::log(x); }
K3_DEVICE float sqrt_f32(float x) { return std::sqrt(x); }
K3_DEVICE float tanh_f32(float x) { return std::tanh(x); }
K3_DEVICE float abs_f32(float x) { return std::fabs(x); }
K3_DEVICE float max_f32(float a, float b) { return std::fmax(a, b); }
#elif K3_TARGET_HIP
K3_DEVICE float exp_f32(float x) { return __builtin_expf(x); }
K3_DEVICE float log_f32(float x) { return __builtin_logf(x); }
K3_DEVICE float sqrt_f32(float x) { return __builtin_sqrtf(x); }
K3_DEVICE float tanh_f32(float x) {
  // No tanh builtin lowers on AMDGPU without device libs: 1 - 2/(e^{2x}+1), saturating.
  const float e = __builtin_expf(2.0f * x);
  return x > 15.0f ? 1.0f : (x < -15.0f ? -1.0f : 1.0f - 2.0f / (e + 1.0f));
}
K3_DEVICE float abs_f32(float x) { return __builtin_fabsf(x); }
K3_DEVICE float max_f32(float a, float b) { return __builtin_fmaxf(a, b); }
#else
K3_DEVICE float exp_f32(float x) { return expf(x); }
K3_DEVICE float log_f32(float x) { return logf(x); }
K3_DEVICE float sqrt_f32(float x) { return sqrtf(x); }
K3_DEVICE float tanh_f32(float x) { return tanhf(x); }
K3_DEVICE float abs_f32(float x) { return fabsf(x); }
K3_DEVICE float max_f32(float a, float b) { return fmaxf(a, b); }
#endif

K3_DEVICE float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// SiTU-GLU of one (gate, up) pair (kernel-api ops/elementwise.rs): beta·tanh(g/beta)·sigmoid(g)
// times the up value, itself capped as linear_beta·tanh(u/linear_beta) when linear_beta > 0.
K3_DEVICE float situ_glu_f32(float g, float u, float beta, float linear_beta) {
  const float gate = beta * tanh_f32(g / beta) * sigmoid_f32(g);
  const float up = linear_beta > 0.0f ? linear_beta * tanh_f32(u / linear_beta) : u;
  return gate * up;
}

K3_END

#endif  // K3_MATH_H
