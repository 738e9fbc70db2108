#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
alignas(64) uint16_t xb[1 << 14];
alignas(64) uint16_t wb[1 << 14];
template <int MODE>
__attribute__((noinline)) __m512 Run(long iters) {
  if constexpr (MODE == 2) {  // 4 weight quads (16 rows) x 6 x rows
    __m512 a[6][4];
    for (int i = 0; i < 6; ++i) for (int h = 0; h < 4; ++h) a[i][h] = _mm512_setzero_ps();
    for (long it = 0; it < iters; ++it) {
      const uint16_t* x = xb + (it & 63) * 96;
      const uint16_t* w = wb + (it & 63) * 64;
      __m512bh wv[4];
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) wv[h] = (__m512bh)_mm512_load_si512(w + 32 * h + (h >= 2 ? 4096 : 0));
#pragma GCC unroll 6
      for (int i = 0; i < 6; ++i) {
        const __m512i xv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(x + 8 * i)));
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) a[i][h] = _mm512_dpbf16_ps(a[i][h], (__m512bh)xv, wv[h]);
      }
    }
    __m512 s = a[0][0];
    for (int i = 0; i < 6; ++i) for (int h = 0; h < 4; ++h) s = _mm512_add_ps(s, a[i][h]);
    return s;
  }
  __m512 a[12][2];
  for (int i = 0; i < 12; ++i) a[i][0] = a[i][1] = _mm512_setzero_ps();
  for (long it = 0; it < iters; ++it) {
    const uint16_t* x = xb + (it & 63) * 96;
    const uint16_t* w = wb + (it & 63) * 64;
    const __m512bh w0 = (__m512bh)_mm512_load_si512(w), w1 = (__m512bh)_mm512_load_si512(w + 32);
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      __m512i xv;
      if (MODE == 0) xv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(x + 8 * i)));
      else xv = _mm512_set1_epi32(*(const int*)(x + 2 * i));
      a[i][0] = _mm512_dpbf16_ps(a[i][0], (__m512bh)xv, w0);
      a[i][1] = _mm512_dpbf16_ps(a[i][1], (__m512bh)xv, w1);
    }
  }
  __m512 s = a[0][0];
  for (int i = 0; i < 12; ++i) s = _mm512_add_ps(s, _mm512_add_ps(a[i][0], a[i][1]));
  return s;
}
template <int M> void T(const char* name) {
  long n = 40000000;
  auto t0 = std::chrono::steady_clock::now();
  __m512 s = Run<M>(n);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float f[16]; _mm512_storeu_ps(f, s);
  printf("%s: %.2f G dpbf16/s = %.0f GFLOP/s (%g)\n", name, 24.0 * n / sec / 1e9, 64 * 24.0 * n / sec / 1e9, f[0]);
}
int main() { for (int r = 0; r < 3; ++r) { T<0>("bcast128 x12, 2 w loads"); T<1>("bcast32 x12, 2 w loads"); T<2>("bcast128 x6, 4 w loads"); } }
