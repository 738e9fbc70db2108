// Paged attention on the CPU fast path: against the reference path and an independent dense
// computation, over scattered block tables, and batch-invariant (a token's output never depends
// on its batch or tile mates, nor on how the kernel splits the batch into work items, nor on the
// thread count).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/bf16_attention_checks.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::AllClose;
using testing::RandomFloats;

// A cache layout of `layers` layers, `block` tokens a block, `kvh` kv heads of `hd`.
KvLayout Layout(int64_t layers, int64_t block, int64_t kvh, int64_t hd, DType dtype) {
  KvLayout layout;
  layout.num_layers = layers;
  layout.block_size = block;
  layout.kv_heads = kvh;
  layout.head_dim = hd;
  layout.dtype = dtype;
  return layout;
}

// Sequences of random lengths in scattered blocks of a fresh cache (random K and V, written by
// `writer`), a decode token for each and a prefill chunk of up to `chunk` tokens for every
// `every`-th, and random queries; keys and queries drawn `spread` times wider than values.
// `lens`, if given, fixes the sequences' lengths (one each).
struct RandomBatch {
  KvLayout layout;
  int64_t layer = 0, q_heads = 0, seqs = 0, max_blocks = 0;
  std::vector<int32_t> tables, token_seq, token_pos;
  std::vector<uint8_t> cache;
  std::vector<float> q;
  int64_t tokens() const { return static_cast<int64_t>(token_seq.size()); }
  AttentionBatch Batch() const { return {token_seq.data(), token_pos.data(), tables.data(), tokens(), seqs, max_blocks}; }
  // Token i alone, as a batch of one.
  AttentionBatch One(int64_t i) const { return {&token_seq[i], &token_pos[i], tables.data(), 1, seqs, max_blocks}; }
};

RandomBatch MakeRandomBatch(Backend& writer, const KvLayout& layout, int64_t layer, int64_t q_heads, int64_t seqs,
                            int64_t max_blocks, int64_t every, int64_t chunk, float spread, std::mt19937& gen,
                            const std::vector<int64_t>& lens_given = {}) {
  if (!lens_given.empty()) {
    EXPECT_EQ(static_cast<int64_t>(lens_given.size()), seqs) << "one length a sequence";
  }
  RandomBatch rb;
  rb.layout = layout;
  rb.layer = layer;
  rb.q_heads = q_heads;
  rb.seqs = seqs;
  rb.max_blocks = max_blocks;
  const int64_t bs = layout.block_size, te = layout.TokenElems();
  std::vector<int64_t> lens = lens_given;
  if (lens.empty()) {
    lens.resize(static_cast<size_t>(seqs));
    for (auto& l : lens) l = std::uniform_int_distribution<int64_t>(1, max_blocks * bs)(gen);
  }
  int64_t blocks = 0;
  for (int64_t l : lens) blocks += (l + bs - 1) / bs;
  rb.layout.num_blocks = blocks;
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  rb.tables.assign(static_cast<size_t>(seqs * max_blocks), 0);
  rb.cache.assign(static_cast<size_t>(blocks) * rb.layout.BlockBytes(), 0);
  size_t next = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    std::vector<int64_t> slots(static_cast<size_t>(lens[s]));
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) rb.tables[s * max_blocks + b] = order[next++];
    for (int64_t p = 0; p < lens[s]; ++p) slots[p] = rb.tables[s * max_blocks + p / bs] * bs + p % bs;
    const auto k = RandomFloats(lens[s] * te, gen(), spread), v = RandomFloats(lens[s] * te, gen());
    writer.WriteKv(k.data(), v.data(), slots.data(), lens[s], rb.layout, layer, rb.cache.data());
    const int64_t n = s % every == 0 ? std::min(lens[s], chunk) : 1;
    for (int64_t p = lens[s] - n; p < lens[s]; ++p) {
      rb.token_seq.push_back(static_cast<int32_t>(s));
      rb.token_pos.push_back(static_cast<int32_t>(p));
    }
  }
  rb.q = RandomFloats(rb.tokens() * q_heads * layout.head_dim, gen(), spread);
  return rb;
}

// Every token of `out` (the whole batch on `b`) is bit-equal to itself computed alone. On the
// amx kernel a token alone is an item of `group` rows, whose keys are read from the cache as A
// tiles, while the batch's prefill tiles (more than 16 rows) score against packed keys as B
// tiles: this also checks that the two operand orders give the same bits on this hardware.
void ExpectEachTokenAsAlone(Backend& b, const RandomBatch& rb, float scale, const std::vector<float>& out) {
  const int64_t row = rb.q_heads * rb.layout.head_dim;
  for (int64_t i = 0; i < rb.tokens(); ++i) {
    std::vector<float> alone(static_cast<size_t>(row));
    b.PagedAttention(rb.q.data() + i * row, rb.One(i), rb.layout, rb.layer, rb.cache.data(), rb.q_heads, scale,
                     alone.data());
    ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + i * row, alone.size() * sizeof(float)))
        << "sequence " << rb.token_seq[i] << " position " << rb.token_pos[i] << ": differs from the same token alone";
  }
}

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

// Contexts past 512 keys: the exact kernel takes them in 512-key chunks weighed together, one
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
  // The last: 65 chunks, more than CombineChunks weighs in one pass (64).
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

