// DeepSeek's CPU ops: latent attention (reference and fast path) against a dense oracle that
// expands the cached latent into per-head keys and values and attends the naive way (MLA's
// non-absorbed form), YaRN-capable RoPE against the theta RoPE, and the grouped router against
// a brute-force search over group choices.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

using testing::AllClose;
using testing::RandomFloats;

class LatentOpsTest : public ::testing::Test {
 protected:
  CpuBackend ref_{CpuBackendOptions{CpuPath::kReference, 1, 0}};
  CpuBackend fast_{CpuBackendOptions{CpuPath::kFast, 2, 0, true, CpuIsa::kAuto, CpuKernelNumerics::kExact}};
};

// Absorbed latent attention equals expanding the latent: with per-head up-projections Wk [dn, r]
// and Wv [dv, r], attention of q = [qn | qr] over keys [Wk c | rope] and values Wv c equals
// attention of q_latent = Wk^T qn (with qr) over the cached rows [c | rope], its output latent
// mapped by Wv.
TEST_F(LatentOpsTest, AbsorbedAttentionEqualsExpandedKeysAndValues) {
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeShortName(kv_dtype));
    const int64_t r = 16, dr = 8, dn = 12, dv = 8, heads = 11, layer = 1;
    KvLayout layout;
    layout.num_blocks = 40;
    layout.num_layers = 2;
    layout.block_size = 4;
    layout.kv_heads = 1;
    layout.head_dim = r + dr;
    layout.planes = 1;
    layout.dtype = kv_dtype;
    // The prefilled third and the last are longer than a value pass of 32 keys and than the 32
    // keys the kernel fetches ahead; the prefill's tiles end at different keys.
    const std::vector<int64_t> lens = {1, 6, 70, 9, 37};
    const int64_t max_blocks = 18;
    std::vector<int32_t> tables(lens.size() * max_blocks, 0);
    std::vector<int32_t> free_blocks(layout.num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::mt19937 gen(7);
    std::shuffle(free_blocks.begin(), free_blocks.end(), gen);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t b = 0; b < (lens[s] + 3) / 4; ++b) tables[s * max_blocks + b] = free_blocks[next++];
    }
    std::vector<uint8_t> cache(layout.num_blocks * layout.BlockBytes()), cache_fast(cache.size());
    std::vector<std::vector<float>> lat, rope;
    for (size_t s = 0; s < lens.size(); ++s) {
      lat.push_back(RandomFloats(lens[s] * r, 60 + s, 1.0f));
      rope.push_back(RandomFloats(lens[s] * dr, 70 + s, 1.0f));
      std::vector<int64_t> slots(lens[s]);
      for (int64_t p = 0; p < lens[s]; ++p) slots[p] = tables[s * max_blocks + p / 4] * 4 + p % 4;
      ref_.WriteLatentKv(lat[s].data(), rope[s].data(), slots.data(), lens[s], r, layout, layer, cache.data());
      fast_.WriteLatentKv(lat[s].data(), rope[s].data(), slots.data(), lens[s], r, layout, layer, cache_fast.data());
    }
    EXPECT_TRUE(cache == cache_fast);
    std::vector<int32_t> token_seq, token_pos;
    for (size_t s = 0; s < lens.size(); ++s) {
      token_seq.push_back(static_cast<int32_t>(s));
      token_pos.push_back(static_cast<int32_t>(lens[s] - 1));
    }
    for (int64_t p = 0; p < lens[2]; ++p) {
      token_seq.push_back(2);
      token_pos.push_back(static_cast<int32_t>(p));
    }
    const int64_t t = static_cast<int64_t>(token_seq.size());
    const auto qn = RandomFloats(t * heads * dn, 80, 1.0f), qr = RandomFloats(t * heads * dr, 81, 1.0f);
    const auto wk = RandomFloats(heads * dn * r, 82, 0.5f), wv = RandomFloats(heads * dv * r, 83, 0.5f);
    std::vector<float> ql(t * heads * r, 0.0f);  // q_latent = Wk^T qn per head
    for (int64_t i = 0; i < t * heads; ++i) {
      const int64_t h = i % heads;
      for (int64_t j = 0; j < r; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < dn; ++d) acc += double{qn[i * dn + d]} * wk[(h * dn + d) * r + j];
        ql[i * r + j] = static_cast<float>(acc);
      }
    }
    AttentionBatch batch{token_seq.data(), token_pos.data(), tables.data(), t, static_cast<int64_t>(lens.size()),
                         max_blocks};
    const float scale = 0.2f;
    std::vector<float> out_ref(t * heads * r), out_fast(t * heads * r);
    ref_.PagedLatentAttention(ql.data(), qr.data(), batch, layout, layer, cache.data(), heads, r, scale, out_ref.data());
    fast_.PagedLatentAttention(ql.data(), qr.data(), batch, layout, layer, cache.data(), heads, r, scale,
                               out_fast.data());
    EXPECT_TRUE(AllClose(out_fast, out_ref, 1e-5, 1e-4));
    auto round = [&](float v) { return kv_dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : v; };
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < t; ++i) {
      const int64_t s = token_seq[i], ctx = token_pos[i] + 1;
      for (int64_t h = 0; h < heads; ++h) {
        // Expanded: k_h[j] = [Wk_h c_j | rope_j], v_h[j] = Wv_h c_j, q_h = [qn | qr].
        std::vector<double> sc(ctx);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < ctx; ++j) {
          double d = 0;
          for (int64_t a = 0; a < dn; ++a) {
            double k = 0;
            for (int64_t b = 0; b < r; ++b) k += double{wk[(h * dn + a) * r + b]} * round(lat[s][j * r + b]);
            d += double{qn[(i * heads + h) * dn + a]} * k;
          }
          for (int64_t a = 0; a < dr; ++a) d += double{qr[(i * heads + h) * dr + a]} * round(rope[s][j * dr + a]);
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        for (auto& v : sc) sum += v = std::exp(v - mx);
        for (int64_t a = 0; a < dv; ++a) {
          double want = 0, got = 0;
          for (int64_t j = 0; j < ctx; ++j) {
            double v = 0;
            for (int64_t b = 0; b < r; ++b) v += double{wv[(h * dv + a) * r + b]} * round(lat[s][j * r + b]);
            want += sc[j] / sum * v;
          }
          for (int64_t b = 0; b < r; ++b) got += double{wv[(h * dv + a) * r + b]} * out_fast[(i * heads + h) * r + b];
          max_err = std::max(max_err, std::fabs(got - want));
          max_ref = std::max(max_ref, std::fabs(want));
        }
      }
    }
    EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref)) << "max-abs " << max_err << " (relative " << max_err / max_ref << ")";
    // Every token alone (a decode token, a prefill token without its tile mates) gives bitwise
    // what it gave in the batch.
    for (int64_t i = 0; i < t; ++i) {
      AttentionBatch one{&token_seq[i], &token_pos[i], tables.data(), 1, static_cast<int64_t>(lens.size()), max_blocks};
      std::vector<float> alone(heads * r);
      fast_.PagedLatentAttention(ql.data() + i * heads * r, qr.data() + i * heads * dr, one, layout, layer,
                                 cache.data(), heads, r, scale, alone.data());
      EXPECT_EQ(0, std::memcmp(alone.data(), out_fast.data() + i * heads * r, alone.size() * sizeof(float)))
          << "position " << token_pos[i];
    }
  }
}

