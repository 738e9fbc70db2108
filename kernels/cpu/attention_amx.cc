// Paged attention on AMX tiles (see attention_amx.h): the products, in amx_tiles.h's arrangement
// (two A tiles of up to 16 rows against two B tiles, four accumulators), each written once over a
// unit (the tiles, or amx_tile_model.h's model of them); the chunk driver both kinds of attention
// share; the multi-head item. Only amx_tiles.h's inline assembly touches the tiles, so no target
// pragma is needed here.
#include "kernels/cpu/attention_amx.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/amx_tile_model.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_bf16_item.h"
#include "kernels/cpu/attention_chunks.h"
#include "kernels/cpu/gemm_kernels.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kTileDwords = 256;  // one B tile: 16 rows x 16 dwords

// The tile operations the products use, on the hardware and on the model.
struct HardwareUnit {
  static void Configure(int rows0, int rows1) { ConfigureAmxTiles(rows0, rows1); }
  static void ZeroC(int rows1) { AmxZeroC(rows1); }
  static void Step(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, int rows1) {
    AmxStep(a0, a1, a_stride, b0, b1, rows1);
  }
  static void StepSharedB(const void* a0, const void* a1, long a_stride, const uint32_t* b0) {
    AmxStepSharedB(a0, a1, a_stride, b0);
  }
  static void StoreC(float* c, int64_t stride, int rows1) { AmxStoreC(c, stride, rows1); }
  static void StoreSharedBC(float* c, int64_t stride) { AmxStoreSharedBC(c, stride); }
};
struct ModelUnit {
  static void Configure(int rows0, int rows1) { amx_model::Configure(rows0, rows1); }
  static void ZeroC(int rows1) { amx_model::ZeroC(rows1); }
  static void Step(const void* a0, const void* a1, long a_stride, const uint32_t* b0, const uint32_t* b1, int rows1) {
    amx_model::Step(a0, a1, a_stride, b0, b1, rows1);
  }
  static void StepSharedB(const void* a0, const void* a1, long a_stride, const uint32_t* b0) {
    amx_model::StepSharedB(a0, a1, a_stride, b0);
  }
  static void StoreC(float* c, int64_t stride, int rows1) { amx_model::StoreC(c, stride, rows1); }
  static void StoreSharedBC(float* c, int64_t stride) { amx_model::StoreSharedBC(c, stride); }
};

template <typename U>
void ScoresOn(const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks, float* out,
              int64_t out_stride) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  U::Configure(rows0, rows1);
  const long a_stride = static_cast<long>(hd * sizeof(uint16_t));
  const int64_t steps = hd / 32, block_dwords = steps * kTileDwords;
  const uint16_t* q1 = rows1 > 0 ? q + 16 * hd : q;  // the second A tile, when there is one
  for (int64_t b = 0; b < blocks; b += 2) {
    U::ZeroC(rows1);
    const uint32_t* k0 = kt + b * block_dwords;
    for (int64_t s = 0; s < steps; ++s) {
      U::Step(q + 32 * s, q1 + 32 * s, a_stride, k0 + s * kTileDwords, k0 + block_dwords + s * kTileDwords, rows1);
    }
    U::StoreC(out + 16 * b, out_stride, rows1);
  }
}

template <typename U>
void ScoresKeysAsAOn(const uint32_t* q_pairs, int64_t rows, int64_t hd, const uint16_t* const* groups, int64_t ngroups,
                     int64_t key_stride, int64_t fetch_bytes, float* out, int64_t out_stride) {
  U::Configure(16, 16);
  const long a_stride = static_cast<long>(key_stride * sizeof(uint16_t));
  const int64_t steps = hd / 32;
  alignas(64) float c[32 * 16];  // two groups' keys x 16 query columns
  for (int64_t g = 0; g < ngroups; g += 2) {
    const uint16_t* a0 = groups[g];
    const uint16_t* a1 = g + 1 < ngroups ? groups[g + 1] : a0;  // a lone last group: computed twice, kept once
    // The next two groups' keys are fetched while these multiply: a tile load of keys a block's
    // slots apart otherwise waits for each of its 16 rows (a decode step's time went there).
    for (int64_t n = g + 2; n < std::min(ngroups, g + 4); ++n) {
      for (int64_t j = 0; j < 16; ++j) {
        const char* row = reinterpret_cast<const char*>(groups[n] + j * key_stride);
        for (int64_t b = 0; b < fetch_bytes; b += 64) PrefetchLine(row + b);
      }
    }
    U::ZeroC(16);
    for (int64_t s = 0; s < steps; ++s) U::StepSharedB(a0 + 32 * s, a1 + 32 * s, a_stride, q_pairs + s * kTileDwords);
    U::StoreSharedBC(c, 16);
    const int64_t keys = std::min<int64_t>(32, (ngroups - g) * 16);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < keys; ++j) out[r * out_stride + 16 * g + j] = c[j * 16 + r];
    }
  }
}

