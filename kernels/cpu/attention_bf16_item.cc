// One work item of the bf16 variants' paged attention, in chunks of its context
// (attention_bf16_item.h); the inner loops are attention_bf16.cc's.
#include "kernels/cpu/attention_bf16_item.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_chunks.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {

void GatherBf16Queries(const ItemRows& it, const float* q, std::vector<float>* gathered, std::vector<uint16_t>* qb) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows;
  gathered->resize(static_cast<size_t>(all * hd));
  qb->resize(static_cast<size_t>(all * hd));
  for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
    for (int64_t r = 0; r < nrows; ++r) {
      std::memcpy(gathered->data() + ((g - it.g0) * nrows + r) * hd, q + it.head_of(g, r) * hd,
                  static_cast<size_t>(hd) * sizeof(float));
    }
  }
  RoundRowsToBf16(gathered->data(), all, hd, qb->data());
}

void PrepareBf16Queries(const ItemRows& it, const float* q, Bf16Scratch* s) { GatherBf16Queries(it, q, &s->q, &s->qb); }

void AttendChunkBf16(const ItemRows& it, float scale, Bf16Scratch* s, float* part) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows, kb = it.k_begin;
  const int64_t padded = RoundUp(it.ctx_max - kb, 32);  // bf16 probabilities in pairs, 32 per rounding
  s->zeros.assign(static_cast<size_t>(it.heads * hd), 0);  // a key past the context: every head
  s->scores.resize(static_cast<size_t>(all * padded));
  s->pb.resize(static_cast<size_t>(all * padded / 2));
  float* acc = part;
  float* max = part + all * hd;
  float* sum = max + all;
  std::fill(acc, acc + all * hd, 0.0f);
  const uint16_t* rows[kBf16MaxValueKeys];
  for (int64_t k0 = kb; k0 < it.ctx_max;) {  // 32 keys a call, 16 for a last odd block
    const int blocks = it.ctx_max - k0 > kBf16KeyBlock ? 2 : 1;
    it.Rows(0, it.g0, k0, blocks * kBf16KeyBlock, s->zeros.data(), rows);
    ScoreKeysBf16(s->qb.data(), nrows, hd, it.heads, rows, blocks, scale, s->scores.data() + (k0 - kb), padded);
    k0 += blocks * kBf16KeyBlock;
  }
  for (int64_t row = 0; row < all; ++row) {
    const int64_t n = it.keys_of(row % nrows);
    if (n == 0) {  // the row's context ends before this chunk
      max[row] = -INFINITY;
      sum[row] = 0.0f;
      continue;
    }
    // The scores are scaled already; probabilities to bf16 for every key, 0 past the row's own.
    uint16_t* pb = reinterpret_cast<uint16_t*>(s->pb.data() + row * padded / 2);  // written by vector stores
    const SoftmaxStats st = SoftmaxBf16(s->scores.data() + row * padded, n, 1.0f, RoundUp(n, 32), pb);
    max[row] = st.max;
    sum[row] = st.sum;
  }
  s->keys.resize(static_cast<size_t>(nrows));
  // A decode token's few rows take the kv heads side by side, each key's whole value row read at
  // once (from DRAM, one head at a time ran at 0.85-0.9x). A prefill tile's tokens read the
  // same values again from cache, so its rows take one head at a time: each pair of keys'
  // values, interleaved once, then serves a block of rows (medium's 2000-token prefill
  // attention 1.34x on the Zen 5; four heads a block of one row took a shuffle per vdpbf16ps).
  const bool one_head = it.nt > 1;
  const uint16_t* head_rows[kBf16MaxValueKeys];
  for (int64_t k0 = kb; k0 < it.ctx_max; k0 += kBf16MaxValueKeys) {
    const int64_t n = std::min(kBf16MaxValueKeys, (it.ctx_max - k0 + 1) / 2 * 2);
    for (int64_t r = 0; r < nrows; ++r) s->keys[r] = std::clamp<int64_t>(it.ctx_of(r) - k0, 0, n);
    it.Rows(1, it.g0, k0, n, s->zeros.data(), rows);
    const uint32_t* pairs = s->pb.data() + (k0 - kb) / 2;
    if (!one_head) {
      AddWeightedPairsBf16(pairs, padded / 2, nrows, it.heads, s->keys.data(), n, rows, hd, acc);
      continue;
    }
    for (int64_t h = 0; h < it.heads; ++h) {  // `zeros` covers every head
      for (int64_t j = 0; j < n; ++j) head_rows[j] = rows[j] + h * hd;
      AddWeightedPairsBf16(pairs + h * nrows * padded / 2, padded / 2, nrows, 1, s->keys.data(), n, head_rows, hd,
                           acc + h * nrows * hd);
    }
  }
}

void AttendBf16(const ItemRows& it, const float* q, float scale, float* out, Bf16Scratch* s) {
  PrepareBf16Queries(it, q, s);
  AttendFolded(ChunksOf(it.ctx_max), it.heads * it.nrows(), it.layout->head_dim, &s->parts,
               [&](int64_t c, float* part) { AttendChunkBf16(ChunkOf(it, c), scale, s, part); });
  WriteItemRows(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
