// Paged attention's inner loops on vdpbf16ps (see attention_bf16.h).
//
// Scores: a register holds dimension pair d of 16 keys (one key per fp32 lane), so a vdpbf16ps
// against the query's pair d broadcast adds that pair's products to 16 scores at once; the keys
// are transposed into that form once per call and serve every query row. Weighted sum: a register
// holds 16 dimensions of two consecutive keys' values interleaved, so a vdpbf16ps against the two
// keys' probabilities broadcast adds both to 16 output dimensions.
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

// The accumulators' lane order for H x 32 dimensions: within each 32 dimensions, interleaving
// two keys' values (unpacklo/hi of 16-bit words) orders the fp32 lanes as dimensions 8L + {0..3}
// (lo) and 8L + 4 + {0..3} (hi) of each 128-bit lane L: the accumulators are kept in that order
// (gathered by lo / hi from the row's two 16-dimension halves) and put back in place on store
// (back0 / back1).
struct LaneOrder {
  alignas(64) int32_t lo[16];
  alignas(64) int32_t hi[16];
  alignas(64) int32_t back0[16];
  alignas(64) int32_t back1[16];
};
constexpr LaneOrder MakeLaneOrder() {
  LaneOrder o{};
  for (int i = 0; i < 16; ++i) {
    o.lo[i] = 8 * (i / 4) + i % 4;
    o.hi[i] = o.lo[i] + 4;
    for (int half = 0; half < 2; ++half) {
      const int d = 16 * half + i, lane = d / 8, w = d % 8;
      (half == 0 ? o.back0 : o.back1)[i] = w < 4 ? 4 * lane + w : 16 + 4 * lane + w - 4;
    }
  }
  return o;
}

// The weighted sum of G heads x R rows (their accumulators in registers) over H x 32 dimensions
// each, the probabilities as bf16 pairs of consecutive keys: row i of head g takes its pair j / 2
// at pairs[(g * head_rows + i) * stride + j / 2], its accumulator at acc + (g * head_rows + i) *
// hd, head g's values at values[j] + voff + g * hd, and stops at keys[i] (every head's row i
// alike). A key's heads are read together (its whole row at once, not a head's part of each row
// and then the next's). Pairs every row takes whole come first, then the last few where rows end
// (each at its own key count, an odd last key paired with zeros): the same operations per row
// whatever G, R and the other rows.
template <int H, int G, int R>
void WeightedBlock(const uint32_t* pairs, int64_t stride, int64_t head_rows, const int64_t* keys, int64_t n,
                   const uint16_t* const* values, int64_t voff, float* acc) {
  constexpr int64_t hd = 32 * H;
  static constexpr LaneOrder kOrder = MakeLaneOrder();
  auto row_pairs = [&](int g, int i) { return pairs + (g * head_rows + i) * stride; };
  auto row_acc = [&](int g, int i) { return acc + (g * head_rows + i) * hd; };
  const __m512i lo = _mm512_load_si512(kOrder.lo), hi = _mm512_load_si512(kOrder.hi);
  __m512 a[G][R][2 * H];
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < H; ++h) {
        const __m512 n0 = _mm512_loadu_ps(row_acc(g, i) + 32 * h), n1 = _mm512_loadu_ps(row_acc(g, i) + 32 * h + 16);
        a[g][i][2 * h] = _mm512_permutex2var_ps(n0, lo, n1);
        a[g][i][2 * h + 1] = _mm512_permutex2var_ps(n0, hi, n1);
      }
    }
  }
  int64_t common = n;
  for (int i = 0; i < R; ++i) common = std::min(common, keys[i] / 2 * 2);
  for (int64_t j = 0; j < common; j += 2) {
    for (int g = 0; g < G; ++g) {
      __m512i v[2 * H];
      for (int h = 0; h < H; ++h) {
        const __m512i v0 = _mm512_loadu_si512(values[j] + voff + g * hd + 32 * h);
        const __m512i v1 = _mm512_loadu_si512(values[j + 1] + voff + g * hd + 32 * h);
        v[2 * h] = _mm512_unpacklo_epi16(v0, v1);
        v[2 * h + 1] = _mm512_unpackhi_epi16(v0, v1);
      }
      for (int i = 0; i < R; ++i) {
        const __m512i pp = _mm512_set1_epi32(static_cast<int>(row_pairs(g, i)[j / 2]));
        for (int h = 0; h < 2 * H; ++h) a[g][i][h] = _mm512_dpbf16_ps(a[g][i][h], AsBh(pp), AsBh(v[h]));
      }
    }
  }
  for (int64_t j = common; j < n; j += 2) {
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < R; ++i) {
        const int64_t own = keys[i];
        if (j >= own) continue;
        const __m512i pp = _mm512_set1_epi32(static_cast<int>(row_pairs(g, i)[j / 2]));
        for (int h = 0; h < H; ++h) {
          const __m512i v0 = _mm512_loadu_si512(values[j] + voff + g * hd + 32 * h);
          const __m512i v1 =
              j + 1 < own ? _mm512_loadu_si512(values[j + 1] + voff + g * hd + 32 * h) : _mm512_setzero_si512();
          a[g][i][2 * h] = _mm512_dpbf16_ps(a[g][i][2 * h], AsBh(pp), AsBh(_mm512_unpacklo_epi16(v0, v1)));
          a[g][i][2 * h + 1] = _mm512_dpbf16_ps(a[g][i][2 * h + 1], AsBh(pp), AsBh(_mm512_unpackhi_epi16(v0, v1)));
        }
      }
    }
  }
  const __m512i b0 = _mm512_load_si512(kOrder.back0), b1 = _mm512_load_si512(kOrder.back1);
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < H; ++h) {
        _mm512_storeu_ps(row_acc(g, i) + 32 * h, _mm512_permutex2var_ps(a[g][i][2 * h], b0, a[g][i][2 * h + 1]));
        _mm512_storeu_ps(row_acc(g, i) + 32 * h + 16, _mm512_permutex2var_ps(a[g][i][2 * h], b1, a[g][i][2 * h + 1]));
      }
    }
  }
}

