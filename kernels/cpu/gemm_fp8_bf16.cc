// The FP8 GEMM for the variants that round activations to bf16 (avx512-bf16, amx): the weights
// stream as bytes and are widened to bf16 (w / 256 is exact in bf16, never subnormal), the rows
// of x are rounded to bf16 once per call, and vdpbf16ps multiplies 32 of each per instruction:
// twice the products of the fp32 kernel per instruction, for the batch sizes where that kernel
// is compute-bound.
//
// Per 128-column group: one 16-lane vdpbf16ps chain over the group's 32-column chunks (lane k
// takes columns 2k and 2k + 1 of each chunk; a partial chunk is zero-padded), scaled by
// 256 x scale into a 16-lane total; at the end the total's halves are added and reduced by
// vec8.h's tree. The same operations for every (i, j) whatever m: batch-invariant. Compiled for
// AVX512-BF16 by the target pragma below and only called where cpu_isa.h found it.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/vec8.h"

#pragma GCC push_options
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 intrinsics' pass-through operand
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")

namespace moeserve::cpu_fast {
namespace {

constexpr int kRows = 4;  // rows of x per pass over a weight row

inline __mmask32 Mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << n) - 1); }

// Up to 32 FP8 bytes (zero past n) as 32 bf16 of w / 256, in column order.
inline __m512bh WidenBf16(const uint8_t* p, int64_t n) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(Mask32(n), p));
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16(static_cast<int16_t>(0xbf80)));
  const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

inline __m512bh LoadBf16(const uint16_t* p, int64_t n) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(Mask32(n), p));
}

// R rows of bf16 x (row stride ldx) against one weight row: its bytes, or `wide` (the same
// widened once) when not null.
template <int R>
void Dots(const uint8_t* bytes, const uint16_t* wide, const float* scales, int64_t cols, const uint16_t* x,
          int64_t ldx, float* out) {
  const int64_t groups = (cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8ScaleCols, c1 = std::min(cols, c0 + kFp8ScaleCols);
    if (wide == nullptr) {
      for (int64_t p = 0; p < kFp8ScaleCols; p += 64) Prefetch(bytes + c0 + 2 * kFp8ScaleCols + p);
    }
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t c = c0; c < c1; c += 32) {
      const int64_t n = c1 - c;
      const __m512bh wv = wide != nullptr ? LoadBf16(wide + c, n) : WidenBf16(bytes + c, n);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], wv, LoadBf16(x + r * ldx + c, n));
    }
    const __m512 s = _mm512_set1_ps(scales[g] * 256.0f);
    for (int r = 0; r < R; ++r) total[r] = _mm512_fmadd_ps(acc[r], s, total[r]);
  }
  for (int r = 0; r < R; ++r) {
    const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(total[r]), _mm512_extractf32x8_ps(total[r], 1));
    out[r] = Reduce(V8{sum});
  }
}

void RowDots(const uint8_t* bytes, const uint16_t* wide, const float* scales, int64_t cols, const uint16_t* x,
             int rows, float* out) {
  switch (rows) {
    case 4: return Dots<4>(bytes, wide, scales, cols, x, cols, out);
    case 3: return Dots<3>(bytes, wide, scales, cols, x, cols, out);
    case 2: return Dots<2>(bytes, wide, scales, cols, x, cols, out);
    default: return Dots<1>(bytes, wide, scales, cols, x, cols, out);
  }
}

// Rows [j0, j1) of w against the m bf16 rows of x; a weight row is widened once when m > 1.
void RowRange(const uint16_t* x, int64_t m, const WeightRef& w, float* y, bool accumulate, int64_t j0, int64_t j1,
              std::vector<uint16_t>* wide) {
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  const int64_t groups = (w.cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  if (m > 1) wide->resize(static_cast<size_t>(w.cols + 32));
  float out[kRows];
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = bytes + j * w.cols;
    const uint16_t* wr = nullptr;
    if (m > 1) {
      for (int64_t c = 0; c < w.cols; c += 32) {
        _mm512_storeu_si512(wide->data() + c, reinterpret_cast<__m512i>(WidenBf16(row + c, w.cols - c)));
      }
      wr = wide->data();
    }
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      RowDots(row, wr, w.scales + j * groups, w.cols, x + i * w.cols, rows, out);
      for (int r = 0; r < rows; ++r) {
        float& dst = y[(i + r) * w.rows + j];
        dst = accumulate ? dst + out[r] : out[r];
      }
    }
  }
}


// x rounded to bf16 (round to nearest even), padded by 32 for the masked tail loads.
std::vector<uint16_t> RoundRows(const float* x, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n + 32));
  for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(x[i]);
  return out;
}

}  // namespace

void GemmFp8Bf16(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) {
  MS_CHECK(w.dtype == DType::kF8E4M3 && w.scales != nullptr && w.layout == WeightLayout::kRowMajor);
  const std::vector<uint16_t> xb = RoundRows(x, m * w.cols);
  pool.ParallelFor((w.rows + kFp8RowGrain - 1) / kFp8RowGrain, 1, [&](int64_t b, int64_t e) {
    std::vector<uint16_t> wide;
    RowRange(xb.data(), m, w, y, accumulate, b * kFp8RowGrain, std::min(w.rows, e * kFp8RowGrain), &wide);
  });
}

void GroupedGemmFp8Bf16(ThreadPool& pool, const float* x, std::span<const WeightRef> w,
                        std::span<const int64_t> offsets, float* y) {
  if (w.empty()) return;
  const std::vector<uint16_t> xb = RoundRows(x, offsets.back() * w[0].cols);
  const std::vector<std::pair<int64_t, int64_t>> items = Fp8GroupItems(w, offsets);
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    std::vector<uint16_t> wide;
    for (int64_t it = b; it < e; ++it) {
      const auto [g, j0] = items[it];
      const WeightRef& wg = w[g];
      RowRange(xb.data() + offsets[g] * wg.cols, offsets[g + 1] - offsets[g], wg, y + offsets[g] * wg.rows, false, j0,
               std::min(wg.rows, j0 + kFp8RowGrain), &wide);
    }
  });
}

}  // namespace moeserve::cpu_fast

#pragma GCC pop_options
