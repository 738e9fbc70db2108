// Paged attention's weighted sums on vdpbf16ps (see attention_bf16.h), and the AMX kernel's
// value tiles: a register holds 16 dimensions of two consecutive keys' values interleaved, so a
// vdpbf16ps against the two keys' probabilities broadcast adds both to 16 output dimensions.
//
// Compiled for AVX512-BF16 by the target pragma below (after every include, so no inline
// function of a header is compiled for it).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/status.h"
#include "kernels/cpu/attention_bf16.h"

#pragma GCC push_options
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

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
// acc_stride, head g's values at values[j] + voff + g * hd, and stops at keys[i] (every head's row i
// alike). A key's heads are read together (its whole row at once, not a head's part of each row
// and then the next's). Pairs every row takes whole come first, then the last few where rows end
// (each at its own key count, an odd last key paired with zeros): the same operations per row
// whatever G, R and the other rows.
template <int H, int G, int R>
void WeightedBlock(const uint32_t* pairs, int64_t stride, int64_t head_rows, const int64_t* keys, int64_t n,
                   const uint16_t* const* values, int64_t voff, float* acc, int64_t acc_stride) {
  constexpr int64_t hd = 32 * H;
  static constexpr LaneOrder kOrder = MakeLaneOrder();
  auto row_pairs = [&](int g, int i) { return pairs + (g * head_rows + i) * stride; };
  auto row_acc = [&](int g, int i) { return acc + (g * head_rows + i) * acc_stride; };
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
                     float* acc, int64_t acc_stride) {
  ((nr == Ns + 1 ? WeightedBlock<H, G, Ns + 1>(pairs, stride, head_rows, keys, n, values, voff, acc, acc_stride)
                 : void()),
   ...);
}

// G heads' `rows` rows each, in blocks of kWeightedRows (accumulators hd = 32 H apart).
template <int H, int G>
void WeightedRows(const uint32_t* pairs, int64_t stride, int64_t rows, const int64_t* keys, int64_t n,
                  const uint16_t* const* values, int64_t voff, float* acc) {
  constexpr int R = kWeightedRows<H, G>;
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, rows - r0));
    WeightedBlockOf<H, G>(nr, std::make_integer_sequence<int, R>{}, pairs + r0 * stride, stride, rows, keys + r0, n,
                          values, voff, acc + r0 * 32 * H, 32 * H);
  }
}

// The same from fp32 probabilities (p_stride apart), rounded to bf16 pairs a block at a time; one
// head, its values at values[j] + voff, its accumulators acc_stride apart.
template <int H>
void WeightedRowsF32(const float* p, int64_t p_stride, int64_t rows, const int64_t* keys, int64_t n,
                     const uint16_t* const* values, int64_t voff, float* acc, int64_t acc_stride) {
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
    WeightedBlockOf<H, 1>(nr, std::make_integer_sequence<int, R>{}, pairs[0], kStride, nr, keys + r0, n, values, voff,
                          acc + r0 * acc_stride, acc_stride);
  }
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
  if (Bf16AttentionHeadDim(hd)) {
    return ForHeadDim(hd, [&](auto h) {
      WeightedRowsF32<decltype(h)::value>(p, p_stride, rows, keys, n, values, 0, acc, hd);
    });
  }
  MS_CHECK(hd % 128 == 0);
  for (int64_t b = 0; b < hd; b += 128) WeightedRowsF32<4>(p, p_stride, rows, keys, n, values, b, acc + b, hd);
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
