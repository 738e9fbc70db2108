// Roofline: hardware profiles, the cost model and the analysis against numbers computed by hand
// from the architecture (parameter counts written out here, independently of ModelConfig).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <unordered_set>

#include "absl/strings/str_format.h"
#include "roofline/analysis.h"
#include "roofline/calibration_fit.h"
#include "roofline/model_presets.h"

namespace moeserve::roofline {
namespace {

// DeepSeek-V3-like sizes, counted by hand.
struct HandCount {
  double h = 7168, inter = 2048, layers = 58, heads = 128, hd = 128, kvh = 2, experts = 256, k = 8, vocab = 129280;
  double Attn() const { return h * heads * hd * 2 + h * kvh * hd * 2; }
  double Expert() const { return 3 * h * inter; }
  double PerLayerDense() const { return Attn() + 2 * h + experts * h + Expert() /*shared*/ + h /*shared gate*/; }
  double Total() const { return layers * (PerLayerDense() + experts * Expert()) + 2 * vocab * h + h; }
  double Active() const { return layers * (PerLayerDense() + k * Expert()) + 2 * vocab * h + h; }
};

TEST(HardwareTest, PresetsHaveDatasheetRatios) {
  auto h100 = HardwarePreset("h100-sxm");
  ASSERT_TRUE(h100.ok());
  EXPECT_NEAR(h100->FlopsPerByte(), 989.4 / 3.35, 1e-9);  // about 295
  for (const std::string& n : HardwarePresetNames()) {
    auto p = HardwarePreset(n);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_TRUE(p->Validate().ok()) << n;
    EXPECT_GT(p->FlopsPerByte(), 200) << n;  // "near 300 across generations"
    EXPECT_LT(p->FlopsPerByte(), 330) << n;
    // The drain time of HBM generations is 15-30 ms.
    EXPECT_GT(p->mem_capacity / p->mem_bandwidth, 0.015) << n;
    EXPECT_LT(p->mem_capacity / p->mem_bandwidth, 0.030) << n;
  }
  auto rack = HardwarePreset("gb200-nvl72");
  ASSERT_TRUE(rack.ok());
  EXPECT_EQ(rack->scale_up_domain, 72);
  EXPECT_NEAR(rack->mem_bandwidth * rack->devices, 576e12, 1e9);
}

TEST(HardwareTest, JsonRoundTripAndErrorsNameTheKey) {
  auto p = HardwarePreset("b200");
  ASSERT_TRUE(p.ok());
  auto q = HardwareProfile::FromJson(p->ToJson());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->mem_bandwidth, p->mem_bandwidth);
  EXPECT_EQ(q->peak_flops_bf16, p->peak_flops_bf16);
  EXPECT_EQ(q->devices, p->devices);
  EXPECT_FALSE(q->empty_exchanges_free);
  HardwareProfile free_empty = *p;
  free_empty.empty_exchanges_free = true;
  auto r = HardwareProfile::FromJson(free_empty.ToJson());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty_exchanges_free);
  auto not_bool = HardwareProfile::FromJson(
      R"({"peak_flops_bf16": 1e12, "mem_bandwidth": 1e11, "mem_capacity": 1e9, "empty_exchanges_free": 1})");
  ASSERT_FALSE(not_bool.ok());
  EXPECT_NE(std::string(not_bool.status().message()).find("empty_exchanges_free"), std::string::npos)
      << not_bool.status();
  auto bad = HardwareProfile::FromJson(R"({"peak_flops_bf16": 1e12, "mem_capacity": 1e9})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("mem_bandwidth"), std::string::npos) << bad.status();
  bad = HardwareProfile::FromJson(R"({"peak_flops_bf16": 1e12, "mem_bandwidth": -5, "mem_capacity": 1e9})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("mem_bandwidth"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadHardware("no-such-gpu").ok());
}

// The experts that T tokens hit when each picks k distinct ones of E uniformly (top-k routing).
std::unordered_set<int> SimulateRouting(int E, int k, int T, std::mt19937_64& gen) {
  std::vector<int> ids(E);
  std::unordered_set<int> hit;
  for (int tok = 0; tok < T; ++tok) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), gen);
    hit.insert(ids.begin(), ids.begin() + k);
  }
  return hit;
}