TEST_F(LatentOpsTest, RopeScaledWithThetaFrequenciesIsRope) {
  const int64_t n = 9, heads = 3, hd = 16;
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 37 % 200);
  auto a = RandomFloats(n * heads * hd, 5, 1.0f);
  auto b = a, k = RandomFloats(n * hd, 6, 1.0f);
  std::vector<float> inv(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / hd));
  ref_.Rope(a.data(), k.data(), pos.data(), n, heads, 1, hd, 10000.0f);
  ref_.RopeScaled(b.data(), pos.data(), n, heads, hd, hd, inv.data(), 1.0f);
  EXPECT_TRUE(AllClose(b, a, 1e-5, 1e-5));
  // The cos/sin factor scales every rotated value.
  auto c = RandomFloats(n * heads * hd, 5, 1.0f);
  ref_.RopeScaled(c.data(), pos.data(), n, heads, hd, hd, inv.data(), 1.5f);
  for (auto& v : a) v *= 1.5f;
  EXPECT_TRUE(AllClose(c, a, 1e-5, 1e-5));
  // A partial rotation (GLM): the first 8 of 16 rotated as an 8-wide RoPE, the rest untouched.
  auto d = RandomFloats(n * heads * hd, 9, 1.0f);
  std::vector<float> first(n * heads * 8), kk(n * 8, 0.0f);
  for (int64_t r = 0; r < n * heads; ++r) std::copy_n(d.begin() + r * hd, 8, first.begin() + r * 8);
  std::vector<float> inv8(4);
  for (int64_t i = 0; i < 4; ++i) inv8[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / 8));
  const auto before = d;
  ref_.RopeScaled(d.data(), pos.data(), n, heads, hd, 8, inv8.data(), 1.0f);
  ref_.Rope(first.data(), kk.data(), pos.data(), n, heads, 1, 8, 10000.0f);
  for (int64_t r = 0; r < n * heads; ++r) {
    for (int64_t e = 0; e < hd; ++e) {
      const float want = e < 8 ? first[r * 8 + e] : before[r * hd + e];
      ASSERT_NEAR(d[r * hd + e], want, 1e-5) << "row " << r << " dim " << e;
    }
  }
}

