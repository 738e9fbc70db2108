// Rounding 16 floats to bf16 on AVX-512, the bits of gemm.cc's scalar RoundToBf16, for the
// kernels compiled for AVX-512 (gemm_amx.cc's A tiles, gemm_bf16.cc's packed row blocks). The
// function carries its own target attribute, so the header can be included before a file's
// target pragma.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace moeserve::cpu_fast {

// 16 floats rounded to nearest even; a NaN stays a NaN, made quiet. vcvtneps2bf16 would flush
// denormals to zero.
__attribute__((target("avx512f"))) inline __m256i RoundSixteen(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

// The first `n` of x rounded (the rest read as 0: zero rounds to zero, so the masked lanes pad).
__attribute__((target("avx512f"))) inline __m256i RoundSixteen(const float* x, int64_t n) {
  const __mmask16 valid = n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
  return RoundSixteen(_mm512_maskz_loadu_ps(valid, x));
}

}  // namespace moeserve::cpu_fast
