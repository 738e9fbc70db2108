// engine/: the sampler's distributions against the exact probabilities, top-k and top-p
// truncation, seeds, and parameter validation.
#include <cmath>
#include <map>

#include "engine/sampling.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

TEST(SamplingTest, GreedyPicksArgmaxLowestIndexOnTies) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler s(SamplingParams{}, 1);
  EXPECT_EQ(s.Sample(logits.data(), 4), 1);
}

TEST(SamplingTest, TemperatureSamplingMatchesSoftmax) {
  std::vector<float> logits = {1.0f, 0.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 3;
  Sampler s(p, 0);
  std::vector<int> counts(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) counts[s.Sample(logits.data(), 4)]++;
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (int i = 0; i < 4; ++i) {
    const double want = std::exp(logits[i] / 0.7) / z;
    const double sd = std::sqrt(want * (1 - want) / n);
    EXPECT_NEAR(counts[i] / static_cast<double>(n), want, 5 * sd) << "token " << i;
  }
}

TEST(SamplingTest, TopKAndTopPTruncate) {
  // Probabilities at temperature 1: roughly 0.64, 0.24, 0.09, 0.03.
  std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams k2;
  k2.temperature = 1.0f;
  k2.top_k = 2;
  k2.seed = 1;
  SamplingParams p07 = k2;
  p07.top_k = 0;
  p07.top_p = 0.7f;  // 0.64 < 0.7, so the nucleus is {0, 1}
  SamplingParams p05 = p07;
  p05.top_p = 0.5f;  // {0}
  Sampler sk(k2, 0), sp(p07, 0), sp5(p05, 0);
  std::map<int, int> ck, cp;
  for (int i = 0; i < 5000; ++i) {
    ck[sk.Sample(logits.data(), 4)]++;
    cp[sp.Sample(logits.data(), 4)]++;
    EXPECT_EQ(sp5.Sample(logits.data(), 4), 0);
  }
  EXPECT_EQ(ck.size(), 2u);
  EXPECT_EQ(ck.count(2) + ck.count(3), 0u);
  EXPECT_EQ(cp.size(), 2u);
  EXPECT_EQ(cp.count(2) + cp.count(3), 0u);
}

TEST(SamplingTest, SameSeedSameStream) {
  auto logits = testing::RandomFloats(300, 9);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  Sampler a(p, 0), b(p, 99);
  p.seed = 1235;
  Sampler c(p, 0);
  int same_ac = 0;
  for (int i = 0; i < 200; ++i) {
    const int32_t ta = a.Sample(logits.data(), 300);
    EXPECT_EQ(ta, b.Sample(logits.data(), 300));
    same_ac += ta == c.Sample(logits.data(), 300);
  }
  EXPECT_LT(same_ac, 100) << "different seeds should give different streams";
}

TEST(SamplingTest, ValidateNamesFieldAndLimit) {
  SamplingParams p;
  p.temperature = -0.5f;
  EXPECT_NE(std::string(p.Validate().message()).find("temperature: must be in [0, 100]"), std::string::npos);
  p = SamplingParams();
  p.top_p = 0.0f;
  EXPECT_NE(std::string(p.Validate().message()).find("top_p: must be in (0, 1]"), std::string::npos);
  p = SamplingParams();
  p.top_k = -1;
  EXPECT_NE(std::string(p.Validate().message()).find("top_k"), std::string::npos);
  EXPECT_TRUE(SamplingParams().Validate().ok());
}

TEST(SamplingTest, TopLogprobsAreNormalised) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const double z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(LogNormalizer(logits.data(), 3), z, 1e-12);
  auto top = TopLogprobs(logits.data(), 3, 2, LogNormalizer(logits.data(), 3));
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 2);
  EXPECT_NEAR(top[0].logprob, 3.0 - z, 1e-6);
}

}  // namespace
}  // namespace moeserve
