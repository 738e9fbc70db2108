// One work item of latent attention (attention_latent.h).
#include "kernels/cpu/attention_latent.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_chunks.h"
#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {

void LatentQueries(const LatentItem& it, const float* q_latent, const float* q_rope, std::vector<float>* q) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, dr = hd - r, nrows = it.nrows();
  q->resize(static_cast<size_t>(nrows * hd));
  for (int64_t row = 0; row < nrows; ++row) {
    std::memcpy(q->data() + row * hd, q_latent + it.pair(row) * r, static_cast<size_t>(r) * sizeof(float));
    std::memcpy(q->data() + row * hd + r, q_rope + it.pair(row) * dr, static_cast<size_t>(dr) * sizeof(float));
  }
}

void WriteLatentRows(const LatentItem& it, const float* part, float* out) {
  const int64_t r = it.latent_dim;
  for (int64_t row = 0; row < it.nrows(); ++row) {
    std::memcpy(out + it.pair(row) * r, part + row * r, static_cast<size_t>(r) * sizeof(float));
  }
}

namespace {

// The rows (bf16) of keys [j0, j0 + n) of the item's sequence; `zeros` at or past ctx.
void LatentRows(const LatentItem& it, int64_t j0, int64_t n, int64_t ctx, const uint16_t* zeros, const uint16_t** rows) {
  BlockRows(*it.layout, it.cache, it.table(), it.layer, 0, 0, j0, n, ctx, zeros, rows);
}

// Keys [kb, ke) of the item (one chunk of its context, attention_chunks.h) into `part`
// (ChunkPartFloats(nrows, latent_dim)): the scores (row by row at s->scores, `padded` apart), each
// row's softmax over its keys in the chunk, then the weighted sums of the latents.
template <typename T>
void LatentChunk(const LatentItem& it, int64_t kb, int64_t ke, float scale, ExactScratch* s, float* part) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), padded = RoundUp(ke - kb, kExactKeys);
  s->scores.resize(static_cast<size_t>(nrows * padded));
  const T* rows[kExactValueKeys];
  auto ctx_of = [&](int64_t row) { return it.ctx_of(row); };
  // The rows past ke that a RowSource reads are only fetched ahead (the next chunk's first keys):
  // 8-key blocks and 32-key value passes never cross a chunk's end.
  const int64_t ctx_max = it.ctx_of(nrows - 1);
  const RowSource keys{it.layout, it.cache, it.table(), it.layer, 0, 0, hd, ctx_max};
  for (int64_t k0 = kb; k0 < ke; k0 += kExactKeys) {
    CopyRows(keys, k0, kExactKeys, s, rows);
    ScoreRowPairs(
        nrows, k0, rows, 0, hd, scale, [&](int64_t row) { return s->q.data() + row * hd; }, ctx_of,
        [&](int64_t row) { return s->scores.data() + row * padded + (k0 - kb); });
  }
  float* max = part + nrows * r;
  float* sum = max + nrows;
  for (int64_t row = 0; row < nrows; ++row) {
    const int64_t n = std::clamp(it.ctx_of(row), kb, ke) - kb;
    const SoftmaxStats st = n > 0 ? Softmax(s->scores.data() + row * padded, n) : SoftmaxStats{-INFINITY, 0.0f};
    max[row] = st.max;
    sum[row] = st.sum;
  }
  std::fill(part, part + nrows * r, 0.0f);
  const RowSource latents{it.layout, it.cache, it.table(), it.layer, 0, 0, r, ctx_max};
  for (int64_t k0 = kb; k0 < ke; k0 += kExactValueKeys) {
    const int64_t n = std::min(kExactValueKeys, ke - k0);
    CopyRows(latents, k0, n, s, rows);
    WeighRowRuns(nrows, k0, n, ctx_of, s->scores.data() + (k0 - kb), padded, rows, 0, r, part, r);
  }
}

}  // namespace

void AttendLatent(const LatentItem& it, const float* q_latent, const float* q_rope, float scale, float* out,
                  ExactScratch* s) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), ctx_max = it.ctx_of(nrows - 1);
  s->zeros.assign(static_cast<size_t>(hd), 0.0f);
  s->zeros16.assign(static_cast<size_t>(hd), 0);
  s->rows16.resize(static_cast<size_t>(kExactValueKeys * hd));
  LatentQueries(it, q_latent, q_rope, &s->q);
  AttendFolded(ChunksOf(ctx_max), nrows, r, &s->parts, [&](int64_t c, float* part) {
    const int64_t kb = c * kAttentionChunkKeys, ke = std::min(ctx_max, kb + kAttentionChunkKeys);
    if (it.layout->dtype == DType::kF32) return LatentChunk<float>(it, kb, ke, scale, s, part);
    LatentChunk<uint16_t>(it, kb, ke, scale, s, part);
  });
  WriteLatentRows(it, s->parts.data(), out);
}

bool Bf16LatentShape(int64_t hd, int64_t latent_dim) {
  const bool block = latent_dim == 32 || latent_dim == 64 || latent_dim % 128 == 0;
  return hd % 32 == 0 && latent_dim > 0 && latent_dim < hd && block;
}

