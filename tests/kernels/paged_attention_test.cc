// Paged attention on the CPU fast path's exact kernel: against the reference path and an
// independent dense computation, over scattered block tables, and batch-invariant (a token's
// output never depends on its batch or tile mates, nor on how the kernel splits the batch into
// work items, nor on the thread count). The bf16 kernels: paged_attention_bf16_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/random_paged_batch.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::AllClose;
using testing::ExpectEachTokenAsAlone;
using testing::Layout;
using testing::MakeRandomBatch;
using testing::RandomBatch;
using testing::RandomFloats;

class PagedAttentionTest : public ::testing::Test {
 protected:
  CpuBackend ref_{CpuBackendOptions{CpuPath::kReference, 1, 0}};
  CpuBackend fast_{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
  // More threads than a token alone has work items: the thread count changes no bit either.
  CpuBackend many_{CpuBackendOptions{CpuPath::kFast, 12, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};

  // The batch on the exact kernel against the reference path; each token bit-equal to itself
  // alone (on 2 and 12 threads), and the batch to itself on each of `threads`.
  void ExpectMatchesReferenceAndBatchInvariant(const RandomBatch& rb, float scale, std::initializer_list<int> threads) {
    std::vector<float> out_ref(rb.q.size()), out_fast(rb.q.size());
    const AttentionBatch batch = rb.Batch();
    ref_.PagedAttention(rb.q.data(), batch, rb.layout, rb.layer, rb.cache.data(), rb.q_heads, scale, out_ref.data());
    fast_.PagedAttention(rb.q.data(), batch, rb.layout, rb.layer, rb.cache.data(), rb.q_heads, scale, out_fast.data());
    EXPECT_TRUE(AllClose(out_fast, out_ref, 1e-5, 1e-4));
    ExpectEachTokenAsAlone(fast_, rb, scale, out_fast);
    ExpectEachTokenAsAlone(many_, rb, scale, out_fast);
    for (int n : threads) {
      CpuBackend other{CpuBackendOptions{CpuPath::kFast, n, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
      std::vector<float> o(rb.q.size());
      other.PagedAttention(rb.q.data(), batch, rb.layout, rb.layer, rb.cache.data(), rb.q_heads, scale, o.data());
      EXPECT_EQ(0, std::memcmp(o.data(), out_fast.data(), o.size() * sizeof(float))) << n << " threads";
    }
  }
};

// Paged attention over sequences of different lengths with scattered block tables, against an
// independent dense computation per sequence.
TEST_F(PagedAttentionTest, PagedAttentionMatchesDenseAttention) {
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeShortName(kv_dtype));
    KvLayout layout;
    layout.num_blocks = 40;
    layout.num_layers = 2;
    layout.block_size = 4;
    layout.kv_heads = 2;
    layout.head_dim = 8;
    layout.dtype = kv_dtype;
    const int64_t qh = 6, layer = 1;
    // The last is longer than the kernel's chunk of 32 keys, and not a multiple of it.
    const std::vector<int64_t> lens = {1, 5, 17, 9, 75};
    const int64_t max_blocks = 19;
    std::vector<int32_t> tables(lens.size() * max_blocks, 0);
    std::vector<int32_t> free_blocks(layout.num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::mt19937 gen(21);
    std::shuffle(free_blocks.begin(), free_blocks.end(), gen);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t b = 0; b < (lens[s] + 3) / 4; ++b) tables[s * max_blocks + b] = free_blocks[next++];
    }
    // Write K/V for every position of every sequence.
    std::vector<uint8_t> cache(layout.num_blocks * layout.BlockBytes());
    std::vector<uint8_t> cache_fast(cache.size());
    std::vector<std::vector<float>> ks, vs;
    for (size_t s = 0; s < lens.size(); ++s) {
      ks.push_back(RandomFloats(lens[s] * 16, 30 + s));
      vs.push_back(RandomFloats(lens[s] * 16, 40 + s));
      std::vector<int64_t> slots(lens[s]);
      for (int64_t p = 0; p < lens[s]; ++p) slots[p] = tables[s * max_blocks + p / 4] * 4 + p % 4;
      ref_.WriteKv(ks[s].data(), vs[s].data(), slots.data(), lens[s], layout, layer, cache.data());
      fast_.WriteKv(ks[s].data(), vs[s].data(), slots.data(), lens[s], layout, layer, cache_fast.data());
    }
    EXPECT_TRUE(cache == cache_fast) << "fast WriteKv wrote different bytes";
    // Queries: the last token of each sequence (decode) plus every token of sequence 2 (prefill).
    std::vector<int32_t> token_seq, token_pos;
    for (size_t s = 0; s < lens.size(); ++s) {
      token_seq.push_back(static_cast<int32_t>(s));
      token_pos.push_back(static_cast<int32_t>(lens[s] - 1));
    }
    for (int64_t p = 0; p < lens[2]; ++p) {
      token_seq.push_back(2);
      token_pos.push_back(static_cast<int32_t>(p));
    }
    const int64_t t = token_seq.size();
    auto q = RandomFloats(t * qh * 8, 50);
    AttentionBatch batch{token_seq.data(), token_pos.data(), tables.data(), t,
                         static_cast<int64_t>(lens.size()), max_blocks};
    const float scale = 1.0f / std::sqrt(8.0f);
    std::vector<float> out_ref(t * qh * 8), out_fast(t * qh * 8);
    ref_.PagedAttention(q.data(), batch, layout, layer, cache.data(), qh, scale, out_ref.data());
    fast_.PagedAttention(q.data(), batch, layout, layer, cache.data(), qh, scale, out_fast.data());
    EXPECT_TRUE(AllClose(out_fast, out_ref, 1e-5, 1e-4));
    // Dense oracle from the unpaged K/V (rounded like the cache).
    auto round = [&](float v) { return kv_dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : v; };
    std::vector<float> dense(t * qh * 8);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t s = token_seq[i], ctx = token_pos[i] + 1;
      for (int64_t h = 0; h < qh; ++h) {
        const int64_t g = h / 3;
        std::vector<double> sc(ctx);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < ctx; ++j) {
          double d = 0;
          for (int64_t e = 0; e < 8; ++e) d += q[(i * qh + h) * 8 + e] * round(ks[s][(j * 2 + g) * 8 + e]);
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto& v : sc) sum += v = std::exp(v - mx);
        for (int64_t e = 0; e < 8; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < ctx; ++j) acc += sc[j] * round(vs[s][(j * 2 + g) * 8 + e]);
          dense[(i * qh + h) * 8 + e] = static_cast<float>(acc / sum);
        }
      }
    }
    EXPECT_TRUE(AllClose(out_ref, dense, 1e-6, 1e-5));
    // Tile invariance: each prefill token of sequence 2 (computed above in tiles of
    // consecutive tokens) gives bitwise the same output when it is the only query.
    for (int64_t i = static_cast<int64_t>(lens.size()); i < t; ++i) {
      AttentionBatch one{&token_seq[i], &token_pos[i], tables.data(), 1, static_cast<int64_t>(lens.size()), max_blocks};
      std::vector<float> alone(qh * 8);
      fast_.PagedAttention(q.data() + i * qh * 8, one, layout, layer, cache.data(), qh, scale, alone.data());
      EXPECT_EQ(0, std::memcmp(alone.data(), out_fast.data() + i * qh * 8, alone.size() * sizeof(float)))
          << "token at position " << token_pos[i] << " depends on its tile mates";
    }
  }
}

