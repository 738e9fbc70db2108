// The exact kernel of paged attention on the CPU fast path (fp32 products over an fp32 or bf16
// cache, vec8.h's 8 lanes), and the pieces the latent (MLA) kernel shares with it. attention.cc
// plans the work items; a context past 512 keys is taken in chunks as the bf16 kernel's
// (attention_chunks.h), so a long context spreads over the threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/vec8.h"

namespace moeserve::cpu_fast {

inline constexpr int64_t kExactKeys = 8;  // keys per group, one per lane of a score vector
// Keys per pass of the weighted sum over V: its accumulators stay in registers over this many
// (a whole head of 64 dimensions is 8 of them), loaded and stored once per pass.
inline constexpr int64_t kExactValueKeys = 32;

// scores[k] = dot(q, keys[k] + off) * scale for the 8 keys (fp32 rows, or bf16 rows widened in
// registers, exactly), as one vector: each an 8-lane FMA chain over the head dimension summed by
// one tree (Reduce8x8). Inlined into its loops over rows: as a call, its setup and return were a
// third of its time in a prefill chunk (head_dim 64).
template <typename T>
[[gnu::always_inline]] inline V8 Scores(const float* q, const T* const keys[kExactKeys], int64_t hd, float scale,
                                        int64_t off = 0) {
  V8 p[kExactKeys] = {Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero(), Zero()};
  for (int64_t c = 0; c < hd; c += 8) {
    const V8 qc = Load(q + c);
    for (int64_t k = 0; k < kExactKeys; ++k) p[k] = Fma(qc, Load(keys[k] + off + c), p[k]);
  }
  return Mul(Reduce8x8(p), Set1(scale));
}

// Scores for two rows at once, each the same operations as Scores': every key load serves both
// (a decode token's query heads share their kv head's keys), four keys at a time so that the
// accumulators fit AVX2's 16 registers, each four summed by Reduce8x8's tree.
template <typename T>
[[gnu::always_inline]] inline void Scores2(const float* q0, const float* q1, const T* const keys[kExactKeys],
                                           int64_t off, int64_t hd, float scale, float* out0, float* out1) {
  for (int64_t half = 0; half < kExactKeys; half += 4) {
    V8 a0[4] = {Zero(), Zero(), Zero(), Zero()}, a1[4] = {Zero(), Zero(), Zero(), Zero()};
    for (int64_t c = 0; c < hd; c += 8) {
      const V8 x0 = Load(q0 + c), x1 = Load(q1 + c);
      for (int64_t k = 0; k < 4; ++k) {
        V8 key = Load(keys[half + k] + off + c);
        Pin(key);  // one load for both rows: the compiler would fold it into each FMA
        a0[k] = Fma(x0, key, a0[k]);
        a1[k] = Fma(x1, key, a1[k]);
      }
    }
    StoreReduce4x8(out0 + half, a0, scale);
    StoreReduce4x8(out1 + half, a1, scale);
  }
}

// Softmax in place over sc[0, ctx), leaving zeros up to the next multiple of 8; returns the
// largest score and the sum of the exponentials (the exponentials vec8.h's Exp, summed lane-wise
// over keys in order, then by Reduce's tree).
SoftmaxStats Softmax(float* sc, int64_t ctx);

struct ExactScratch {
  std::vector<float> scores, zeros, parts, q;
  std::vector<uint16_t> zeros16;  // a bf16 cache's keys past the context
  std::vector<uint16_t> rows16;  // a bf16 cache's rows of a pass, copied whole
};

// Where a pass reads one sequence's rows: plane `kv` (K 0, V 1; latent rows have one) of
// `layer`, elements [col0, col0 + width) of each token's row, keys up to `ctx`.
struct RowSource {
  const KvLayout* layout;
  const void* cache;
  const int32_t* table;  // the sequence's block table
  int64_t layer;
  int kv;
  int64_t col0, width, ctx;
};

// The scores of keys [k0, k0 + 8) for the rows r < nrows that take them (k0 < ctx_of(r); rows
// ascend in context, so the next row takes them too), two rows a key load: row r's query at q(r)
// (hd values), its 8 scaled scores to sc(r), its keys' values at keys[k] + off.
template <typename T, typename QueryOf, typename CtxOf, typename ScoresAt>
void ScoreRowPairs(int64_t nrows, int64_t k0, const T* const keys[kExactKeys], int64_t off, int64_t hd, float scale,
                   const QueryOf& q, const CtxOf& ctx_of, const ScoresAt& sc) {
  for (int64_t r = 0; r < nrows;) {
    if (k0 >= ctx_of(r)) {
      ++r;
    } else if (r + 1 < nrows) {
      Scores2(q(r), q(r + 1), keys, off, hd, scale, sc(r), sc(r + 1));
      r += 2;
    } else {
      Store(sc(r), Scores(q(r), keys, hd, scale, off));
      r += 1;
    }
  }
}

// The weighted sums of the n values from key k0 for the rows r < nrows, each taking min(n,
// ctx_of(r) - k0) of them: runs of rows taking the same keys (a token's query heads) share each
// value load (AddWeightedRows; row r's probabilities at probs + r * p_stride, its sums at out + r *
// out_stride, its values at values[k] + off).
template <typename T, typename CtxOf>
void WeighRowRuns(int64_t nrows, int64_t k0, int64_t n, const CtxOf& ctx_of, const float* probs, int64_t p_stride,
                  const T* const* values, int64_t off, int64_t width, float* out, int64_t out_stride);

// The rows of keys [k0, k0 + n) at rows[k] (T: float for an fp32 cache, uint16_t for bf16): an
// fp32 cache's in place; a bf16 cache's copied, each key's row whole and in address order, into
// s->rows16 (n * width elements; the passes then read a few columns of many keys at a time,
// which from DRAM ran at 0.6-0.8 of the speed; widening them there as well cost a fifth of the
// kernel's time). Each key's row kExactFetchKeys keys on is fetched meanwhile: the copy
// otherwise waits for DRAM with nothing to overlap (from DRAM 1.3-1.5x, in cache 0.92-0.95x).
// Keys at or past ctx read s->zeros / s->zeros16 (width of them).
inline constexpr int64_t kExactFetchKeys = 32;
template <typename T>
void CopyRows(const RowSource& src, int64_t k0, int64_t n, ExactScratch* s, const T** rows);

// out[r * out_stride + c] += sum over keys k < nk of probs[r * p_stride + k] * values[k][off + c]
// for rows r < rows and columns c < width: each element a chain of FMAs over the keys in order;
// a key's values loaded once for up to four rows (copied bf16 rows; fp32 rows in place are read
// one row at a time, each key's values whole).
template <typename T>
void AddWeightedRows(const float* probs, int64_t p_stride, int64_t rows, int64_t nk, const T* const* values,
                     int64_t off, int64_t width, float* out, int64_t out_stride);

template <typename T, typename CtxOf>
void WeighRowRuns(int64_t nrows, int64_t k0, int64_t n, const CtxOf& ctx_of, const float* probs, int64_t p_stride,
                  const T* const* values, int64_t off, int64_t width, float* out, int64_t out_stride) {
  auto keys = [&](int64_t r) { return std::min(n, ctx_of(r) - k0); };
  for (int64_t r = 0, end; r < nrows; r = end) {
    const int64_t nk = keys(r);
    for (end = r + 1; end < nrows && keys(end) == nk;) ++end;
    if (nk > 0) {
      AddWeightedRows(probs + r * p_stride, p_stride, end - r, nk, values, off, width, out + r * out_stride, out_stride);
    }
  }
}

// Keys [it.k_begin, it.ctx_max) of an item into `part` (attention_chunks.h's ChunkPartFloats
// layout): scores 8 keys at a time for every row of each kv head (two rows a key load), the
// softmax, then the weighted sum over 32 keys at a time (up to four rows a value load over a bf16
// cache); each row
// stops at its own context. An fp32 cache is read in place, a bf16 one's rows copied whole first.
void AttendExactChunk(const ItemRows& it, const float* q, float scale, float* part, ExactScratch* s);

// A whole item (it.k_begin 0): each chunk of its context in turn, folded in as it comes (AttendFolded).
void AttendExact(const ItemRows& it, const float* q, float scale, float* out, ExactScratch* s);

}  // namespace moeserve::cpu_fast
