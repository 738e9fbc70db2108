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
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xbf80))));
}

// R rows of x against N weight rows (R x N <= 8: 32 registers).
template <int R, int N>
void Dots(const Fp8Row* w, const float* x, int64_t ldx, float* out) {
  const int64_t cols = w[0].cols, groups = (cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  __m512 total[N][R];  // low half: the AVX2 kernel's scaled even sums, high half: its odd ones
  float tail[N][R] = {};
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < R; ++r) total[n][r] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8ScaleCols, c1 = std::min(cols, c0 + kFp8ScaleCols);
    const int64_t full = c0 + (c1 - c0) / 8 * 8;
    __m512 acc[N][R];  // low half: the AVX2 kernel's even chunks, high half: its odd ones
    for (int n = 0; n < N; ++n) {
      for (int r = 0; r < R; ++r) acc[n][r] = _mm512_setzero_ps();
    }
    // Streamed weight bytes: fetch the group after next while this one computes.
    if (w[0].wide == nullptr) {
      for (int n = 0; n < N; ++n) {
        for (int64_t p = 0; p < kFp8ScaleCols; p += 64) Prefetch(w[n].bytes + c0 + 2 * kFp8ScaleCols + p);
      }
    }
    int64_t c = c0;
    for (; c + 16 <= full; c += 16) {
      for (int n = 0; n < N; ++n) {
        const __m512 wv = w[n].wide != nullptr ? _mm512_loadu_ps(w[n].wide + c) : Widen16(w[n].bytes + c);
        for (int r = 0; r < R; ++r) acc[n][r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + c), acc[n][r]);
      }
    }
    if (c < full) {  // one more even chunk of 8, into the low half
      for (int n = 0; n < N; ++n) {
        const __m512 wv = _mm512_zextps256_ps512(w[n].wide != nullptr ? _mm256_loadu_ps(w[n].wide + c)
                                                                      : LoadFp8Over256(w[n].bytes + c).v);
        for (int r = 0; r < R; ++r) {
          acc[n][r] = _mm512_fmadd_ps(wv, _mm512_zextps256_ps512(_mm256_loadu_ps(x + r * ldx + c)), acc[n][r]);
        }
      }
    }
    for (int n = 0; n < N; ++n) {
      const float sf = w[n].scales[g] * 256.0f;
      const __m512 s = _mm512_set1_ps(sf);
      for (int r = 0; r < R; ++r) {
        total[n][r] = _mm512_fmadd_ps(acc[n][r], s, total[n][r]);
        if (full < c1) tail[n][r] = std::fma(Fp8TailDot(w[n].bytes + full, x + r * ldx + full, c1 - full), sf, tail[n][r]);
      }
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < R; ++r) {
      const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(total[n][r]), _mm512_extractf32x8_ps(total[n][r], 1));
      out[n * R + r] = Reduce(V8{sum}) + tail[n][r];
    }
  }
}

}  // namespace

void Fp8DotsAvx512(const Fp8Row* w, int n, const float* x, int64_t ldx, int rows, float* out) {
  if (n == 4) return Dots<1, 4>(w, x, ldx, out);
  if (n == 2) return Dots<4, 2>(w, x, ldx, out);
  switch (rows) {
    case 4: return Dots<4, 1>(w, x, ldx, out);
    case 3: return Dots<3, 1>(w, x, ldx, out);
    case 2: return Dots<2, 1>(w, x, ldx, out);
    default: return Dots<1, 1>(w, x, ldx, out);
  }
}

}  // namespace moeserve::cpu_fast
