// The bf16 variants' paged attention for one work item (attention.cc plans the items), its
// context taken in fixed chunks of kAttentionChunkKeys keys: each chunk's softmax and weighted
// sum on its own, then the chunks' results weighed together in chunk order. The chunks are a
// token's, fixed by key positions alone, so its bits never depend on its batch: a few long
// sequences run one chunk an item, over every thread (a batch-1 decode at context 4096 on 2
// threads read its cache at 14 GB/s split by kv heads), many run all of a tile's chunks an
// item. A context of one chunk is computed exactly as before the split.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_item.h"

namespace moeserve::cpu_fast {

// Keys of a chunk: a multiple of 32 (the probabilities' bf16 pairs and rounding blocks).
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
// sums [all][hd], then each row's largest score [all] and sum of exponentials [all].
inline int64_t ChunkPartFloats(int64_t all, int64_t hd) { return all * (hd + 2); }

struct Bf16Scratch {
  std::vector<float> q, scores, parts;
  std::vector<uint16_t> qb, zeros;
  std::vector<uint32_t> pb;  // the probabilities as bf16 pairs, rows of scores' length / 2
  std::vector<int64_t> keys;  // value keys per row of a pass
};

// The item's queries rounded to bf16 (s->qb), rows (g - g0) * nrows + r.
void PrepareBf16Queries(const ItemRows& it, const float* q, Bf16Scratch* s);

// Keys [it.k_begin, it.ctx_max) (one chunk, on PrepareBf16Queries' queries) into `part`
// (ChunkPartFloats): scores 32 keys a call for all rows of the item's kv heads (their parts of
// each key's row read together), the softmax in fp32 on 16 lanes writing the probabilities
// rounded to bf16, the weighted sum over up to 64 keys a call, up to four heads a block. A row
// with no keys in the chunk gets sum 0.
void AttendChunkBf16(const ItemRows& it, float scale, Bf16Scratch* s, float* part);

// The item's rows (it.k_begin 0, ctx_max the tile's) from the results of their chunks, `parts`
// holding ChunksOf(it.ctx_max) of them one after another: a row of n chunks weighs chunk c by
// w_c = sum_c e^(max_c - M) / sum over c' of w_c' (M the largest max_c), its outputs a chain of
// fp32 FMAs over c in order. One chunk has weight 1 exactly: its result unchanged.
void CombineChunks(const ItemRows& it, const float* parts, float* out);

// The item's output from its chunks' results: CombineChunks, or with one chunk its rows as they
// are (the weight is 1: the same bits, without an exponential and a division a row).
void FinishChunks(const ItemRows& it, const float* parts, float* out);

// A whole item (it.k_begin 0): its queries, each chunk of its context in turn, then combined.
void AttendBf16(const ItemRows& it, const float* q, float scale, float* out, Bf16Scratch* s);

}  // namespace moeserve::cpu_fast