// Rows per head of one block: the G x R x 2H accumulators fill at most 24 of AVX-512's 32
// registers; the block size a compile-time constant (a last, partial block dispatched to its own).
template <int H, int G>
inline constexpr int kWeightedRows = 24 / (2 * H * G) > 0 ? 24 / (2 * H * G) : 1;

template <int H, int G, int... Ns>
void WeightedBlockOf(int nr, std::integer_sequence<int, Ns...>, const uint32_t* pairs, int64_t stride,
                     int64_t head_rows, const int64_t* keys, int64_t n, const uint16_t* const* values, int64_t voff,
                     float* acc) {
  ((nr == Ns + 1 ? WeightedBlock<H, G, Ns + 1>(pairs, stride, head_rows, keys, n, values, voff, acc) : void()), ...);
}

// G heads' `rows` rows each, in blocks of kWeightedRows.
template <int H, int G>
void WeightedRows(const uint32_t* pairs, int64_t stride, int64_t rows, const int64_t* keys, int64_t n,
                  const uint16_t* const* values, int64_t voff, float* acc) {
  constexpr int R = kWeightedRows<H, G>;
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, rows - r0));
    WeightedBlockOf<H, G>(nr, std::make_integer_sequence<int, R>{}, pairs + r0 * stride, stride, rows, keys + r0, n,
                          values, voff, acc + r0 * 32 * H);
  }
}

// The same from fp32 probabilities (p_stride apart), rounded to bf16 pairs a block at a time; one head.
template <int H>
void WeightedRowsF32(const float* p, int64_t p_stride, int64_t rows, const int64_t* keys, int64_t n,
                     const uint16_t* const* values, float* acc) {
  constexpr int R = kWeightedRows<H, 1>;
  constexpr int64_t kStride = kBf16MaxValueKeys / 2;
  alignas(64) uint32_t pairs[R][kStride];
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, rows - r0));
    for (int i = 0; i < nr; ++i) {
      const float* pr = p + (r0 + i) * p_stride;
      for (int64_t j = 0; j < n; j += 32) {  // probabilities rounded to bf16 pairs
        const __mmask16 m0 = static_cast<__mmask16>(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
        const __mmask16 m1 = static_cast<__mmask16>(n - j >= 32 ? 0xffff : n - j <= 16 ? 0 : (1u << (n - j - 16)) - 1);
        const __m512bh bh = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, pr + j + 16), _mm512_maskz_loadu_ps(m0, pr + j));
        _mm512_store_si512(pairs[i] + j / 2, reinterpret_cast<__m512i>(bh));
      }
    }
    WeightedBlockOf<H, 1>(nr, std::make_integer_sequence<int, R>{}, pairs[0], kStride, nr, keys + r0, n, values, 0,
                          acc + r0 * 32 * H);
  }
}

