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
#include "engine/output_processor.h"
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
  double busy = 0;
  for (const StepRecord& r : stats.recent_steps) busy += r.duration_seconds;
  EXPECT_NEAR(busy, stats.busy_seconds, 1e-9 * busy);
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
    // The parts add up; a request decodes (after its first token) only if it made more than one.
    EXPECT_NEAR(rc.prefill_device_seconds + rc.decode_device_seconds + rc.transfer_device_seconds, rc.device_seconds,
                1e-12 + 1e-9 * rc.device_seconds);
    EXPECT_GT(rc.prefill_device_seconds, 0);
    EXPECT_EQ(rc.decode_device_seconds > 0, ev.usage.completion_tokens > 1) << ev.usage.completion_tokens;
    EXPECT_EQ(rc.transfer_device_seconds, 0);  // no tiers
    EXPECT_GT(rc.kv_gb_seconds, 0);
  }
  EXPECT_NEAR(attributed, busy, 1e-9 * busy + 1e-12) << "every step's time is attributed exactly once";
}

// A step of 0.62 s in which request A computes 30 prompt tokens and request B decodes one, after
// 0.08 s of tier copies: 3 blocks swapped in for B and 1 block demoted for no one.
TEST(InstrumentationTest, ReceiptPartsByHand) {
  LiveRequest a, b;
  a.seq.id = 1;
  a.seq.prompt_len = 40;
  a.seq.blocks = {0, 1};
  b.seq.id = 2;
  b.seq.prompt_len = 20;
  b.seq.blocks = {2, 3, 4, 5};
  SchedulerOutput out;
  out.chunks = {ScheduledChunk{&a.seq, 0, 30, false}, ScheduledChunk{&b.seq, 50, 1, true}};
  out.num_tokens = 31;
  KvTransfer swap_in, demote;
  swap_in.kind = KvTransfer::Kind::kSwapIn;
  swap_in.blocks = {3, 4, 5};
  demote.blocks = {7};
  out.transfers = {swap_in, demote};
  out.transfer_seqs = {&b.seq, nullptr};
  const LiveLookup lookup = [&](uint64_t id) -> LiveRequest& { return id == 1 ? a : b; };
  BookReceipts(out, 2, 0.62, 0.08, 1e6, lookup);
  // B's copies: 3 of the 4 blocks moved, 0.06 s. The other 0.56 s over 31 tokens: A 30, B 1.
  EXPECT_NEAR(b.transfer_device_seconds, 0.06, 1e-15);
  EXPECT_NEAR(a.prefill_device_seconds, 0.56 * 30 / 31, 1e-15);
  EXPECT_EQ(a.decode_device_seconds, 0);
  EXPECT_NEAR(b.decode_device_seconds, 0.56 / 31, 1e-15);
  EXPECT_EQ(b.prefill_device_seconds, 0);
  EXPECT_NEAR(a.device_seconds + b.device_seconds, 0.62, 1e-15);
  // KV held for the step: 2 and 4 blocks of 1 MB for 0.62 s.
  EXPECT_NEAR(a.kv_gb_seconds, 2e-3 * 0.62, 1e-15);
  EXPECT_NEAR(b.kv_gb_seconds, 4e-3 * 0.62, 1e-15);
  EXPECT_EQ(a.steps, 1);
  EXPECT_EQ(b.batch_sum, 2);
  // Copies reported longer than the step (they overlap it) are charged the step at most.
  LiveRequest c;
  c.seq.id = 2;
  c.seq.blocks = {1};
  SchedulerOutput only;
  only.transfers = {swap_in};
  only.transfer_seqs = {&c.seq};
  BookReceipts(only, 0, 0.01, 0.5, 1e6, [&](uint64_t) -> LiveRequest& { return c; });
  EXPECT_NEAR(c.transfer_device_seconds, 0.01, 1e-15);
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
