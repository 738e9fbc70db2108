// kernels_bench's paged attention cases (kernels_bench.h): decode over a cache of layers read
// from DRAM or cache, the cache's bare read pattern, latent (MLA) decode, and prefill chunks,
// multi-head and latent.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "benchmarks/kernels_bench.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"

namespace moeserve {
namespace {

using bench::Report;
using bench::TheBackend;

// A decode batch's paged cache: `batch` sequences of `context` tokens each, one token each
// attending, their blocks in order, zeroed, on the backend's memory as the engine's KV arena is.
struct DecodeCache {
  DecodeCache(const KvLayout& l, int64_t batch, int64_t context) : layout(l) {
    const int64_t blocks_per_seq = (context + layout.block_size - 1) / layout.block_size;
    layout.num_blocks = batch * blocks_per_seq;
    const size_t bytes = static_cast<size_t>(layout.num_blocks) * layout.BlockBytes();
    kv = *TheBackend().Allocate(bytes);
    std::memset(kv.data(), 0, bytes);
    tables.resize(static_cast<size_t>(layout.num_blocks));
    for (int64_t i = 0; i < layout.num_blocks; ++i) tables[i] = static_cast<int32_t>(i);
    for (int64_t s = 0; s < batch; ++s) {
      seq.push_back(static_cast<int32_t>(s));
      pos.push_back(static_cast<int32_t>(context - 1));
    }
    ab = AttentionBatch{seq.data(), pos.data(), tables.data(), batch, batch, blocks_per_seq};
  }
  KvLayout layout;
  DeviceBuffer kv;
  std::vector<int32_t> tables, seq, pos;
  AttentionBatch ab;
};

// Decode attention over a bf16 (f32: 1) cache of `layers` layers and `kv_heads` kv heads of 64
// (four query heads each), attending layer 0 (`cold` 0):
// with more than one, a sequence's rows lie in blocks a whole block of every layer apart, as in a model.
// With `cold` 1, each call attends the next layer in turn (as a model's step does), so that a
// cache of layers larger than the last-level cache is read from DRAM even at small batch.
void BM_PagedDecodeAttention(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1), layers = state.range(2);
  const bool f32 = state.range(3) != 0, cold = state.range(4) != 0;
  const int64_t kv_heads = state.range(5), heads = 4 * kv_heads, head_dim = 64;
  KvLayout layout;
  layout.num_layers = layers;
  layout.kv_heads = kv_heads;
  layout.head_dim = head_dim;
  layout.dtype = f32 ? DType::kF32 : DType::kBF16;
  DecodeCache c(layout, batch, context);
  std::vector<float> q(static_cast<size_t>(batch * heads * head_dim), 0.1f), out(q.size());
  int64_t layer = 0;
  for (auto _ : state) {
    TheBackend().PagedAttention(q.data(), c.ab, c.layout, layer, c.kv.data(), heads, 0.125f, out.data());
    if (cold) layer = (layer + 1) % layers;
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 4.0 * batch * context * heads * head_dim;
  const double bytes = 2.0 * batch * context * kv_heads * head_dim * (f32 ? 4 : 2);  // K and V
  Report(state, flops, bytes, layout.dtype);
}
BENCHMARK(BM_PagedDecodeAttention)
    ->ArgNames({"batch", "context", "layers", "f32", "cold", "kv_heads"})
    ->Args({1, 4096, 1, 0, 0, 2})
    ->Args({16, 1024, 1, 0, 0, 2})
    ->Args({64, 4096, 1, 0, 0, 2})
    ->Args({1, 4096, 8, 1, 0, 2})
    ->Args({16, 4096, 8, 0, 0, 2})
    ->Args({16, 4096, 8, 1, 0, 2})
    ->Args({64, 192, 8, 0, 0, 2})  // the offline benchmark's batch of 64 (128 in, 128 out) half way
    ->Args({1, 16384, 16, 0, 1, 2})  // 128 MiB of KV in 16 layers: each call's layer from DRAM
    ->Args({4, 8192, 16, 0, 1, 2})
    ->Args({16, 4096, 10, 0, 1, 4})  // medium's shape: four kv heads (512-byte rows), ten layers
    ->Args({64, 1024, 10, 0, 1, 4})  // the same at the decode sweep's 64 x 1024
    ->Args({1, 4096, 1, 0, 0, 4})
    ->UseRealTime();

// The decode attention cases' own read pattern with no arithmetic: each sequence's K then V plane
// of one layer, block after block (a block's plane one contiguous run, the next a block of every
// layer on), summed with plain 256-bit loads on as many threads as the backend, sequences split
// between them. What the cache's layout alone allows a kernel reading it: BM_PagedDecodeAttention's
// cold cases against this one are the attention's fraction of it (a plain read of one contiguous
// arena runs faster: blocks whose layers lie apart restart the hardware's prefetchers; `block`
// tokens a block).
void BM_KvReadPattern(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1), layers = state.range(2), kv_heads = state.range(3);
  KvLayout layout;
  layout.num_layers = layers;
  layout.kv_heads = kv_heads;
  layout.head_dim = 64;
  layout.block_size = state.range(4);
  layout.dtype = DType::kBF16;
  DecodeCache c(layout, batch, context);
  static ThreadPool pool(0);
  const int64_t blocks_per_seq = c.ab.max_blocks_per_seq;
  const size_t plane = static_cast<size_t>(layout.block_size * layout.TokenElems()) * sizeof(uint16_t);
  std::vector<int64_t> sums(static_cast<size_t>(batch));
  int64_t layer = 0;
  for (auto _ : state) {
    pool.ParallelFor(batch, 1, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s) {
        __m256i acc = _mm256_setzero_si256();
        for (int kv = 0; kv < 2; ++kv) {
          for (int64_t i = 0; i < blocks_per_seq; ++i) {
            const auto* p = static_cast<const uint8_t*>(c.kv.data()) +
                            layout.Offset(c.tables[s * blocks_per_seq + i], layer, kv, 0) * sizeof(uint16_t);
            for (size_t o = 0; o < plane; o += 32) {
              acc = _mm256_add_epi32(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + o)));
            }
          }
        }
        sums[s] = _mm256_extract_epi64(acc, 0);
      }
    });
    layer = (layer + 1) % layers;
    benchmark::DoNotOptimize(sums.data());
  }
  Report(state, 0, 2.0 * batch * blocks_per_seq * static_cast<double>(plane), layout.dtype);
}
BENCHMARK(BM_KvReadPattern)
    ->ArgNames({"batch", "context", "layers", "kv_heads", "block"})
    ->Args({16, 4096, 10, 4, 16})  // BM_PagedDecodeAttention's medium shape from DRAM
    ->Args({64, 1024, 10, 4, 16})
    ->Args({4, 8192, 16, 2, 16})
    ->Args({16, 4096, 10, 4, 256})  // the same in blocks of 256 tokens: longer contiguous runs
    ->Args({64, 1024, 10, 4, 256})
    ->UseRealTime();

