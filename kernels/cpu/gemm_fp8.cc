// GEMM against FP8 weights (float8_e4m3fn, one fp32 scale per row and 128 columns) on the CPU
// fast path: the weights stream from memory as bytes, one per weight (plus 4 bytes per 128),
// and are widened in registers, so a memory-bound decode step reads half the bytes of bf16.
// Each (i, j) takes the same operations in the same order whatever m and whatever its batch
// mates (gemm_fp8.h), so the kernel is batch-invariant; for more than kFp8Rows rows of x a
// weight row is widened once into a buffer that every row of x then reads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/gemm_fp8.h"
#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {
namespace {

// R rows of x against N weight rows (R x N <= 4: the chains stay in registers).
template <int R, int N>
void Dots(const Fp8Row* w, const float* x, int64_t ldx, float* out) {
  const int64_t cols = w[0].cols, groups = (cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  V8 ta[N][R], tb[N][R];  // the scaled sums of the even and of the odd chunks
  float tail[N][R] = {};
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < R; ++r) ta[n][r] = tb[n][r] = Zero();
  }
  auto chunk = [&](int n, int64_t c) {
    return w[n].wide != nullptr ? Load(w[n].wide + c) : LoadFp8Over256(w[n].bytes + c);
  };
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kFp8ScaleCols, c1 = std::min(cols, c0 + kFp8ScaleCols);
    const int64_t full = c0 + (c1 - c0) / 8 * 8;
    V8 pa[N][R], pb[N][R];  // the even and the odd chunks of 8 columns
    for (int n = 0; n < N; ++n) {
      for (int r = 0; r < R; ++r) pa[n][r] = pb[n][r] = Zero();
      // Streamed weight bytes: fetch the group after next while this one computes.
      for (int64_t p = 0; w[n].wide == nullptr && p < kFp8ScaleCols; p += 64) {
        Prefetch(w[n].bytes + c0 + 2 * kFp8ScaleCols + p);
      }
    }
    int64_t c = c0;
    for (; c + 16 <= full; c += 16) {
      for (int n = 0; n < N; ++n) {
        const V8 wa = chunk(n, c), wb = chunk(n, c + 8);
        for (int r = 0; r < R; ++r) {
          pa[n][r] = Fma(wa, Load(x + r * ldx + c), pa[n][r]);
          pb[n][r] = Fma(wb, Load(x + r * ldx + c + 8), pb[n][r]);
        }
      }
    }
    if (c < full) {
      for (int n = 0; n < N; ++n) {
        const V8 wa = chunk(n, c);
        for (int r = 0; r < R; ++r) pa[n][r] = Fma(wa, Load(x + r * ldx + c), pa[n][r]);
      }
    }
    for (int n = 0; n < N; ++n) {
      const float s = w[n].scales[g] * 256.0f;
      for (int r = 0; r < R; ++r) {
        ta[n][r] = Fma(pa[n][r], Set1(s), ta[n][r]);
        tb[n][r] = Fma(pb[n][r], Set1(s), tb[n][r]);
        if (full < c1) tail[n][r] = std::fma(Fp8TailDot(w[n].bytes + full, x + r * ldx + full, c1 - full), s, tail[n][r]);
      }
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < R; ++r) out[n * R + r] = Reduce(Add(ta[n][r], tb[n][r])) + tail[n][r];
  }
}

constexpr int64_t kLongRow = 4096;  // columns from which a decode product takes four weight rows at once

// Rows [j0, j1) of one weight against all m rows of x: for one row of x and long weight rows,
// four weight rows at a time (the row of x, too large for the registers, is read once per
// four); else one weight row at a time for up to four rows of x. On the Zen 4 the four-row
// form streamed a 16384 x 8192 matrix at 18-21 GB/s against 13 for one row, but rows of 512
// or 1024 columns at 10-12 GB/s against 18-20 (benchmarks/kernels_bench BM_GemmFp8ColdWeights).
void RowRange(const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate, bool avx512, int64_t j0,
              int64_t j1, std::vector<float>* wide) {
  const uint8_t* bytes = static_cast<const uint8_t*>(w.data);
  const int64_t groups = (w.cols + kFp8ScaleCols - 1) / kFp8ScaleCols;
  auto row = [&](int64_t j) { return Fp8Row{bytes + j * w.cols, nullptr, w.scales + j * groups, w.cols}; };
  auto put = [&](int64_t i, int64_t j, float v) {
    float& dst = y[i * w.rows + j];
    dst = accumulate ? dst + v : v;
  };
  float out[kFp8Rows];
  if (m == 1 && w.cols >= kLongRow) {
    int64_t j = j0;
    for (; j + kFp8Rows <= j1; j += kFp8Rows) {
      const Fp8Row rows[kFp8Rows] = {row(j), row(j + 1), row(j + 2), row(j + 3)};
      (avx512 ? Fp8DotsAvx512 : Fp8DotsAvx2)(rows, kFp8Rows, x, w.cols, 1, out);
      for (int n = 0; n < kFp8Rows; ++n) put(0, j + n, out[n]);
    }
    for (; j < j1; ++j) {
      const Fp8Row one = row(j);
      (avx512 ? Fp8DotsAvx512 : Fp8DotsAvx2)(&one, 1, x, w.cols, 1, out);
      put(0, j, out[0]);
    }
    return;
  }
  const bool widen = m > kFp8Rows;
  // With 32 registers, two widened weight rows share each block of four rows of x (half the
  // reads of x); with 16, one.
  const int64_t pair = widen && avx512 ? 2 : 1;
  if (widen) wide->resize(static_cast<size_t>(pair * w.cols));
  for (int64_t j = j0; j < j1; j += pair) {
    const int64_t nj = std::min(pair, j1 - j);
    Fp8Row r[2] = {row(j), nj > 1 ? row(j + 1) : row(j)};
    for (int64_t k = 0; widen && k < nj; ++k) {
      WidenFp8Row(r[k].bytes, w.cols, wide->data() + k * w.cols);
      r[k].wide = wide->data() + k * w.cols;
    }
    for (int64_t i = 0; i < m; i += kFp8Rows) {
      const int rows = static_cast<int>(std::min<int64_t>(kFp8Rows, m - i));
      if (nj == 2 && rows == kFp8Rows) {
        float out2[2 * kFp8Rows];
        Fp8DotsAvx512(r, 2, x + i * w.cols, w.cols, rows, out2);
        for (int k = 0; k < rows; ++k) {
          put(i + k, j, out2[k]);
          put(i + k, j + 1, out2[kFp8Rows + k]);
        }
        continue;
      }
      for (int64_t n = 0; n < nj; ++n) {
        (avx512 ? Fp8DotsAvx512 : Fp8DotsAvx2)(&r[n], 1, x + i * w.cols, w.cols, rows, out);
        for (int k = 0; k < rows; ++k) put(i + k, j + n, out[k]);
      }
    }
  }
}


}  // namespace