template <typename U>
void WeightedSumOn(const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt, int64_t steps, int64_t hd,
                   float* acc) {
  const int rows0 = static_cast<int>(std::min<int64_t>(rows, 16)), rows1 = static_cast<int>(rows - rows0);
  U::Configure(rows0, rows1);
  const long a_stride = static_cast<long>(p_stride * sizeof(uint16_t));
  const int64_t step_dwords = hd / 16 * kTileDwords;
  const uint16_t* p1 = rows1 > 0 ? p + 16 * p_stride : p;
  for (int64_t c = 0; c < hd / 16; c += 2) {  // 32 dimensions per pass
    U::ZeroC(rows1);
    for (int64_t t = 0; t < steps; ++t) {
      const uint32_t* v = vt + t * step_dwords + c * kTileDwords;
      U::Step(p + 32 * t, p1 + 32 * t, a_stride, v, v + kTileDwords, rows1);
    }
    U::StoreC(acc + 16 * c, hd, rows1);
  }
}

}  // namespace

void ScoresAmx(AmxUnit unit, const uint16_t* q, int64_t rows, int64_t hd, const uint32_t* kt, int64_t blocks,
               float* out, int64_t out_stride) {
  auto run = unit == AmxUnit::kTiles ? ScoresOn<HardwareUnit> : ScoresOn<ModelUnit>;
  run(q, rows, hd, kt, blocks, out, out_stride);
}

void ScoresAmxKeysAsA(AmxUnit unit, const uint32_t* q_pairs, int64_t rows, int64_t hd, const uint16_t* const* groups,
                      int64_t ngroups, int64_t key_stride, int64_t fetch_bytes, float* out, int64_t out_stride) {
  auto run = unit == AmxUnit::kTiles ? ScoresKeysAsAOn<HardwareUnit> : ScoresKeysAsAOn<ModelUnit>;
  run(q_pairs, rows, hd, groups, ngroups, key_stride, fetch_bytes, out, out_stride);
}

void QueryPairsAmx(const uint16_t* q, int64_t rows, int64_t hd, uint32_t* q_pairs) {
  std::fill(q_pairs, q_pairs + hd / 32 * kTileDwords, 0u);  // the columns past `rows`
  for (int64_t s = 0; s < hd / 32; ++s) {
    uint32_t* tile = q_pairs + s * kTileDwords;
    for (int64_t n = 0; n < rows; ++n) {
      const uint16_t* pair = q + n * hd + 32 * s;
      for (int64_t p = 0; p < 16; ++p) tile[p * 16 + n] = pair[2 * p] | static_cast<uint32_t>(pair[2 * p + 1]) << 16;
    }
  }
}

void WeightedSumAmx(AmxUnit unit, const uint16_t* p, int64_t p_stride, int64_t rows, const uint32_t* vt,
                    int64_t steps, int64_t hd, float* acc) {
  auto run = unit == AmxUnit::kTiles ? WeightedSumOn<HardwareUnit> : WeightedSumOn<ModelUnit>;
  run(p, p_stride, rows, vt, steps, hd, acc);
}

