// Engine instrumentation: every step's record carries the batch shape, the phases, the work
// (FLOPs counted here independently from the config) and the roofline prediction; traces are
// well-formed; receipts share each step's time among its tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "roofline/hardware.h"

namespace moeserve {
namespace {

struct Fixture {
  CpuBackend backend;
  ModelConfig config = *PresetConfig("tiny");
  std::unique_ptr<ModelWeights> weights;
  Fixture() {
    auto tensors = GenerateRandomWeights(config, 99, DType::kF32);
    weights = *ModelWeights::Load(config, *tensors, &backend, DType::kBF16);
  }
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string();
}

TEST(InstrumentationTest, StepRecordsCarryWorkAndPredictionsAndTracesAreWellFormed) {
  Fixture f;
  EngineConfig ec;
  ec.step_history = 1 << 20;
  ec.hardware = *roofline::HardwarePreset("h100-sxm");
  ec.trace_jsonl = TempPath("steps.jsonl");
  ec.trace_chrome = TempPath("trace.json");
  ec.scheduler.max_tokens_per_step = 64;  // chunked prefill mixed with decodes
  auto engine = Engine::Create(ec, f.weights.get(), &f.backend);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 gen(std::random_device{}());
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    const int len = 1 + static_cast<int>(gen() % 100);
    for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 1 + static_cast<int32_t>(gen() % 20);
    ASSERT_TRUE((*engine)->Submit(r, nullptr).ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  const EngineStats stats = (*engine)->GetStats();
  engine->reset();  // closes the traces
  ASSERT_EQ(static_cast<int64_t>(stats.recent_steps.size()), stats.steps);
  const ModelConfig& c = f.config;
  // FLOPs by hand: 2 per weight a token touches (no embedding lookup, lm_head per sampled
  // row) plus 4 * heads * head_dim per attended position per layer.
  const double per_token = 2.0 * (c.ActiveParams() - c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 0 : 1) -
                                  c.vocab_size * c.hidden_size);
  int decode_only = 0;
  for (const StepRecord& r : stats.recent_steps) {
    EXPECT_GT(r.predicted_bound_seconds, 0);
    EXPECT_DOUBLE_EQ(r.predicted_seconds, r.predicted_bound_seconds);  // no calibration given
    EXPECT_NEAR(r.predicted_compute_seconds, r.flops / 989.4e12, 1e-9 * r.predicted_compute_seconds);
    EXPECT_GT(r.weight_bytes, 0);
    EXPECT_GE(r.duration_seconds, r.attention_seconds + r.moe_seconds);
    EXPECT_GE(r.sampling_seconds, 0);
    if (r.prefill_tokens == 0) {
      ++decode_only;
      const double expect = r.num_tokens * per_token + 2.0 * c.vocab_size * c.hidden_size * r.num_seqs +
                            4.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * r.context_tokens;
      EXPECT_NEAR(r.flops, expect, 1e-9 * expect) << "step " << r.step;
      EXPECT_NEAR(r.kv_write_bytes, r.num_tokens * 2.0 * c.num_hidden_layers * c.kv_dim() * 4, 1e-6);
    }
  }
  EXPECT_GT(decode_only, 0);

  std::ifstream jl(ec.trace_jsonl);
  std::string line;
  int64_t lines = 0;
  while (std::getline(jl, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int64_t>(), lines);
    EXPECT_GT(j["predicted_s"]["bound"].get<double>(), 0);
    ++lines;
  }
  EXPECT_EQ(lines, stats.steps);
  std::ifstream cf(ec.trace_chrome);
  const auto trace = nlohmann::json::parse(cf);
  ASSERT_TRUE(trace.is_array());
  int64_t step_events = 0;
  for (const auto& ev : trace) {
    if (ev["name"] == "step") ++step_events;
  }
  EXPECT_EQ(step_events, stats.steps);
  std::filesystem::remove(ec.trace_jsonl);
  std::filesystem::remove(ec.trace_chrome);
}

TEST(InstrumentationTest, ReceiptsShareEachStepAmongItsTokens) {
  Fixture f;
  EngineConfig ec;
  ec.step_history = 1 << 20;
  ec.price_per_hour = 3.6;  // one cent per device-second... times 0.1: $0.001 per second
  auto engine = Engine::Create(ec, f.weights.get(), &f.backend);
  ASSERT_TRUE(engine.ok());
  std::mutex mu;
  std::vector<RequestEvent> finals;
  std::mt19937 gen(std::random_device{}());
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r;
    const int len = 1 + static_cast<int>(gen() % 60);
    for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 1 + static_cast<int32_t>(gen() % 16);
    ASSERT_TRUE((*engine)
                    ->Submit(r,
                             [&](const RequestEvent& ev) {
                               if (!ev.finished) return;
                               std::lock_guard<std::mutex> lock(mu);
                               finals.push_back(ev);
                             })
                    .ok());
  }
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  const EngineStats stats = (*engine)->GetStats();
  double forward = 0;
  for (const StepRecord& r : stats.recent_steps) forward += r.duration_seconds - r.sampling_seconds;
  double attributed = 0;
  ASSERT_EQ(finals.size(), 10u);
  for (const RequestEvent& ev : finals) {
    const RequestReceipt& rc = ev.receipt;
    attributed += rc.device_seconds;
    EXPECT_GT(rc.steps, 0);
    EXPECT_GE(rc.steps, ev.usage.completion_tokens);  // a token per step at most
    EXPECT_GE(rc.mean_batch_size, 1.0);
    EXPECT_LE(rc.mean_batch_size, 10.0);
    EXPECT_NEAR(rc.cost_usd, rc.device_seconds * 3.6 / 3600, 1e-15);
    EXPECT_NEAR(rc.queue_seconds + rc.prefill_seconds + rc.decode_seconds, ev.timing.e2e_seconds, 1e-3);
  }
  EXPECT_NEAR(attributed, forward, 1e-9 * forward + 1e-12) << "every step's forward time is attributed exactly once";
}

TEST(InstrumentationTest, ARequestAloneJoinsOneStepPerToken) {
  Fixture f;
  auto engine = Engine::Create(EngineConfig(), f.weights.get(), &f.backend);
  ASSERT_TRUE(engine.ok());
  RequestEvent last;
  GenerateRequest r;
  r.prompt = {256, 1, 2, 3, 4, 5};
  r.max_tokens = 7;
  ASSERT_TRUE((*engine)->Submit(r, [&](const RequestEvent& ev) { if (ev.finished) last = ev; }).ok());
  ASSERT_TRUE((*engine)->RunUntilIdle().ok());
  EXPECT_EQ(last.receipt.steps, last.usage.completion_tokens);
  EXPECT_DOUBLE_EQ(last.receipt.mean_batch_size, 1.0);
  EXPECT_EQ(last.receipt.cost_usd, 0.0);  // no price configured
}

}  // namespace
}  // namespace moeserve
