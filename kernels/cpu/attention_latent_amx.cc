// Latent attention (MLA) on AMX tiles, for the amx variant over a bf16 cache (attention_amx.h's
// AttendLatentAmx): every head of a token reads the same row, [latent | rotary key], so an item's
// rows (token, head) are query rows of one chunk on tiles (ChunkOnTiles), the whole row the key
// and its latent the value. A decode token's heads share each key tile read from the cache.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_chunks.h"
#include "kernels/cpu/attention_latent.h"
#include "kernels/cpu/gemm_kernels.h"

namespace moeserve::cpu_fast {

void AttendLatentAmx(AmxUnit unit, const LatentItem& it, const float* q_latent, const float* q_rope, float scale,
                     float* out, AmxScratch* s) {
  const int64_t hd = it.layout->head_dim, r = it.latent_dim, nrows = it.nrows(), ctx_max = it.ctx_of(nrows - 1);
  LatentQueries(it, q_latent, q_rope, &s->q);
  s->qb.resize(static_cast<size_t>(nrows * hd));
  RoundRowsToBf16(s->q.data(), nrows, hd, s->qb.data());
  // Up to two 16-row query groups read the keys from the cache as A tiles (a decode batch's
  // items take up to 32 heads); a prefill tile's many rows share packed keys.
  const bool keys_as_a = nrows <= 32 && it.layout->block_size % 16 == 0;
  if (keys_as_a) {
    s->q_pairs.resize(static_cast<size_t>(QueryGroupsDwords(nrows, hd)));
    QueryGroupsAmx(s->qb.data(), nrows, hd, s->q_pairs.data());
  }
  s->ctx.resize(static_cast<size_t>(nrows));
  for (int64_t row = 0; row < nrows; ++row) s->ctx[row] = it.ctx_of(row);
  AttendFolded(ChunksOf(ctx_max), nrows, r, &s->parts, [&](int64_t c, float* part) {
    const int64_t kb = c * kAttentionChunkKeys;
    // The values are the keys' own rows, read by the scores just before: nothing to fetch.
    const TileChunk tc{nrows, hd, r, kb, std::min(ctx_max, kb + kAttentionChunkKeys), s->ctx.data(), it.layout,
                       it.cache, it.table(), it.layer, 0, 0, 0, 0, keys_as_a,
                       hd * static_cast<int64_t>(sizeof(uint16_t)), 0, s->qb.data(),
                       keys_as_a ? s->q_pairs.data() : nullptr};
    ChunkOnTiles(unit, tc, scale, s, part, part + nrows * r, part + nrows * r + nrows);
  });
  WriteLatentRows(it, s->parts.data(), out);
}

}  // namespace moeserve::cpu_fast
