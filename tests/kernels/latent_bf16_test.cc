// Latent (MLA) attention of the bf16 variants (vdpbf16ps, kernels/cpu/attention_latent.h; AMX tiles,
// attention_amx.h, on the hardware and on the model of the tiles):
// against float64 attention over the same bf16 cache with the queries rounded as the kernel
// rounds them, within the bound of the rest (kernels/cpu/attention_bound.h); every token bit-equal to itself alone, and the
// batch to itself on other thread counts. Shapes the kernel does not take stay on the exact kernel,
// whose long contexts in chunks are checked the same way (LatentExactTest).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/fast_ops.h"
#include "tests/kernels/bf16_attention_checks.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::RandomFloats;

class LatentBf16Test : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::Bf16AttentionSkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  CpuBackend Make(int threads) const {
    return testing::VariantBackend(GetParam(), threads);
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, LatentBf16Test,
                         ::testing::ValuesIn(testing::kBf16AttentionVariants),
                         [](const auto& info) { return testing::VariantParamName(info.param); });

// Sequences of the given lengths in scattered blocks of 16, written through the backend; a decode
// token for each and a prefill chunk of the last `chunk` tokens of the first.
struct LatentBatch {
  KvLayout layout;
  int64_t heads = 0, r = 0, max_blocks = 0;
  std::vector<int32_t> tables, token_seq, token_pos;
  std::vector<uint8_t> cache;
  std::vector<float> q_latent, q_rope;
  int64_t tokens() const { return static_cast<int64_t>(token_seq.size()); }
  AttentionBatch Batch() const {
    return {token_seq.data(), token_pos.data(), tables.data(), tokens(), static_cast<int64_t>(tables.size()) / max_blocks,
            max_blocks};
  }
};

LatentBatch MakeLatentBatch(CpuBackend& b, int64_t r, int64_t dr, int64_t heads, const std::vector<int64_t>& lens,
                            int64_t chunk, std::mt19937& gen) {
  LatentBatch lb;
  lb.heads = heads;
  lb.r = r;
  lb.layout.num_layers = 2;
  lb.layout.block_size = 16;
  lb.layout.kv_heads = 1;
  lb.layout.head_dim = r + dr;
  lb.layout.planes = 1;
  lb.layout.dtype = DType::kBF16;
  int64_t blocks = 0;
  for (int64_t l : lens) {
    blocks += (l + 15) / 16;
    lb.max_blocks = std::max(lb.max_blocks, (l + 15) / 16);
  }
  lb.layout.num_blocks = blocks;
  std::vector<int32_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  lb.tables.assign(lens.size() * lb.max_blocks, 0);
  lb.cache.assign(static_cast<size_t>(blocks) * lb.layout.BlockBytes(), 0);
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int64_t> slots(static_cast<size_t>(lens[s]));
    for (int64_t k = 0; k < (lens[s] + 15) / 16; ++k) lb.tables[s * lb.max_blocks + k] = order[next++];
    for (int64_t p = 0; p < lens[s]; ++p) slots[p] = lb.tables[s * lb.max_blocks + p / 16] * 16 + p % 16;
    const auto lat = RandomFloats(lens[s] * r, gen(), 1.0f), rope = RandomFloats(lens[s] * dr, gen(), 1.0f);
    b.WriteLatentKv(lat.data(), rope.data(), slots.data(), lens[s], r, lb.layout, 1, lb.cache.data());
    const int64_t n = s == 0 ? std::min(lens[s], chunk) : 1;
    for (int64_t p = lens[s] - n; p < lens[s]; ++p) {
      lb.token_seq.push_back(static_cast<int32_t>(s));
      lb.token_pos.push_back(static_cast<int32_t>(p));
    }
  }
  lb.q_latent = RandomFloats(lb.tokens() * heads * r, gen(), 2.0f);
  lb.q_rope = RandomFloats(lb.tokens() * heads * dr, gen(), 2.0f);
  return lb;
}

// `bf16`: the backend's latent kernel rounds queries and probabilities to bf16 (the bound allows
// for it, and the exact kernel must give other bits); else it is the exact kernel.
void ExpectWithinBoundAndBatchInvariant(const std::function<CpuBackend(int)>& make, int64_t r, int64_t dr,
                                        int64_t heads, const std::vector<int64_t>& lens, int64_t chunk,
                                        std::mt19937& gen, bool bf16 = true) {
  SCOPED_TRACE(::testing::Message() << "latent " << r << " + rope " << dr << ", " << heads << " heads, "
                                    << lens.size() << " sequences");
  CpuBackend b = make(2);
  const LatentBatch lb = MakeLatentBatch(b, r, dr, heads, lens, chunk, gen);
  const int64_t hd = r + dr, t = lb.tokens();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> out(static_cast<size_t>(t * heads * r));
  b.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), heads, r,
                          scale, out.data());
  auto cached = [&](int64_t s, int64_t j, int64_t e) {
    const int64_t off = lb.layout.Offset(lb.tables[s * lb.max_blocks + j / 16], 1, 0, j % 16) + e;
    return static_cast<double>(Bf16ToF32(reinterpret_cast<const uint16_t*>(lb.cache.data())[off]));
  };
  cpu_fast::AttentionBound check;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t s = lb.token_seq[i], ctx = lb.token_pos[i] + 1;
    for (int64_t h = 0; h < heads; ++h) {
      auto q = [&](int64_t e) {
        return e < r ? double{lb.q_latent[(i * heads + h) * r + e]} : double{lb.q_rope[(i * heads + h) * dr + e - r]};
      };
      auto row = [&](int64_t j, int64_t e) { return cached(s, j, e); };  // the latent doubles as the value
      cpu_fast::CheckAttentionRow(ctx, hd, r, scale, bf16, q, row, row, out.data() + (i * heads + h) * r, &check);
    }
  }
  EXPECT_LE(check.worst, 1.0) << "largest error " << check.worst_err << " is " << check.worst << " of its bound";
  for (int threads : {2, 12}) {  // each token alone: on more threads than its items, too
    CpuBackend other = make(threads);
    for (int64_t i = 0; i < t; ++i) {
      const AttentionBatch one{&lb.token_seq[i], &lb.token_pos[i], lb.tables.data(), 1,
                               static_cast<int64_t>(lens.size()), lb.max_blocks};
      std::vector<float> alone(static_cast<size_t>(heads * r));
      other.PagedLatentAttention(lb.q_latent.data() + i * heads * r, lb.q_rope.data() + i * heads * dr, one, lb.layout,
                                 1, lb.cache.data(), heads, r, scale, alone.data());
      ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + i * heads * r, alone.size() * sizeof(float)))
          << "sequence " << lb.token_seq[i] << " position " << lb.token_pos[i] << ", " << threads
          << " threads: differs from the same token alone";
    }
  }
  std::vector<float> other(out.size());
  make(5).PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(),
                                  heads, r, scale, other.data());
  EXPECT_EQ(0, std::memcmp(other.data(), out.data(), out.size() * sizeof(float))) << "5 threads";
  if (!bf16) return;
  // And it ran the bf16 kernel: the exact one (fp32 queries and probabilities) gives other bits.
  CpuBackend exact{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
  exact.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), heads, r,
                             scale, other.data());
  EXPECT_NE(0, std::memcmp(other.data(), out.data(), out.size() * sizeof(float))) << "the exact kernel's bits";
}

