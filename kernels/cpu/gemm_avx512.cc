// The exact GEMM kernels on AVX-512 (16 fp32 lanes). A register holds chunk c of two weight
// rows (the tiled layout stores them side by side) and x's chunk is broadcast to both halves, so
// every lane runs the same FMA chain as a lane of gemm_avx2.cc and each half is summed by
// vec8.h's Reduce tree: bit-identical to avx2, with twice the work per instruction.
//
// Compiled for AVX-512 by the target pragma below (after every include, so no inline function
// of a header is compiled for it) and only called where cpu_isa.h found AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/vec8.h"

#pragma GCC push_options
// GCC 12 warns of the undefined pass-through operand inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

namespace moeserve::cpu_fast {
namespace {

constexpr int kMaxRows = 6;  // 6 x rows x 4 row pairs = 24 accumulators of AVX-512's 32 registers

// 8 columns of a row as fp32, zero-padded past `rem` (< 8) when rem > 0.
inline __m256 Load8(const float* p, int rem) {
  return rem > 0 ? _mm256_maskz_loadu_ps(static_cast<__mmask8>((1u << rem) - 1), p) : _mm256_loadu_ps(p);
}
inline __m256 Load8(const uint16_t* p, int rem) {
  const __m128i h = rem > 0 ? _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << rem) - 1), p)
                            : _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// 16 consecutive elements (two rows' chunk in a tiled layout) as fp32.
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Where the kernel reads row pair q's chunk c: in a tiled layout one run of 16 elements at
// tile + c * 64 + q * 16; otherwise two rows' own chunks (rem: columns of a last partial chunk).
template <typename T>
struct PairSource {
  const T* tile = nullptr;  // tiled: the tile's first element
  const T* row[kTileRows];  // row-major: each row's first element
  __m512 Load(int64_t c, int q, int rem) const {
    if (tile != nullptr) return Load16(tile + c * kTileRows * kTileCols + q * 2 * kTileCols);
    const __m256 lo = Load8(row[2 * q] + c * kTileCols, rem), hi = Load8(row[2 * q + 1] + c * kTileCols, rem);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
};

// M x rows against the 8 rows of a tile: acc[i][q] holds rows 2q and 2q + 1 for x row i.
template <typename T, int M>
void KernelMx8(const float* const* x, const PairSource<T>& w, int64_t cols, float* const* y, int store_cols,
               bool accumulate, const char* pf) {
  __m512 acc[M][4];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_setzero_ps();
  }
  const int64_t chunks = (cols + kTileCols - 1) / kTileCols, full = cols / kTileCols;
  constexpr int64_t kPfBytes = kTileRows * kTileCols * sizeof(T);
  for (int64_t c = 0; c < chunks; ++c) {
    if (pf != nullptr) {
      for (int64_t b = 0; b < kPfBytes; b += 64) _mm_prefetch(pf + c * kPfBytes + b, _MM_HINT_T0);
    }
    const int rem = c < full ? 0 : static_cast<int>(cols - full * kTileCols);
    __m512 wv[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) wv[q] = w.Load(c, q, rem);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const __m512 xv = _mm512_broadcast_f32x8(Load8(x[i] + c * kTileCols, rem));
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_fmadd_ps(xv, wv[q], acc[i][q]);
    }
  }
  // Every access to acc has a constant index (loops fully unrolled), so it lives in registers.
  alignas(64) float sums[M][8];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      sums[i][2 * q] = Reduce(V8{_mm512_castps512_ps256(acc[i][q])});
      sums[i][2 * q + 1] = Reduce(V8{_mm512_extractf32x8_ps(acc[i][q], 1)});
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < store_cols; ++j) y[i][j] = accumulate ? y[i][j] + sums[i][j] : sums[i][j];
  }
}

