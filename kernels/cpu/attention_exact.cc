// The exact kernel of paged attention (attention_exact.h).
#include "kernels/cpu/attention_exact.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_chunks.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {

namespace {

// Rows r < R of out (out_stride apart) over 8N columns: out[r][c] += sum over keys k < nk of
// probs[r * p_stride + k] * values[k][col + c], each element a chain of FMAs over the keys in
// order; a key's values loaded once for all R rows.
template <int R, int N, typename T>
void WeightedBlock(const float* probs, int64_t p_stride, int64_t nk, const T* const* values, int64_t col, float* out,
                   int64_t out_stride) {
  V8 a[R][N];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < N; ++c) a[r][c] = Load(out + r * out_stride + 8 * c);
  }
  for (int64_t k = 0; k < nk; ++k) {
    V8 v[N];
    for (int c = 0; c < N; ++c) v[c] = Load(values[k] + col + 8 * c);
    for (int r = 0; r < R; ++r) {
      const V8 pk = Set1(probs[r * p_stride + k]);
      for (int c = 0; c < N; ++c) a[r][c] = Fma(pk, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < N; ++c) Store(out + r * out_stride + 8 * c, a[r][c]);
  }
}

// WeightedBlock over hd columns (of the rows from values[k] + off), 16 at a time (8 for an odd last).
template <int R, typename T>
void WeightedColumns(const float* probs, int64_t p_stride, int64_t nk, const T* const* values, int64_t off, int64_t hd,
                     float* out, int64_t out_stride) {
  int64_t c = 0;
  for (; c + 16 <= hd; c += 16) WeightedBlock<R, 2>(probs, p_stride, nk, values, off + c, out + c, out_stride);
  if (c < hd) WeightedBlock<R, 1>(probs, p_stride, nk, values, off + c, out + c, out_stride);
}

// One row, 64 columns at a time (eight accumulators), then 32, 16, 8: a key's values read whole.
template <typename T>
void WeightedRow(const float* probs, int64_t nk, const T* const* values, int64_t off, int64_t width, float* out) {
  int64_t c = 0;
  for (; c + 64 <= width; c += 64) WeightedBlock<1, 8>(probs, 0, nk, values, off + c, out + c, 0);
  if (c + 32 <= width) WeightedBlock<1, 4>(probs, 0, nk, values, off + c, out + c, 0), c += 32;
  if (c + 16 <= width) WeightedBlock<1, 2>(probs, 0, nk, values, off + c, out + c, 0), c += 16;
  if (c < width) WeightedBlock<1, 1>(probs, 0, nk, values, off + c, out + c, 0);
}

}  // namespace

// Rows copied into L1 (bf16): four at a time (eight accumulators), then two, then one. Rows read
// in place from an fp32 cache: one at a time, each key's values whole (16 columns of 32 keys at a
// time read a DRAM-resident cache at 0.6 of the speed).
template <typename T>
void AddWeightedRows(const float* probs, int64_t p_stride, int64_t rows, int64_t nk, const T* const* values, int64_t off,
                     int64_t width, float* out, int64_t out_stride) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t r = 0; r < rows; ++r) WeightedRow(probs + r * p_stride, nk, values, off, width, out + r * out_stride);
  } else {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      WeightedColumns<4>(probs + r * p_stride, p_stride, nk, values, off, width, out + r * out_stride, out_stride);
    }
    if (r + 2 <= rows) {
      WeightedColumns<2>(probs + r * p_stride, p_stride, nk, values, off, width, out + r * out_stride, out_stride);
      r += 2;
    }
    if (r < rows) {
      WeightedColumns<1>(probs + r * p_stride, p_stride, nk, values, off, width, out + r * out_stride, out_stride);
    }
  }
}
template void AddWeightedRows(const float*, int64_t, int64_t, int64_t, const float* const*, int64_t, int64_t, float*,
                              int64_t);
template void AddWeightedRows(const float*, int64_t, int64_t, int64_t, const uint16_t* const*, int64_t, int64_t, float*,
                              int64_t);

template <typename T>
void CopyRows(const RowSource& src, int64_t k0, int64_t n, ExactScratch* s, const T** rows) {
  const KvLayout& l = *src.layout;
  auto row_of = [&](int64_t j) {
    return static_cast<const T*>(src.cache) + l.Offset(src.table[j / l.block_size], src.layer, src.kv, j % l.block_size) +
           src.col0;
  };
  for (int64_t k = 0; k < n; ++k) {
    const int64_t j = k0 + k;
    if (j >= src.ctx) {
      if constexpr (std::is_same_v<T, float>) {
        rows[k] = s->zeros.data();
      } else {
        rows[k] = s->zeros16.data();
      }
      continue;
    }
    if (j + kExactFetchKeys < src.ctx) {  // every line of the row kExactFetchKeys keys on, while these compute
      const uintptr_t begin = reinterpret_cast<uintptr_t>(row_of(j + kExactFetchKeys));
      const uintptr_t end = begin + static_cast<uintptr_t>(src.width) * sizeof(T);
      for (uintptr_t line = begin & ~uintptr_t{63}; line < end; line += 64) PrefetchLine(reinterpret_cast<const void*>(line));
    }
    if constexpr (std::is_same_v<T, float>) {
      rows[k] = row_of(j);
    } else {
      uint16_t* row = s->rows16.data() + k * src.width;
      std::memcpy(row, row_of(j), static_cast<size_t>(src.width) * sizeof(uint16_t));
      rows[k] = row;
    }
  }
}
template void CopyRows(const RowSource&, int64_t, int64_t, ExactScratch*, const float**);
template void CopyRows(const RowSource&, int64_t, int64_t, ExactScratch*, const uint16_t**);

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

