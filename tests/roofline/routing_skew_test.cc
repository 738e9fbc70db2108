// A recorded routing's expectations (roofline/routing_skew.h): uniform routing gives the cost
// model's own closed forms, the extremes are exact, and skewed random routings agree with a
// simulation of tokens routed with exactly the recorded pick probabilities.
#include "roofline/routing_skew.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "roofline/cost_model.h"

namespace moeserve::roofline {
namespace {

TEST(RoutingSkewTest, UniformRoutingGivesTheCostModelsClosedForms) {
  for (const auto& [experts, top_k, ep] : {std::tuple{8, 2, 2}, {8, 2, 4}, {64, 6, 8}, {256, 8, 32}}) {
    for (double tokens : {1.0, 3.0, 16.0, 100.0}) {
      const RoutingExpectation x = ExpectRouting(RecordedRouting::Uniform(experts, top_k, ep), tokens);
      EXPECT_NEAR(x.experts_hit_per_layer, ExpectedExpertsHit(experts, top_k, tokens), 1e-9 * experts);
      EXPECT_NEAR(x.weight_imbalance, ExpectedExpertRankImbalance(experts, top_k, ep, tokens), 1e-9)
          << experts << " experts, top " << top_k << ", ep " << ep << ", " << tokens << " tokens";
    }
  }
  const RoutingExpectation one = ExpectRouting(RecordedRouting::Uniform(8, 2, 1), 10);
  EXPECT_EQ(one.weight_imbalance, 1.0);
  EXPECT_EQ(one.rows_imbalance, 1.0);
}

TEST(RoutingSkewTest, EveryTokenToOneExpertLoadsOneRank) {
  // Top-1 routing, all to expert 0 (rank 0 of 4): that rank computes every row and reads the
  // one expert hit; the mean rank a quarter of each.
  const std::vector<int64_t> counts = {100, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<std::vector<std::vector<int32_t>>> owner = {{{0}, {0}, {1}, {1}, {2}, {2}, {3}, {3}}};
  const RoutingExpectation x = ExpectRouting(RecordedRouting::FromCounts(counts, 8, 1, 4, owner), 50);
  EXPECT_NEAR(x.experts_hit_per_layer, 1.0, 1e-12);
  EXPECT_NEAR(x.weight_imbalance, 4.0, 1e-9);
  EXPECT_NEAR(x.rows_imbalance, 4.0, 1e-9);
}

// An expert copied onto two ranks: each copy carries half its share, so the two ranks even out.
TEST(RoutingSkewTest, AReplicatedExpertsShareIsSplitAmongItsCopies) {
  const std::vector<int64_t> counts = {300, 100};
  const std::vector<std::vector<std::vector<int32_t>>> copied = {{{0, 1}, {1}}}, single = {{{0}, {1}}};
  const RecordedRouting r = RecordedRouting::FromCounts(counts, 2, 1, 2, copied);
  ASSERT_EQ(r.share[0].size(), 3u);
  EXPECT_EQ(r.share[0], (std::vector<double>{0.375, 0.375, 0.25}));
  EXPECT_EQ(r.owner[0], (std::vector<int32_t>{0, 1, 1}));
  // Many tokens: rank 0 gets 3/8 of the rows and rank 1 5/8 (not 3/4 and 1/4).
  EXPECT_NEAR(ExpectRouting(r, 1e6).rows_imbalance, 1.25, 2e-3);
  EXPECT_NEAR(ExpectRouting(RecordedRouting::FromCounts(counts, 2, 1, 2, single), 1e6).rows_imbalance, 1.5, 2e-3);
}

TEST(RoutingSkewTest, DenseLayersAreSkippedAndCountsBecomeShares) {
  const std::vector<int64_t> counts = {0, 0, 0, 0, 30, 10, 40, 20};
  const std::vector<std::vector<std::vector<int32_t>>> owner = {{{0}, {0}, {1}, {1}}, {{0}, {1}, {0}, {1}}};
  const RecordedRouting r = RecordedRouting::FromCounts(counts, 4, 2, 2, owner);
  ASSERT_EQ(r.share.size(), 1u);
  EXPECT_DOUBLE_EQ(r.share[0][0], 0.3);
  EXPECT_DOUBLE_EQ(r.share[0][2], 0.4);
  EXPECT_EQ(r.owner[0], (std::vector<int32_t>{0, 1, 0, 1}));
  // Many tokens: every expert hit, and the rows settle at the shares (0.7 vs 0.3 of 2 ranks).
  const RoutingExpectation x = ExpectRouting(r, 1e6);
  EXPECT_NEAR(x.weight_imbalance, 1.0, 1e-9);
  EXPECT_NEAR(x.rows_imbalance, 1.4, 2e-3);
}

// Tokens routed with exactly the pick probabilities q_e = k share_e: each token's experts by
// systematic sampling over a fresh random order of the experts (each picked with probability
// q_e, k distinct ones per token).
struct Simulated {
  double weight_imbalance = 0, rows_imbalance = 0;
};
Simulated Simulate(const RecordedRouting& r, int64_t tokens, int trials, std::mt19937_64* rng) {
  const size_t ep = static_cast<size_t>(r.ep);
  double busiest_hits = 0, hits = 0, busiest_rows = 0, rows = 0;
  std::uniform_real_distribution<double> u01(0, 1);
  for (int t = 0; t < trials; ++t) {
    for (size_t l = 0; l < r.share.size(); ++l) {
      const size_t experts = r.share[l].size();
      std::vector<int64_t> picked(experts, 0);
      std::vector<size_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      for (int64_t n = 0; n < tokens; ++n) {
        std::shuffle(order.begin(), order.end(), *rng);
        double next = u01(*rng), edge = 0;
        for (size_t e : order) {
          edge += static_cast<double>(r.top_k) * r.share[l][e];
          if (next < edge) ++picked[e], next += 1;
        }
      }
      std::vector<double> rank_rows(ep, 0.0), rank_hits(ep, 0.0);
      for (size_t e = 0; e < experts; ++e) {
        rank_rows[static_cast<size_t>(r.owner[l][e])] += static_cast<double>(picked[e]);
        rank_hits[static_cast<size_t>(r.owner[l][e])] += picked[e] > 0 ? 1 : 0;
      }
      busiest_rows += *std::max_element(rank_rows.begin(), rank_rows.end());
      busiest_hits += *std::max_element(rank_hits.begin(), rank_hits.end());
      rows += std::accumulate(rank_rows.begin(), rank_rows.end(), 0.0);
      hits += std::accumulate(rank_hits.begin(), rank_hits.end(), 0.0);
    }
  }
  return {busiest_hits / (hits / static_cast<double>(ep)), busiest_rows / (rows / static_cast<double>(ep))};
}

TEST(RoutingSkewTest, SkewedRoutingAgreesWithASimulation) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int64_t kExperts = 16, kTopK = 2, kEp = 4, kLayers = 3;
  std::vector<int64_t> counts;
  std::vector<std::vector<int32_t>> owner(kLayers);
  std::vector<std::vector<std::vector<int32_t>>> holders(kLayers);
  std::uniform_int_distribution<int64_t> count(0, 400);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t e = 0; e < kExperts; ++e) {
      counts.push_back(100 + count(rng));  // skewed, yet no expert above 1 / k of a layer's rows
      owner[static_cast<size_t>(l)].push_back(static_cast<int32_t>(e % kEp));
    }
    std::shuffle(owner[static_cast<size_t>(l)].begin(), owner[static_cast<size_t>(l)].end(), rng);
    for (int32_t rank : owner[static_cast<size_t>(l)]) holders[static_cast<size_t>(l)].push_back({rank});
  }
  const RecordedRouting r = RecordedRouting::FromCounts(counts, kExperts, kTopK, kEp, holders);
  for (int64_t tokens : {2, 8, 64, 512}) {
    const RoutingExpectation x = ExpectRouting(r, static_cast<double>(tokens));
    const Simulated sim = Simulate(r, tokens, 3000, &rng);
    // The model takes experts as picked independently and a rank's rows as normal: within 2-3%
    // from 8 tokens on (0.1-2% seen), about 5% low at 2 (a few rows are far from normal).
    const double weight_tol = tokens < 8 ? 0.05 : 0.02, rows_tol = tokens < 8 ? 0.08 : 0.03;
    EXPECT_NEAR(x.weight_imbalance, sim.weight_imbalance, weight_tol * sim.weight_imbalance)
        << tokens << " tokens: model " << x.weight_imbalance << ", simulated " << sim.weight_imbalance;
    EXPECT_NEAR(x.rows_imbalance, sim.rows_imbalance, rows_tol * sim.rows_imbalance)
        << tokens << " tokens: model " << x.rows_imbalance << ", simulated " << sim.rows_imbalance;
  }
}

