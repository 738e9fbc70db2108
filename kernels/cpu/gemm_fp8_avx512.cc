// The FP8 GEMM's row kernel on 16 lanes (gemm_fp8.h): the two 8-lane chains of the AVX2 kernel
// are the low and high halves of one 16-lane chain, so the bits are the same.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/vec8.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace moeserve::cpu_fast {
namespace {

// Sixteen FP8 bytes as fp32 / 256 (vec8.h's LoadFp8Over256 on 16 lanes).
inline __m512 Widen16(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
  const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
  return _mm512_cvtph_ps(_mm256_or_si256(sign, mag));
}

float TailDot(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t c = 0; c < n; ++c) acc = std::fma(F8E4M3ToF32(w[c]) / 256.0f, x[c], acc);
  return acc;
}

template <int R>
void Dots(const Fp8Row& w, const float* x, int64_t ldx, float* out) {
  const int64_t groups = (w.cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  __m256 total[R];
  float tail[R] = {};
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8ScaleCols, c1 = std::min(w.cols, c0 + kFp8ScaleCols);
    const int64_t full = c0 + (c1 - c0) / 8 * 8;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    int64_t c = c0;
    for (; c + 16 <= full; c += 16) {
      const __m512 wv = w.wide != nullptr ? _mm512_loadu_ps(w.wide + c) : Widen16(w.bytes + c);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + c), acc[r]);
    }
    if (c < full) {  // one more chunk of 8 into the low half, as the AVX2 kernel's first chain
      const __m512 wv = _mm512_zextps256_ps512(w.wide != nullptr ? _mm256_loadu_ps(w.wide + c)
                                                                  : LoadFp8Over256(w.bytes + c).v);
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(wv, _mm512_zextps256_ps512(_mm256_loadu_ps(x + r * ldx + c)), acc[r]);
      }
    }
    const __m256 s = _mm256_set1_ps(w.scales[g] * 256.0f);
    for (int r = 0; r < R; ++r) {
      const __m256 part = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
      total[r] = _mm256_fmadd_ps(part, s, total[r]);
      if (full < c1) tail[r] = std::fma(TailDot(w.bytes + full, x + r * ldx + full, c1 - full), w.scales[g] * 256.0f, tail[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Reduce(V8{total[r]}) + tail[r];
}

}  // namespace

void Fp8DotsAvx512(const Fp8Row& w, const float* x, int64_t ldx, int rows, float* out) {
  switch (rows) {
    case 4: return Dots<4>(w, x, ldx, out);
    case 3: return Dots<3>(w, x, ldx, out);
    case 2: return Dots<2>(w, x, ldx, out);
    default: return Dots<1>(w, x, ldx, out);
  }
}

}  // namespace moeserve::cpu_fast
