// vec8.h's Exp on 16 AVX-512 lanes, for the kernels compiled for AVX-512 (attention_bf16.cc's
// softmax, gemm_amx.cc's fused SwiGLU). The function carries its own target attribute, so the
// header can be included before a file's target pragma.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/vec8.h"  // ExpConst

namespace moeserve::cpu_fast {

// The same operations per lane as vec8.h's Exp, except that 2^n is applied by vscalefps instead
// of a product with the power of two built in the exponent field. After the clamp n is in
// [-126, 127], so that power is a normal number, and both round y * 2^n once, to nearest: the
// same bits, three instructions fewer.
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  using C = ExpConst;
  __m512 v = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(C::kLo)), _mm512_set1_ps(C::kHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(C::kLog2e), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  v = _mm512_fmadd_ps(n, _mm512_set1_ps(C::kC1), v);
  v = _mm512_fmadd_ps(n, _mm512_set1_ps(C::kC2), v);
  __m512 y = _mm512_set1_ps(C::kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(C::kP[i]));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(v, v), v), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// silu(g) * u on 16 lanes: g / (1 + e^-g) * u, SiluMulRow's operations per lane (its bits).
__attribute__((target("avx512f"))) inline __m512 SiluTimes16(__m512 g, __m512 u) {
  const __m512 e = Exp16(_mm512_mul_ps(g, _mm512_set1_ps(-1.0f)));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace moeserve::cpu_fast