namespace {

constexpr int64_t kAmxChunk = 32;  // rows per pass of the products: two A tiles

// The row pointers of keys (kv 0) or values (kv 1) [j0, j0 + n) of the chunk; zeros past it.
void ChunkRows(const TileChunk& c, int kv, int64_t j0, int64_t n, const uint16_t* zeros, const uint16_t** rows) {
  BlockRows(*c.layout, c.cache, c.table, c.layer, kv == 0 ? c.key_plane : c.value_plane,
            kv == 0 ? c.key_offset : c.value_offset, j0, n, c.k_end, zeros, rows);
}

// The chunk's keys as the tiles' B operands: 16-key blocks from k_begin to k_end rounded up to
// 32 (zero keys past it).
void PackKeys(const TileChunk& c, AmxScratch* s) {
  const int64_t blocks = RoundUp(c.k_end - c.k_begin, kAmxValueKeys) / kBf16KeyBlock;
  const int64_t key_block = c.key_width / 2 * kBf16KeyBlock;  // dwords
  s->kt.resize(static_cast<size_t>(blocks * key_block));
  const uint16_t* rows[kBf16KeyBlock];
  for (int64_t b = 0; b < blocks; ++b) {
    ChunkRows(c, 0, c.k_begin + b * kBf16KeyBlock, kBf16KeyBlock, s->zeros.data(), rows);
    KeyPairsBf16(rows, c.key_width, s->kt.data() + b * key_block);
  }
}

// The chunk's whole 32-key steps of values as the tiles' B operands, the next step's rows
// fetched (c.value_fetch bytes each) while these are packed.
void PackValues(const TileChunk& c, AmxScratch* s) {
  const int64_t steps = (c.k_end - c.k_begin) / kAmxValueKeys, value_step = c.value_width / 16 * kTileDwords;
  s->vt.resize(static_cast<size_t>(steps * value_step));
  const uint16_t* rows[kAmxValueKeys];
  const uint16_t* next[kAmxValueKeys];
  if (steps > 0) ChunkRows(c, 1, c.k_begin, kAmxValueKeys, s->zeros.data(), next);
  for (int64_t t = 0; t < steps; ++t) {
    std::copy(next, next + kAmxValueKeys, rows);
    if (t + 1 < steps) {
      ChunkRows(c, 1, c.k_begin + (t + 1) * kAmxValueKeys, kAmxValueKeys, s->zeros.data(), next);
      for (const uint16_t* row : next) {
        for (int64_t b = 0; b < c.value_fetch; b += 64) PrefetchLine(reinterpret_cast<const char*>(row) + b);
      }
    }
    ValuePairsBf16(rows, c.value_width, s->vt.data() + t * value_step);
  }
}

// acc rows [r0, r1) of the chunk (all taking `steps` whole 32-key steps): the tiles' steps,
// then each row's own remaining keys (fewer than 32) on vdpbf16ps.
void WeightedRun(AmxUnit unit, const TileChunk& c, int64_t r0, int64_t r1, int64_t steps, int64_t padded,
                 AmxScratch* s, float* acc) {
  const int64_t width = c.value_width, pass0 = r0 / kAmxChunk * kAmxChunk;
  if (steps > 0) {
    WeightedSumAmx(unit, s->pb.data() + (r0 - pass0) * padded, padded, r1 - r0, s->vt.data(), steps, width, acc);
  } else {
    std::fill(acc, acc + (r1 - r0) * width, 0.0f);
  }
  int64_t n = 0;
  for (int64_t r = r0; r < r1; ++r) n = std::max(n, s->keys[r - r0] = c.keys_of(r) - steps * kAmxValueKeys);
  n = (n + 1) / 2 * 2;
  if (n == 0) return;
  const uint16_t* rows[kBf16MaxValueKeys];
  ChunkRows(c, 1, c.k_begin + steps * kAmxValueKeys, n, s->zeros.data(), rows);
  AddWeightedBf16(s->scores.data() + (r0 - pass0) * padded + steps * kAmxValueKeys, padded, r1 - r0, s->keys.data(), n,
                  rows, width, acc);
}

// Scores of rows [c0, c1) (a pass, the last row with the most keys) against the chunk's keys
// into s->scores: against packed keys, or with the keys read from the cache as A tiles, 16
// rows' queries at a time as B (the same bits: ScoresAmxKeysAsA).
void ChunkScores(AmxUnit unit, const TileChunk& c, int64_t c0, int64_t c1, int64_t padded, AmxScratch* s) {
  const int64_t hd = c.key_width, n = c.keys_of(c1 - 1);
  if (!c.keys_as_a) {
    ScoresAmx(unit, c.qb + c0 * hd, c1 - c0, hd, s->kt.data(), RoundUp(n, kAmxValueKeys) / kBf16KeyBlock,
              s->scores.data(), padded);
    return;
  }
  const int64_t ngroups = (n + 15) / 16;
  s->groups.resize(static_cast<size_t>(ngroups));
  for (int64_t i = 0; i < ngroups; ++i) ChunkRows(c, 0, c.k_begin + 16 * i, 1, s->zeros.data(), &s->groups[i]);
  const int64_t key_stride = c.layout->TokenElems();
  for (int64_t g0 = c0; g0 < c1; g0 += 16) {  // c0 is a multiple of 16
    ScoresAmxKeysAsA(unit, c.q_pairs + g0 / 16 * (hd / 32) * kTileDwords, std::min<int64_t>(16, c1 - g0), hd,
                     s->groups.data(), ngroups, key_stride, c.key_fetch, s->scores.data() + (g0 - c0) * padded,
                     padded);
  }
}

}  // namespace

