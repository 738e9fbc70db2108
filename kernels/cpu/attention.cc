// Paged causal attention on the CPU fast path (declared in fast_ops.h): the work items of the
// multi-head kernels and of the latent (MLA) one.
//
// Work items are (tile, kv heads): a tile is up to 16 consecutive tokens of one sequence (64 on
// the amx kernel, AttendAmx in attention_amx.cc; a prefill chunk; a decode token is a tile of
// one), and the group of query heads that share a kv head reads each K/V row once. Items take as
// many kv heads as keep the threads busy (PlanItems), so that a token's row (all kv heads side by
// side in the cache) is read whole. Every kernel takes a context in chunks of 512 keys folded
// together in order (attention_chunks.h), so few long contexts also split by chunk, one an item.
// Every kernel is batch-invariant: a token's scores, softmax and weighted sum are the same
// operations in the same order whatever its tile, batch mates, item or thread.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/attention_bf16_item.h"
#include "kernels/cpu/attention_chunks.h"
#include "kernels/cpu/attention_exact.h"
#include "kernels/cpu/attention_latent.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/latent_ops.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/weight_layout.h"

namespace moeserve::cpu_fast {
namespace {

constexpr int64_t kTile = 16;     // tokens of one sequence per work item
constexpr int64_t kAmxTile = 64;  // the same for the amx kernel
// The tiles of a batch: runs of up to `tile_tokens` consecutive positions of one sequence
// (tile i is tokens [start[i], start[i + 1])).
std::vector<int64_t> TileStarts(const AttentionBatch& batch, int64_t tile_tokens) {
  std::vector<int64_t> start;
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const bool extends = t > 0 && t - start.back() < tile_tokens && batch.token_seq[t] == batch.token_seq[t - 1] &&
                         batch.token_pos[t] == batch.token_pos[t - 1] + 1;
    if (!extends) start.push_back(t);
  }
  start.push_back(batch.num_tokens);
  return start;
}

// How work items cover (tile, kv head) pairs: each takes `heads` of a tile's kv heads, and with
// `split` only one chunk of its context (attention_chunks.h), the chunks combined afterwards.
struct ItemPlan {
  int64_t heads;
  bool split;
};

// A token's K (and V) row holds every kv head side by side; the bf16 kernels read a DRAM-resident
// cache 1.5x faster whole than a head's part at a time. So an item takes as many kv heads as still
// leave items enough to keep the threads busy (four a thread, or for a single tile a multiple of
// the threads: its items are equal but for a shorter last chunk), splitting long contexts into
// their chunks before it splits rows (on 2 threads a batch-1 decode at context 4096 runs eight
// chunks of whole rows). `chunks` is the tiles' chunks in all. No choice changes a bit.
ItemPlan PlanItems(int64_t tiles, int64_t chunks, int64_t kvh, int64_t threads) {
  auto enough = [&](int64_t items) { return items >= 4 * threads || (tiles == 1 && items % threads == 0); };
  for (int64_t d = kvh; d >= 1; --d) {
    if (kvh % d != 0) continue;
    if (enough(tiles * (kvh / d))) return {d, false};
    if (chunks > tiles && enough(chunks * (kvh / d))) return {d, true};
  }
  return {1, chunks > tiles};
}

// The kernel that computes a batch: `kernel` where the cache and shape allow its bf16 products
// (`bf16`), else the exact one.
AttentionKernel KernelFor(AttentionKernel kernel, bool bf16) { return bf16 ? kernel : AttentionKernel::kExact; }

// Whether `kernel` is the amx one (on the tiles or their model).
bool OnTiles(AttentionKernel kernel) {
  return kernel == AttentionKernel::kAmxTiles || kernel == AttentionKernel::kAmxTilesModel;
}

// Where an amx kernel's tile instructions run.
AmxUnit UnitOf(AttentionKernel kernel) {
  return kernel == AttentionKernel::kAmxTilesModel ? AmxUnit::kModel : AmxUnit::kTiles;
}

// The whole item `it` on `kernel`.
void AttendItem(AttentionKernel kernel, const ItemRows& it, const float* q, float scale, float* out,
                ExactScratch* exact, Bf16Scratch* bf16, AmxScratch* amx) {
  switch (kernel) {
    case AttentionKernel::kExact: return AttendExact(it, q, scale, out, exact);
    case AttentionKernel::kBf16Dot: return AttendBf16(it, q, scale, out, bf16);
    case AttentionKernel::kAmxTiles:
    case AttentionKernel::kAmxTilesModel: return AttendAmx(UnitOf(kernel), it, q, scale, out, amx);
  }
}

// Chunk c of the whole item `it` on `kernel`, its result (ChunkPartFloats) into `part`.
void AttendItemChunk(AttentionKernel kernel, const ItemRows& it, int64_t c, const float* q, float scale, float* part,
                     ExactScratch* exact, Bf16Scratch* bf16, AmxScratch* amx) {
  if (kernel == AttentionKernel::kExact) return AttendExactChunk(ChunkOf(it, c), q, scale, part, exact);
  if (kernel == AttentionKernel::kBf16Dot) {
    PrepareBf16Queries(it, q, bf16);
    return AttendChunkBf16(ChunkOf(it, c), scale, bf16, part);
  }
  PrepareAmxQueries(it, q, amx);
  AttendChunkAmx(UnitOf(kernel), ChunkOf(it, c), scale, amx, part);
}

// The split plan: an item per chunk of each (tile, kv heads), their results side by side in
// `parts` (a (tile, heads)'s chunks one after another), then an item per (tile, kv heads) folds
// its chunks in order (AttendFolded's operations, so the same bits).
template <typename RowsOf>
void AttendInChunks(ThreadPool& pool, AttentionKernel kernel, const std::vector<int64_t>& order, const RowsOf& item_rows,
                    int64_t groups, int64_t heads, const float* q, float scale, float* out) {
  struct Part {
    int64_t tile, g0, chunk, offset;
  };
  std::vector<Part> items;
  std::vector<int64_t> base(order.size() * static_cast<size_t>(groups));
  int64_t total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      const ItemRows it = item_rows(order[i], g * heads);
      const int64_t stride = ChunkPartFloats(it.heads * it.nrows(), it.layout->head_dim);
      base[i * groups + g] = total;
      for (int64_t c = 0; c < ChunksOf(it.ctx_max); ++c, total += stride) items.push_back({order[i], g * heads, c, total});
    }
  }
  std::vector<float> parts(static_cast<size_t>(total));
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    ExactScratch exact;
    Bf16Scratch bf16;
    AmxScratch amx;
    for (int64_t i = b; i < e; ++i) {
      const Part& p = items[static_cast<size_t>(i)];
      AttendItemChunk(kernel, item_rows(p.tile, p.g0), p.chunk, q, scale, parts.data() + p.offset, &exact, &bf16, &amx);
    }
  });
  pool.ParallelFor(static_cast<int64_t>(base.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const ItemRows it = item_rows(order[static_cast<size_t>(i / groups)], i % groups * heads);
      FoldChunks(parts.data() + base[i], ChunksOf(it.ctx_max), it.heads * it.nrows(), it.layout->head_dim);
      WriteItemRows(it, parts.data() + base[i], out);
    }
  });
}

}  // namespace