namespace {

// Keys [kb, ke) of the item (one chunk of its context, attention_chunks.h) into `part`
// (ChunkPartFloats(nrows, latent_dim): the rows' weighted sums, then their maxima and sums): the
// scores 32 keys a call, each row's softmax over its keys in the chunk, the weighted sum of the
// latents 64 keys a call in blocks of `width` values. The chunk's rows stay in L2 between the
// two passes (a context taken whole read them from DRAM twice).
void LatentChunkBf16(const LatentItem& it, int64_t kb, int64_t ke, float scale, int64_t width, LatentBf16Scratch* s,
                     float* part) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), padded = RoundUp(ke - kb, 32);
  s->scores.resize(static_cast<size_t>(nrows * padded));
  s->pb.resize(static_cast<size_t>(nrows * padded / 2));
  const uint16_t* rows[kBf16MaxValueKeys];
  const uint16_t* ahead[2 * kBf16KeyBlock];  // the rows 32 keys on (the next chunk's too), fetched meanwhile
  for (int64_t k0 = kb; k0 < ke;) {  // 32 keys a call, 16 for a last odd block
    const int blocks = ke - k0 > kBf16KeyBlock ? 2 : 1;
    LatentRows(it, k0, blocks * kBf16KeyBlock, ke, s->zeros.data(), rows);
    LatentRows(it, k0 + 32, blocks * kBf16KeyBlock, it.ctx_of(nrows - 1), s->zeros.data(), ahead);
    ScoreLatentKeysBf16(s->qb.data(), nrows, hd, rows, blocks * kBf16KeyBlock, scale, s->scores.data() + (k0 - kb),
                        padded, ahead);
    k0 += blocks * kBf16KeyBlock;
  }
  float* max = part + nrows * r;
  float* sum = max + nrows;
  for (int64_t row = 0; row < nrows; ++row) {  // the scores are scaled already
    const int64_t n = std::clamp(it.ctx_of(row), kb, ke) - kb;
    if (n == 0) {  // the row's context ends before this chunk
      max[row] = -INFINITY;
      sum[row] = 0.0f;
      continue;
    }
    const SoftmaxStats st = SoftmaxBf16(s->scores.data() + row * padded, n, 1.0f, RoundUp(n, 32),
                                        reinterpret_cast<uint16_t*>(s->pb.data() + row * padded / 2));
    max[row] = st.max;
    sum[row] = st.sum;
  }
  s->acc.assign(static_cast<size_t>(nrows * r), 0.0f);  // block b's rows at b * nrows * width
  s->keys.resize(static_cast<size_t>(nrows));
  const uint16_t* block_rows[kBf16MaxValueKeys];
  for (int64_t k0 = kb; k0 < ke; k0 += kBf16MaxValueKeys) {
    const int64_t n = std::min(kBf16MaxValueKeys, (ke - k0 + 1) / 2 * 2);
    for (int64_t row = 0; row < nrows; ++row) s->keys[row] = std::clamp<int64_t>(it.ctx_of(row) - k0, 0, n);
    LatentRows(it, k0, n, ke, s->zeros.data(), rows);
    for (int64_t b = 0; b < r / width; ++b) {
      for (int64_t j = 0; j < n; ++j) block_rows[j] = rows[j] == s->zeros.data() ? rows[j] : rows[j] + b * width;
      AddWeightedPairsBf16(s->pb.data() + (k0 - kb) / 2, padded / 2, nrows, 1, s->keys.data(), n, block_rows, width,
                           s->acc.data() + b * nrows * width);
    }
  }
  for (int64_t row = 0; row < nrows; ++row) {
    for (int64_t b = 0; b < r / width; ++b) {
      std::memcpy(part + row * r + b * width, s->acc.data() + (b * nrows + row) * width,
                  static_cast<size_t>(width) * sizeof(float));
    }
  }
}

}  // namespace

void AttendLatentBf16(const LatentItem& it, const float* q_latent, const float* q_rope, float scale, float* out,
                      LatentBf16Scratch* s) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), ctx_max = it.ctx_of(nrows - 1);
  // A weighted-sum block's values: 128 (not 256) leaves registers for three rows a latent load
  // (deepseek-mini: attention 1.1-1.15x); the same operations per output either way.
  const int64_t width = std::min<int64_t>(r, 128);
  LatentQueries(it, q_latent, q_rope, &s->q);
  s->qb.resize(static_cast<size_t>(nrows * hd));
  RoundRowsToBf16(s->q.data(), nrows, hd, s->qb.data());
  s->zeros.assign(static_cast<size_t>(hd), 0);
  AttendFolded(ChunksOf(ctx_max), nrows, r, &s->parts, [&](int64_t c, float* part) {
    const int64_t kb = c * kAttentionChunkKeys;
    LatentChunkBf16(it, kb, std::min(ctx_max, kb + kAttentionChunkKeys), scale, width, s, part);
  });
  WriteLatentRows(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
