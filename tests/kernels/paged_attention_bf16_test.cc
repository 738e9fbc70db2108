// Paged attention of the bf16 variants (avx512-bf16, amx) over a bf16 cache: within the bound of
// their arithmetic against float64, batch-invariant, and no value past a row's own keys reaching
// it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fast_ops.h"
#include "tests/kernels/bf16_attention_checks.h"
#include "tests/kernels/random_paged_batch.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::ExpectEachTokenAsAlone;
using testing::Layout;
using testing::MakeRandomBatch;
using testing::RandomBatch;
using testing::RandomFloats;

// The bf16 path of the avx512-bf16 and amx variants (queries and probabilities rounded to bf16,
// vdpbf16ps) against float64 attention over the same cache with the queries rounded as the
// kernel rounds them, within the bound of what is left (kernels/cpu/attention_bound.h: fp32 sums,
// the exponential, the probabilities' bf16 rounding, against sum_j p_j |v_j|; scores 0.5% off
// fail it). And batch-invariant: every token equals itself computed alone, with many tiles and
// with few. On each variant of kBf16AttentionVariants (amx-model too).
class PagedAttentionBf16Test : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::Bf16AttentionSkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  CpuBackend Make(int threads = 2) const {
    return testing::VariantBackend(GetParam(), threads);
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, PagedAttentionBf16Test,
                         ::testing::ValuesIn(testing::kBf16AttentionVariants),
                         [](const auto& info) { return testing::VariantParamName(info.param); });

// One random batch of `seqs` sequences of up to `max_blocks` blocks of 16 (every other one a
// prefill chunk of up to `chunk` tokens) against float64 attention and against itself computed
// alone (on 2 and 12 threads), and the batch to itself on 3, 5 and 9.
void ExpectWithinBoundAndBatchInvariant(const std::function<CpuBackend(int)>& make,
                                        int64_t kvh, int64_t hd, int64_t seqs, int64_t max_blocks, int64_t chunk,
                                        std::mt19937& gen, const std::vector<int64_t>& lens = {}) {
  SCOPED_TRACE(::testing::Message() << kvh << " kv heads of " << hd << ", " << seqs << " sequences of up to "
                                    << max_blocks * 16 << " tokens");
  CpuBackend bf16 = make(2);
  const KvLayout layout = Layout(2, 16, kvh, hd, DType::kBF16);
  const int64_t qh = 3 * kvh, layer = 1;
  const RandomBatch rb = MakeRandomBatch(bf16, layout, layer, qh, seqs, max_blocks, /*every=*/2, chunk,
                                         /*spread=*/2.0f, gen, lens);
  const int64_t t = rb.tokens();
  const std::vector<float>& q = rb.q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> out(q.size());
  bf16.PagedAttention(q.data(), rb.Batch(), rb.layout, layer, rb.cache.data(), qh, scale, out.data());
  auto cached = [&](int kv, int64_t s, int64_t j, int64_t g, int64_t i) {
    const int64_t off = rb.layout.Offset(rb.tables[s * max_blocks + j / 16], layer, kv, j % 16) + g * hd + i;
    return static_cast<double>(Bf16ToF32(reinterpret_cast<const uint16_t*>(rb.cache.data())[off]));
  };
  cpu_fast::AttentionBound check;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t s = rb.token_seq[i], ctx = rb.token_pos[i] + 1;
    for (int64_t h = 0; h < qh; ++h) {
      const int64_t g = h / 3;
      const float* qr = q.data() + (i * qh + h) * hd;
      cpu_fast::CheckAttentionRow(
          ctx, hd, hd, scale, /*bf16=*/true, [&](int64_t e) { return double{qr[e]}; },
          [&](int64_t j, int64_t e) { return cached(0, s, j, g, e); },
          [&](int64_t j, int64_t e) { return cached(1, s, j, g, e); }, out.data() + (i * qh + h) * hd, &check);
    }
  }
  EXPECT_LE(check.worst, 1.0) << "largest error " << check.worst_err << " is " << check.worst << " of its bound";
  ExpectEachTokenAsAlone(bf16, rb, scale, out);
  CpuBackend many = make(12);  // more threads than a token alone has items
  ExpectEachTokenAsAlone(many, rb, scale, out);
  // Other thread counts split the work otherwise (an item takes the most kv heads that leave
  // four items a thread: two of four, two or three of six, for some tile counts; long contexts
  // split by chunk or not).
  for (int threads : {3, 5, 9}) {
    std::vector<float> other(q.size());
    make(threads).PagedAttention(q.data(), rb.Batch(), rb.layout, layer, rb.cache.data(), qh, scale, other.data());
    EXPECT_EQ(std::memcmp(other.data(), out.data(), out.size() * sizeof(float)), 0) << threads << " threads";
  }
}

TEST_P(PagedAttentionBf16Test, RoundsQueriesAndProbabilitiesWithinTheirBoundAndIsBatchInvariant) {
  CpuBackend bf16 = Make();
  ASSERT_TRUE(bf16.Bf16Attention());
  ASSERT_EQ(bf16.AmxAttention(), IsAmx(GetParam()));
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  // Items of many tiles take all kv heads side by side (a key transposition takes up to 256
  // dimensions: 4 x 128 in two; a value block up to 4 heads of up to 64, 2 of 128: 6 x 64 as 4 + 2);
  // a token alone takes as few as leave its items a multiple of the threads.
  const std::pair<int64_t, int64_t> shapes[] = {{2, 32}, {2, 64}, {2, 128}, {2, 256}, {4, 64}, {4, 128}, {5, 32}, {6, 64}};
  for (const auto& [kvh, hd] : shapes) {
    for (int64_t seqs : {3, 19}) {
      ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, kvh, hd, seqs, /*max_blocks=*/12,
                                         /*chunk=*/seqs == 3 ? 70 : 21, gen);  // 70: whole 64-token amx tiles
    }
  }
}

