// One work item of paged attention on the CPU fast path (attention.cc plans them; the
// exact, bf16-dot and AMX drivers compute them): which rows it holds and where their keys are.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/backend.h"

namespace moeserve::cpu_fast {

// Fetches the cache line at p into L1, changing no result. Inline assembly, not
// __builtin_prefetch: GCC 12 at -O3 deleted a function's prefetches in its tree DCE pass.
inline void PrefetchLine(const void* p) { __asm__ volatile("prefetcht0 %0" ::"m"(*static_cast<const char*>(p))); }

// A row's softmax: its largest score and the sum of the exponentials it divided by, which a
// context in chunks needs to weigh each chunk's result (attention_chunks.h).
struct SoftmaxStats {
  float max, sum;
};

// rows[i] = the bf16 row of key j0 + i of a sequence (block table `table`), plane `plane` of
// `layer`, from element `offset` of the token's row on; `zeros` at or past ctx. Each block's
// address is computed once (a decode step spent an eighth of its attention time on that
// arithmetic per key).
inline void BlockRows(const KvLayout& l, const void* cache, const int32_t* table, int64_t layer, int plane,
                      int64_t offset, int64_t j0, int64_t n, int64_t ctx, const uint16_t* zeros, const uint16_t** rows) {
  const int64_t bs = l.block_size, token = l.TokenElems();
  for (int64_t i = 0; i < n;) {
    const int64_t j = j0 + i;
    if (j >= ctx) {
      rows[i++] = zeros;
      continue;
    }
    const uint16_t* row = static_cast<const uint16_t*>(cache) + l.Offset(table[j / bs], layer, plane, j % bs) + offset;
    for (const int64_t end = std::min({n, i + bs - j % bs, ctx - j0}); i < end; ++i, row += token) rows[i] = row;
  }
}

// One work item's rows: tokens [t0, t0 + nt) of one sequence, kv heads [g0, g0 + heads); per
// kv head, rows are (token, query head) pairs, token-major. Its keys are [k_begin, ctx_max): all
// of the tile's context, or one chunk of it (attention_chunks.h).
struct ItemRows {
  const AttentionBatch* batch;
  const KvLayout* layout;
  const void* cache;
  int64_t layer, t0, nt, g0, heads, group, q_heads, ctx_max;
  int64_t k_begin = 0;
  int64_t nrows() const { return nt * group; }
  int64_t ctx_of(int64_t r) const { return static_cast<int64_t>(batch->token_pos[t0 + r / group]) + 1; }
  // Row r's keys in [k_begin, ctx_max): none for a row whose context ends before the chunk.
  int64_t keys_of(int64_t r) const { return std::clamp(ctx_of(r), k_begin, ctx_max) - k_begin; }
  int64_t head_of(int64_t g, int64_t r) const { return (t0 + r / group) * q_heads + g * group + r % group; }
  const int32_t* table() const { return batch->block_tables + batch->token_seq[t0] * batch->max_blocks_per_seq; }
  // The bf16 row of key j (K: kv 0, V: 1) of kv head g; `zeros` at or past ctx_max.
  const uint16_t* Row(int kv, int64_t g, int64_t j, const uint16_t* zeros) const {
    if (j >= ctx_max) return zeros;
    const int64_t bs = layout->block_size;
    return static_cast<const uint16_t*>(cache) + layout->Offset(table()[j / bs], layer, kv, j % bs) +
           g * layout->head_dim;
  }
  // rows[i] = Row(kv, g, j0 + i, zeros) for i < n (BlockRows).
  void Rows(int kv, int64_t g, int64_t j0, int64_t n, const uint16_t* zeros, const uint16_t** rows) const {
    BlockRows(*layout, cache, table(), layer, kv, g * layout->head_dim, j0, n, ctx_max, zeros, rows);
  }
};

}  // namespace moeserve::cpu_fast