void PagedAttention(ThreadPool& pool, const float* q, const AttentionBatch& batch,
                    const KvLayout& layout, int64_t layer, const void* cache, int64_t q_heads,
                    float scale, float* out, AttentionKernel kernel) {
  const int64_t hd = layout.head_dim, kvh = layout.kv_heads, group = q_heads / kvh;
  const AttentionKernel item_kernel = KernelFor(kernel, layout.dtype == DType::kBF16 && Bf16AttentionHeadDim(hd));
  if (hd % 8 != 0) {  // the vector kernel works in chunks of 8 dimensions
    return cpu_ref::PagedAttention(q, batch, layout, layer, cache, q_heads, scale, out);
  }
  // The amx kernel packs an item's keys and values for its tiles once for all its rows: longer
  // tiles share more of that work (rows are independent, so no result changes).
  const std::vector<int64_t> tile_start = TileStarts(batch, OnTiles(item_kernel) ? kAmxTile : kTile);
  const int64_t tiles = static_cast<int64_t>(tile_start.size()) - 1;
  auto ctx_of_tile = [&](int64_t tile) { return batch.token_pos[tile_start[tile + 1] - 1] + 1; };  // positions ascend
  // Longest contexts first: the threads take parts in order, so the largest come first and the
  // small ones even out the end (a prefill's last tiles cost the most).
  std::vector<int64_t> order(static_cast<size_t>(tiles));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ctx_of_tile(a) > ctx_of_tile(b); });
  int64_t chunks = 0;
  for (int64_t tile = 0; tile < tiles; ++tile) chunks += ChunksOf(ctx_of_tile(tile));
  const ItemPlan plan = PlanItems(tiles, chunks, kvh, static_cast<int64_t>(pool.num_threads()));
  const int64_t groups = kvh / plan.heads;
  auto item_rows = [&](int64_t tile, int64_t g0) {
    const int64_t t0 = tile_start[tile];
    return ItemRows{&batch, &layout, cache, layer, t0, tile_start[tile + 1] - t0, g0, plan.heads, group, q_heads,
                    ctx_of_tile(tile)};
  };
  if (plan.split) return AttendInChunks(pool, item_kernel, order, item_rows, groups, plan.heads, q, scale, out);
  pool.ParallelFor(tiles * groups, 1, [&](int64_t b, int64_t e) {
    ExactScratch exact;
    Bf16Scratch bf16_scratch;
    AmxScratch amx_scratch;
    for (int64_t item = b; item < e; ++item) {
      const ItemRows it = item_rows(order[static_cast<size_t>(item / groups)], item % groups * plan.heads);
      AttendItem(item_kernel, it, q, scale, out, &exact, &bf16_scratch, &amx_scratch);
    }
  });
}

