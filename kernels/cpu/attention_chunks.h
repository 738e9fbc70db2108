// Attention over a context in fixed chunks of kAttentionChunkKeys keys, for the exact
// (attention_exact.h), bf16 (attention_bf16_item.h) and AMX (attention_amx.h) kernels, multi-head
// and latent: each chunk's softmax and weighted sum on its own, then folded into a row's result
// in chunk order (FoldChunk: the online softmax's merge of two partial results). The chunks are a
// token's, fixed by key positions alone, so its bits never depend on its batch; who computes which
// chunk is attention.cc's choice: a few long sequences run one chunk an item, over every thread (a
// batch-1 decode at context 4096 on 2 threads had read its cache at 14 GB/s split by kv heads),
// their results folded afterwards; many run all of a tile's chunks an item, folding each as it
// comes (AttendFolded), so that an item holds two chunks' results whatever its context. A row
// whose context is one chunk gets that chunk's result as it is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_item.h"

namespace moeserve::cpu_fast {

// Keys of a chunk: a multiple of 32 (the bf16 probabilities' pairs and rounding blocks).
inline constexpr int64_t kAttentionChunkKeys = 512;

inline int64_t ChunksOf(int64_t ctx) { return (ctx + kAttentionChunkKeys - 1) / kAttentionChunkKeys; }

// Chunk c of a whole item: its keys [512 c, min(512 (c + 1), ctx_max)).
inline ItemRows ChunkOf(const ItemRows& it, int64_t c) {
  ItemRows chunk = it;
  chunk.k_begin = c * kAttentionChunkKeys;
  chunk.ctx_max = std::min(it.ctx_max, chunk.k_begin + kAttentionChunkKeys);
  return chunk;
}

// The floats of one chunk's result for an item of `all` rows (heads x nrows): the rows' weighted
// sums [all][width] (normalized: each row's probabilities over the chunk's keys sum to 1), then
// each row's largest score [all] and sum of exponentials [all] (a row with no keys in the chunk:
// -inf and 0).
inline int64_t ChunkPartFloats(int64_t all, int64_t width) { return all * (width + 2); }

// Folds the chunk result `part` into `acc` (both ChunkPartFloats(all, width), width a multiple of
// 8), row by row: a row with no keys in `part` keeps acc's; one with none in `acc` takes part's
// bits; otherwise, with m = max(m_acc, m_part), la = l_acc e^(m_acc - m), lp = l_part e^(m_part -
// m), each output becomes fma(la / (la + lp), o_acc, lp / (la + lp) * o_part) and the row's max
// and sum m and la + lp. Folding a row's chunks in order is then its result over all of them.
void FoldChunk(const float* part, int64_t all, int64_t width, float* acc);

// Chunks 1 .. chunks - 1 of `parts` (ChunkPartFloats(all, width) apart, all computed) folded in
// order into chunk 0: what AttendFolded does as they come, for results computed elsewhere.
inline void FoldChunks(float* parts, int64_t chunks, int64_t all, int64_t width) {
  const int64_t stride = ChunkPartFloats(all, width);
  for (int64_t c = 1; c < chunks; ++c) FoldChunk(parts + c * stride, all, width, parts);
}

// An item's `chunks` chunks, computed by attend(c, part) into `parts` and folded in order into
// parts[0, stride) (stride = ChunkPartFloats(all, width)): two chunks' results held at a time.
template <typename Attend>
void AttendFolded(int64_t chunks, int64_t all, int64_t width, std::vector<float>* parts, const Attend& attend) {
  const int64_t stride = ChunkPartFloats(all, width);
  parts->resize(static_cast<size_t>(std::min<int64_t>(chunks, 2) * stride));
  attend(int64_t{0}, parts->data());
  for (int64_t c = 1; c < chunks; ++c) {
    attend(c, parts->data() + stride);
    FoldChunk(parts->data() + stride, all, width, parts->data());
  }
}

// The item's rows (multi-head: `part` laid out as heads x nrows rows of head_dim) into their
// places in `out` ([token][q head][head_dim]).
void WriteItemRows(const ItemRows& it, const float* part, float* out);

}  // namespace moeserve::cpu_fast
