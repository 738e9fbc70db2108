// The pieces of the radix-descent sampler that the CPU replay (kernels/cpu/sample_ops.cc,
// RadixSampleRow) and the CUDA kernel (kernels/cuda/sample_kernel.cu) share, so the CPU tests
// of the method check the GPU's own decision code: the 64-bit order key and the choice of the
// next key byte from a 256-bucket histogram. Compiles as C++17 for nvcc and as host C++.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOESERVE_HOST_DEVICE __host__ __device__
#else
#define MOESERVE_HOST_DEVICE
#endif

namespace moeserve {

// Order key: larger = earlier in the sampling order (higher logit, then lower id).
MOESERVE_HOST_DEVICE inline uint64_t OrderKey(float logit, int64_t id) {
  if (logit == 0.0f) logit = 0.0f;  // -0 ties +0, as in the sort
  uint32_t b;
  static_assert(sizeof(b) == sizeof(logit), "a float is 32 bits");
  std::memcpy(&b, &logit, sizeof(b));
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // monotone in the float's value
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

// vLLM's min_p as a logit floor: a token stays iff its logit >= this (probability at least min_p
// times the likeliest one's at `temperature`); -inf when off. In double, the same on both sides.
MOESERVE_HOST_DEVICE inline double MinPLogitFloor(float max_logit, float temperature, float min_p) {
  if (!(min_p > 0.0f)) return -INFINITY;
  return static_cast<double>(max_logit) + static_cast<double>(temperature) * log(static_cast<double>(min_p));
}

// One pass of the descent: walks the 256 buckets of `hist` (the weight of the candidates whose
// next key byte is d) from byte 255 down, adding their weight to *above, and returns the first
// byte where the cumulative weight reaches `target` (inclusive: >=) or exceeds it (strict: >),
// with *above the weight of the keys before it. When rounding leaves the target unreached, the
// last nonempty bucket (the least likely candidates), as the sort does; -1 if all are empty.
MOESERVE_HOST_DEVICE inline int ChooseKeyByte(const double* hist, double target, bool inclusive, double* above) {
  int last_nonempty = -1;
  for (int d = 255; d >= 0; --d) {
    if (hist[d] == 0) continue;
    last_nonempty = d;
    const double cum = *above + hist[d];
    if (inclusive ? cum >= target : cum > target) return d;
    *above = cum;
  }
  if (last_nonempty >= 0) *above -= hist[last_nonempty];
  return last_nonempty;
}

// One logit under a LogitEdit (kernels/backend.h), in vLLM's order: bias, repetition penalty
// (a positive logit divided, a negative one multiplied), then the frequency/presence subtraction.
MOESERVE_HOST_DEVICE inline float EditedLogit(float logit, float bias, float repetition, float subtract) {
  const float l = logit + bias;
  return (l > 0.0f ? l / repetition : l * repetition) - subtract;
}

}  // namespace moeserve
