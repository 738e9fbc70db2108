// One work item of latent attention (attention_latent.h).
#include "kernels/cpu/attention_latent.h"

#include <algorithm>
#include <cstring>

#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {
namespace {

// Scores (row by row at s->scores, `padded` apart), softmax, then the weighted sums into s->acc.
template <typename T>
void LatentPasses(const LatentItem& it, float scale, int64_t padded, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), ctx_max = it.ctx_of(nrows - 1);
  const T* rows[kExactValueKeys];
  const RowSource keys{it.layout, it.cache, it.table(), it.layer, 0, 0, hd, ctx_max};
  for (int64_t k0 = 0; k0 < ctx_max; k0 += kExactKeys) {
    CopyRows(keys, k0, kExactKeys, s, rows);
    for (int64_t row = 0; row < nrows;) {
      if (k0 >= it.ctx_of(row)) {  // rows ascend in context: the next one may still take these keys
        ++row;
        continue;
      }
      float* sc = s->scores.data() + row * padded + k0;
      const float* q = s->q.data() + row * hd;
      if (row + 1 < nrows) {
        Scores2(q, q + hd, rows, 0, hd, scale, sc, sc + padded);
        row += 2;
      } else {
        Store(sc, Scores(q, rows, hd, scale));
        row += 1;
      }
    }
  }
  for (int64_t row = 0; row < nrows; ++row) Softmax(s->scores.data() + row * padded, it.ctx_of(row));
  const RowSource latents{it.layout, it.cache, it.table(), it.layer, 0, 0, r, ctx_max};
  for (int64_t k0 = 0; k0 < ctx_max; k0 += kExactValueKeys) {
    const int64_t n = std::min(kExactValueKeys, ctx_max - k0);
    CopyRows(latents, k0, n, s, rows);
    auto keys_of = [&](int64_t row) { return std::min(n, it.ctx_of(row) - k0); };
    for (int64_t row = 0, end; row < nrows; row = end) {  // runs of rows taking the same keys
      const int64_t nk = keys_of(row);
      for (end = row + 1; end < nrows && keys_of(end) == nk;) ++end;
      if (nk > 0) {
        AddWeightedRows(s->scores.data() + row * padded + k0, padded, end - row, nk, rows, 0, r,
                        s->acc.data() + row * r, r);
      }
    }
  }
}

}  // namespace

void AttendLatent(const LatentItem& it, const float* q_latent, const float* q_rope, float scale, float* out,
                  ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, dr = hd - r, nrows = it.nrows();
  const int64_t padded = RoundUp(it.ctx_of(nrows - 1), kExactKeys);
  s->scores.resize(static_cast<size_t>(nrows * padded));
  s->acc.assign(static_cast<size_t>(nrows * r), 0.0f);
  s->q.resize(static_cast<size_t>(nrows * hd));
  s->zeros.assign(static_cast<size_t>(hd), 0.0f);
  s->rows16.resize(static_cast<size_t>(kExactValueKeys * hd));
  for (int64_t row = 0; row < nrows; ++row) {
    std::memcpy(s->q.data() + row * hd, q_latent + it.pair(row) * r, static_cast<size_t>(r) * sizeof(float));
    std::memcpy(s->q.data() + row * hd + r, q_rope + it.pair(row) * dr, static_cast<size_t>(dr) * sizeof(float));
  }
  if (it.layout->dtype == DType::kF32) {
    LatentPasses<float>(it, scale, padded, s);
  } else {
    LatentPasses<uint16_t>(it, scale, padded, s);
  }
  for (int64_t row = 0; row < nrows; ++row) {
    std::memcpy(out + it.pair(row) * r, s->acc.data() + row * r, static_cast<size_t>(r) * sizeof(float));
  }
}

}  // namespace moeserve::cpu_fast
