// Paged attention on AMX tiles (tdpbf16ps), for the amx variant over a bf16 KV cache: an item's
// driver (AttendAmx: packing, softmax, which keys each row takes; its context in chunks,
// attention_chunks.h) and its two products, Q·Kᵀ against KeyPairsBf16's tiles and P·V against
// ValuePairsBf16's (attention_bf16.h). Each output element is one tdpbf16ps accumulation over its
// K steps in order; tile rows are independent, so a row's result never depends on the rows
// beside it. Each function runs on the tiles (only CPUs granted AMX tiles may ask for that) or
// on their software model (amx_tile_model.h: tests, on any CPU with AVX512-BF16).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/attention_latent.h"

namespace moeserve::cpu_fast {

// Where the tile instructions run: the hardware's tiles, or the software model of them.
enum class AmxUnit { kTiles, kModel };

// out[r * out_stride + j] = dot(q_r, key j) for rows r < rows (1..32) and keys j < 16 blocks
// (blocks even): q is rows x hd bf16, row after row; kt holds each 16-key block's KeyPairsBf16,
// hd / 2 x 16 dwords, block after block. The sums are not scaled.
void ScoresAmx(AmxUnit unit, const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks, float* out,
               int64_t out_stride);

// The same scores with the keys as the A operand, read straight from the cache, and the queries
// as the B operand: for rows r < rows (1..16) and the keys of `ngroups` 16-key groups, group i
// starting at groups[i] (its 16 keys `key_stride` elements apart: one cache block's slots),
// out[r * out_stride + 16 i + j] = dot(q_r, key j of group i). q_pairs holds, per 32-dimension
// step, the queries' pair rows (QueryPairsAmx). A product of two bf16 values is exact and
// tdpbf16ps adds a pair's products in the same order whichever operand holds them, so every
// score has ScoresAmx's bits (checked on AMX hardware, kernels_test) with no keys packed: a
// decode token's item, whose rows are few, no longer repacks its whole context per step. Keys
// of a group past a row's context are read but never used: the callers start every group below
// the chunk's end, at a multiple of 16 keys, in blocks of whole groups, so a group's keys lie
// in one block of the sequence.
// The first `fetch_bytes` of each key row of the next two groups are fetched ahead.
void ScoresAmxKeysAsA(AmxUnit unit, const uint32_t* q_pairs, int64_t rows, int64_t hd, const uint16_t* const* groups,
                      int64_t ngroups, int64_t key_stride, int64_t fetch_bytes, float* out, int64_t out_stride);

// q_pairs for ScoresAmxKeysAsA from rows r < rows (1..16) of q (rows x hd bf16, row after row):
// per 32-dimension step s, 16 pair rows p of 16 dwords, (q_n[32 s + 2 p], q_n[32 s + 2 p + 1])
// in column n, zero past `rows`. hd / 32 x 256 dwords.
void QueryPairsAmx(const uint16_t* q, int64_t rows, int64_t hd, uint32_t* q_pairs);

// acc[r * hd + c] = sum over keys j < 32 steps of p[r * p_stride + j] * value j, dimension c, for
// rows r < rows (1..32): p bf16 (rows 64-byte aligned not needed), vt holds each 32-key step's
// ValuePairsBf16, hd / 16 tiles, step after step.
void WeightedSumAmx(AmxUnit unit, const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt, int64_t steps, int64_t hd,
                    float* acc);

// A thread's scratch for the tile kernels, reused across its items.
struct AmxScratch {
  std::vector<float> q, scores, parts;
  std::vector<uint16_t> qb, pb, zeros;
  std::vector<uint32_t> kt, vt;  // the chunk's keys and values as B tiles
  std::vector<uint32_t> q_pairs;         // or its queries as B tiles, the keys read from the cache
  std::vector<const uint16_t*> groups;  // there: each 16-key group's first key
  std::vector<int64_t> keys, ctx;
};

// q_pairs for ScoresAmxKeysAsA of `rows` query rows (q: rows x hd bf16), 16 rows a group, group
// after group (QueryGroupsDwords(rows, hd) dwords).
inline int64_t QueryGroupsDwords(int64_t rows, int64_t hd) { return (rows + 15) / 16 * (hd / 32) * 256; }
void QueryGroupsAmx(const uint16_t* q, int64_t rows, int64_t hd, uint32_t* q_pairs);

// One chunk of keys [k_begin, k_end) for query rows on tiles, whoever's rows they are (one kv
// head of a multi-head item; a latent item's heads): key j's row is `key_width` values at
// `key_offset` of plane `key_plane` of its cache slot, its value `value_width` values at
// `value_offset` of `value_plane`.
struct TileChunk {
  int64_t nrows, key_width, value_width, k_begin, k_end;
  const int64_t* ctx;  // per row, ascending
  const KvLayout* layout;
  const void* cache;
  const int32_t* table;
  int64_t layer;
  int key_plane, value_plane;
  int64_t key_offset, value_offset;
  bool keys_as_a;                  // keys read from the cache as A tiles (blocks of whole 16-key groups)
  int64_t key_fetch, value_fetch;  // bytes of each row fetched ahead
  const uint16_t* qb;              // the rows' queries, bf16, key_width each
  const uint32_t* q_pairs;         // with keys_as_a: QueryGroupsAmx of qb
  // Row r's keys in the chunk.
  int64_t keys_of(int64_t r) const { return std::clamp(ctx[r], k_begin, k_end) - k_begin; }
};

// The chunk into acc (nrows x value_width), max and sum (nrows): Q·Kᵀ on tiles, the softmax on
// 16 lanes, then P·V on tiles over the whole 32-key steps of each row's keys in the chunk and
// vdpbf16ps for the rest. A row's operations depend only on its own context, so a decode token
// and the same token in any prefill tile take the same ones, and no row reads a value past its
// own keys. key_width a multiple of 32; value_width one AddWeightedBf16 takes.
void ChunkOnTiles(AmxUnit unit, const TileChunk& c, float scale, AmxScratch* s, float* acc, float* max, float* sum);

// The item's queries rounded to bf16 (s->qb, rows (g - g0) * nrows + r) and, for an item whose
// keys are read as A tiles (KeysAsA), their pair rows (s->q_pairs, kv head after kv head).
void PrepareAmxQueries(const ItemRows& it, const float* q, AmxScratch* s);

// Whether an item reads its keys from the cache as A tiles: at most 16 rows (a decode token's),
// blocks of whole 16-key groups.
inline bool KeysAsA(const ItemRows& it) { return it.nrows() <= 16 && it.layout->block_size % 16 == 0; }

// Keys [it.k_begin, it.ctx_max) (one chunk, on PrepareAmxQueries' queries) into `part`
// (ChunkPartFloats), one kv head at a time (ChunkOnTiles), 32 rows per pass. An item of at most
// 16 rows reads its keys from the cache as they are (16-key groups, one cache block's slots
// apart) instead of packing them.
void AttendChunkAmx(AmxUnit unit, const ItemRows& it, float scale, AmxScratch* s, float* part);

// A whole item (it.k_begin 0): its queries, then each chunk of its context in turn, folded into
// the rows' results as it comes (AttendFolded: a context of one chunk as it is).
void AttendAmx(AmxUnit unit, const ItemRows& it, const float* q, float scale, float* out, AmxScratch* s);

// A latent (MLA) item on tiles (attention_latent_amx.cc): its rows' [q_latent | q_rope] rounded
// to bf16, each chunk of its context on tiles against the whole cached rows as keys and their
// latents as values (ChunkOnTiles), the chunks folded in order (AttendFolded). A row's
// operations depend only on its own context. Shapes of Bf16LatentShape only.
void AttendLatentAmx(AmxUnit unit, const LatentItem& it, const float* q_latent, const float* q_rope, float scale,
                     float* out, AmxScratch* s);

}  // namespace moeserve::cpu_fast