// Brute force: every way to pick topk_group groups, the best top_k experts inside them by
// biased score, and the choice whose groups score best wins.
TEST_F(LatentOpsTest, GroupedRouterPicksTheBestExpertsOfTheBestGroups) {
  const int64_t e = 16, n = 40;
  for (bool sigmoid : {true, false}) {
    for (bool two_sum : {true, false}) {
      Backend::GroupedRouting spec{e, 3, 4, 2, sigmoid, two_sum, sigmoid, 2.5f};
      const auto logits = RandomFloats(n * e, sigmoid ? 11 : 12, 2.0f);
      const auto bias = RandomFloats(e, 13, 0.3f);
      std::vector<int32_t> ids(n * 3);
      std::vector<float> w(n * 3);
      fast_.RouterGroupedTopK(logits.data(), n, spec, sigmoid ? bias.data() : nullptr, ids.data(), w.data());
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> score(e), choice(e);
        for (int64_t x = 0; x < e; ++x) {
          const double l = logits[t * e + x];
          score[x] = sigmoid ? 1 / (1 + std::exp(-l)) : l;
        }
        if (!sigmoid) {
          double mx = *std::max_element(score.begin(), score.end()), sum = 0;
          for (auto& v : score) sum += v = std::exp(v - mx);
          for (auto& v : score) v /= sum;
        }
        for (int64_t x = 0; x < e; ++x) choice[x] = score[x] + (sigmoid ? bias[x] : 0.0);
        std::vector<double> gs(4);
        for (int64_t g = 0; g < 4; ++g) {
          std::vector<double> m(choice.begin() + g * 4, choice.begin() + g * 4 + 4);
          std::sort(m.rbegin(), m.rend());
          gs[g] = two_sum ? m[0] + m[1] : m[0];
        }
        std::vector<int> order = {0, 1, 2, 3};
        std::sort(order.begin(), order.end(), [&](int a, int b) { return gs[a] > gs[b]; });
        std::vector<int32_t> allowed;
        for (int g : {order[0], order[1]}) {
          for (int x = 0; x < 4; ++x) allowed.push_back(g * 4 + x);
        }
        std::sort(allowed.begin(), allowed.end(), [&](int a, int b) { return choice[a] > choice[b]; });
        std::vector<int32_t> want(allowed.begin(), allowed.begin() + 3), got(ids.begin() + t * 3, ids.begin() + t * 3 + 3);
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got, want) << "token " << t << " sigmoid " << sigmoid << " two_sum " << two_sum;
        double sum = 0;
        for (int32_t x : want) sum += score[x];
        for (int64_t j = 0; j < 3; ++j) {
          const double expect = (spec.renormalize ? score[ids[t * 3 + j]] / sum : score[ids[t * 3 + j]]) * 2.5;
          EXPECT_NEAR(w[t * 3 + j], expect, 1e-5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
