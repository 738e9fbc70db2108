// The layout explorer's search: what fits on each device (pipelining divides the weights, not
// the KV of the sequences that keep its stages busy), and predictions that are the roofline's
// own for the same layout (AnalyzeRoofline's rows), so the explorer and `moeserve roofline`
// never disagree.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "roofline/analysis.h"
#include "roofline/layout_search.h"
#include "roofline/model_presets.h"

namespace moeserve::roofline {
namespace {

LayoutSearch MixtralOnH100s(int64_t devices) {
  LayoutSearch s;
  const ModelConfig c = *AnalysisPreset("mixtral-8x7b");
  s.model = ModelCosts::From(c, "bf16", "bf16");
  s.hw = *HardwarePreset("h100-sxm");
  s.devices = devices;
  s.experts = c.num_local_experts;
  s.layers = c.num_hidden_layers;
  s.context = 4096;
  s.sequences = {8, 64, 256};
  s.price_per_hour = 2.0;
  return s;
}

const LayoutCandidate* Find(const std::vector<LayoutCandidate>& all, int64_t ep, int64_t pp) {
  for (const auto& c : all) {
    if (c.layout.ep == ep && c.layout.pp == pp) return &c;
  }
  return nullptr;
}

TEST(LayoutSearchTest, EnumeratesEveryLayoutThatTheExpertsAndLayersAllow) {
  const auto all = ExploreLayouts(MixtralOnH100s(8));
  // ep in {1, 2, 4, 8} (8 experts), pp with ep x pp <= 8: 8 + 4 + 2 + 1.
  EXPECT_EQ(all.size(), 15u);
  for (const auto& c : all) {
    EXPECT_EQ(8 % c.layout.ep, 0);
    EXPECT_LE(c.layout.devices(), 8);
  }
  EXPECT_EQ(ExploreLayouts(MixtralOnH100s(3)).size(), 3u + 1u);  // ep 1 x pp 1..3, ep 2 x pp 1
}

TEST(LayoutSearchTest, PipeliningDividesTheWeightsButNotTheKvOfABusyPipeline) {
  LayoutSearch s = MixtralOnH100s(8);
  s.sequences = {8, 16, 32, 64, 128, 256};
  const auto all = ExploreLayouts(s);
  const LayoutCandidate* one = Find(all, 1, 1);
  const LayoutCandidate* two = Find(all, 1, 2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  EXPECT_NEAR(two->weight_bytes_per_device, one->weight_bytes_per_device / 2, 1.0);
  EXPECT_FALSE(one->weights_fit) << "Mixtral-8x7B's 93 GB of bf16 weights on one 80 GB H100";
  EXPECT_TRUE(two->weights_fit);
  // The same micro-batch (what makes a step efficient) keeps the same KV per device: pp
  // micro-batches in flight, each device holding 1/pp of the layers.
  const LayoutCandidate* four = Find(all, 1, 4);
  int compared = 0;
  for (const auto& p2 : two->points) {
    for (const auto& p4 : four->points) {
      if (p2.micro_batch != p4.micro_batch) continue;
      EXPECT_DOUBLE_EQ(p2.kv_bytes_per_device, p4.kv_bytes_per_device) << "micro-batch " << p2.micro_batch;
      ++compared;
    }
  }
  EXPECT_GE(compared, 3);
  // A point fits exactly up to the largest micro-batch the layout reports.
  for (const auto& p : two->points) EXPECT_EQ(p.fits, p.micro_batch <= two->max_micro_batch);
  // Expert parallelism divides both: the experts, and the sequences of data-parallel attention.
  const LayoutCandidate* ep2 = Find(all, 2, 1);
  EXPECT_LT(ep2->weight_bytes_per_device, one->weight_bytes_per_device);
  EXPECT_DOUBLE_EQ(ep2->points[0].kv_bytes_per_device, one->points[0].kv_bytes_per_device / 2);
}

// Layouts beyond one scale-up domain fill whole domains in rank order: EP groups that neither
// fill whole domains nor share one are skipped, and the others carry the domain's size, so
// their hand-offs between domains are priced at the scale-out network.
TEST(LayoutSearchTest, LayoutsBeyondADomainFillWholeDomains) {
  LayoutSearch s = MixtralOnH100s(6);
  s.hw.scale_up_domain = 3;
  s.sequences = {12, 48};
  const auto all = ExploreLayouts(s);
  EXPECT_EQ(Find(all, 2, 3), nullptr) << "two EP ranks per stage do not split domains of 3";
  ASSERT_NE(Find(all, 2, 1), nullptr);
  EXPECT_EQ(Find(all, 2, 1)->layout.domain_size, 0) << "two devices fit one domain";
  const LayoutCandidate* pp6 = Find(all, 1, 6);
  ASSERT_NE(pp6, nullptr);
  EXPECT_EQ(pp6->layout.domain_size, 3);
  EXPECT_EQ(pp6->layout.CrossDomainHandOffs(), 1);
  // The same pipeline inside one domain hands off faster.
  LayoutSearch one_domain = s;
  one_domain.hw.scale_up_domain = 8;
  const LayoutCandidate* inside = Find(ExploreLayouts(one_domain), 1, 6);
  ASSERT_NE(inside, nullptr);
  EXPECT_LT(pp6->points[0].engine_tokens_per_second, inside->points[0].engine_tokens_per_second);
}

// --domain-sizes: each layout once per distinct domain it makes (a layout inside every size
// once, at 0), skipped where its EP groups would split a domain; a smaller domain sends more of
// the same all-to-all over the slower scale-out network, so it never predicts more tokens/s.
TEST(LayoutSearchTest, EveryDomainSizeAsked) {
  LayoutSearch s = MixtralOnH100s(8);
  s.domain_sizes = {1, 2, 3, 4, 8};
  const auto all = ExploreLayouts(s);
  auto count = [&](int64_t ep, int64_t pp) {
    return std::count_if(all.begin(), all.end(), [&](const LayoutCandidate& c) { return c.layout.ep == ep && c.layout.pp == pp; });
  };
  EXPECT_EQ(count(1, 1), 1) << "one device: one domain whatever its size";
  EXPECT_EQ(count(4, 2), 4) << "domains of 1, 2 and 4 devices, and all 8 in one (0); 3 splits an EP group";
  EXPECT_EQ(count(2, 2), 3) << "domains of 1 and 2, and all 4 in one (sizes 4 and 8 both)";
  EXPECT_EQ(count(8, 1), 4);
  std::map<int64_t, double> ep8;  // domain size -> tokens/s at 64 sequences
  for (const auto& c : all) {
    if (c.layout.ep != 8) continue;
    for (const auto& p : c.points) {
      if (p.sequences == 64) ep8[c.layout.domain_size] = p.tokens_per_second;
    }
  }
  ASSERT_EQ(ep8.size(), 4u);
  EXPECT_LT(ep8[1], ep8[4]);
  EXPECT_LE(ep8[4], ep8[0]);
  EXPECT_GT(ep8[0] / ep8[1], 1.01) << "every all-to-all byte on the scale-out network against none";
  // The default: only the hardware's own size, as before.
  LayoutSearch def = MixtralOnH100s(8);
  EXPECT_EQ(ExploreLayouts(def).size(), 15u);
}

TEST(LayoutSearchTest, PredictionsAreTheRooflinesOwnForTheSameLayout) {
  const LayoutSearch s = MixtralOnH100s(8);
  for (const auto& c : ExploreLayouts(s)) {
    RooflineInputs in;
    in.model = s.model;
    in.hw = s.hw;
    in.layout = c.layout;
    in.context = s.context;
    in.price_per_hour = s.price_per_hour;
    for (const auto& p : c.points) in.batches.push_back(p.micro_batch);
    const RooflineReport r = AnalyzeRoofline(in);
    ASSERT_EQ(r.rows.size(), c.points.size());
    for (size_t i = 0; i < c.points.size(); ++i) {
      EXPECT_DOUBLE_EQ(c.points[i].tokens_per_second, r.rows[i].tokens_per_second)
          << "ep " << c.layout.ep << " pp " << c.layout.pp << " sequences " << c.points[i].sequences;
      EXPECT_DOUBLE_EQ(c.points[i].usd_per_million_tokens, r.rows[i].usd_per_million_tokens);
    }
  }
}

// moeserve's engine drains its pipeline every step: pp micro-batches through pp stages in
// (2 pp - 1) stage-times, where the roofline's steady pipeline takes pp. With equal stages and
// micro-batches, and nothing to communicate, the engine's rate is pp / (2 pp - 1) of it.
TEST(LayoutSearchTest, TheEnginesRateDrainsThePipelineEachStep) {
  LayoutSearch s = MixtralOnH100s(4);
  s.hw.interconnect_bandwidth = 0;  // no hand-off costs: stages of equal work
  s.sequences = {8, 64};
  for (const auto& c : ExploreLayouts(s)) {
    for (const auto& p : c.points) {
      if (c.layout.pp == 1) {
        EXPECT_DOUBLE_EQ(p.engine_tokens_per_second, p.tokens_per_second);
        continue;
      }
      ParallelLayout l = c.layout;
      const PipelinedSeconds step = PipelinedStepSeconds(s.model, StepShape::Decode(p.sequences, s.context), s.hw, l);
      EXPECT_DOUBLE_EQ(p.engine_tokens_per_second, static_cast<double>(p.sequences) / step.bound_seconds);
      if (c.layout.ep > 1 || s.model.layers % c.layout.pp != 0) continue;  // uneven stages or ranks
      const double pp = static_cast<double>(c.layout.pp);
      EXPECT_NEAR(p.engine_tokens_per_second / p.tokens_per_second, pp / (2 * pp - 1), 0.05)
          << "pp " << c.layout.pp << " sequences " << p.sequences;
    }
  }
}

TEST(LayoutSearchTest, APointFitsOnlyWhenItsKvFitsBesideTheWeights) {
  LayoutSearch s = MixtralOnH100s(2);
  s.sequences = {2, 4096};
  s.context = 32768;
  const auto all = ExploreLayouts(s);
  const LayoutCandidate* ep2 = Find(all, 2, 1);
  ASSERT_NE(ep2, nullptr);
  ASSERT_TRUE(ep2->weights_fit);
  EXPECT_TRUE(ep2->points[0].fits);
  EXPECT_FALSE(ep2->points[1].fits) << "4096 sequences of 32k tokens: " << ep2->points[1].kv_bytes_per_device / 1e9
                                    << " GB of KV per device";
  EXPECT_LE(ep2->points[0].kv_bytes_per_device + ep2->weight_bytes_per_device, s.hw.mem_capacity);
}

// A recorded routing (explore --expert-load) sets each point's experts hit and imbalances: here
// every token goes to experts 0 and 1. Both on EP rank 0 of 2, that rank reads and computes
// everything (ep 2 then halves no more than the dense part of the step); one on each rank, the
// ranks are even and the step faster.
TEST(LayoutSearchTest, ARecordedRoutingSetsTheExpertsHitAndTheImbalance) {
  LayoutSearch s = MixtralOnH100s(2);
  const std::vector<int64_t> counts = {50, 50, 0, 0, 0, 0, 0, 0};
  const std::vector<std::vector<std::vector<int32_t>>> one_rank(1, std::vector<std::vector<int32_t>>(8, {0}));
  const std::vector<std::vector<std::vector<int32_t>>> same_rank = {{{0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}}};
  const std::vector<std::vector<std::vector<int32_t>>> split = {{{0}, {1}, {0}, {0}, {1}, {1}, {1}, {0}}};
  s.routing[{1, 0}].routing = RecordedRouting::FromCounts(counts, 8, 2, 1, one_rank);
  s.routing[{2, 0}].routing = RecordedRouting::FromCounts(counts, 8, 2, 2, same_rank);
  const auto all = ExploreLayouts(s);
  s.routing[{2, 0}].routing = RecordedRouting::FromCounts(counts, 8, 2, 2, split);
  const auto even = ExploreLayouts(s);
  const LayoutCandidate *ep1 = Find(all, 1, 1), *ep2 = Find(all, 2, 1), *ep2_even = Find(even, 2, 1);
  ASSERT_TRUE(ep1 && ep2 && ep2_even);
  for (size_t i = 0; i < ep2->points.size(); ++i) {
    const StepCost& c = ep2->points[i].cost;
    EXPECT_NEAR(c.experts_hit, 2.0 * s.model.moe_layers, 1e-9);
    EXPECT_NEAR(c.expert_rank_imbalance, 2.0, 1e-9);
    EXPECT_NEAR(c.expert_rows_imbalance, 2.0, 1e-9);
    EXPECT_NEAR(ep2_even->points[i].cost.expert_rank_imbalance, 1.0, 1e-9);
    EXPECT_NEAR(ep2_even->points[i].cost.expert_rows_imbalance, 1.0, 1e-9);
    EXPECT_GT(ep2_even->points[i].tokens_per_second, ep2->points[i].tokens_per_second) << ep2->points[i].sequences;
    EXPECT_GE(ep2->points[i].token_seconds * 2, ep1->points[i].token_seconds) << ep2->points[i].sequences;
  }
}

}  // namespace
}  // namespace moeserve::roofline
