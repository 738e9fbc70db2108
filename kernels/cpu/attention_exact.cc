// The exact kernel of paged attention (attention_exact.h).
#include "kernels/cpu/attention_exact.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_chunks.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {

void GatherKeys(const KvLayout& layout, const void* cache, const int32_t* table, int64_t layer, int kv, int64_t g,
                int64_t heads, int64_t k0, int64_t n, int64_t ctx, float* scratch, const float* zeros,
                const float** rows) {
  const int64_t hd = layout.head_dim, bs = layout.block_size, width = heads * hd;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t j = k0 + k;
    if (j >= ctx) {
      rows[k] = zeros;
      continue;
    }
    const int64_t off = layout.Offset(table[j / bs], layer, kv, j % bs) + g * hd;
    if (layout.dtype == DType::kF32) {
      rows[k] = static_cast<const float*>(cache) + off;
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(cache) + off;
      float* row = scratch + k * width;
#pragma GCC unroll 4
      for (int64_t c = 0; c < width; c += 8) Store(row + c, Load(src + c));
      rows[k] = row;
    }
  }
}

V8 Scores(const float* q, const float* const keys[kExactKeys], int64_t hd, float scale) {
  V8 p[kExactKeys] = {Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero()};
  for (int64_t c = 0; c < hd; c += 8) {
    const V8 qc = Load(q + c);
    for (int64_t k = 0; k < kExactKeys; ++k) p[k] = Fma(qc, Load(keys[k] + c), p[k]);
  }
  return Mul(Reduce8x8(p), Set1(scale));
}

namespace {

// out[0 .. 8N) += sum over the first nk keys of probs[k] * values[k][c0 .. c0 + 8N), keys in order.
template <int N>
void AddWeighted(const float* probs, int64_t nk, const float* const* values, int64_t c0,
                 float* out) {
  V8 a[N];
  for (int c = 0; c < N; ++c) a[c] = Load(out + 8 * c);
  for (int64_t k = 0; k < nk; ++k) {
    const V8 pk = Set1(probs[k]);
    for (int c = 0; c < N; ++c) a[c] = Fma(pk, Load(values[k] + c0 + 8 * c), a[c]);
  }
  for (int c = 0; c < N; ++c) Store(out + 8 * c, a[c]);
}

}  // namespace

void AddWeightedRow(const float* probs, int64_t nk, const float* const* values, int64_t hd,
                    float* out) {
  for (int64_t c = 0; c < hd;) {  // blocks of up to 8 chunks: the accumulators stay in registers
    const int64_t left = (hd - c) / 8;
    if (left >= 8) {
      AddWeighted<8>(probs, nk, values, c, out + c);
      c += 64;
    } else if (left >= 4) {
      AddWeighted<4>(probs, nk, values, c, out + c);
      c += 32;
    } else if (left >= 2) {
      AddWeighted<2>(probs, nk, values, c, out + c);
      c += 16;
    } else {
      AddWeighted<1>(probs, nk, values, c, out + c);
      c += 8;
    }
  }
}

ExactSoftmaxStats Softmax(float* sc, int64_t ctx) {
  const int64_t padded = RoundUp(ctx, kExactKeys);
  for (int64_t j = ctx; j < padded; ++j) sc[j] = -INFINITY;
  V8 m = Set1(-INFINITY);
  for (int64_t j = 0; j < padded; j += kExactKeys) m = Max(m, Load(sc + j));
  float lanes[8];
  Store(lanes, m);
  const float mx = *std::max_element(lanes, lanes + 8);
  V8 sum = Zero();
  const V8 neg = Set1(-mx);
  for (int64_t j = 0; j < padded; j += kExactKeys) {
    V8 e = Exp(Add(Load(sc + j), neg));
    if (j + kExactKeys > ctx) {  // the partial last group: its padding lanes are zero, not e^-inf
      float t[8];
      Store(t, e);
      for (int64_t l = ctx - j; l < kExactKeys; ++l) t[l] = 0.0f;
      e = Load(t);
    }
    sum = Add(sum, e);
    Store(sc + j, e);
  }
  const float total = Reduce(sum);
  const V8 inv = Set1(1.0f / total);
  for (int64_t j = 0; j < padded; j += kExactKeys) Store(sc + j, Mul(Load(sc + j), inv));
  return {mx, total};
}