// DeepSeek-mini's latent (256 + 32), DeepSeek-V3's (512 + 64: four 128-value blocks of the
// weighted sum), and smaller ones; heads not a multiple of the 8 an item takes; contexts from 1
// to past a 64-key value pass, odd and even, and a prefill chunk whose rows end at different keys.
// Then a decode batch of 9 tokens, whose items take up to 32 heads (40: 32 + 8), each token
// alone taking 8; then contexts of several 512-key chunks, folded in order.
TEST_P(LatentBf16Test, WithinTheRoundingBoundAndBatchInvariant) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{256, 32, 16}, {512, 64, 3}, {64, 32, 11}, {128, 64, 9},
                                                          {32, 32, 5}};
  for (const auto& [r, dr, heads] : shapes) {
    ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, r, dr, heads, {150, 1, 33, 64, 97}, 40,
                                       gen);
  }
  ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, 128, 64, 40, {70, 1, 2, 33, 64, 97, 5, 16, 31},
                                     1, gen);
  // Contexts past the 512-key chunks: a prefill chunk across the boundary at 1024 (tokens
  // 1010-1049), decodes at 513, 600 and 1537 (four chunks, the last of one key).
  ExpectWithinBoundAndBatchInvariant([&](int n) { return Make(n); }, 256, 32, 16, {1050, 513, 600, 1537}, 40, gen);
}

// The exact latent kernel (fp32 queries and probabilities; --cpu-kernel exact, an f32 cache, or a
// shape the bf16 kernel does not take) in the same 512-key chunks, folded in order: within the
// bound of its arithmetic and batch-invariant, from one chunk to four.
TEST(LatentExactTest, LongContextsInChunksWithinTheBoundAndBatchInvariant) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  auto make = [](int threads) {
    return CpuBackend{CpuBackendOptions{CpuPath::kFast, threads, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
  };
  ExpectWithinBoundAndBatchInvariant(make, 64, 32, 11, {150, 1, 33, 64, 97}, 40, gen, /*bf16=*/false);
  ExpectWithinBoundAndBatchInvariant(make, 256, 32, 16, {1050, 513, 600, 1537}, 40, gen, /*bf16=*/false);
}

// The amx_model latent kernel is the tile kernel, not a fallback to vdpbf16ps: over a random
// batch some outputs differ in their last bits (the scores' products summed in other orders).
TEST(AmxModelLatentTest, IsNotTheVdpbf16psKernel) {
  if (const std::string why = testing::Bf16AttentionSkipReason(CpuIsa::kAmxModel); !why.empty()) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  CpuBackend model = testing::VariantBackend(CpuIsa::kAmxModel), dot = testing::VariantBackend(CpuIsa::kAvx512Bf16);
  const LatentBatch lb = MakeLatentBatch(dot, 256, 32, 8, {150, 33, 600}, 20, gen);
  std::vector<float> a(static_cast<size_t>(lb.tokens() * 8 * 256)), b(a.size());
  model.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), 8, 256,
                             0.06f, a.data());
  dot.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), 8, 256,
                           0.06f, b.data());
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "the avx512-bf16 kernel's bits";
}

// A latent the bf16 kernel does not take (24 values: not whole 32-value blocks) runs the exact
// kernel on these variants too: its output equals the exact numerics' bit for bit.
TEST_P(LatentBf16Test, ShapesItDoesNotTakeRunTheExactKernel) {
  std::mt19937 gen(3);
  CpuBackend b = Make(2);
  CpuBackend exact{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
  const LatentBatch lb = MakeLatentBatch(b, 24, 8, 5, {40, 7}, 10, gen);
  std::vector<float> got(static_cast<size_t>(lb.tokens() * 5 * 24)), want(got.size());
  b.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), 5, 24, 0.2f,
                          got.data());
  exact.PagedLatentAttention(lb.q_latent.data(), lb.q_rope.data(), lb.Batch(), lb.layout, 1, lb.cache.data(), 5, 24,
                             0.2f, want.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

}  // namespace
}  // namespace moeserve