TEST(CostModelTest, ExpectedExpertsHitMatchesSimulation) {
  std::mt19937_64 gen(std::random_device{}());
  for (auto [E, k, T] : {std::tuple<int, int, int>{8, 2, 1}, {8, 2, 3}, {64, 6, 10}, {256, 8, 40}}) {
    double sum = 0;
    const int trials = 4000;
    for (int t = 0; t < trials; ++t) sum += static_cast<double>(SimulateRouting(E, k, T, gen).size());
    const double simulated = sum / trials;
    const double predicted = ExpectedExpertsHit(E, k, T);
    EXPECT_NEAR(predicted, simulated, 0.03 * E) << "E=" << E << " k=" << k << " T=" << T;
  }
  EXPECT_DOUBLE_EQ(ExpectedExpertsHit(8, 2, 1), 2.0);
  EXPECT_NEAR(ExpectedExpertsHit(8, 2, 1000), 8.0, 1e-9);
}

// The busiest EP rank's share of the experts hit, against a simulation of top-k routing: each
// token picks k distinct experts, rank r holds experts [r E/ep, (r+1) E/ep); the ratio of the
// mean busiest rank's count to the mean rank's count.
TEST(CostModelTest, ExpectedExpertRankImbalanceMatchesSimulation) {
  std::mt19937_64 gen(std::random_device{}());
  for (auto [E, k, ep, T] : {std::tuple<int, int, int, int>{8, 2, 2, 1}, {8, 2, 4, 1}, {8, 2, 2, 8}, {64, 6, 8, 1},
                             {64, 6, 8, 16}, {256, 8, 16, 4}, {256, 8, 8, 64}}) {
    double busiest = 0, mean = 0;
    const int trials = 3000;
    for (int t = 0; t < trials; ++t) {
      const std::unordered_set<int> hit = SimulateRouting(E, k, T, gen);
      std::vector<int> per_rank(static_cast<size_t>(ep), 0);
      for (int id : hit) ++per_rank[static_cast<size_t>(id / (E / ep))];
      busiest += *std::max_element(per_rank.begin(), per_rank.end());
      mean += static_cast<double>(hit.size()) / ep;
    }
    const double simulated = busiest / mean, predicted = ExpectedExpertRankImbalance(E, k, ep, T);
    EXPECT_NEAR(predicted, simulated, 0.06 * simulated)
        << "E=" << E << " k=" << k << " ep=" << ep << " T=" << T << ": predicted " << predicted << ", simulated "
        << simulated << " (rel err " << (predicted - simulated) / simulated << ")";
  }
  EXPECT_EQ(ExpectedExpertRankImbalance(8, 2, 1, 5), 1.0);
  EXPECT_NEAR(ExpectedExpertRankImbalance(8, 2, 2, 1e4), 1.0, 1e-9) << "every expert hit on every rank";
}

// Without measured statistics, an EP step's expert weights are the busiest rank's expected share.
TEST(CostModelTest, AnUnmeasuredEpStepReadsTheBusiestRanksExpectedExperts) {
  auto c = AnalysisPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  auto hw = HardwarePreset("h100-sxm");
  ASSERT_TRUE(hw.ok());
  ParallelLayout ep4;
  ep4.ep = 4;
  const StepShape shape = StepShape::Decode(2, 100);
  const StepCost expected = PredictStep(m, shape, *hw, ep4);
  const double imbalance = ExpectedExpertRankImbalance(8, 2, 4, 2);
  EXPECT_GT(imbalance, 1.3);
  EXPECT_DOUBLE_EQ(expected.expert_rank_imbalance, imbalance);
  StepShape even = shape;
  even.expert_rank_imbalance = 1.0;
  const StepCost flat = PredictStep(m, even, *hw, ep4);
  const double spread = expected.weight_seconds - flat.weight_seconds;  // (imbalance - 1) x the mean rank's part
  const double dense = m.DenseBytes() / hw->mem_bandwidth;
  EXPECT_NEAR(spread, (imbalance - 1) * (flat.weight_seconds - dense), 1e-9 * flat.weight_seconds);
}

