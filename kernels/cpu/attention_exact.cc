// The exact kernel of paged attention (attention_exact.h).
#include "kernels/cpu/attention_exact.h"

#include <algorithm>
#include <cmath>

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

SoftmaxStats Softmax(float* sc, int64_t ctx) {
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

namespace {

// Head g's part of the n rows GatherKeys gathered for all of the item's heads.
const float* const* HeadRows(const ItemRows& it, int64_t g, int64_t n, ExactScratch* s) {
  for (int64_t k = 0; k < n; ++k) s->head_rows[k] = s->rows[k] + (g - it.g0) * it.layout->head_dim;
  return s->head_rows;
}

// The scaled scores of keys [k_begin, ctx_max) for row (g - g0) * nrows + r at s->scores +
// row * padded, 8 keys at a time up to the row's context.
void ExactScorePass(const ItemRows& it, const float* q, float scale, int64_t padded, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  for (int64_t k0 = it.k_begin; k0 < it.ctx_max; k0 += kExactKeys) {
    GatherKeys(*it.layout, it.cache, it.table(), it.layer, 0, it.g0, it.heads, k0, kExactKeys, it.ctx_max,
               s->scratch.data(), s->zeros.data(), s->rows);
    for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
      const float* const* keys = HeadRows(it, g, kExactKeys, s);
      for (int64_t r = 0; r < nrows; ++r) {
        if (k0 >= it.ctx_of(r)) continue;
        float* sc = s->scores.data() + ((g - it.g0) * nrows + r) * padded + (k0 - it.k_begin);
        Store(sc, Scores(q + it.head_of(g, r) * hd, keys, hd, scale));
      }
    }
  }
}

// part[row * hd ...] += the rows' probabilities (s->scores) times the values, 32 keys a pass.
void ExactValuePass(const ItemRows& it, int64_t padded, ExactScratch* s, float* part) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  for (int64_t k0 = it.k_begin; k0 < it.ctx_max; k0 += kExactValueKeys) {
    const int64_t n = std::min(kExactValueKeys, it.ctx_max - k0);
    GatherKeys(*it.layout, it.cache, it.table(), it.layer, 1, it.g0, it.heads, k0, n, it.ctx_max, s->scratch.data(),
               s->zeros.data(), s->rows);
    for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
      const float* const* values = HeadRows(it, g, n, s);
      for (int64_t r = 0; r < nrows; ++r) {
        const int64_t nk = std::min(n, it.ctx_of(r) - k0), row = (g - it.g0) * nrows + r;
        if (nk > 0) AddWeightedRow(s->scores.data() + row * padded + (k0 - it.k_begin), nk, values, hd, part + row * hd);
      }
    }
  }
}

}  // namespace

void AttendExactChunk(const ItemRows& it, const float* q, float scale, float* part, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows;
  const int64_t padded = RoundUp(it.ctx_max - it.k_begin, kExactKeys);
  s->scratch.resize(static_cast<size_t>(kExactValueKeys * it.heads * hd));
  s->zeros.assign(static_cast<size_t>(it.heads * hd), 0.0f);
  s->scores.resize(static_cast<size_t>(all * padded));
  std::fill(part, part + all * hd, 0.0f);
  ExactScorePass(it, q, scale, padded, s);
  float* max = part + all * hd;
  float* sum = max + all;
  for (int64_t row = 0; row < all; ++row) {
    const int64_t n = it.keys_of(row % nrows);
    const SoftmaxStats st = n > 0 ? Softmax(s->scores.data() + row * padded, n) : SoftmaxStats{-INFINITY, 0.0f};
    max[row] = st.max;
    sum[row] = st.sum;
  }
  ExactValuePass(it, padded, s, part);
}

void AttendExact(const ItemRows& it, const float* q, float scale, float* out, ExactScratch* s) {
  const int64_t stride = ChunkPartFloats(it.heads * it.nrows(), it.layout->head_dim), chunks = ChunksOf(it.ctx_max);
  s->parts.resize(static_cast<size_t>(chunks * stride));
  for (int64_t c = 0; c < chunks; ++c) AttendExactChunk(ChunkOf(it, c), q, scale, s->parts.data() + c * stride, s);
  FinishChunks(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
