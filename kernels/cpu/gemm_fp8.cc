// GEMM against FP8 weights (float8_e4m3fn, one fp32 scale per row and 128 columns) on the CPU
// fast path: the weights stream from memory as bytes, one per weight (plus 4 bytes per 128),
// and are widened in registers (vec8.h's LoadFp8Over256), so a memory-bound decode step reads
// half the bytes of bf16.
//
// y[i, j] = sum over column groups g of (256 x scale[j, g]) x (sum over the group's columns of
// w[j, c] / 256 x x[i, c]): an 8-lane FMA chain per group, then scaled into an 8-lane total,
// reduced by one tree. Every (i, j) takes the same operations in the same order whatever m, so
// the kernel is batch-invariant. Up to four rows of x share each widened weight vector.
#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kMr = 4;  // rows of x per pass over a weight row

// The scalar tail of a group whose width is not a multiple of 8, per row of x, in order.
float TailDot(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t c = 0; c < n; ++c) acc = std::fma(F8E4M3ToF32(w[c]) / 256.0f, x[c], acc);
  return acc;
}

template <int R>
void RowDots(const uint8_t* w, const float* scales, const float* x, int64_t ldx, int64_t cols, float* out) {
  const int64_t groups = (cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  V8 total[R];
  float tail[R] = {};
  for (int r = 0; r < R; ++r) total[r] = Zero();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8ScaleCols, c1 = std::min(cols, c0 + kFp8ScaleCols);
    const int64_t full = c0 + (c1 - c0) / 8 * 8;
    V8 part[R];
    for (int r = 0; r < R; ++r) part[r] = Zero();
    for (int64_t c = c0; c < full; c += 8) {
      const V8 wv = LoadFp8Over256(w + c);
      for (int r = 0; r < R; ++r) part[r] = Fma(wv, Load(x + r * ldx + c), part[r]);
    }
    const float s = scales[g] * 256.0f;
    for (int r = 0; r < R; ++r) {
      total[r] = Fma(part[r], Set1(s), total[r]);
      if (full < c1) tail[r] = std::fma(TailDot(w + full, x + r * ldx + full, c1 - full), s, tail[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Reduce(total[r]) + tail[r];
}

}  // namespace

void GemmFp8(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate) {
  MS_CHECK(w.dtype == DType::kF8E4M3 && w.scales != nullptr && w.layout == WeightLayout::kRowMajor);
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  const int64_t groups = (w.cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  pool.ParallelFor(w.rows, 16, [&](int64_t j0, int64_t j1) {
    float out[kMr];
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* wr = bytes + j * w.cols;
      const float* sr = w.scales + j * groups;
      for (int64_t i = 0; i < m; i += kMr) {
        const int64_t rows = std::min(kMr, m - i);
        const float* xi = x + i * w.cols;
        switch (rows) {
          case 4: RowDots<4>(wr, sr, xi, w.cols, w.cols, out); break;
          case 3: RowDots<3>(wr, sr, xi, w.cols, w.cols, out); break;
          case 2: RowDots<2>(wr, sr, xi, w.cols, w.cols, out); break;
          default: RowDots<1>(wr, sr, xi, w.cols, w.cols, out); break;
        }
        for (int64_t r = 0; r < rows; ++r) {
          float& dst = y[(i + r) * w.rows + j];
          dst = accumulate ? dst + out[r] : out[r];
        }
      }
    }
  });
}

}  // namespace moeserve::cpu_fast