// Contexts past kAttentionChunkKeys (512): the avx512-bf16 kernel takes them in chunks, one an
// item where tiles are few (most tokens alone, 2 or 3 sequences), all of a tile's in one item
// where they are many (17), folded in order; prefill tiles straddle the boundaries
// at 512 and 1536. The same bound and the same bits. The amx kernel as well (its tiles over each
// chunk's whole 32-key steps).
TEST_P(PagedAttentionBf16Test, LongContextsInChunksStayWithinTheBoundAndBatchInvariant) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const auto& [kvh, hd] : {std::pair<int64_t, int64_t>{4, 64}, {2, 128}}) {
    for (int64_t seqs : {2, 17}) {
      ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, kvh, hd, seqs, /*max_blocks=*/100,
                                         /*chunk=*/seqs == 2 ? 40 : 3, gen);
    }
    // Prefill tiles across chunk boundaries (tokens 490-529 and 1520-1559) and a decode at 1099.
    ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, kvh, hd, 3, /*max_blocks=*/100,
                                       /*chunk=*/40, gen, {530, 1100, 1560});
    // 65 chunks, folded in turn (and split over the threads when alone).
    ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, kvh, hd, 1, /*max_blocks=*/2063,
                                       /*chunk=*/1, gen, {33000});
  }
}

// The amx_model kernel is the tile kernel, not a fallback to vdpbf16ps: the two sum a score's
// products in other orders, so over a random batch some outputs differ in their last bits.
TEST(AmxModelAttentionTest, IsNotTheVdpbf16psKernel) {
  if (const std::string why = testing::Bf16AttentionSkipReason(CpuIsa::kAmxModel); !why.empty()) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  CpuBackend model = testing::VariantBackend(CpuIsa::kAmxModel), dot = testing::VariantBackend(CpuIsa::kAvx512Bf16);
  const KvLayout layout = Layout(2, 16, 2, 128, DType::kBF16);
  const RandomBatch rb = MakeRandomBatch(dot, layout, /*layer=*/1, /*q_heads=*/6, /*seqs=*/3,
                                         /*max_blocks=*/40, /*every=*/2, /*chunk=*/40, /*spread=*/2.0f, gen);
  std::vector<float> a(rb.q.size()), b(rb.q.size());
  model.PagedAttention(rb.q.data(), rb.Batch(), rb.layout, 1, rb.cache.data(), 6, 0.09f, a.data());
  dot.PagedAttention(rb.q.data(), rb.Batch(), rb.layout, 1, rb.cache.data(), 6, 0.09f, b.data());
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "the avx512-bf16 kernel's bits";
}

// A key or value that is not finite reaches only the tokens that attend it: earlier tokens of the
// same prefill tile (which share the kernel's key and value passes) stay finite and equal to
// themselves alone. The amx variant's tiles take the 32 keys below a row's context in whole
// steps: tokens 32-38 take one step and then the pairs of their own keys.
TEST_P(PagedAttentionBf16Test, ALaterTokensValuesNeverReachAnEarlierToken) {
  CpuBackend bf16 = Make();
  // The bad row is key 39, the second of a pair: token 38 (39 keys) ends on that pair's first.
  const int64_t hd = 64, qh = 4, len = 40;
  KvLayout layout = Layout(/*layers=*/1, /*block=*/16, /*kvh=*/1, hd, DType::kBF16);
  layout.num_blocks = 3;
  std::vector<uint8_t> cache(layout.num_blocks * layout.BlockBytes());
  std::vector<int64_t> slots(len);
  std::iota(slots.begin(), slots.end(), 0);
  auto k = RandomFloats(len * hd, 5), v = RandomFloats(len * hd, 6);
  v[(len - 1) * hd + 3] = INFINITY;  // the last token's value row
  k[(len - 1) * hd + 5] = INFINITY;  // and its key
  bf16.WriteKv(k.data(), v.data(), slots.data(), len, layout, 0, cache.data());
  std::vector<int32_t> table = {0, 1, 2}, seq(len, 0), pos(len);
  std::iota(pos.begin(), pos.end(), 0);
  const auto q = RandomFloats(len * qh * hd, 7);
  std::vector<float> out(q.size());
  bf16.PagedAttention(q.data(), AttentionBatch{seq.data(), pos.data(), table.data(), len, 1, 3}, layout, 0,
                      cache.data(), qh, 0.125f, out.data());
  for (int64_t t = 0; t + 1 < len; ++t) {
    std::vector<float> alone(qh * hd);
    bf16.PagedAttention(q.data() + t * qh * hd, AttentionBatch{&seq[t], &pos[t], table.data(), 1, 1, 3}, layout, 0,
                        cache.data(), qh, 0.125f, alone.data());
    for (float x : alone) ASSERT_TRUE(std::isfinite(x)) << "token " << t;
    ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + t * qh * hd, alone.size() * sizeof(float))) << "token " << t;
  }
}

}  // namespace
}  // namespace moeserve