// Latent attention (MLA): every head reads the same row per token, [latent | rotary key], the
// latent doubling as the value (attention_latent.h): on the bf16 variants' dot products or the
// amx variant's tiles (attention_amx.h) over a bf16 cache where the shape allows, else the exact
// kernel's pieces. Work items are (tile, chunk of heads), so that a decode token's heads spread
// over the threads; a context's chunks stay in one item (the heads already fill the threads).
void PagedLatentAttention(ThreadPool& pool, const float* q_latent, const float* q_rope, const AttentionBatch& batch,
                          const KvLayout& layout, int64_t layer, const void* cache, int64_t heads,
                          int64_t latent_dim, float scale, float* out, AttentionKernel kernel) {
  const AttentionKernel item_kernel =
      KernelFor(kernel, layout.dtype == DType::kBF16 && Bf16LatentShape(layout.head_dim, latent_dim));
  if (item_kernel == AttentionKernel::kExact && (layout.head_dim % 8 != 0 || latent_dim % 8 != 0)) {
    return cpu_ref::PagedLatentAttention(q_latent, q_rope, batch, layout, layer, cache, heads, latent_dim, scale, out);
  }
  const std::vector<int64_t> tile_start = TileStarts(batch, kTile);
  const int64_t tiles = static_cast<int64_t>(tile_start.size()) - 1;
  // Heads an item: 8, so that a few decode tokens' heads spread over the threads; up to 32 where
  // a decode batch's tokens alone keep them busy, so that each key row read serves
  // more heads (deepseek-mini at batch 32: attention 1.15x). A prefill tile keeps 8 (its
  // scores are rows x context floats).
  const bool decode = tiles == batch.num_tokens, busy = tiles >= 4 * static_cast<int64_t>(pool.num_threads());
  const int64_t head_chunk = decode && busy ? std::min<int64_t>(heads, 32) : 8;
  const int64_t chunks = (heads + head_chunk - 1) / head_chunk;
  pool.ParallelFor(tiles * chunks, 1, [&](int64_t b, int64_t e) {
    ExactScratch scratch;
    LatentBf16Scratch bf16_scratch;
    AmxScratch amx_scratch;
    for (int64_t item = b; item < e; ++item) {
      const int64_t tile = item / chunks, h0 = item % chunks * head_chunk;
      const int64_t t0 = tile_start[tile], nt = tile_start[tile + 1] - t0;
      const LatentItem it{&batch, &layout, cache, layer, t0, nt, h0, std::min(head_chunk, heads - h0), heads, latent_dim};
      if (OnTiles(item_kernel)) {
        AttendLatentAmx(UnitOf(item_kernel), it, q_latent, q_rope, scale, out, &amx_scratch);
      } else if (item_kernel == AttentionKernel::kBf16Dot) {
        AttendLatentBf16(it, q_latent, q_rope, scale, out, &bf16_scratch);
      } else {
        AttendLatent(it, q_latent, q_rope, scale, out, &scratch);
      }
    }
  });
}

}  // namespace moeserve::cpu_fast
