// KDA decay gate shared by the gate kernel and the prefill prepare pass (kernel-api
// ops/kda_gate.rs is the spec). f32 throughout.
#ifndef K3_OPS_KDA_GATE_CUH
#define K3_OPS_KDA_GATE_CUH

// Gate modes as the launchers pass them.
enum KdaGateModeCode : int { kKdaGateLowerBound = 0, kKdaGateSoftplus = 1, kKdaGatePrecomputed = 2 };

// softplus(x) = ln(1 + e^x) without overflow and without the cancellation of log(1 + tiny):
// log1p(e) = log(u)·e/(u − 1) with u = 1 + e (and e itself when u rounds to 1).
K3_DEVICE float kda_softplus(float x) {
  if (x > 20.0f) return x;
  const float e = k3::exp_f32(x);
  const float u = 1.0f + e;
  return u == 1.0f ? e : k3::log_f32(u) * (e / (u - 1.0f));
}

// g for one channel: f = f̃, a_log = A_log[h], bias = dt_bias[h·K + i].
K3_DEVICE float kda_gate_value(int mode, float f, float a_log, float bias, float lower_bound) {
  if (mode == kKdaGatePrecomputed) return f;
  const float a = k3::exp_f32(a_log);
  const float x = f + bias;
  if (mode == kKdaGateLowerBound) return lower_bound / (1.0f + k3::exp_f32(-(a * x)));
  return -(a * kda_softplus(x));
}

#endif  // K3_OPS_KDA_GATE_CUH