template <typename T, int M>
void Block(const float* x, int64_t i, int64_t cols, const PairSource<T>& w, float* y, int64_t rows, int64_t r0,
           int store_cols, bool accumulate, const char* pf) {
  const float* xr[M];
  float* yr[M];
  for (int r = 0; r < M; ++r) {
    xr[r] = x + (i + r) * cols;
    yr[r] = y + (i + r) * rows + r0;
  }
  KernelMx8<T, M>(xr, w, cols, yr, store_cols, accumulate, pf);
}

// Rows [r0, r0 + 8) of w (those below `rows`) against x rows [m0, m1).
template <typename T>
void Tile(const float* x, int64_t m0, int64_t m1, const Rows<T>& w, int64_t rows, int64_t r0, float* y,
          bool accumulate, const char* prefetch) {
  const int64_t cols = w.cols, nrows = std::min<int64_t>(kTileRows, rows - r0);
  PairSource<T> src;
  if (w.tiled) {
    src.tile = w.Row(r0);
  } else {
    for (int64_t j = 0; j < kTileRows; ++j) src.row[j] = w.Row(r0 + std::min<int64_t>(j, nrows - 1));
  }
  const int store = static_cast<int>(nrows);
  for (int64_t i = m0; i < m1;) {
    const char* pf = i == m0 ? prefetch : nullptr;
    switch (std::min<int64_t>(m1 - i, kMaxRows)) {
      case 1: Block<T, 1>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 1; break;
      case 2: Block<T, 2>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 2; break;
      case 3: Block<T, 3>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 3; break;
      case 4: Block<T, 4>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 4; break;
      case 5: Block<T, 5>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 5; break;
      default: Block<T, 6>(x, i, cols, src, y, rows, r0, store, accumulate, pf); i += 6; break;
    }
  }
}

template <typename T>
void RunItem(const GemmTask& t, const GemmItem& it, GemmScratch* widened) {
  const Rows<T> w = RowsOf<T>(t.w);
  const int64_t r0 = it.tile * kTileRows;
  if (t.m <= kDirectMaxRows || std::is_same_v<T, float>) {
    const char* pf = w.tiled ? reinterpret_cast<const char*>(w.Row(r0)) + kPrefetchBytes : nullptr;
    Tile<T>(t.x, it.m0, it.m1, w, t.w.rows, r0, t.y, t.accumulate, pf);
    return;
  }
  // Widen the 8-row tile to fp32, tiled, once per run of items on the same tile.
  const int64_t cols8 = RoundUp(t.w.cols, kTileCols), chunks = cols8 / kTileCols;
  if (widened->from != t.w.data || widened->tile != it.tile) {
    float* dst = widened->Reset(static_cast<size_t>(kTileRows * cols8));
    const int64_t nrows = std::min<int64_t>(kTileRows, t.w.rows - r0);
    const int64_t full = t.w.cols / kTileCols;
    for (int64_t j = 0; j < kTileRows; ++j) {
      const T* src = w.Row(r0 + std::min<int64_t>(j, nrows - 1));
      for (int64_t c = 0; c < chunks; ++c) {
        const int rem = c < full ? 0 : static_cast<int>(t.w.cols - full * kTileCols);
        const __m256 v = w.tiled ? Load8(src + c * w.chunk_stride, 0) : Load8(src + c * w.chunk_stride, rem);
        _mm256_store_ps(dst + c * kTileRows * kTileCols + j * kTileCols, v);
      }
    }
    widened->from = t.w.data;
    widened->tile = it.tile;
  }
  const Rows<float> f{widened->data, t.w.cols, kTileRows * kTileCols, true, r0};
  const char* next = w.tiled && r0 + kTileRows < t.w.rows ? reinterpret_cast<const char*>(w.Row(r0 + kTileRows))
                                                          : nullptr;
  Tile<float>(t.x, it.m0, it.m1, f, t.w.rows, r0, t.y, t.accumulate, next);
}

}  // namespace

void TileAvx512(const GemmTask& t, const uint16_t* /*x_bf16*/, const GemmItem& it, GemmScratch* s) {
  if (t.w.dtype == DType::kF32) {
    RunItem<float>(t, it, s);
  } else {
    RunItem<uint16_t>(t, it, s);
  }
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