TEST(CostModelTest, DecodeStepCountsFlopsAndBytesByHand) {
  auto c = AnalysisPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  const double h = 4096, layers = 32, heads = 32, hd = 128, kvh = 8, vocab = 32000, inter = 14336;
  const double expert = 3 * h * inter;
  const double attn = h * heads * hd * 2 + h * kvh * hd * 2;
  const double per_layer_dense = attn + 2 * h + 8 * h;
  EXPECT_DOUBLE_EQ(m.total_params, layers * (per_layer_dense + 8 * expert) + 2 * vocab * h + h);
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token, 2 * layers * kvh * hd * 2);
  auto hw = HardwarePreset("h100-sxm");
  const int64_t B = 16, ctx = 1000;
  const StepCost s = PredictStep(m, StepShape::Decode(B, ctx), *hw);
  // 2 FLOPs per active weight per token (the embedding lookup is no FLOP), plus attention.
  const double active_no_embedding = layers * (per_layer_dense + 2 * expert) + vocab * h + h;
  EXPECT_NEAR(s.flops, B * 2 * active_no_embedding + B * ctx * 4 * layers * heads * hd, 1e-6 * s.flops);
  const double hit = layers * 8 * (1 - std::pow(1 - 2.0 / 8, B));
  EXPECT_NEAR(s.experts_hit, hit, 1e-9);
  const double weight_bytes = 2 * (layers * per_layer_dense + h + vocab * h + hit * expert + B * h);
  EXPECT_NEAR(s.weight_bytes, weight_bytes, 1e-6 * weight_bytes);
  EXPECT_NEAR(s.kv_read_bytes, B * ctx * m.kv_bytes_per_token, 1);
  EXPECT_NEAR(s.memory_seconds, (weight_bytes + B * (ctx + 1) * m.kv_bytes_per_token) / 3.35e12, 1e-12);
  EXPECT_NEAR(s.bound_seconds, std::max(s.compute_seconds, s.memory_seconds), 1e-15);
  EXPECT_FALSE(s.compute_bound);
  // Nothing to communicate on one device; EP adds an all-to-all.
  EXPECT_EQ(s.comm_seconds, 0.0);
  ParallelLayout ep8;
  ep8.ep = 8;
  const StepCost e = PredictStep(m, StepShape::Decode(B, ctx), *hw, ep8);
  EXPECT_NEAR(e.comm_bytes, layers * B * 2 * h * 2 * 2 * 7.0 / 8, 1);  // rows out and back
  EXPECT_GT(e.bound_seconds, e.comm_seconds);
  EXPECT_EQ(e.scale_out_bytes, 0.0) << "one domain by default";
}

// A sequence lives on one EP rank: the step waits for the rank with the most, ceil(n / ep) of
// the n sequences, and their attention and KV; computed here by hand from the one-rank figures.
TEST(CostModelTest, AttentionAndKvAreTheBusiestEpRanks) {
  auto c = AnalysisPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  auto hw = HardwarePreset("h100-sxm");
  ASSERT_TRUE(hw.ok());
  ParallelLayout ep4;
  ep4.ep = 4;
  for (int64_t n : {1, 3, 4, 6, 8}) {
    const StepCost one = PredictStep(m, StepShape::Decode(n, 2000), *hw, ParallelLayout());
    const StepCost four = PredictStep(m, StepShape::Decode(n, 2000), *hw, ep4);
    const double busiest = std::ceil(n / 4.0) / static_cast<double>(n);  // its share of the sequences
    EXPECT_NEAR(four.attention_seconds, one.attention_seconds * busiest, 1e-12 + 1e-9 * one.attention_seconds) << n;
    EXPECT_NEAR(four.kv_seconds, one.kv_seconds * busiest, 1e-12 + 1e-9 * one.kv_seconds) << n;
  }
  // Where the step was measured, its own imbalances: the busiest rank's tokens (max over mean,
  // over ep) and expert rows. All the experts' rows on one of 4 ranks: that rank streams them all.
  StepShape measured = StepShape::Decode(8, 2000);
  measured.attention_rank_imbalance = 2.0;  // one rank with half the tokens
  measured.expert_rank_imbalance = 4.0;
  const StepCost one = PredictStep(m, StepShape::Decode(8, 2000), *hw, ParallelLayout());
  const StepCost four = PredictStep(m, measured, *hw, ep4);
  EXPECT_NEAR(four.attention_seconds, one.attention_seconds / 2, 1e-9 * one.attention_seconds);
  EXPECT_NEAR(four.weight_seconds, one.weight_seconds, 1e-9 * one.weight_seconds)
      << "every expert's rows on one rank: it reads all the experts hit, as one rank does";
}