// The busiest rank's share of the expert FLOPs sets a compute-bound step's compute time.
TEST(RoutingSkewTest, RowsImbalanceScalesTheExpertFlopsOnly) {
  ModelConfig c;
  c.hidden_size = 1024, c.intermediate_size = 2048, c.num_hidden_layers = 4, c.num_attention_heads = 8;
  c.num_key_value_heads = 8, c.head_dim = 128, c.vocab_size = 1000, c.num_local_experts = 8;
  c.num_experts_per_tok = 2;
  const ModelCosts m = ModelCosts::From(c, "bf16", "bf16");
  HardwareProfile hw;
  hw.peak_flops_bf16 = 1e12, hw.mem_bandwidth = 1e11, hw.mem_capacity = 1e10;
  ParallelLayout ep2;
  ep2.ep = 2;
  StepShape even = StepShape::Decode(4096, 8), skewed = even;
  even.expert_rows_imbalance = 1.0;
  skewed.expert_rows_imbalance = 1.5;
  const StepCost a = PredictStep(m, even, hw, ep2), b = PredictStep(m, skewed, hw, ep2);
  const double expert_flops = 4096.0 * 2 * m.moe_layers * m.top_k * m.expert_params;
  EXPECT_NEAR(b.compute_seconds - a.compute_seconds, 0.5 * expert_flops / (2 * hw.PeakFlops("bf16")),
              1e-9 * a.compute_seconds);
  EXPECT_EQ(b.expert_rows_imbalance, 1.5);
  // Unmeasured: uniform routing's expectation, above 1 for a few tokens on 2 ranks.
  StepShape unmeasured = StepShape::Decode(2, 8);
  EXPECT_GT(PredictStep(m, unmeasured, hw, ep2).expert_rows_imbalance, 1.1);
}

}  // namespace
}  // namespace moeserve::roofline