inline __mmask16 FirstLanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// The word permutes that interleave two keys' 32 dimensions: word 2i of lo is dimension i of the
// first key, 2i + 1 dimension i of the second; hi the same for dimensions 16 + i.
struct PairIndex {
  alignas(64) int16_t lo[32];
  alignas(64) int16_t hi[32];
};
constexpr PairIndex MakePairIndex() {
  PairIndex x{};
  for (int i = 0; i < 16; ++i) {
    x.lo[2 * i] = static_cast<int16_t>(i), x.lo[2 * i + 1] = static_cast<int16_t>(32 + i);
    x.hi[2 * i] = static_cast<int16_t>(16 + i), x.hi[2 * i + 1] = static_cast<int16_t>(48 + i);
  }
  return x;
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

void ValuePairsBf16(const uint16_t* const values[kAmxValueKeys], int64_t hd, uint32_t* out) {
  static constexpr PairIndex kIndex = MakePairIndex();
  const __m512i lo = _mm512_load_si512(kIndex.lo), hi = _mm512_load_si512(kIndex.hi);
  for (int64_t p = 0; p < kAmxValueKeys / 2; ++p) {
    for (int64_t h = 0; h < hd / 32; ++h) {
      const __m512i v0 = _mm512_loadu_si512(values[2 * p] + 32 * h), v1 = _mm512_loadu_si512(values[2 * p + 1] + 32 * h);
      _mm512_storeu_si512(out + (2 * h) * 256 + p * 16, _mm512_permutex2var_epi16(v0, lo, v1));
      _mm512_storeu_si512(out + (2 * h + 1) * 256 + p * 16, _mm512_permutex2var_epi16(v0, hi, v1));
    }
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

void ScoreWideKeysBf16(const uint16_t* q, int64_t rows, int64_t hd, const uint16_t* const* keys, int blocks,
                       float scale, float* out, int64_t out_stride, uint32_t* kt) {
  for (int b = 0; b < blocks; ++b) KeyPairsBf16(keys + b * kBf16KeyBlock, hd, kt + b * hd / 2 * 16);
  const __m512i* pairs = reinterpret_cast<const __m512i*>(kt);
  if (blocks == 2) {
    ScoreBlocks<2>(q, rows, hd, pairs, hd / 2, scale, out, out_stride);
  } else {
    ScoreBlocks<1>(q, rows, hd, pairs, hd / 2, scale, out, out_stride);
  }
}

// One of the head sizes Bf16AttentionHeadDim admits, as the template's H (hd / 32).
template <typename F>
void ForHeadDim(int64_t hd, F f) {
  switch (hd / 32) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return;  // Bf16AttentionHeadDim keeps other sizes on the exact kernel
  }
}

void AddWeightedBf16(const float* p, int64_t p_stride, int64_t rows, const int64_t* keys, int64_t n,
                     const uint16_t* const* values, int64_t hd, float* acc) {
  ForHeadDim(hd, [&](auto h) { WeightedRowsF32<decltype(h)::value>(p, p_stride, rows, keys, n, values, acc); });
}

void AddWeightedPairsBf16(const uint32_t* pairs, int64_t stride, int64_t rows, int64_t heads, const int64_t* keys,
                          int64_t n, const uint16_t* const* values, int64_t hd, float* acc) {
  ForHeadDim(hd, [&](auto h) {
    constexpr int H = decltype(h)::value;
    for (int64_t g = 0; g < heads;) {  // as many heads a block as their accumulators fit
      const int64_t left = heads - g;
      const uint32_t* p = pairs + g * rows * stride;
      float* a = acc + g * rows * hd;
      if constexpr (4 * 2 * H <= 24) {
        if (left >= 4) {
          WeightedRows<H, 4>(p, stride, rows, keys, n, values, g * hd, a);
          g += 4;
          continue;
        }
      }
      if constexpr (2 * 2 * H <= 24) {
        if (left >= 2) {
          WeightedRows<H, 2>(p, stride, rows, keys, n, values, g * hd, a);
          g += 2;
          continue;
        }
      }
      WeightedRows<H, 1>(p, stride, rows, keys, n, values, g * hd, a);
      g += 1;
    }
  });
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