TEST(RooflineTest, DeepSeekV3LikeOnNvl72MatchesHandComputedNumbers) {
  auto c = AnalysisPreset("deepseek-v3-like");
  ASSERT_TRUE(c.ok());
  const HandCount hand;
  EXPECT_NEAR(hand.Total(), static_cast<double>(c->TotalParams()), 1);
  EXPECT_NEAR(hand.Active(), static_cast<double>(c->ActiveParams()), 1);
  EXPECT_NEAR(hand.Total() / 1e9, 670, 15);  // about 670B total
  EXPECT_NEAR(hand.Active() / 1e9, 37, 3);   // about 37B active

  RooflineInputs in;
  in.model = ModelCosts::From(*c, "bf16", "bf16");
  in.hw = *HardwarePreset("gb200-nvl72");
  in.layout.ep = 72;
  in.context = 4096;
  in.batches = {1, 4096, 16384};
  in.price_per_hour = 6;
  const RooflineReport r = AnalyzeRoofline(in);
  const double ratio = 2.5e15 / 8e12;  // 312.5, "about 300"
  EXPECT_DOUBLE_EQ(r.flops_per_byte, ratio);
  EXPECT_NEAR(r.critical_batch, ratio * hand.Total() / hand.Active(), 1e-6);
  EXPECT_NEAR(r.critical_batch, 5400, 300);
  EXPECT_DOUBLE_EQ(r.critical_batch_routed_experts, ratio * 256 / 8);  // 10000
  const double weight_bytes = 2 * hand.Total();
  const double expert_bytes = 2 * hand.layers * hand.experts * hand.Expert();
  const double replicated_bytes = weight_bytes - expert_bytes;  // attention, shared expert, embeddings
  // Fully sharded, all weights over the rack's 576 TB/s: about 2.3 ms. With expert parallelism
  // every rank also reads its own copy of the dense weights, which dominates.
  EXPECT_NEAR(r.latency_floor_seconds, weight_bytes / (72 * 8e12), 1e-12);
  EXPECT_NEAR(r.latency_floor_layout_seconds, replicated_bytes / 8e12 + expert_bytes / (72 * 8e12), 1e-12);
  // So the crossing of compute and weight time moves beyond the sharded formula...
  EXPECT_GT(r.critical_batch_moe_aware, r.critical_batch);
  {
    // ... while on one device (everything sharded trivially) it is near the formula: with
    // thousands of tokens every expert is hit.
    RooflineInputs one = in;
    one.layout.ep = 1;
    EXPECT_NEAR(AnalyzeRoofline(one).critical_batch_moe_aware / r.critical_batch, 1.0, 0.1);
  }
  EXPECT_NEAR(r.drain_seconds, 186e9 / 8e12, 1e-12);                       // 23 ms
  const double kv_per_token = 2 * 58 * 2 * 128 * 2;
  EXPECT_DOUBLE_EQ(r.kv_bytes_per_token, kv_per_token);
  EXPECT_EQ(r.max_batch_kv_fits,
            static_cast<int64_t>((72 * 186e9 - 72 * replicated_bytes - expert_bytes) / (kv_per_token * 4096)));
  EXPECT_NEAR(r.kv_equals_weights_context_batch1, weight_bytes / kv_per_token, 1e-3);
  ASSERT_EQ(r.rows.size(), 3u);
  // Cost per token falls with batch: batch 1 pays the whole weight read for one token.
  EXPECT_GT(r.rows[0].usd_per_million_tokens, 10 * r.rows[2].usd_per_million_tokens);
  const auto& row = r.rows[1];
  EXPECT_NEAR(row.tokens_per_second, 4096 / row.cost.bound_seconds, 1e-6);
  EXPECT_NEAR(row.usd_per_million_tokens, 6.0 * 72 / 3600 / row.tokens_per_second * 1e6, 1e-9);
}

TEST(RooflineTest, DenseModelCriticalBatchIsTheFlopByteRatio) {
  auto c = AnalysisPreset("mixtral-8x7b");
  ASSERT_TRUE(c.ok());
  c->num_local_experts = 1;
  c->num_experts_per_tok = 1;
  RooflineInputs in;
  in.model = ModelCosts::From(*c, "bf16", "bf16");
  in.hw = *HardwarePreset("h100-sxm");
  const RooflineReport r = AnalyzeRoofline(in);
  EXPECT_DOUBLE_EQ(r.critical_batch, 989.4 / 3.35);
  // f32 weights double the bytes, so the critical batch doubles too.
  in.model = ModelCosts::From(*c, "f32", "bf16");
  EXPECT_DOUBLE_EQ(AnalyzeRoofline(in).critical_batch, 2 * 989.4 / 3.35);
}

