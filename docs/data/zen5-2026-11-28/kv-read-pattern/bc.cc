#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
alignas(64) uint16_t buf[4096];
template <int MODE>
__attribute__((noinline)) __m512 Run(long iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_setzero_ps();
  __m512bh q = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  for (long it = 0; it < iters; ++it) {
    const uint16_t* p = buf + (it & 63) * 32;
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      __m512i k;
      if (MODE == 0) k = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)(p + 8 * i)));
      else if (MODE == 1) k = _mm512_load_si512(p + 32 * (i & 1));
      else if (MODE == 2) k = _mm512_set1_epi32(*(const int*)(p + 2 * i));
      else k = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i*)(p + 16 * (i&1))));
      a[i] = _mm512_dpbf16_ps(a[i], q, (__m512bh)k);
    }
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return s;
}
template <int M> void T(const char* name) {
  long n = 50000000;
  auto t0 = std::chrono::steady_clock::now();
  __m512 s = Run<M>(n);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float f[16]; _mm512_storeu_ps(f, s);
  printf("%s: %.2f G dpbf16/s (%g)\n", name, 12.0 * n / sec / 1e9, f[0]);
}
int main() { T<0>("bcast128"); T<1>("load512"); T<2>("bcast32"); T<3>("bcast256"); }