// The item's rows of keys [k0, k0 + n) of plane kv (its kv heads side by side): CopyRows.
template <typename T>
void Gather(const ItemRows& it, int kv, int64_t k0, int64_t n, ExactScratch* s, const T** rows) {
  const int64_t hd = it.layout->head_dim;
  CopyRows(RowSource{it.layout, it.cache, it.table(), it.layer, kv, it.g0 * hd, it.heads * hd, it.ctx_max}, k0, n, s,
           rows);
}

// The scaled scores of keys [k_begin, ctx_max) for row (g - g0) * nrows + r at s->scores +
// row * padded, 8 keys at a time up to the row's context, two rows of a kv head at once.
template <typename T>
void ExactScorePass(const ItemRows& it, const float* q, float scale, int64_t padded, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  const T* keys[kExactKeys];
  for (int64_t k0 = it.k_begin; k0 < it.ctx_max; k0 += kExactKeys) {
    Gather(it, 0, k0, kExactKeys, s, keys);
    for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
      float* head_scores = s->scores.data() + (g - it.g0) * nrows * padded + (k0 - it.k_begin);
      ScoreRowPairs(
          nrows, k0, keys, (g - it.g0) * hd, hd, scale, [&](int64_t r) { return q + it.head_of(g, r) * hd; },
          [&](int64_t r) { return it.ctx_of(r); }, [&](int64_t r) { return head_scores + r * padded; });
    }
  }
}

// part[row * hd ...] += the rows' probabilities (s->scores) times the values, 32 keys a pass;
// rows that take the same keys of a pass (a token's query heads) share each value load (bf16 cache).
template <typename T>
void ExactValuePass(const ItemRows& it, int64_t padded, ExactScratch* s, float* part) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  const T* values[kExactValueKeys];
  for (int64_t k0 = it.k_begin; k0 < it.ctx_max; k0 += kExactValueKeys) {
    const int64_t n = std::min(kExactValueKeys, it.ctx_max - k0);
    Gather(it, 1, k0, n, s, values);
    for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
      const int64_t first = (g - it.g0) * nrows;  // the head's first row
      WeighRowRuns(nrows, k0, n, [&](int64_t r) { return it.ctx_of(r); },
                   s->scores.data() + first * padded + (k0 - it.k_begin), padded, values, (g - it.g0) * hd, hd,
                   part + first * hd, hd);
    }
  }
}

template <typename T>
void ExactPasses(const ItemRows& it, const float* q, float scale, int64_t padded, ExactScratch* s, float* part) {
  ExactScorePass<T>(it, q, scale, padded, s);
  const int64_t nrows = it.nrows(), all = it.heads * nrows, hd = it.layout->head_dim;
  float* max = part + all * hd;
  float* sum = max + all;
  for (int64_t row = 0; row < all; ++row) {
    const int64_t n = it.keys_of(row % nrows);
    const SoftmaxStats st = n > 0 ? Softmax(s->scores.data() + row * padded, n) : SoftmaxStats{-INFINITY, 0.0f};
    max[row] = st.max;
    sum[row] = st.sum;
  }
  ExactValuePass<T>(it, padded, s, part);
}

}  // namespace

void AttendExactChunk(const ItemRows& it, const float* q, float scale, float* part, ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, all = it.heads * it.nrows();
  const int64_t padded = RoundUp(it.ctx_max - it.k_begin, kExactKeys);
  s->zeros.assign(static_cast<size_t>(it.heads * hd), 0.0f);
  s->zeros16.assign(static_cast<size_t>(it.heads * hd), 0);
  s->rows16.resize(static_cast<size_t>(kExactValueKeys * it.heads * hd));
  s->scores.resize(static_cast<size_t>(all * padded));
  std::fill(part, part + all * hd, 0.0f);
  if (it.layout->dtype == DType::kF32) {
    ExactPasses<float>(it, q, scale, padded, s, part);
  } else {
    ExactPasses<uint16_t>(it, q, scale, padded, s, part);
  }
}

void AttendExact(const ItemRows& it, const float* q, float scale, float* out, ExactScratch* s) {
  AttendFolded(ChunksOf(it.ctx_max), it.heads * it.nrows(), it.layout->head_dim, &s->parts,
               [&](int64_t c, float* part) { AttendExactChunk(ChunkOf(it, c), q, scale, part, s); });
  WriteItemRows(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
