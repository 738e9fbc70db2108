// Attention over a context in fixed chunks of kAttentionChunkKeys keys, for the exact
// (attention_exact.h), bf16 (attention_bf16_item.h) and AMX (attention_amx.h) kernels, multi-head
// and latent: each chunk's softmax and weighted
// sum on its own, then a row's chunks weighed together in chunk order. The chunks are a token's,
// fixed by key positions alone, so its bits never depend on its batch; who computes which chunk
// is attention.cc's choice: a few long sequences run one chunk an item, over every thread (a
// batch-1 decode at context 4096 on 2 threads had read its cache at 14 GB/s split by kv heads),
// many run all of a tile's chunks an item. A context of one chunk is computed as if unchunked.
#pragma once

#include <algorithm>
#include <cstdint>

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
// sums [all][hd], then each row's largest score [all] and sum of exponentials [all] (a row with
// no keys in the chunk: -inf and 0).
inline int64_t ChunkPartFloats(int64_t all, int64_t hd) { return all * (hd + 2); }

// Row `row` of `all` (each `width` wide, a multiple of 8) from the first n of its chunks' results
// in `parts` (ChunkPartFloats(all, width) apart), into dst: with M the largest max_c of the row's
// n chunks, chunk c weighs w_c = sum_c e^(max_c - M) / (sum over c' of sum_c' e^(max_c' - M)), and
// each output is a chain of fp32 FMAs over c in order, from -0. One chunk weighs 1 exactly: its
// result unchanged.
void CombineRow(const float* parts, int64_t all, int64_t width, int64_t row, int64_t n, float* dst);

// The item's rows (it.k_begin 0, ctx_max the tile's) from the results of their chunks, `parts`
// holding ChunksOf(it.ctx_max) of them one after another, each row by CombineRow over its own
// chunks.
void CombineChunks(const ItemRows& it, const float* parts, float* out);

// The item's output from its chunks' results: CombineChunks, or with one chunk its rows as they
// are (the same bits, without an exponential and a division a row).
void FinishChunks(const ItemRows& it, const float* parts, float* out);

}  // namespace moeserve::cpu_fast