// Many sequences (more work items than the threads: each item then takes all of a tile's kv
// heads) against each token computed alone (one kv head per item), bit for bit, and against the
// reference path; fresh random lengths, block tables and values each run.
TEST_F(PagedAttentionTest, ATokensOutputDoesNotDependOnHowTheBatchIsSplit) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeShortName(kv_dtype));
    const KvLayout layout = Layout(3, 8, 4, 24, kv_dtype);
    const RandomBatch rb = MakeRandomBatch(ref_, layout, /*layer=*/2, /*q_heads=*/8, /*seqs=*/21, /*max_blocks=*/20,
                                           /*every=*/3, /*chunk=*/20, /*spread=*/1.0f, gen);
    ExpectMatchesReferenceAndBatchInvariant(rb, 1.0f / std::sqrt(24.0f), {});
  }
}

// Contexts past 512 keys: the exact kernel takes them in 512-key chunks folded in order, one
// chunk an item where tiles are few (most tokens alone, the batches of 2 and 3 sequences) and all
// of a tile's chunks an item where they are many (17 sequences); prefill tiles straddle the
// chunk boundaries at 512 and 1536 (fixed lengths 530 and 1560). Against the reference path and
// bit for bit against each token alone and other thread counts.
TEST_F(PagedAttentionTest, LongContextsInChunksMatchTheReferenceAndAreBatchInvariant) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  struct Case {
    int64_t seqs, chunk;
    std::vector<int64_t> lens;  // random where empty
  };
  // The last: 65 chunks, folded in turn (and split over the threads when alone).
  const Case cases[] = {{2, 40, {}}, {17, 3, {}}, {3, 40, {530, 1100, 1560}}, {1, 1, {33000}}};
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    for (const auto& [seqs, chunk, lens] : cases) {
      SCOPED_TRACE(::testing::Message() << DTypeShortName(kv_dtype) << ", " << seqs << " sequences");
      const KvLayout layout = Layout(2, 16, 4, 32, kv_dtype);
      const int64_t max_blocks = lens.empty() ? 100 : (*std::max_element(lens.begin(), lens.end()) + 15) / 16;
      const RandomBatch rb = MakeRandomBatch(ref_, layout, /*layer=*/1, /*q_heads=*/8, seqs, max_blocks,
                                             /*every=*/2, chunk, /*spread=*/1.0f, gen, lens);
      ExpectMatchesReferenceAndBatchInvariant(rb, 1.0f / std::sqrt(32.0f), {3, 5});
    }
  }
}

}  // namespace
}  // namespace moeserve