void AttendExactChunk(const ItemRows& it, const float* q, float scale, float* part, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows, g0 = it.g0;
  const int64_t kb = it.k_begin, ctx_max = it.ctx_max, padded = RoundUp(ctx_max - kb, kExactKeys);
  const int32_t* table = it.table();
  s->scratch.resize(static_cast<size_t>(kExactValueKeys * it.heads * hd));
  s->zeros.assign(static_cast<size_t>(it.heads * hd), 0.0f);
  s->scores.resize(static_cast<size_t>(all * padded));
  float* max = part + all * hd;
  float* sum = max + all;
  std::fill(part, part + all * hd, 0.0f);
  auto row_of = [&](int64_t g, int64_t r) { return (g - g0) * nrows + r; };
  auto scores_of = [&](int64_t g, int64_t r) { return s->scores.data() + row_of(g, r) * padded; };
  auto head_rows = [&](int64_t g, int64_t n) {  // head g's part of the gathered rows
    for (int64_t k = 0; k < n; ++k) s->head_rows[k] = s->rows[k] + (g - g0) * hd;
    return s->head_rows;
  };
  for (int64_t k0 = kb; k0 < ctx_max; k0 += kExactKeys) {
    GatherKeys(*it.layout, it.cache, table, it.layer, 0, g0, it.heads, k0, kExactKeys, ctx_max, s->scratch.data(),
               s->zeros.data(), s->rows);
    for (int64_t g = g0; g < g0 + it.heads; ++g) {
      const float* const* keys = head_rows(g, kExactKeys);
      for (int64_t r = 0; r < nrows; ++r) {
        if (k0 < it.ctx_of(r)) Store(scores_of(g, r) + (k0 - kb), Scores(q + it.head_of(g, r) * hd, keys, hd, scale));
      }
    }
  }
  for (int64_t g = g0; g < g0 + it.heads; ++g) {
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t n = it.keys_of(r);
      const ExactSoftmaxStats st = n > 0 ? Softmax(scores_of(g, r), n) : ExactSoftmaxStats{-INFINITY, 0.0f};
      max[row_of(g, r)] = st.max;
      sum[row_of(g, r)] = st.sum;
    }
  }
  for (int64_t k0 = kb; k0 < ctx_max; k0 += kExactValueKeys) {
    const int64_t n = std::min(kExactValueKeys, ctx_max - k0);
    GatherKeys(*it.layout, it.cache, table, it.layer, 1, g0, it.heads, k0, n, ctx_max, s->scratch.data(),
               s->zeros.data(), s->rows);
    for (int64_t g = g0; g < g0 + it.heads; ++g) {
      const float* const* values = head_rows(g, n);
      for (int64_t r = 0; r < nrows; ++r) {
        const int64_t nk = std::min(n, it.ctx_of(r) - k0);
        if (nk > 0) AddWeightedRow(scores_of(g, r) + (k0 - kb), nk, values, hd, part + row_of(g, r) * hd);
      }
    }
  }
}

void AttendExact(const ItemRows& it, const float* q, float scale, float* out, ExactScratch* s) {
  const int64_t stride = ChunkPartFloats(it.heads * it.nrows(), it.layout->head_dim), chunks = ChunksOf(it.ctx_max);
  s->parts.resize(static_cast<size_t>(chunks * stride));
  for (int64_t c = 0; c < chunks; ++c) AttendExactChunk(ChunkOf(it, c), q, scale, s->parts.data() + c * stride, s);
  FinishChunks(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
