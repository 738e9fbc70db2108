// Eight fp32 lanes for the CPU fast path's hand-written kernels (gemm.cc, attention.cc): AVX2
// registers where the build has AVX2 + FMA, else a plain array with the same arithmetic (fused
// multiply-adds and the same reduction trees), so results never depend on which is used.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MOESERVE_VEC8_AVX2 1
#endif

namespace moeserve::cpu_fast {

#if MOESERVE_VEC8_AVX2
struct V8 {
  __m256 v;
};
inline V8 Zero() { return {_mm256_setzero_ps()}; }
inline V8 Set1(float x) { return {_mm256_set1_ps(x)}; }
inline V8 Load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V8 Load(const uint16_t* p) {  // bf16 -> fp32 is a 16-bit shift, exact
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
inline void Store(float* p, V8 a) { _mm256_storeu_ps(p, a.v); }
// Eight float8_e4m3fn bytes as fp32, divided by 256 (exact): each byte's sign, exponent and
// mantissa placed in an fp16 of exponent bias 15 instead of 7, widened by vcvtph2ps. The byte
// sign-extended and shifted left by 7 has its exponent and mantissa in place and its sign in
// bits 14 and 15; clearing bit 14 leaves the fp16. NaN codes (0x7f, 0xff) read as 480/256;
// FP8 weights are checked free of them at load.
inline V8 LoadFp8Over256(const uint8_t* p) {
  const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(static_cast<int16_t>(0xbf80)));
  return {_mm256_cvtph_ps(h)};
}
inline V8 Fma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V8 Add(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V8 Mul(V8 a, V8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V8 Div(V8 a, V8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V8 Max(V8 a, V8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
inline float Reduce(V8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Lane k of the result is the sum of p[k]'s lanes, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 +
// l7)).
inline V8 Reduce8x8(const V8 p[8]) {
  const __m256 s01 = _mm256_hadd_ps(p[0].v, p[1].v), s23 = _mm256_hadd_ps(p[2].v, p[3].v);
  const __m256 s45 = _mm256_hadd_ps(p[4].v, p[5].v), s67 = _mm256_hadd_ps(p[6].v, p[7].v);
  const __m256 t0 = _mm256_hadd_ps(s01, s23), t1 = _mm256_hadd_ps(s45, s67);
  // t0 = [p0:0123 p1:0123 p2:0123 p3:0123 | p0:4567 ...], t1 the same for p4..p7.
  return {
      _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31))};
}
// out[k] = (the sum of p[k]'s lanes) * scale for k < 4, the sum by Reduce8x8's tree (the same bits
// as its lanes 0-3, or 4-7 for p[4..7]).
inline void StoreReduce4x8(float* out, const V8 p[4], float scale) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(p[0].v, p[1].v), _mm256_hadd_ps(p[2].v, p[3].v));
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  _mm_storeu_ps(out, _mm_mul_ps(s, _mm_set1_ps(scale)));
}
inline void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// Keeps a value in a register: the compiler may not fold its load into later instructions.
inline void Pin(V8& a) { __asm__("" : "+x"(a.v)); }
#else
struct V8 {
  float v[8];
};
inline V8 Zero() { return V8{}; }
inline V8 Set1(float x) {
  V8 r;
  for (float& f : r.v) f = x;
  return r;
}
inline V8 Load(const float* p) {
  V8 r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline V8 Load(const uint16_t* p) {
  V8 r;
  for (int l = 0; l < 8; ++l) {
    const uint32_t bits = static_cast<uint32_t>(p[l]) << 16;
    std::memcpy(&r.v[l], &bits, sizeof(float));
  }
  return r;
}
inline void Store(float* p, V8 a) { std::memcpy(p, a.v, sizeof(a.v)); }
inline V8 LoadFp8Over256(const uint8_t* p) {
  V8 r;
  for (int l = 0; l < 8; ++l) {
    const int exp = (p[l] >> 3) & 0xf, mant = p[l] & 0x7;
    const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -17) : std::ldexp(static_cast<float>(8 + mant), exp - 18);
    r.v[l] = (p[l] & 0x80) ? -mag : mag;
  }
  return r;
}
inline V8 Fma(V8 a, V8 b, V8 c) {
  for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline V8 Add(V8 a, V8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] += b.v[l];
  return a;
}
inline V8 Mul(V8 a, V8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] *= b.v[l];
  return a;
}
inline V8 Max(V8 a, V8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
  return a;
}
inline V8 Div(V8 a, V8 b) {
  for (int l = 0; l < 8; ++l) a.v[l] /= b.v[l];
  return a;
}
inline float Reduce(V8 a) {
  float s[4];
  for (int l = 0; l < 4; ++l) s[l] = a.v[l] + a.v[l + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}
inline V8 Reduce8x8(const V8 p[8]) {
  V8 r;
  for (int k = 0; k < 8; ++k) {
    const float* a = p[k].v;
    r.v[k] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
  return r;
}
inline void StoreReduce4x8(float* out, const V8 p[4], float scale) {
  for (int k = 0; k < 4; ++k) {
    const float* a = p[k].v;
    out[k] = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) * scale;
  }
}
inline void Prefetch(const void*) {}
inline void Pin(V8&) {}
#endif

// e^x for softmax, to about 2 ulp (Cephes' expf: x = n ln 2 + r, a degree-6 polynomial in r,
// then 2^n by the exponent bits). The AVX2 and the plain version perform the same operations
// (fused multiply-adds, exact floor), so every build and lane gives the same value. Inputs are
// clamped to [-87.3, 88.3]: far below the maximum a softmax weight is about 1e-38, not 0.
struct ExpConst {
  static constexpr float kLo = -87.3f, kHi = 88.3f, kLog2e = 1.44269504088896341f;
  static constexpr float kC1 = -0.693359375f, kC2 = 2.12194440e-4f;
  static constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};
#if MOESERVE_VEC8_AVX2
inline V8 Exp(V8 x) {
  using C = ExpConst;
  __m256 v = _mm256_min_ps(_mm256_max_ps(x.v, _mm256_set1_ps(C::kLo)), _mm256_set1_ps(C::kHi));
  const __m256 n =
      _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(C::kLog2e), _mm256_set1_ps(0.5f)));
  v = _mm256_fmadd_ps(n, _mm256_set1_ps(C::kC1), v);
  v = _mm256_fmadd_ps(n, _mm256_set1_ps(C::kC2), v);
  __m256 y = _mm256_set1_ps(C::kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(C::kP[i]));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(v, v), v), _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_mul_ps(y, _mm256_castsi256_ps(e))};
}
#else
inline V8 Exp(V8 x) {
  using C = ExpConst;
  V8 r;
  for (int l = 0; l < 8; ++l) {
    float v = std::fmin(std::fmax(x.v[l], C::kLo), C::kHi);
    const float n = std::floor(std::fma(v, C::kLog2e, 0.5f));
    v = std::fma(n, C::kC1, v);
    v = std::fma(n, C::kC2, v);
    float y = C::kP[0];
    for (int i = 1; i < 6; ++i) y = std::fma(y, v, C::kP[i]);
    y = std::fma(y, v * v, v) + 1.0f;
    const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &e, sizeof(scale));
    r.v[l] = y * scale;
  }
  return r;
}
#endif

}  // namespace moeserve::cpu_fast
