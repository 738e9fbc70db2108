// Swap or recompute: the policy's answers against prices worked out by hand, with a roofline
// and with the measured prefill rate, and its counts.
#include <gtest/gtest.h>

#include "engine/preemption_policy.h"
#include "roofline/hardware.h"
#include "roofline/model_presets.h"

namespace moeserve {
namespace {

TEST(PreemptionPolicyTest, FixedModesAnswerAlwaysTheSameAndAreCounted) {
  PreemptionPolicy swap(PreemptionMode::kSwap, 1e6, 0);
  PreemptionPolicy recompute(PreemptionMode::kRecompute, 1, 1e12);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(swap.ShouldSwap(100, 1));
    EXPECT_FALSE(recompute.ShouldSwap(1, 100000));
  }
  EXPECT_EQ(swap.swap_decisions(), 3);
  EXPECT_EQ(swap.recompute_decisions(), 0);
  EXPECT_EQ(recompute.recompute_decisions(), 3);
}

// Without a profile: the copies (2 x blocks x block bytes over the link) against the tokens at
// the measured seconds per prefill token (a moving average, 0.8 old + 0.2 new).
TEST(PreemptionPolicyTest, AutoWeighsTheCopiesAgainstTheMeasuredPrefillRate) {
  PreemptionPolicy p(PreemptionMode::kAuto, /*block_bytes=*/1e6, /*link=*/1e9);
  EXPECT_FALSE(p.ShouldSwap(1, 1000)) << "nothing measured yet: a recompute is priced at 0";
  p.ObservePrefill(100, 0.1);  // 1 ms a token
  EXPECT_DOUBLE_EQ(p.RecomputeSeconds(10), 0.01);
  p.ObservePrefill(100, 0.6);  // 6 ms a token: 0.8 x 1 + 0.2 x 6 = 2 ms
  EXPECT_NEAR(p.RecomputeSeconds(10), 0.02, 1e-12);
  // 4 blocks: 8 MB of copies at 1 GB/s = 8 ms, against 10 tokens (20 ms): swap; 3 tokens (6 ms): recompute.
  EXPECT_TRUE(p.ShouldSwap(4, 10));
  EXPECT_FALSE(p.ShouldSwap(4, 3));
  EXPECT_EQ(p.swap_decisions(), 1);
  EXPECT_EQ(p.recompute_decisions(), 2);
  PreemptionPolicy no_link(PreemptionMode::kAuto, 1e6, 0);
  no_link.ObservePrefill(1, 1.0);
  EXPECT_FALSE(no_link.ShouldSwap(1, 1000)) << "an unknown link is never swapped over";
}

// With a profile: a recompute is priced as the roofline's prefill step of those tokens.
TEST(PreemptionPolicyTest, AutoPricesARecomputeWithTheRoofline) {
  auto c = roofline::AnalysisPreset("mixtral-8x7b");
  auto hw = roofline::HardwarePreset("h100-sxm");
  ASSERT_TRUE(c.ok() && hw.ok());
  const roofline::ModelCosts costs = roofline::ModelCosts::From(*c, "bf16", "bf16");
  roofline::Efficiency eff;
  eff.compute = 0.5;
  PreemptionPolicy p(PreemptionMode::kAuto, 1e6, 50e9, PreemptionPolicy::Roofline{&costs, &*hw, eff});
  roofline::StepShape shape;
  shape.seqs.push_back({2000, 2000, false});
  const double want = roofline::PredictStep(costs, shape, *hw, {}, eff).seconds;
  EXPECT_DOUBLE_EQ(p.RecomputeSeconds(2000), want);
  // The block count where the copies cost the same: swap below it, recompute above.
  const double even = want * 50e9 / 2e6;
  EXPECT_TRUE(p.ShouldSwap(static_cast<int64_t>(even * 0.9), 2000));
  EXPECT_FALSE(p.ShouldSwap(static_cast<int64_t>(even * 1.1) + 1, 2000));
}

}  // namespace
}  // namespace moeserve
