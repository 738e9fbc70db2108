// The GPU's sampling method (radix descent over the order key, RadixSampleRow) against sorting
// the candidates (SortSampleRow, the host sampler's rule) on fresh random rows: ties (logits
// quantised to a few values), top-k at and past the vocabulary, tiny and full top-p, low and
// high temperatures, u near 0 and near 1. And CpuBackend::SampleRows row by row.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/sample_ops.h"

namespace moeserve {
namespace {

TEST(SampleOpsTest, RadixDescentPicksWhatSortingPicks) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int checked = 0, sampled_non_top = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t vocab = 1 + static_cast<int64_t>(gen() % (trial % 10 == 0 ? 5000 : 300));
    std::vector<float> logits(vocab);
    const bool ties = gen() % 2 == 0;
    std::normal_distribution<float> normal(0.0f, trial % 3 == 0 ? 8.0f : 2.0f);
    for (float& x : logits) x = ties ? static_cast<float>(static_cast<int>(normal(gen)) / 2) : normal(gen);
    SampleSpec spec;
    const float temps[] = {0.0f, 0.05f, 0.7f, 1.0f, 3.0f};
    spec.temperature = temps[gen() % 5];
    const int32_t ks[] = {0, 1, 2, 7, 50, static_cast<int32_t>(vocab), static_cast<int32_t>(vocab) + 3};
    spec.top_k = ks[gen() % 7];
    const float ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
    spec.top_p = ps[gen() % 4];
    const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.3f, 1.0f};
    spec.min_p = min_ps[gen() % 5];
    const double us[] = {0.0, 1e-12, 0.999999999, unit(gen), unit(gen)};
    spec.u = us[gen() % 5];
    const int32_t want = cpu_sample::SortSampleRow(logits.data(), vocab, spec);
    const int32_t got = cpu_sample::RadixSampleRow(logits.data(), vocab, spec);
    ASSERT_EQ(got, want) << "trial " << trial << " seed " << seed << ": vocab " << vocab << " temperature "
                         << spec.temperature << " top_k " << spec.top_k << " top_p " << spec.top_p << " min_p " << spec.min_p << " u "
                         << spec.u << " logit of sort's " << logits[want] << ", of radix's " << logits[got];
    ++checked;
    if (want != static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())) ++sampled_non_top;
  }
  EXPECT_EQ(checked, 3000);
  EXPECT_GT(sampled_non_top, 300) << "the trials must exercise more than the argmax";
}

// min_p by hand (vLLM's rule): logits {0, -1, -3} at temperature 1 are relative probabilities
// {1, 0.37, 0.05}; min_p 0.2 drops the third, so no draw picks it, and the draws split the rest
// in proportion 1 : e^-1; min_p 0.5 leaves the first alone.
TEST(SampleOpsTest, MinPDropsTokensBelowItsShareOfTheLikeliest) {
  const std::vector<float> logits = {0.0f, -1.0f, -3.0f};
  for (const bool radix : {false, true}) {
    SampleSpec spec;
    spec.temperature = 1.0f;
    spec.min_p = 0.2f;
    int picked[3] = {0, 0, 0};
    for (int i = 0; i < 1000; ++i) {
      spec.u = (i + 0.5) / 1000.0;
      const int32_t t = radix ? cpu_sample::RadixSampleRow(logits.data(), 3, spec)
                              : cpu_sample::SortSampleRow(logits.data(), 3, spec);
      ++picked[t];
    }
    EXPECT_EQ(picked[2], 0) << "radix " << radix;
    const double want_first = 1000.0 / (1.0 + std::exp(-1.0));
    EXPECT_NEAR(picked[0], want_first, 1.0) << "radix " << radix;
    spec.min_p = 0.5f;
    spec.u = 0.999;
    EXPECT_EQ(radix ? cpu_sample::RadixSampleRow(logits.data(), 3, spec) : cpu_sample::SortSampleRow(logits.data(), 3, spec), 0);
  }
}

TEST(SampleOpsTest, BackendSamplesEachRowWithItsOwnSpec) {
  CpuBackend b;
  const int64_t vocab = 40;
  std::vector<float> logits(3 * vocab, 0.0f);
  logits[0 * vocab + 7] = 5.0f;                      // row 0: greedy -> 7
  logits[1 * vocab + 3] = logits[1 * vocab + 9] = 4.0f;  // row 1: top_k 1 -> the lower id of the tie
  for (int64_t i = 0; i < vocab; ++i) logits[2 * vocab + i] = static_cast<float>(i);  // row 2
  std::vector<SampleSpec> specs(3);
  specs[1].temperature = 1.0f;
  specs[1].top_k = 1;
  specs[1].u = 0.9;
  specs[2].temperature = 1.0f;
  specs[2].u = 0.999999;  // the far tail of a softmax over 0..39, at most the lowest ids
  std::vector<int32_t> tokens(3, -1);
  b.SampleRows(logits.data(), 3, vocab, specs.data(), tokens.data());
  EXPECT_EQ(tokens[0], 7);
  EXPECT_EQ(tokens[1], 3);
  EXPECT_EQ(tokens[2], cpu_sample::SortSampleRow(logits.data() + 2 * vocab, vocab, specs[2]));
  EXPECT_LT(tokens[2], 30);
}

}  // namespace
}  // namespace moeserve
