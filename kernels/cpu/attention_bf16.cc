// Paged attention's inner loops on vdpbf16ps (see attention_bf16.h): the scores and the softmax;
// the weighted sums are attention_bf16_values.cc's.
//
// Scores: a register holds dimension pair d of 16 keys (one key per fp32 lane), so a vdpbf16ps
// against the query's pair d broadcast adds that pair's products to 16 scores at once; the keys
// are transposed into that form once per call and serve every query row.
//
// Compiled for AVX512-BF16 by the target pragma below (after every include, so no inline
// function of a header is compiled for it).
#include "kernels/cpu/attention_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/cpu/exp16.h"

#pragma GCC push_options
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

// 16 rows of 16 dwords into 16 columns, in place.
inline void Transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + c], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + c.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), p1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
    const __m512i q0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44),
                  q1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(p0, q0, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xDD);
  }
}

inline uint32_t PairAt(const uint16_t* row, int64_t d) {
  uint32_t v;
  std::memcpy(&v, row + 2 * d, sizeof(v));
  return v;
}

inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

inline __mmask16 FirstLanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

}  // namespace

SoftmaxStats SoftmaxBf16(float* sc, int64_t ctx, float scale, int64_t whole, uint16_t* pb) {
  // The scaled scores are recomputed in the second pass (the same product) rather than stored
  // by the first: one pass less over the row. The maximum runs in four chains (a maximum is
  // exact in any order), the sum in one, in key order.
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t j = 0;
  for (; j + 64 <= ctx; j += 64) {
    m0 = _mm512_max_ps(m0, _mm512_mul_ps(_mm512_loadu_ps(sc + j), vscale));
    m1 = _mm512_max_ps(m1, _mm512_mul_ps(_mm512_loadu_ps(sc + j + 16), vscale));
    m2 = _mm512_max_ps(m2, _mm512_mul_ps(_mm512_loadu_ps(sc + j + 32), vscale));
    m3 = _mm512_max_ps(m3, _mm512_mul_ps(_mm512_loadu_ps(sc + j + 48), vscale));
  }
  for (; j < ctx; j += 16) {
    const __mmask16 k = FirstLanes(ctx - j);
    m0 = _mm512_mask_max_ps(m0, k, m0, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, sc + j), vscale));
  }
  const float max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  const __m512 neg = _mm512_set1_ps(-max);
  __m512 sum = _mm512_setzero_ps();
  for (j = 0; j + 16 <= ctx; j += 16) {
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sc + j), vscale);
    __asm__("" : "+v"(x));  // the product rounded, as stored before: never contracted into an FMA
    const __m512 e = Exp16(_mm512_add_ps(x, neg));
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(sc + j, e);
  }
  if (j < ctx) {
    const __mmask16 k = FirstLanes(ctx - j);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, sc + j), vscale);
    __asm__("" : "+v"(x));
    const __m512 e = _mm512_maskz_mov_ps(k, Exp16(_mm512_add_ps(x, neg)));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(sc + j, k, e);
  }
  // One fixed tree over the lanes (reduce_add's order is the compiler's to pick).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  }
  const __m512 inv = _mm512_set1_ps(1.0f / lanes[0]);
  for (j = 0; j < whole; j += 32) {  // whole is a multiple of 32; keys past ctx get 0
    const __m512 p0 = _mm512_maskz_mul_ps(FirstLanes(ctx - j), _mm512_loadu_ps(sc + j), inv);
    const __m512 p1 = _mm512_maskz_mul_ps(FirstLanes(ctx - j - 16), _mm512_loadu_ps(sc + j + 16), inv);
    _mm512_storeu_si512(pb + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
  }
  for (j = whole; j < ctx; j += 16) {  // the lanes past ctx become 0 (an odd last key's pair)
    _mm512_storeu_ps(sc + j, _mm512_maskz_mul_ps(FirstLanes(ctx - j), _mm512_loadu_ps(sc + j), inv));
  }
  return {max, lanes[0]};
}

