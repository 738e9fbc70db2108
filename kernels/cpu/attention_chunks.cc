// Attention over a context in fixed chunks of keys, weighed together (attention_chunks.h).
#include "kernels/cpu/attention_chunks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {

void CombineRow(const float* parts, int64_t all, int64_t width, int64_t row, int64_t n, float* dst) {
  const int64_t stride = ChunkPartFloats(all, width);
  float weight[64];  // per chunk, a pass of up to 64 chunks at a time
  auto max_of = [&](int64_t c) { return parts[c * stride + all * width + row]; };
  auto sum_of = [&](int64_t c) { return parts[c * stride + all * width + all + row]; };
  float m = -INFINITY, total = 0.0f;
  for (int64_t c = 0; c < n; ++c) m = std::max(m, max_of(c));
  for (int64_t c = 0; c < n; ++c) total += sum_of(c) * std::exp(max_of(c) - m);
  // -0, not +0: fma(w, o, -0) is w * o rounded even where that is -0, so one chunk (w = 1)
  // keeps every bit of its result (FinishChunks copies such rows).
  for (int64_t d = 0; d < width; d += 8) Store(dst + d, Set1(-0.0f));
  for (int64_t c0 = 0; c0 < n; c0 += 64) {
    const int64_t c1 = std::min(n, c0 + 64);
    for (int64_t c = c0; c < c1; ++c) weight[c - c0] = sum_of(c) * std::exp(max_of(c) - m) / total;
    for (int64_t d = 0; d < width; d += 8) {
      V8 a = Load(dst + d);
      for (int64_t c = c0; c < c1; ++c) a = Fma(Set1(weight[c - c0]), Load(parts + c * stride + row * width + d), a);
      Store(dst + d, a);
    }
  }
}

void CombineChunks(const ItemRows& it, const float* parts, float* out) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows;
  for (int64_t row = 0; row < all; ++row) {
    const int64_t r = row % nrows;
    CombineRow(parts, all, hd, row, ChunksOf(it.ctx_of(r)), out + it.head_of(it.g0 + row / nrows, r) * hd);
  }
}

void FinishChunks(const ItemRows& it, const float* parts, float* out) {
  if (ChunksOf(it.ctx_max) > 1) return CombineChunks(it, parts, out);
  // CombineChunks would copy the bits (fma(1, o, -0) = o), at 3% of a 512-token prefill chunk's
  // attention.
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  for (int64_t row = 0; row < it.heads * nrows; ++row) {
    std::memcpy(out + it.head_of(it.g0 + row / nrows, row % nrows) * hd, parts + row * hd,
                static_cast<size_t>(hd) * sizeof(float));
  }
}

}  // namespace moeserve::cpu_fast