void ChunkOnTiles(AmxUnit unit, const TileChunk& c, float scale, AmxScratch* s, float* acc, float* max, float* sum) {
  const int64_t padded = RoundUp(c.k_end - c.k_begin, kAmxValueKeys);
  s->zeros.assign(static_cast<size_t>(std::max(c.key_width, c.value_width)), 0);
  s->scores.resize(static_cast<size_t>(kAmxChunk * padded));
  s->pb.resize(static_cast<size_t>(kAmxChunk * padded));
  s->keys.resize(static_cast<size_t>(kAmxChunk));
  if (!c.keys_as_a) PackKeys(c, s);
  PackValues(c, s);
  for (int64_t c0 = 0; c0 < c.nrows; c0 += kAmxChunk) {  // rows ascend in context: the last one's bounds a pass
    const int64_t c1 = std::min(c.nrows, c0 + kAmxChunk);
    if (c.keys_of(c1 - 1) > 0) ChunkScores(unit, c, c0, c1, padded, s);
    for (int64_t r = c0; r < c1; ++r) {
      const int64_t n = c.keys_of(r);
      SoftmaxStats st{-INFINITY, 0.0f};  // a row whose context ends before the chunk
      if (n > 0) {
        st = SoftmaxBf16(s->scores.data() + (r - c0) * padded, n, scale, n / kAmxValueKeys * kAmxValueKeys,
                         s->pb.data() + (r - c0) * padded);
      }
      max[r] = st.max;
      sum[r] = st.sum;
    }
    for (int64_t r0 = c0, r1; r0 < c1; r0 = r1) {  // runs of rows with the same whole steps
      const int64_t steps = c.keys_of(r0) / kAmxValueKeys;
      for (r1 = r0 + 1; r1 < c1 && c.keys_of(r1) / kAmxValueKeys == steps;) ++r1;
      WeightedRun(unit, c, r0, r1, steps, padded, s, acc + r0 * c.value_width);
    }
  }
}

void QueryGroupsAmx(const uint16_t* q, int64_t rows, int64_t hd, uint32_t* q_pairs) {
  for (int64_t g0 = 0; g0 < rows; g0 += 16) {
    QueryPairsAmx(q + g0 * hd, std::min<int64_t>(16, rows - g0), hd, q_pairs + g0 / 16 * (hd / 32) * kTileDwords);
  }
}

void PrepareAmxQueries(const ItemRows& it, const float* q, AmxScratch* s) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows();
  GatherBf16Queries(it, q, &s->q, &s->qb);
  if (!KeysAsA(it)) return;
  const int64_t head_dwords = QueryGroupsDwords(nrows, hd);
  s->q_pairs.resize(static_cast<size_t>(it.heads * head_dwords));
  for (int64_t h = 0; h < it.heads; ++h) {
    QueryGroupsAmx(s->qb.data() + h * nrows * hd, nrows, hd, s->q_pairs.data() + h * head_dwords);
  }
}

void AttendChunkAmx(AmxUnit unit, const ItemRows& it, float scale, AmxScratch* s, float* part) {
  const int64_t hd = it.layout->head_dim, nrows = it.nrows(), all = it.heads * nrows;
  s->ctx.resize(static_cast<size_t>(nrows));
  for (int64_t r = 0; r < nrows; ++r) s->ctx[r] = it.ctx_of(r);
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(uint16_t));
  for (int64_t g = it.g0; g < it.g0 + it.heads; ++g) {
    const int64_t h = g - it.g0;
    // The first kv head fetches the rows of all the item's heads (side by side in the cache), so
    // each block's keys and values stream in once, in address order; the later heads find
    // theirs in L2.
    const int64_t fetch = (g == it.g0 ? it.heads : 1) * row_bytes;
    const TileChunk c{nrows, hd, hd, it.k_begin, it.ctx_max, s->ctx.data(), it.layout, it.cache, it.table(),
                      it.layer, 0, 1, g * hd, g * hd, KeysAsA(it), fetch, g == it.g0 ? fetch : 0,
                      s->qb.data() + h * nrows * hd,
                      KeysAsA(it) ? s->q_pairs.data() + h * QueryGroupsDwords(nrows, hd) : nullptr};
    ChunkOnTiles(unit, c, scale, s, part + h * nrows * hd, part + all * hd + h * nrows, part + all * hd + all + h * nrows);
  }
}

void AttendAmx(AmxUnit unit, const ItemRows& it, const float* q, float scale, float* out, AmxScratch* s) {
  PrepareAmxQueries(it, q, s);
  AttendFolded(ChunksOf(it.ctx_max), it.heads * it.nrows(), it.layout->head_dim, &s->parts,
               [&](int64_t c, float* part) { AttendChunkAmx(unit, ChunkOf(it, c), scale, s, part); });
  WriteItemRows(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
