// Latent attention's scores on vdpbf16ps (see attention_bf16.h): a register holds 32 dimensions
// of one query row and one key row, so a vdpbf16ps adds 16 partial dot products (one per pair of
// dimensions) and a key's row is read as it lies in the cache, with no transposition: with 16
// or more heads a key, transposing each row into dimension pairs cost more than the products.
// Each score's 16 lanes are summed at the end by one fixed tree that reduces 16 scores at once.
//
// Compiled for AVX512-BF16 by the target pragma below (after every include, so no inline
// function of a header is compiled for it).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_bf16.h"

#pragma GCC push_options
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Sum16's output lane 4r + k holds the sum of accumulator kSlot[r][k]'s 16 lanes (worked out from
// its four levels below), so a tile's row r lands in 128-bit block r, its keys in order.
constexpr int kSlot[4][4] = {{0, 2, 1, 3}, {8, 10, 9, 11}, {4, 6, 5, 7}, {12, 14, 13, 15}};

// The 16 lane sums of a[0..15] in one register. Every sum is the same tree over its lanes:
// lanes l and l + 8, then + 4, + 2, + 1 apart (the halves, the 128-bit blocks, the 64-bit
// pairs, the neighbours), whichever accumulator it is.
inline __m512 Sum16(const __m512 a[16]) {
  __m512 t[8], v[4], z[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // blocks [a0 + a2, a1 + a3, b0 + b2, b1 + b3] of a = a[i], b = a[i + 8]
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // one 128-bit block each of t[i]'s a, t[i]'s b, t[i + 4]'s a and b
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xDD));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {  // per block: lanes (0 + 2, 1 + 3) of v[i], then of v[i + 2]
    const __m512d x = _mm512_castps_pd(v[i]), y = _mm512_castps_pd(v[i + 2]);
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of NR query rows (q: row after row, hd apart) against 4 keys: out[r * out_stride + k].
// With kFetch, the rows `ahead` are fetched line by line beside the keys' own loads.
template <int NR, bool kFetch>
void ScoreTile(const uint16_t* q, int64_t hd, const uint16_t* const keys[4], float scale, float* out,
               int64_t out_stride, const uint16_t* const* ahead) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < hd; c += 32) {
    __m512i k[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) k[j] = _mm512_loadu_si512(keys[j] + c);
    if constexpr (kFetch) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) PrefetchLine(ahead[j] + c);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512i x = _mm512_loadu_si512(q + r * hd + c);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) a[kSlot[r][j]] = _mm512_dpbf16_ps(a[kSlot[r][j]], AsBh(x), AsBh(k[j]));
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, _mm512_mul_ps(Sum16(a), _mm512_set1_ps(scale)));
  for (int r = 0; r < NR; ++r) std::memcpy(out + r * out_stride, sums + 4 * r, 4 * sizeof(float));
}

// Rows r0 .. r0 + nr (nr <= 4) of ScoreLatentKeysBf16 against keys[0..4).
template <bool kFetch>
void ScoreRows(const uint16_t* q, int64_t nr, int64_t hd, const uint16_t* const keys[4], float scale, float* out,
               int64_t out_stride, const uint16_t* const* ahead) {
  switch (nr) {
    case 4: return ScoreTile<4, kFetch>(q, hd, keys, scale, out, out_stride, ahead);
    case 3: return ScoreTile<3, kFetch>(q, hd, keys, scale, out, out_stride, ahead);
    case 2: return ScoreTile<2, kFetch>(q, hd, keys, scale, out, out_stride, ahead);
    default: return ScoreTile<1, kFetch>(q, hd, keys, scale, out, out_stride, ahead);
  }
}

}  // namespace

void ScoreLatentKeysBf16(const uint16_t* q, int64_t rows, int64_t hd, const uint16_t* const* keys, int64_t n,
                         float scale, float* out, int64_t out_stride, const uint16_t* const* ahead) {
  for (int64_t j = 0; j < n; j += 4) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {  // the first rows' tile fetches the rows ahead
      const int64_t nr = std::min<int64_t>(4, rows - r0);
      float* o = out + r0 * out_stride + j;
      if (r0 == 0) {
        ScoreRows<true>(q, nr, hd, keys + j, scale, o, out_stride, ahead + j);
      } else {
        ScoreRows<false>(q + r0 * hd, nr, hd, keys + j, scale, o, out_stride, nullptr);
      }
    }
  }
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