// Latent (MLA) decode attention, DeepSeek's absorbed form: `heads` query heads of one token per
// sequence against each cached [latent | rotary key] row (a bf16 cache of `layers` layers, one
// plane), attending each layer in turn so that a cache larger than the last-level cache is read
// from DRAM (`layers` 1: layer 0 again, in cache). GB/s of rows read; GFLOP/s of the scores
// (latent + rope) and the weighted sum (latent), two FLOPs a product.
void BM_PagedLatentDecodeAttention(benchmark::State& state) {
  const int64_t batch = state.range(0), context = state.range(1), layers = state.range(2);
  const int64_t heads = state.range(3), latent = state.range(4), rope = state.range(5);
  KvLayout layout;
  layout.num_layers = layers;
  layout.kv_heads = 1;
  layout.head_dim = latent + rope;
  layout.planes = 1;
  layout.dtype = DType::kBF16;
  DecodeCache c(layout, batch, context);
  std::vector<float> q_latent(static_cast<size_t>(batch * heads * latent), 0.1f), q_rope(
      static_cast<size_t>(batch * heads * rope), 0.1f), out(q_latent.size());
  int64_t layer = 0;
  for (auto _ : state) {
    TheBackend().PagedLatentAttention(q_latent.data(), q_rope.data(), c.ab, c.layout, layer, c.kv.data(), heads,
                                      latent, 0.1f, out.data());
    layer = (layer + 1) % layers;
    benchmark::DoNotOptimize(out.data());
  }
  const double products = static_cast<double>(batch) * context * heads * (2 * latent + rope);
  Report(state, 2.0 * products, static_cast<double>(batch) * context * (latent + rope) * 2, layout.dtype);
}
BENCHMARK(BM_PagedLatentDecodeAttention)
    ->ArgNames({"batch", "context", "layers", "heads", "latent", "rope"})
    ->Args({32, 4096, 8, 16, 256, 32})  // deepseek-mini's shape, a decode step's eight layers from DRAM
    ->Args({8, 1024, 1, 16, 256, 32})   // the same in cache
    ->Args({4, 4096, 8, 16, 512, 64})   // DeepSeek-V3's latent, 16 of its heads (a tensor-parallel slice)
    ->Args({16, 2048, 8, 32, 512, 64})  // the same with 32 heads (of 128 over four ranks), a busier batch
    ->UseRealTime();