// The sweep's critical batch: the smallest compute-bound decode batch, against a linear scan of
// PredictStep, for sparse and dense models on a GPU preset and on a CPU-like profile (FLOP/byte 2.4).
TEST(RooflineTest, SmallestComputeBoundBatchMatchesALinearScan) {
  HardwareProfile cpu = *HardwarePreset("h100-sxm");
  cpu.peak_flops_bf16 = 60e9;
  cpu.peak_flops_f32 = 60e9;
  cpu.mem_bandwidth = 25e9;
  int checked = 0;
  for (const char* preset : {"mixtral-8x7b", "small", "tiny"}) {
    for (int dense = 0; dense < 2; ++dense) {
      auto c = AnalysisPreset(preset);
      ASSERT_TRUE(c.ok()) << preset;
      if (dense) c->num_experts_per_tok = c->num_local_experts;
      const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
      for (const HardwareProfile& hw : {*HardwarePreset("h100-sxm"), cpu}) {
        for (int64_t ctx : {1, 128, 4096}) {
          int64_t scan = 0;
          for (int64_t b = 1; b <= 4096 && scan == 0; ++b) {
            const StepCost s = PredictStep(m, StepShape::Decode(b, ctx), hw);
            if (s.compute_seconds >= s.memory_seconds) scan = b;
          }
          if (scan == 0) continue;  // past the scan: only checked where the scan reaches
          EXPECT_EQ(SmallestComputeBoundBatch(m, hw, ctx), scan)
              << preset << (dense ? " (all experts)" : "") << " on " << hw.name << ", context " << ctx;
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 20) << "the scan reaches most cases";
  // A model whose KV read outgrows its compute is never compute-bound.
  auto c = AnalysisPreset("tiny");
  HardwareProfile slow_memory = cpu;
  slow_memory.mem_bandwidth = 1e6;
  EXPECT_EQ(SmallestComputeBoundBatch(ModelCosts::From(*c, "bf16", "bf16"), slow_memory, 1 << 20), 0);
  // A critical batch exists exactly when the machine's FLOP/byte is below what one more sequence
  // adds (its FLOPs over its KV bytes), e.g. a CPU with matrix units against tiny's small layers.
  const ModelCosts tiny = ModelCosts::From(*c, "bf16", "bf16");
  for (int64_t ctx : {9, 33, 1025}) {
    const double marginal = MarginalDecodeIntensity(tiny, cpu, ctx);
    ASSERT_GT(marginal, 0);
    for (double factor : {0.5, 2.0}) {
      HardwareProfile hw = cpu;
      hw.peak_flops_bf16 = hw.peak_flops_f32 = marginal * factor * hw.mem_bandwidth;
      const int64_t b = SmallestComputeBoundBatch(tiny, hw, ctx);
      if (factor < 1) {
        EXPECT_GT(b, 0) << "context " << ctx << ": machine " << marginal * factor << " FLOP/byte";
      } else {
        EXPECT_EQ(b, 0) << "context " << ctx;
        EXPECT_NE(NoCriticalBatchReason(tiny, hw, ctx).find(absl::StrFormat("%.1f FLOP per byte", marginal)),
                  std::string::npos)
            << NoCriticalBatchReason(tiny, hw, ctx);
      }
    }
  }
}

// A step whose working set (all the weights a device holds plus the batch's KV) fits in the
// last-level cache streams at the LLC's bandwidth; one byte over, at the memory's.
TEST(RooflineTest, AWorkingSetInsideTheLastLevelCacheStreamsAtItsBandwidth) {
  auto c = AnalysisPreset("tiny");
  ASSERT_TRUE(c.ok());
  const ModelCosts m = ModelCosts::From(*c, "bf16", "bf16");
  HardwareProfile hw = *HardwarePreset("h100-sxm");
  hw.mem_bandwidth = 25e9;
  hw.llc_bandwidth = 150e9;
  const StepShape shape = StepShape::Decode(4, 32);
  const StepCost dram = PredictStep(m, shape, hw);
  EXPECT_FALSE(dram.llc_resident) << "no LLC in the profile";
  const double working_set = m.TotalWeightBytes() + dram.kv_read_bytes + dram.kv_write_bytes;
  hw.llc_bytes = working_set;
  const StepCost llc = PredictStep(m, shape, hw);
  EXPECT_TRUE(llc.llc_resident);
  // Same bytes, six times the bandwidth.
  EXPECT_DOUBLE_EQ(llc.weight_bytes, dram.weight_bytes);
  EXPECT_NEAR(llc.memory_seconds, dram.memory_seconds * 25e9 / 150e9, 1e-15);
  EXPECT_NEAR(llc.memory_seconds, (dram.weight_bytes + dram.kv_read_bytes + dram.kv_write_bytes) / 150e9, 1e-12);
  hw.llc_bytes = working_set - 1;
  EXPECT_FALSE(PredictStep(m, shape, hw).llc_resident);
}

}  // namespace
}  // namespace moeserve::roofline
