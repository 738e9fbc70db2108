// The price sheet's four derivations against hand arithmetic on a toy machine and model (each
// expected figure is worked out in the comment above it), and its monotonicity on real presets.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "roofline/analysis.h"
#include "roofline/model_presets.h"
#include "roofline/predicted_times.h"
#include "roofline/pricing.h"

namespace moeserve::roofline {
namespace {

// Decode: 40 ms of weights plus 10 ns per token of context per sequence (memory-bound).
// Prefill: 0.1 ms per prompt token plus 10 ms per step (compute-bound).
class ToyTimes : public StepTimes {
 public:
  StepTime Decode(int64_t b, int64_t c) const override { return {0.04 + 1e-8 * double(b) * double(c), false}; }
  StepTime Prefill(int64_t p, int64_t step) const override {
    const double tokens = double(PromptsPerStep(p, step) * p);
    return {1e-4 * tokens + 0.01 * std::ceil(tokens / double(step)), true};
  }
};

// $3.60 per hour ($0.001/s), 100 GB of memory, 20 GB of weights, 100 KB of KV per token.
PriceInputs Toy() {
  PriceInputs in;
  in.machine.devices = 1;
  in.machine.usd_per_device_hour = 3.6;
  in.machine.device_memory_bytes = 100e9;
  in.machine.usd_per_gb_hour_ddr = 0.01;
  in.machine.usd_per_gb_hour_flash = 0.0001;
  in.machine.host_link_bytes_per_s = 10e9;
  in.machine.flash_read_bytes_per_s = 1e9;
  in.model.weight_bytes = 20e9;
  in.model.kv_bytes_per_token = 1e5;
  in.model.max_context = 100000;
  in.mix.prompt_tokens = 1000;
  in.mix.output_tokens = 200;  // decode context 1100
  in.mix.cache_hit_rate = 0.5;
  in.mix.tpot_seconds = 0.05;
  in.mix.ttft_seconds = 2.0;
  in.grid.batches = {1, 2, 4, 8, 16, 32, 64};
  in.grid.contexts = {100, 1100, 10000, 80000};
  in.grid.chunks = {100, 500, 1000};
  in.latency_floor_seconds = 0.04;
  return in;
}

TEST(PriceSheetTest, OutputAndInputPricesByHand) {
  const PriceInputs in = Toy();
  ASSERT_TRUE(in.Validate().ok()) << in.Validate();
  const PriceSheet s = ComputePriceSheet(in, ToyTimes());
  // KV at 1100 tokens: 80 GB free / 110 MB per sequence = 727 sequences, so all of the grid
  // fits; TPOT: 0.04 + 1.1e-5 b <= 0.05 holds up to b = 909, so b = 64, step 40.704 ms,
  // $0.001/s x 0.040704 s / 64 tokens = $0.636 per million.
  EXPECT_EQ(s.output.batch, 64);
  EXPECT_NEAR(s.output.seconds, 0.040704, 1e-12);
  EXPECT_NEAR(s.output.usd_per_million, 0.636, 1e-9);
  EXPECT_FALSE(s.output.compute_bound);
  EXPECT_TRUE(s.output.target_met);
  EXPECT_EQ(s.output.limited_by, "grid");
  // Chunks 100 / 500 / 1000: 0.2 / 0.12 / 0.11 s for the prompt: 1000 wins, $0.11 per million.
  EXPECT_EQ(s.input.batch, 1000);
  EXPECT_NEAR(s.input.seconds, 0.11, 1e-12);
  EXPECT_NEAR(s.input.usd_per_million, 0.11, 1e-9);
  EXPECT_TRUE(s.input.compute_bound);
  EXPECT_NEAR(s.output_over_input, 0.636 / 0.11, 1e-9);
}

TEST(PriceSheetTest, PrefillStepsLargerThanAPromptCarrySeveralPrompts) {
  PriceInputs in = Toy();
  in.grid.chunks = {1000, 2500, 4000};
  // 2500 tokens per step: 2 prompts, 2000 tokens in one step, 0.2 + 0.01 = 0.21 s, 1.05e-4 s
  // per token. 4000: 4 prompts, 0.41 s, 1.025e-4 s per token: the cheapest, $0.1025/M.
  const PriceSheet s = ComputePriceSheet(in, ToyTimes());
  EXPECT_EQ(s.input.batch, 4000);
  EXPECT_EQ(s.input.prompts, 4);
  EXPECT_NEAR(s.input.seconds, 0.41, 1e-12);
  EXPECT_NEAR(s.input.usd_per_million, 0.1025, 1e-9);
  // With a 0.3 s TTFT target the 4-prompt step (0.41 s) is out: 2 prompts, $0.105/M.
  in.mix.ttft_seconds = 0.3;
  const PriceSheet t = ComputePriceSheet(in, ToyTimes());
  EXPECT_EQ(t.input.prompts, 2);
  EXPECT_NEAR(t.input.usd_per_million, 0.105, 1e-9);
  EXPECT_TRUE(t.input.target_met);
  // With room for the KV of only 3 prompts (3e8 bytes over the weights), 4 per step is out.
  in = Toy();
  in.grid.chunks = {1000, 2500, 4000};
  in.machine.device_memory_bytes = 20e9 + 3.5e8;
  EXPECT_EQ(ComputePriceSheet(in, ToyTimes()).input.prompts, 2);
}

TEST(PriceSheetTest, TierPricesAndBreakEvenByHand) {
  const PriceSheet s = ComputePriceSheet(Toy(), ToyTimes());
  ASSERT_EQ(s.tiers.size(), 3u);
  // Holding one token (1e-4 GB) for one second at $X/GB-hour: 1e-4 X / 3600 $, per million
  // tokens 100 X / 3600 $/s.
  // Device: $3.6 / 100 GB = $0.036/GB-hour -> $0.001/M/s; 300 s -> $0.3/M; nothing to restore.
  // Break-even: $0.11 / $0.001 = 110 s.
  EXPECT_NEAR(s.tiers[0].usd_per_gb_hour, 0.036, 1e-12);
  EXPECT_NEAR(s.tiers[0].hold_usd_per_million, 0.3, 1e-9);
  EXPECT_NEAR(s.tiers[0].restore_usd_per_million, 0.0, 1e-12);
  EXPECT_NEAR(s.tiers[0].discount, 0.11 / 0.3, 1e-9);
  EXPECT_NEAR(s.tiers[0].break_even_retention_seconds, 110, 1e-6);
  // DDR: $0.01 -> 2.7778e-4 $/M/s; 300 s -> $0.083333; restore 1e5 B / 10 GB/s = 10 us per
  // token -> $0.01/M. Total $0.093333; break-even (0.11 - 0.01) / 2.7778e-4 = 360 s.
  EXPECT_NEAR(s.tiers[1].hold_usd_per_million, 0.25 / 3, 1e-9);
  EXPECT_NEAR(s.tiers[1].restore_seconds_per_token, 1e-5, 1e-15);
  EXPECT_NEAR(s.tiers[1].restore_usd_per_million, 0.01, 1e-9);
  EXPECT_NEAR(s.tiers[1].usd_per_million, 0.25 / 3 + 0.01, 1e-9);
  EXPECT_NEAR(s.tiers[1].break_even_retention_seconds, 360, 1e-6);
  // Flash: $0.0001 -> 2.7778e-6 $/M/s; 3600 s -> $0.01; restore 1e5 B / 1 GB/s = 100 us ->
  // $0.1/M. Total $0.11 (discount 1); break-even (0.11 - 0.1) / 2.7778e-6 = 3600 s.
  EXPECT_NEAR(s.tiers[2].hold_usd_per_million, 0.01, 1e-9);
  EXPECT_NEAR(s.tiers[2].usd_per_million, 0.11, 1e-9);
  EXPECT_NEAR(s.tiers[2].break_even_retention_seconds, 3600, 1e-6);
  // A request: half its 1000 prompt tokens at $0.11/M, half at the cheapest tier's $0.093333/M,
  // 200 output tokens at $0.636/M: (55 + 46.667 + 127.2) / 1e6 $.
  EXPECT_NEAR(s.usd_per_request, (55 + 140.0 / 3 + 127.2) / 1e6, 1e-12);
}

TEST(PriceSheetTest, ContextCliffByHand) {
  const PriceSheet s = ComputePriceSheet(Toy(), ToyTimes());
  // KV = weights at 20e9 / (64 x 1e5) = 3125 tokens; 80 GB free is filled at 12500.
  EXPECT_NEAR(s.kv_equals_weights_context, 3125, 1e-9);
  EXPECT_NEAR(s.batch_shrinks_context, 12500, 1e-9);
  ASSERT_EQ(s.context_curve.size(), 4u);
  // 100 tokens: step 0.04 + 6.4e-5 -> $0.626/M; 10000: 0.0464 -> $0.725/M; 80000: only
  // 10 sequences fit (8e5 / 80000) so the grid's 8, step 0.0464 -> $5.8/M.
  EXPECT_NEAR(s.context_curve[0].usd_per_million_output, 0.626, 1e-9);
  EXPECT_NEAR(s.context_curve[2].usd_per_million_output, 0.725, 1e-9);
  EXPECT_EQ(s.context_curve[3].batch, 8);
  PriceInputs tight = Toy();
  tight.mix.tpot_seconds = 0.0405;  // 0.04 + 1.1e-5 b: b <= 45, so 32 (64 would miss it)
  EXPECT_EQ(ComputePriceSheet(tight, ToyTimes()).output.batch, 32);
  EXPECT_EQ(ComputePriceSheet(tight, ToyTimes()).output.limited_by, "tpot");
  tight = Toy();
  tight.machine.device_memory_bytes = 20e9 + 4e9;  // 4 GB of KV: 4e9 / (1100 x 1e5) = 36 sequences
  EXPECT_EQ(ComputePriceSheet(tight, ToyTimes()).output.batch, 32);
  EXPECT_EQ(ComputePriceSheet(tight, ToyTimes()).output.limited_by, "memory");
  EXPECT_TRUE(s.context_curve[3].memory_limited);
  EXPECT_FALSE(s.context_curve[2].memory_limited);
  EXPECT_NEAR(s.context_curve[3].usd_per_million_output, 5.8, 1e-9);
  EXPECT_NEAR(s.context_curve[3].kv_over_weight_bytes, 8 * 80000 * 1e5 / 20e9, 1e-12);
  EXPECT_EQ(s.doubling_context, 80000);
  EXPECT_NEAR(s.long_over_short, 5.8 / 0.626, 1e-9);
}

TEST(PriceSheetTest, FastModeByHand) {
  const PriceSheet s = ComputePriceSheet(Toy(), ToyTimes());
  ASSERT_EQ(s.fast_curve.size(), 7u);
  EXPECT_EQ(s.fast_curve.front().batch, 64);
  EXPECT_NEAR(s.fast_curve.front().price_multiple, 1.0, 1e-12);
  EXPECT_EQ(s.fast_curve.back().batch, 1);
  // Batch 1: step 0.040011 s; speed 0.040704 / 0.040011; price (0.040011 / 1) / (0.040704 / 64).
  EXPECT_NEAR(s.fast_curve.back().speed_multiple, 0.040704 / 0.040011, 1e-12);
  EXPECT_NEAR(s.fast_curve.back().price_multiple, 0.040011 * 64 / 0.040704, 1e-9);
  EXPECT_NEAR(s.max_speed_multiple, 0.040704 / 0.040011, 1e-12);
  EXPECT_TRUE(s.fast_curve.back().at_floor);
}

TEST(PriceSheetTest, UnmetTargetsPriceTheFastestAndSaySo) {
  PriceInputs in = Toy();
  in.mix.tpot_seconds = 0.01;  // below the 40 ms weight read
  in.mix.ttft_seconds = 0.05;  // below the 0.1 s of arithmetic
  const PriceSheet s = ComputePriceSheet(in, ToyTimes());
  EXPECT_FALSE(s.output.target_met);
  EXPECT_EQ(s.output.batch, 1);
  EXPECT_FALSE(s.input.target_met);
  EXPECT_EQ(s.input.batch, 1000);
}

TEST(PriceSheetTest, ABatchThatDoesNotFitIsMarkedNotNaN) {
  PriceInputs in = Toy();
  in.grid.batches = {8, 16};
  in.grid.contexts = {1100, 200000};
  in.model.max_context = 0;
  // At 200000 tokens 8 sequences need 160 GB of KV where 80 GB are free: the smallest is priced.
  const PriceSheet s = ComputePriceSheet(in, ToyTimes());
  ASSERT_EQ(s.context_curve.size(), 2u);
  EXPECT_FALSE(s.context_curve[1].fits);
  EXPECT_EQ(s.context_curve[1].batch, 8);
  EXPECT_TRUE(std::isfinite(s.context_curve[1].usd_per_million_output));
}

TEST(PriceSheetTest, BadInputsAreRefusedByName) {
  PriceInputs in = Toy();
  in.grid.contexts = {100, 10000};
  EXPECT_NE(std::string(in.Validate().message()).find("1100"), std::string::npos) << in.Validate();
  in = Toy();
  in.mix.cache_hit_rate = 1.5;
  EXPECT_NE(std::string(in.Validate().message()).find("cache hit rate"), std::string::npos);
  in = Toy();
  in.grid.batches = {4, 2};
  EXPECT_NE(std::string(in.Validate().message()).find("batches"), std::string::npos);
  in = Toy();
  in.mix.prompt_tokens = 100000;
  EXPECT_NE(std::string(in.Validate().message()).find("context"), std::string::npos);
  in = Toy();
  in.model.weight_bytes = 120e9;  // over the 100 GB of memory
  EXPECT_NE(std::string(in.Validate().message()).find("--ep"), std::string::npos) << in.Validate();
  in = Toy();
  in.machine.usd_per_gb_hour_flash = 0;
  EXPECT_NE(std::string(in.Validate().message()).find("$/GB-hour"), std::string::npos) << in.Validate();
}

// On real presets: at a fixed batch the price never falls as the context grows, the context
// curve never falls either, and no batch's step is faster than reading the weights a batch-1
// step must read.
TEST(PriceSheetTest, PredictedPricesAreMonotoneAndRespectTheFloor) {
  // Mixtral's 94 GB of bf16 weights need two H100s.
  for (const auto& [model_name, hw_name, devices] :
       {std::tuple{"mixtral-8x7b", "h100-sxm", 2}, {"deepseek-v3-like", "gb200-nvl72", 72}}) {
    auto config = AnalysisPreset(model_name);
    auto hw = HardwarePreset(hw_name);
    ASSERT_TRUE(config.ok() && hw.ok());
    const ModelCosts m = ModelCosts::From(*config, "bf16", "bf16");
    ParallelLayout layout;
    layout.ep = devices;
    const PredictedStepTimes times(m, *hw, layout);
    PriceInputs in;
    in.machine.devices = devices;
    in.machine.usd_per_device_hour = hw->price_per_hour;
    in.machine.device_memory_bytes = hw->mem_capacity;
    in.machine.usd_per_gb_hour_ddr = 0.005;
    in.machine.usd_per_gb_hour_flash = 0.0001;
    in.machine.host_link_bytes_per_s = hw->host_link_bandwidth;
    in.machine.flash_read_bytes_per_s = hw->disk_read_bandwidth;
    in.model.weight_bytes = m.TotalWeightBytes();
    in.model.kv_bytes_per_token = m.kv_bytes_per_token;
    in.model.max_context = config->max_position_embeddings;
    in.mix.prompt_tokens = 2048;
    in.mix.output_tokens = 512;
    for (int64_t b = 1; b <= 8192; b *= 2) in.grid.batches.push_back(b);
    in.grid.contexts = {256, 1024, 2304, 8192, 32768};
    for (int64_t c = 256; c <= 262144; c *= 2) in.grid.chunks.push_back(c);
    in.mix.ttft_seconds = 10;
    in.latency_floor_seconds = BatchOneWeightSeconds(m, *hw, layout);
    ASSERT_TRUE(in.Validate().ok()) << in.Validate();
    const PriceSheet s = ComputePriceSheet(in, times);
    for (int64_t b : in.grid.batches) {
      double last = 0;
      for (int64_t c : in.grid.contexts) {
        const double t = times.Decode(b, c).seconds;
        EXPECT_GE(t, last) << model_name << " batch " << b << " context " << c;
        last = t;
      }
    }
    for (size_t i = 1; i < s.context_curve.size(); ++i) {
      EXPECT_GE(s.context_curve[i].usd_per_million_output, s.context_curve[i - 1].usd_per_million_output)
          << model_name << " context " << s.context_curve[i].context;
    }
    double speed = 0;
    for (const FastPoint& f : s.fast_curve) {  // the operating batch down to 1
      EXPECT_GE(f.step_seconds, in.latency_floor_seconds * (1 - 1e-9)) << model_name << " batch " << f.batch;
      EXPECT_GT(f.speed_multiple, speed) << model_name << " batch " << f.batch << ": a smaller batch is faster";
      EXPECT_GE(f.price_multiple, 1.0 - 1e-9) << model_name;
      speed = f.speed_multiple;
    }
    EXPECT_EQ(s.max_speed_multiple, s.fast_curve.back().speed_multiple) << model_name << ": batch 1 is the fastest";
    // Prefill with enough tokens per step is compute-bound and decode at the operating batch
    // memory-bound on these GPUs, so output costs more than input (the lecture's ~5x, within a
    // factor of a few).
    EXPECT_TRUE(s.input.compute_bound) << model_name;
    EXPECT_GT(s.output_over_input, 1.5) << model_name;
    EXPECT_FALSE(ReadPriceSheet(s, in).empty());
  }
}

}  // namespace
}  // namespace moeserve::roofline