// The bf16 path of the avx512-bf16 and amx variants (queries and probabilities rounded to bf16,
// vdpbf16ps) against float64 attention over the same cache with the queries rounded as the
// kernel rounds them, within the bound of what is left (kernels/cpu/attention_bound.h: fp32 sums,
// the exponential, the probabilities' bf16 rounding, against sum_j p_j |v_j|; scores 0.5% off
// fail it). And batch-invariant: every token equals itself computed alone, with many tiles and
// with few.
class PagedAttentionBf16Test : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::Bf16AttentionSkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  CpuBackend Backend(int threads = 2) const {
    return CpuBackend{CpuBackendOptions{CpuPath::kFast, threads, 0, true, GetParam(), CpuKernelNumerics::kFastest}};
  }
};

INSTANTIATE_TEST_SUITE_P(Variants, PagedAttentionBf16Test, ::testing::Values(CpuIsa::kAvx512Bf16, CpuIsa::kAmx),
                         [](const auto& info) { return std::string(info.param == CpuIsa::kAmx ? "amx" : "avx512bf16"); });

// One random batch of `seqs` sequences of up to `max_blocks` blocks of 16 (every other one a
// prefill chunk of up to `chunk` tokens) against float64 attention and against itself computed
// alone (on 2 and 12 threads), and the batch to itself on 3, 5 and 9.
void ExpectWithinBoundAndBatchInvariant(const std::function<CpuBackend(int)>& backend,
                                        int64_t kvh, int64_t hd, int64_t seqs, int64_t max_blocks, int64_t chunk,
                                        std::mt19937& gen, const std::vector<int64_t>& lens = {}) {
  SCOPED_TRACE(::testing::Message() << kvh << " kv heads of " << hd << ", " << seqs << " sequences of up to "
                                    << max_blocks * 16 << " tokens");
  CpuBackend bf16 = backend(2);
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
  CpuBackend many = backend(12);  // more threads than a token alone has items
  ExpectEachTokenAsAlone(many, rb, scale, out);
  // Other thread counts split the work otherwise (an item takes the most kv heads that leave
  // four items a thread: two of four, two or three of six, for some tile counts; long contexts
  // split by chunk or not).
  for (int threads : {3, 5, 9}) {
    std::vector<float> other(q.size());
    backend(threads).PagedAttention(q.data(), rb.Batch(), rb.layout, layer, rb.cache.data(), qh, scale, other.data());
    EXPECT_EQ(std::memcmp(other.data(), out.data(), out.size() * sizeof(float)), 0) << threads << " threads";
  }
}

TEST_P(PagedAttentionBf16Test, RoundsQueriesAndProbabilitiesWithinTheirBoundAndIsBatchInvariant) {
  CpuBackend bf16 = Backend();
  ASSERT_TRUE(bf16.Bf16Attention());
  ASSERT_EQ(bf16.AmxAttention(), GetParam() == CpuIsa::kAmx);
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
      ExpectWithinBoundAndBatchInvariant([&](int n) { return Backend(n); }, kvh, hd, seqs, /*max_blocks=*/12,
                                         /*chunk=*/seqs == 3 ? 70 : 21, gen);  // 70: whole 64-token amx tiles
    }
  }
}

// Contexts past kAttentionChunkKeys (512): the avx512-bf16 kernel takes them in chunks, one an
// item where tiles are few (most tokens alone, 2 or 3 sequences), all of a tile's in one item
// where they are many (17), weighed together afterwards; prefill tiles straddle the boundaries
// at 512 and 1536. The same bound and the same bits. (The amx kernel takes contexts whole.)
TEST_P(PagedAttentionBf16Test, LongContextsInChunksStayWithinTheBoundAndBatchInvariant) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const auto& [kvh, hd] : {std::pair<int64_t, int64_t>{4, 64}, {2, 128}}) {
    for (int64_t seqs : {2, 17}) {
      ExpectWithinBoundAndBatchInvariant([&](int n) { return Backend(n); }, kvh, hd, seqs, /*max_blocks=*/100,
                                         /*chunk=*/seqs == 2 ? 40 : 3, gen);
    }
    // Prefill tiles across chunk boundaries (tokens 490-529 and 1520-1559) and a decode at 1099.
    ExpectWithinBoundAndBatchInvariant([&](int n) { return Backend(n); }, kvh, hd, 3, /*max_blocks=*/100,
                                       /*chunk=*/40, gen, {530, 1100, 1560});
    // 65 chunks: more than CombineChunks weighs in one pass.
    ExpectWithinBoundAndBatchInvariant([&](int n) { return Backend(n); }, kvh, hd, 1, /*max_blocks=*/2063,
                                       /*chunk=*/1, gen, {33000});
  }
}

// A key or value that is not finite reaches only the tokens that attend it: earlier tokens of the
// same prefill tile (which share the kernel's key and value passes) stay finite and equal to
// themselves alone. The amx variant's tiles take the 32 keys below a row's context in whole
// steps: tokens 32-38 take one step and then the pairs of their own keys.
TEST_P(PagedAttentionBf16Test, ALaterTokensValuesNeverReachAnEarlierToken) {
  CpuBackend bf16 = Backend();
  // The bad row is key 39, the second of a pair: token 38 (39 keys) ends on that pair's first.
  const int64_t hd = 64, qh = 4, len = 40;
  KvLayout layout;
  layout.num_blocks = 3;
  layout.num_layers = 1;
  layout.block_size = 16;
  layout.kv_heads = 1;
  layout.head_dim = hd;
  layout.dtype = DType::kBF16;
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