// A prefill step's paged cache: `chunk` new tokens of one sequence at the end of `context`, its
// blocks in order, zeroed, on the backend's memory; `layout` gives everything but the blocks.
struct PrefillCache {
  PrefillCache(const KvLayout& l, int64_t context, int64_t chunk) : layout(l) {
    layout.num_blocks = (context + layout.block_size - 1) / layout.block_size;
    const size_t bytes = static_cast<size_t>(layout.num_blocks) * layout.BlockBytes();
    kv = *TheBackend().Allocate(bytes);
    std::memset(kv.data(), 0, bytes);
    table.resize(static_cast<size_t>(layout.num_blocks));
    for (int64_t i = 0; i < layout.num_blocks; ++i) table[i] = static_cast<int32_t>(i);
    seq.assign(static_cast<size_t>(chunk), 0);
    for (int64_t t = 0; t < chunk; ++t) pos.push_back(static_cast<int32_t>(context - chunk + t));
    ab = AttentionBatch{seq.data(), pos.data(), table.data(), chunk, 1, layout.num_blocks};
  }
  // The keys the step's tokens attend in all (causally).
  double Attended() const {
    double n = 0;
    for (int32_t p : pos) n += static_cast<double>(p + 1);
    return n;
  }
  KvLayout layout;
  DeviceBuffer kv;
  std::vector<int32_t> table, seq, pos;
  AttentionBatch ab;
};

// A prefill chunk: `chunk` new tokens of one sequence at the end of `context`, attending
// causally (the tokens of a 2000-token prompt's last 512-token step, as the engine runs it), with
// `heads` query heads over `kv_heads` of 64 (`small`'s 8 / 2, `medium`'s 16 / 4).
void BM_PagedPrefillAttention(benchmark::State& state) {
  const int64_t context = state.range(0), chunk = state.range(1), heads = state.range(2), kv_heads = state.range(3);
  const int64_t head_dim = 64;
  KvLayout layout;
  layout.num_layers = 1;
  layout.block_size = 16;
  layout.kv_heads = kv_heads;
  layout.head_dim = head_dim;
  layout.dtype = DType::kBF16;
  const PrefillCache c(layout, context, chunk);
  std::vector<float> q(static_cast<size_t>(chunk * heads * head_dim), 0.1f), out(q.size());
  for (auto _ : state) {
    TheBackend().PagedAttention(q.data(), c.ab, c.layout, 0, c.kv.data(), heads, 0.125f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, 4.0 * c.Attended() * heads * head_dim, 2.0 * context * kv_heads * head_dim * 2, layout.dtype);
}
BENCHMARK(BM_PagedPrefillAttention)
    ->ArgNames({"context", "chunk", "heads", "kv_heads"})
    ->Args({512, 512, 8, 2})
    ->Args({2000, 464, 8, 2})
    ->Args({2000, 464, 16, 4})
    ->Args({16384, 512, 16, 4})  // medium's last step of a 16k-token prompt: 32 chunks a row
    ->UseRealTime();

// A latent (MLA) prefill chunk: `chunk` new tokens of one sequence at the end of `context`,
// attending causally with `heads` heads over [latent | rope] rows (DeepSeek-V3's 512 + 64).
void BM_PagedLatentPrefillAttention(benchmark::State& state) {
  const int64_t context = state.range(0), chunk = state.range(1), heads = state.range(2);
  const int64_t latent = state.range(3), rope = state.range(4);
  KvLayout layout;
  layout.num_layers = 1;
  layout.block_size = 16;
  layout.kv_heads = 1;
  layout.head_dim = latent + rope;
  layout.planes = 1;
  layout.dtype = DType::kBF16;
  const PrefillCache c(layout, context, chunk);
  std::vector<float> q_latent(static_cast<size_t>(chunk * heads * latent), 0.1f),
      q_rope(static_cast<size_t>(chunk * heads * rope), 0.1f), out(q_latent.size());
  for (auto _ : state) {
    TheBackend().PagedLatentAttention(q_latent.data(), q_rope.data(), c.ab, c.layout, 0, c.kv.data(), heads, latent,
                                      0.1f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, 2.0 * c.Attended() * heads * (2 * latent + rope), 2.0 * context * (latent + rope), layout.dtype);
}
BENCHMARK(BM_PagedLatentPrefillAttention)
    ->ArgNames({"context", "chunk", "heads", "latent", "rope"})
    ->Args({2048, 512, 32, 512, 64})  // DeepSeek-V3's latent, 32 of its heads, a 2048-token prompt's last step
    ->Args({2048, 512, 16, 256, 32})  // deepseek-mini's shape
    ->UseRealTime();

}  // namespace
}  // namespace moeserve
