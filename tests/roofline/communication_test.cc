// The cost model's communication against prices computed by hand: the expert all-to-all inside
// and across scale-up domains, exchanges that move no rows, pipeline hand-offs by where the stages
// sit, and which domain sizes have one price.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "roofline/cost_model.h"
#include "roofline/hardware.h"
#include "roofline/model_presets.h"

namespace moeserve::roofline {
namespace {

// Mixtral-8x7B in bf16 on the h100-sxm preset (NVLink 450 GB/s and 10 us a call, the fabric
// 50 GB/s and 25 us), the figures every price below is computed from.
struct MixtralOnH100s {
  ModelCosts model = ModelCosts::From(*AnalysisPreset("mixtral-8x7b"), "bf16", "bf16");
  HardwareProfile hw = *HardwarePreset("h100-sxm");
};

// An expert layer spread over two scale-up domains: the traffic to the other domain crosses the
// scale-out NIC (50 GB/s per H100 against NVLink's 450 GB/s), and that link, busy at the same
// time as NVLink, sets the time.
TEST(CostModelTest, AllToAllAcrossScaleUpDomainsIsPricedAtTheScaleOutNetwork) {
  const MixtralOnH100s f;
  const ModelCosts& m = f.model;
  const HardwareProfile& hw = f.hw;
  EXPECT_EQ(hw.scale_out_bandwidth, 50e9);
  // Each routed row: bf16 out, bf16 back.
  const double h = 4096, layers = 32, B = 64, ep = 16, routed = layers * B * 2 * h * 2 * 2;
  ParallelLayout one, two;
  one.ep = two.ep = 16;
  two.domain_size = 8;
  const StepCost a = PredictStep(m, StepShape::Decode(64, 1000), hw, one);
  const StepCost b = PredictStep(m, StepShape::Decode(64, 1000), hw, two);
  // Three collective calls per layer (counts, rows, results back, as
  // parallel/expert_dispatch.cc makes them), each paying the link's per-call latency (10 us
  // NVLink, 25 us across the fabric, the preset's figures) on top of its bytes.
  EXPECT_EQ(hw.interconnect_latency, 10e-6);
  EXPECT_EQ(hw.scale_out_latency, 25e-6);
  const double calls = 3 * layers;
  EXPECT_NEAR(a.comm_bytes, routed * 15 / ep, 1);
  EXPECT_NEAR(a.comm_seconds, routed * 15 / ep / (450e9 * ep) + calls * 10e-6, 1e-15);
  EXPECT_NEAR(a.comm_latency_seconds, calls * 10e-6, 1e-15);
  EXPECT_NEAR(b.comm_bytes, routed * 15 / ep, 1) << "the same bytes leave each device";
  EXPECT_NEAR(b.scale_out_bytes, routed * 8 / ep, 1);
  const double inside = routed * 7 / ep / (450e9 * ep), outside = routed * 8 / ep / (50e9 * ep);
  EXPECT_NEAR(b.comm_seconds, std::max(inside, outside) + calls * 25e-6, 1e-15);
  // Bytes alone: 8 of the 15 peers are behind the 9x slower link, 9 x 8/15 = 4.8x the
  // one-domain time.
  EXPECT_NEAR((b.comm_seconds - b.comm_latency_seconds) / (a.comm_seconds - a.comm_latency_seconds), 9.0 * 8 / 15,
              1e-9);
  // Without a latency (a profile that gives none) only the bytes are priced.
  HardwareProfile no_latency = hw;
  no_latency.interconnect_latency = no_latency.scale_out_latency = 0;
  EXPECT_NEAR(PredictStep(m, StepShape::Decode(64, 1000), no_latency, one).comm_seconds,
              routed * 15 / ep / (450e9 * ep), 1e-15);
}

// A placement's own traffic (ParallelLayout::routed_inside / routed_outside, from replicated
// experts' copies in each domain): the bytes follow the fractions, and the calls still pay the
// scale-out latency where the EP group spans domains, even when no routed row leaves its domain.
TEST(CostModelTest, APlacementsTrafficSetsTheBytesButNotTheLatency) {
  const MixtralOnH100s f;
  const double h = 4096, layers = 32, B = 64, ep = 16, routed = layers * B * 2 * h * 2 * 2, calls = 3 * layers;
  ParallelLayout placed;
  placed.ep = 16;
  placed.domain_size = 8;
  placed.routed_inside = 0.5, placed.routed_outside = 0.25;
  const StepCost a = PredictStep(f.model, StepShape::Decode(64, 1000), f.hw, placed);
  EXPECT_NEAR(a.comm_bytes, routed * 0.75, 1);
  EXPECT_NEAR(a.scale_out_bytes, routed * 0.25, 1);
  const double inside = routed * 0.5 / (450e9 * ep), outside = routed * 0.25 / (50e9 * ep);
  EXPECT_NEAR(a.comm_seconds, std::max(inside, outside) + calls * 25e-6, 1e-15);
  placed.routed_inside = 0.875, placed.routed_outside = 0;  // every expert in both domains
  const StepCost b = PredictStep(f.model, StepShape::Decode(64, 1000), f.hw, placed);
  EXPECT_EQ(b.scale_out_bytes, 0);
  EXPECT_NEAR(b.comm_seconds, routed * 0.875 / (450e9 * ep) + calls * 25e-6, 1e-15)
      << "the counts still cross: the scale-out latency stays";
  placed.domain_size = 0;  // one domain: NVLink's latency
  EXPECT_NEAR(PredictStep(f.model, StepShape::Decode(64, 1000), f.hw, placed).comm_latency_seconds, calls * 10e-6, 1e-15);
}

// Where the transport skips an all-to-all that moves nothing (Open MPI), the rows out and back pay
// the latency only when some token's experts are not all on its own rank: with 8 experts top-2 on
// 2 ranks, C(4,2)/C(8,2) = 6/28 per token.
TEST(CostModelTest, ExchangesThatMoveNoRowsPayNoLatencyWhereTheTransportSkipsThem) {
  EXPECT_DOUBLE_EQ(NoRowLeavesItsRank(8, 2, 2, 1), 6.0 / 28);
  EXPECT_NEAR(NoRowLeavesItsRank(8, 2, 2, 3), std::pow(6.0 / 28, 3), 1e-15);
  EXPECT_DOUBLE_EQ(NoRowLeavesItsRank(8, 2, 1, 5), 1.0);
  EXPECT_DOUBLE_EQ(NoRowLeavesItsRank(8, 2, 8, 1), 0.0) << "one expert per rank: a token's two cannot both be home";
  EXPECT_NEAR(NoRowLeavesItsRank(16, 2, 4, 1), (4.0 * 3) / (16 * 15), 1e-15);
  const MixtralOnH100s f;
  const ModelCosts& m = f.model;
  const HardwareProfile& hw = f.hw;
  ParallelLayout ep2;
  ep2.ep = 2;
  HardwareProfile skips = hw;
  skips.empty_exchanges_free = true;
  const double layers = 32, alpha = 10e-6;
  for (int64_t t : {1, 2, 16}) {
    const StepCost always = PredictStep(m, StepShape::Decode(t, 100), hw, ep2);
    const StepCost sometimes = PredictStep(m, StepShape::Decode(t, 100), skips, ep2);
    EXPECT_NEAR(always.comm_latency_seconds, 3 * layers * alpha, 1e-15) << t;
    const double crossing = 1 - std::pow(6.0 / 28, static_cast<double>(t));
    EXPECT_NEAR(sometimes.comm_latency_seconds, (1 + 2 * crossing) * layers * alpha, 1e-15) << t;
    EXPECT_NEAR(always.comm_seconds - sometimes.comm_seconds, 2 * (1 - crossing) * layers * alpha, 1e-15) << t;
  }
}

// An exchange across domains follows a layer's streaming, and pays the latency calibrate measured
// right after a read of that size: linear from the warm latency up to the first sweep,
// log-linear between sweeps, the largest beyond them.
TEST(CostModelTest, ScaleOutExchangesPayTheLatencyMeasuredAfterALayersStreaming) {
  const MixtralOnH100s f;
  HardwareProfile hw = f.hw;  // 25 us a call across the fabric when warm
  hw.scale_out_latency_after_sweep = {{8e6, 40e-6}, {32e6, 60e-6}, {128e6, 100e-6}};
  EXPECT_DOUBLE_EQ(hw.ScaleOutLatencyAfter(0), 25e-6);
  EXPECT_DOUBLE_EQ(hw.ScaleOutLatencyAfter(4e6), 32.5e-6);
  EXPECT_DOUBLE_EQ(hw.ScaleOutLatencyAfter(8e6), 40e-6);
  EXPECT_NEAR(hw.ScaleOutLatencyAfter(16e6), 50e-6, 1e-18) << "one octave of the two to 32 MB";
  EXPECT_NEAR(hw.ScaleOutLatencyAfter(64e6), 80e-6, 1e-18);
  EXPECT_DOUBLE_EQ(hw.ScaleOutLatencyAfter(1e9), 100e-6);
  // A Mixtral layer's attention weights alone are 84 MB (4096 x 10240 in bf16), and a rank's
  // share of the experts hit adds more: past the largest sweep, so each of the 3 calls of the 32
  // layers pays 100 us instead of 25. Inside one domain nothing changes.
  ParallelLayout one, two;
  one.ep = two.ep = 16;
  two.domain_size = 8;
  EXPECT_NEAR(PredictStep(f.model, StepShape::Decode(64, 1000), hw, two).comm_latency_seconds, 3 * 32 * 100e-6, 1e-15);
  EXPECT_NEAR(PredictStep(f.model, StepShape::Decode(64, 1000), hw, one).comm_latency_seconds, 3 * 32 * 10e-6, 1e-15);
  // The scale-up link's own after-sweep latency, where measured, prices the calls inside a
  // domain; across domains the slower link's still sets the price.
  hw.interconnect_latency_after_sweep = {{8e6, 15e-6}};
  EXPECT_DOUBLE_EQ(hw.InterconnectLatencyAfter(4e6), 12.5e-6);
  EXPECT_NEAR(PredictStep(f.model, StepShape::Decode(64, 1000), hw, one).comm_latency_seconds, 3 * 32 * 15e-6, 1e-15);
  EXPECT_NEAR(PredictStep(f.model, StepShape::Decode(64, 1000), hw, two).comm_latency_seconds, 3 * 32 * 100e-6, 1e-15);
  // The profile keeps the measurements, and refuses sweeps out of order by name.
  const absl::StatusOr<HardwareProfile> back = HardwareProfile::FromJson(hw.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->scale_out_latency_after_sweep.size(), 3u);
  EXPECT_EQ(back->scale_out_latency_after_sweep[2].sweep_bytes, 128e6);
  EXPECT_EQ(back->scale_out_latency_after_sweep[2].latency, 100e-6);
  ASSERT_EQ(back->interconnect_latency_after_sweep.size(), 1u);
  EXPECT_EQ(back->interconnect_latency_after_sweep[0].latency, 15e-6);
  hw.scale_out_latency_after_sweep[1].sweep_bytes = 4e6;
  const absl::StatusOr<HardwareProfile> bad = HardwareProfile::FromJson(hw.ToJson());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'scale_out_latency_after_sweep' entry 1"), std::string::npos) << bad.status();
}

// Ranks fill the domains in order (rank = stage x ep + EP rank): with domains of 2, ep 2 x pp 4
// puts every stage in a domain of its own, ep 1 x pp 4 two stages in each.
TEST(CostModelTest, HandOffsBetweenDomainsArePricedAtTheScaleOutNetwork) {
  const MixtralOnH100s f;
  const ModelCosts& m = f.model;
  const HardwareProfile& hw = f.hw;
  const double rows = 64 * 4096 * 2;  // 64 tokens' bf16 hidden states per boundary
  struct Case {
    int64_t ep, pp, domain, crossing;
  };
  for (const Case& k : {Case{1, 4, 0, 0}, Case{1, 4, 2, 1}, Case{1, 4, 1, 3}, Case{2, 4, 2, 3}, Case{2, 4, 4, 1},
                        Case{4, 2, 2, 1}, Case{2, 2, 4, 0}, Case{2, 3, 4, 1}}) {
    SCOPED_TRACE(testing::Message() << "ep " << k.ep << " pp " << k.pp << " domain " << k.domain);
    ParallelLayout l;
    l.ep = k.ep;
    l.pp = k.pp;
    l.domain_size = k.domain;
    ASSERT_TRUE(CheckDomainSize(l, "--domain-size").ok());
    EXPECT_EQ(l.CrossDomainHandOffs(), k.crossing);
    // The hand-offs alone: the same layout without stages prices the same all-to-all. Each EP
    // rank hands its 64 / ep tokens to the next stage's, all ranks at once.
    ParallelLayout one_stage = l;
    one_stage.pp = 1;
    const StepCost s = PredictStep(m, StepShape::Decode(64, 1000), hw, l);
    const StepCost base = PredictStep(m, StepShape::Decode(64, 1000), hw, one_stage);
    const double rank_rows = rows / static_cast<double>(k.ep);
    const double in = static_cast<double>(k.pp - 1 - k.crossing), out = static_cast<double>(k.crossing);
    EXPECT_NEAR(s.comm_seconds - base.comm_seconds,
                in * (10e-6 + rank_rows / 450e9) + out * (25e-6 + rank_rows / 50e9), 1e-12);
    EXPECT_NEAR(s.scale_out_bytes - base.scale_out_bytes, out * rows, 1e-3);
    EXPECT_NEAR(s.comm_bytes - base.comm_bytes, (in + out) * rows, 1e-3);
  }
  // The pipelined step carries its first micro-batch over the boundaries: 16 tokens each here.
  ParallelLayout inside, across;
  inside.pp = across.pp = 4;
  across.domain_size = 1;
  const double a = PipelinedStepSeconds(m, StepShape::Decode(64, 1000), hw, inside).seconds;
  const double b = PipelinedStepSeconds(m, StepShape::Decode(64, 1000), hw, across).seconds;
  EXPECT_NEAR(b - a, 3 * ((25e-6 + rows / 4 / 50e9) - (10e-6 + rows / 4 / 450e9)), 1e-12);
}

TEST(CostModelTest, ADomainSizeMustSplitTheRanksEvenly) {
  const auto check = [](int64_t ep, int64_t pp, int64_t d) {
    ParallelLayout l;
    l.ep = ep;
    l.pp = pp;
    l.domain_size = d;
    return CheckDomainSize(l, "--domain-size");
  };
  EXPECT_TRUE(check(4, 1, 0).ok());
  EXPECT_TRUE(check(4, 1, 2).ok());
  EXPECT_TRUE(check(2, 4, 4).ok()) << "two stages' EP groups share a domain";
  EXPECT_TRUE(check(1, 4, 2).ok());
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> refused = {
      {4, 1, 3}, {4, 2, 6}, {2, 2, 5}, {2, 1, -1}, {3, 2, 2}};
  for (const auto& [ep, pp, d] : refused) {
    const absl::Status s = check(ep, pp, d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ep << " " << pp << " " << d;
    EXPECT_NE(s.message().find("--domain-size"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(std::to_string(d)), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace moeserve::roofline
