// What a recorded routing (an expert-load file: tokens per layer and expert) means for a step's
// cost under an expert-parallel placement: how many experts a batch hits, and how much more the
// busiest EP rank reads and computes than the mean rank. Uniform routing is the special case
// the cost model assumes without a recording (ExpectedExpertsHit, ExpectedExpertRankImbalance).
#pragma once

#include <cstdint>
#include <vector>

namespace moeserve::roofline {

// The routing of each MoE layer as recorded, and the EP rank that holds each expert's copy.
struct RecordedRouting {
  int64_t top_k = 1;
  int64_t ep = 1;
  // Per MoE layer (the recording's layers with tokens), per copy of an expert (one per expert
  // unless the placement replicates it): its share of the layer's rows (an expert's share split
  // evenly among its copies; summing to 1), and owner[layer][c] the EP rank holding copy c.
  std::vector<std::vector<double>> share;
  std::vector<std::vector<int32_t>> owner;

  // From counts [layers x experts] (a dense layer's row all zero: skipped) and the ranks
  // holding each expert of every layer (parallel/placement.h's ExpertHolderTable).
  static RecordedRouting FromCounts(const std::vector<int64_t>& counts, int64_t experts, int64_t top_k, int64_t ep,
                                    const std::vector<std::vector<std::vector<int32_t>>>& holders);
  // Uniform routing over `experts`, contiguous placement, one layer (every layer alike).
  static RecordedRouting Uniform(int64_t experts, int64_t top_k, int64_t ep);
};

struct RoutingExpectation {
  // Distinct (layer, expert) pairs a step of `tokens` tokens hits, per recorded layer averaged
  // (multiply by the model's MoE layers).
  double experts_hit_per_layer = 0;
  // The busiest EP rank's experts hit, summed over layers, over the mean rank's: the expert
  // weights a memory-bound step waits for (StepShape::expert_rank_imbalance).
  double weight_imbalance = 1;
  // The busiest EP rank's expert rows, summed over layers, over the mean rank's: the expert
  // FLOPs a compute-bound step waits for (StepShape::expert_rows_imbalance).
  double rows_imbalance = 1;
};

// Each token picks expert (copy) e with probability q_e = min(1, top_k x share_e) (the recorded
// frequency), the experts taken as independent; a copy's weights are read where it is hit. Hits: expert e is hit by some token with
// probability 1 - (1 - q_e)^tokens, a rank's count is Poisson-binomial, and the busiest rank's
// expectation E[max] = sum over x of 1 - prod over ranks of P(count <= x): exact under
// independence, and for uniform routing the binomial of ExpectedExpertRankImbalance. Rows: a
// rank's rows are a sum over tokens, taken as normal (mean tokens x sum q_e, variance
// tokens x sum q_e (1 - q_e)), and E[max] integrated numerically. Both are 1 for ep 1 or no tokens.
RoutingExpectation ExpectRouting(const RecordedRouting& routing, double tokens);

}  // namespace moeserve::roofline
