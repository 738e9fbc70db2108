// Attention over a context in fixed chunks of keys, folded in order (attention_chunks.h).
#include "kernels/cpu/attention_chunks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {

void FoldChunk(const float* part, int64_t all, int64_t width, float* acc) {
  float* acc_max = acc + all * width;
  float* acc_sum = acc_max + all;
  const float* part_max = part + all * width;
  const float* part_sum = part_max + all;
  for (int64_t row = 0; row < all; ++row) {
    float* o = acc + row * width;
    const float* p = part + row * width;
    if (part_sum[row] == 0.0f) continue;  // the row's context ends before this chunk
    if (acc_sum[row] == 0.0f) {           // nothing folded yet: the chunk's result as it is
      std::memcpy(o, p, static_cast<size_t>(width) * sizeof(float));
      acc_max[row] = part_max[row];
      acc_sum[row] = part_sum[row];
      continue;
    }
    const float m = std::max(acc_max[row], part_max[row]);
    const float la = acc_sum[row] * std::exp(acc_max[row] - m), lp = part_sum[row] * std::exp(part_max[row] - m);
    const float total = la + lp;
    const V8 wa = Set1(la / total), wp = Set1(lp / total);
    for (int64_t d = 0; d < width; d += 8) Store(o + d, Fma(wa, Load(o + d), Mul(wp, Load(p + d))));
    acc_max[row] = m;
    acc_sum[row] = total;
  }
}

void WriteItemRows(const ItemRows& it, const float* part, float* out) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  for (int64_t row = 0; row < it.heads * nrows; ++row) {
    std::memcpy(out + it.head_of(it.g0 + row / nrows, row % nrows) * hd, part + row * hd,
                static_cast<size_t>(hd) * sizeof(float));
  }
}

}  // namespace moeserve::cpu_fast
