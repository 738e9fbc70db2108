// Pipeline stages in the cost model: the (m + p - 1) stage-times of a step against one stage's
// price, and the fill and drain streaming faster where ranks share a machine's memory.
#include <gtest/gtest.h>

#include "roofline/cost_model.h"
#include "roofline/hardware.h"
#include "roofline/model_presets.h"

namespace moeserve::roofline {
namespace {

// Pipeline stages overlap the micro-batches: a step of m equal micro-batches through p equal
// stages takes (m + p - 1) times one micro-batch's time on a stage (the bubble (p-1)/(m+p-1)),
// and a stage holds 1/p of the layers' weights and the whole lm_head.
TEST(CostModelTest, APipelinedStepIsMPlusPMinusOneStageTimes) {
  auto c = AnalysisPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  auto hw = HardwarePreset("h100-sxm");
  ASSERT_TRUE(hw.ok());
  const ModelCosts half = StageCosts(m, 2);
  const double lm_head = m.lm_head_params * m.weight_bytes_per_param;
  EXPECT_NEAR(half.TotalWeightBytes(), (m.TotalWeightBytes() - lm_head) / 2 + lm_head, 1e-6 * m.TotalWeightBytes());
  EXPECT_EQ(half.layers, 16);
  EXPECT_NEAR(half.kv_bytes_per_token, m.kv_bytes_per_token / 2, 1e-9);
  for (int64_t micro : {1, 2, 4, 8}) {
    ParallelLayout pp2;
    pp2.pp = 2;
    pp2.micro_batches = micro;
    const double step = PipelinedStepSeconds(m, StepShape::Decode(64, 1000), *hw, pp2).seconds;
    const double stage = PredictStep(half, StepShape::Decode(64 / micro, 1000), *hw).seconds;
    // The first micro-batch's hand-off: its bf16 rows over NVLink (450 GB/s) after 10 us.
    const double hand_off = 10e-6 + (64.0 / micro) * 4096 * 2 / 450e9;
    EXPECT_NEAR(step, static_cast<double>(micro + 1) * stage + hand_off, 1e-12 + 1e-9 * step)
        << micro << " micro-batches";
  }
  ParallelLayout one;
  EXPECT_EQ(PipelinedStepSeconds(m, StepShape::Decode(64, 1000), *hw, one).seconds,
            PredictStep(m, StepShape::Decode(64, 1000), *hw, one).seconds);
}

// Two ranks of one machine: each holds a half share of its 20 GB/s, and one streaming alone pulls
// 16. A pipeline's fill and drain have one stage streaming, so they run at 16 where the middle
// slot runs at 10: a memory-bound step takes (2 x 10/16 + 1) / 3 = 0.75 of the evenly shared one.
TEST(RooflineTest, APipelinesFillAndDrainStreamAtWhatALoneRankPulls) {
  HardwareProfile hw;
  hw.peak_flops_bf16 = 1e18;  // memory-bound throughout
  hw.mem_bandwidth = 10e9;
  hw.mem_capacity = 1e12;
  HardwareProfile shared = hw;
  shared.ranks_sharing_memory = 2;
  shared.solo_mem_bandwidth = 16e9;
  EXPECT_EQ(shared.MemBandwidthWithActive(1), 16e9);
  EXPECT_EQ(shared.MemBandwidthWithActive(2), 10e9);
  EXPECT_EQ(hw.MemBandwidthWithActive(1), 10e9) << "no sharing modelled";
  HardwareProfile fast = shared;
  fast.solo_mem_bandwidth = 30e9;
  EXPECT_EQ(fast.MemBandwidthWithActive(1), 20e9) << "at most the machine's total";
  const ModelCosts m = ModelCosts::From(*AnalysisPreset("mixtral-8x7b"), "bf16", "bf16");
  ParallelLayout pp2;
  pp2.pp = 2;
  const double even = PipelinedStepSeconds(m, StepShape::Decode(8, 100), hw, pp2).bound_seconds;
  const double alone = PipelinedStepSeconds(m, StepShape::Decode(8, 100), shared, pp2).bound_seconds;
  EXPECT_NEAR(alone / even, 0.75, 1e-12);
  // The profile keeps the figures; a thread count out of order is refused by name.
  shared.mem_bandwidth_by_threads = {{1, 16e9}, {2, 20e9}};
  const absl::StatusOr<HardwareProfile> back = HardwareProfile::FromJson(shared.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ranks_sharing_memory, 2);
  EXPECT_EQ(back->solo_mem_bandwidth, 16e9);
  EXPECT_EQ(back->MemBandwidthAtThreads(1), 16e9);
  EXPECT_EQ(back->MemBandwidthAtThreads(3), 20e9);
  EXPECT_EQ(back->MemBandwidthAtThreads(0), 0);
  shared.mem_bandwidth_by_threads[1].threads = 1;
  const absl::StatusOr<HardwareProfile> bad = HardwareProfile::FromJson(shared.ToJson());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'mem_bandwidth_by_threads' entry 1"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace moeserve::roofline