void KeyPairsBf16(const uint16_t* const keys[kBf16KeyBlock], int64_t hd, uint32_t* out, int64_t first) {
  for (int64_t d0 = 0; d0 < hd / 2; d0 += 16) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(keys[j] + first + 2 * d0);
    Transpose16(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + (d0 + j) * 16, r[j]);
  }
}

namespace {

// ScoreKeysBf16 over B blocks of 16 keys (kt: block b's pairs at kt + b * block_pairs), two query rows
// at a time: each broadcast query pair serves B key registers, so more keys per call means
// fewer loads per vdpbf16ps (one per product at B = 1, three quarters at B = 2).
template <int B>
void ScoreBlocks(const uint16_t* q, int64_t rows, int64_t hd, const __m512i* kt, int64_t block_pairs, float scale,
                 float* out, int64_t out_stride) {
  const int64_t pairs = hd / 2;
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; r += 2) {
    const uint16_t* q0 = q + r * hd;
    const uint16_t* q1 = r + 1 < rows ? q0 + hd : q0;  // an odd last row is computed twice, stored once
    __m512 a0[B][4], a1[B][4];
    for (int b = 0; b < B; ++b) {
      for (int u = 0; u < 4; ++u) a0[b][u] = a1[b][u] = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < pairs; d += 4) {
      for (int u = 0; u < 4; ++u) {
        const __m512bh x0 = AsBh(_mm512_set1_epi32(static_cast<int>(PairAt(q0, d + u))));
        const __m512bh x1 = AsBh(_mm512_set1_epi32(static_cast<int>(PairAt(q1, d + u))));
        for (int b = 0; b < B; ++b) {
          const __m512bh k = AsBh(kt[b * block_pairs + d + u]);
          a0[b][u] = _mm512_dpbf16_ps(a0[b][u], x0, k);
          a1[b][u] = _mm512_dpbf16_ps(a1[b][u], x1, k);
        }
      }
    }
    for (int b = 0; b < B; ++b) {
      const __m512 s0 = _mm512_add_ps(_mm512_add_ps(a0[b][0], a0[b][1]), _mm512_add_ps(a0[b][2], a0[b][3]));
      _mm512_storeu_ps(out + r * out_stride + 16 * b, _mm512_mul_ps(s0, vscale));
      if (r + 1 < rows) {
        const __m512 s1 = _mm512_add_ps(_mm512_add_ps(a1[b][0], a1[b][1]), _mm512_add_ps(a1[b][2], a1[b][3]));
        _mm512_storeu_ps(out + (r + 1) * out_stride + 16 * b, _mm512_mul_ps(s1, vscale));
      }
    }
  }
}

}  // namespace

void ScoreKeysBf16(const uint16_t* q, int64_t rows, int64_t hd, int64_t heads, const uint16_t* const* keys,
                   int blocks, float scale, float* out, int64_t out_stride) {
  // Heads one transposition takes (hd <= kBf16MaxKeyWidth: Bf16AttentionHeadDim admits no wider).
  const int64_t per_pass = kBf16MaxKeyWidth / hd;
  alignas(64) __m512i kt[2 * 128];  // kt[b * 128 + d]: pair d of block b's 16 keys, the heads side by side
  for (int64_t g0 = 0; g0 < heads; g0 += per_pass) {
    const int64_t nh = std::min(per_pass, heads - g0);
    for (int b = 0; b < blocks; ++b) {
      KeyPairsBf16(keys + b * kBf16KeyBlock, nh * hd, reinterpret_cast<uint32_t*>(kt + b * 128), g0 * hd);
    }
    for (int64_t g = g0; g < g0 + nh; ++g) {
      const __m512i* head_kt = kt + (g - g0) * hd / 2;
      float* head_out = out + g * rows * out_stride;
      if (blocks == 2) {
        ScoreBlocks<2>(q + g * rows * hd, rows, hd, head_kt, 128, scale, head_out, out_stride);
      } else {
        ScoreBlocks<1>(q + g * rows * hd, rows, hd, head_kt, 128, scale, head_out, out_stride);
      }
    }
  }
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