float Fp8TailDot(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t c = 0; c < n; ++c) acc = std::fma(F8E4M3ToF32(w[c]) / 256.0f, x[c], acc);
  return acc;
}

std::vector<std::pair<int64_t, int64_t>> Fp8GroupItems(std::span<const WeightRef> w, std::span<const int64_t> offsets) {
  std::vector<std::pair<int64_t, int64_t>> items;
  for (size_t g = 0; g < w.size(); ++g) {
    if (offsets[g + 1] == offsets[g]) continue;
    MS_CHECK(w[g].dtype == DType::kF8E4M3 && w[g].scales != nullptr);
    for (int64_t j = 0; j < w[g].rows; j += kFp8RowGrain) items.push_back({static_cast<int64_t>(g), j});
  }
  return items;
}

void WidenFp8Row(const uint8_t* bytes, int64_t cols, float* out) {
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) Store(out + c, LoadFp8Over256(bytes + c));
  for (; c < cols; ++c) out[c] = F8E4M3ToF32(bytes[c]) / 256.0f;
}

void Fp8DotsAvx2(const Fp8Row* w, int n, const float* x, int64_t ldx, int rows, float* out) {
  if (n == 4) return Dots<1, 4>(w, x, ldx, out);
  switch (rows) {
    case 4: return Dots<4, 1>(w, x, ldx, out);
    case 3: return Dots<3, 1>(w, x, ldx, out);
    case 2: return Dots<2, 1>(w, x, ldx, out);
    default: return Dots<1, 1>(w, x, ldx, out);
  }
}

void GemmFp8(ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y, bool accumulate, bool avx512) {
  MS_CHECK(w.dtype == DType::kF8E4M3 && w.scales != nullptr && w.layout == WeightLayout::kRowMajor);
  pool.ParallelFor((w.rows + kFp8RowGrain - 1) / kFp8RowGrain, 1, [&](int64_t b, int64_t e) {
    std::vector<float> wide;
    RowRange(x, m, w, y, accumulate, avx512, b * kFp8RowGrain, std::min(w.rows, e * kFp8RowGrain), &wide);
  });
}

void GroupedGemmFp8(ThreadPool& pool, const float* x, std::span<const WeightRef> w, std::span<const int64_t> offsets,
                    float* y, bool avx512) {
  const std::vector<std::pair<int64_t, int64_t>> items = Fp8GroupItems(w, offsets);
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    std::vector<float> wide;
    for (int64_t it = b; it < e; ++it) {
      const auto [g, j0] = items[it];
      const WeightRef& wg = w[g];
      const int64_t m = offsets[g + 1] - offsets[g];
      RowRange(x + offsets[g] * wg.cols, m, wg, y + offsets[g] * wg.rows, false, avx512, j0,
               std::min(wg.rows, j0 + kFp8RowGrain), &wide);
    }
  });
}

void GemmFp8On(CpuIsa isa, ThreadPool& pool, const float* x, int64_t m, const WeightRef& w, float* y,
               bool accumulate) {
  if (RoundsActivations(isa)) return GemmFp8Bf16(pool, x, m, w, y, accumulate);
  GemmFp8(pool, x, m, w, y, accumulate, isa != CpuIsa::kAvx2);
}

void GroupedGemmFp8On(CpuIsa isa, ThreadPool& pool, const float* x, std::span<const WeightRef> w,
                      std::span<const int64_t> offsets, float* y) {
  if (RoundsActivations(isa)) return GroupedGemmFp8Bf16(pool, x, w, offsets, y);
  GroupedGemmFp8(pool, x, w, offsets, y, isa != CpuIsa::kAvx2);
}

}  // namespace moeserve::cpu_fast
