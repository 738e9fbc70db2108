// engine/Engine: 60 random requests through continuous batching give, token for token, the
// greedy output of each request run alone (the static Generator), with and without chunked
// prefill, with prefix-cache hits, and with a KV pool so small that preemption happens. Also
// seeded sampling whatever the batch mates, cancellation, deadlines, the queue bound and
// validation, with exact pool accounting after each.
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "tests/engine/generator.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = new CpuBackend();
    config_ = new ModelConfig(*PresetConfig("tiny"));
    auto tensors = GenerateRandomWeights(*config_, 2024, DType::kF32);
    weights_ = ModelWeights::Load(*config_, *tensors, backend_, DType::kBF16)->release();
    // 60 requests; 20 share a 40-token prefix and 10 share a 9-token one.
    std::mt19937 gen(7);
    std::uniform_int_distribution<int32_t> tok(0, 255);
    std::vector<int32_t> shared_long(40), shared_short(9);
    for (auto& t : shared_long) t = tok(gen);
    for (auto& t : shared_short) t = tok(gen);
    requests_ = new std::vector<GenerateRequest>();
    for (int i = 0; i < 60; ++i) {
      GenerateRequest r;
      if (i % 3 == 0) r.prompt = shared_long;
      if (i % 6 == 1) r.prompt = shared_short;
      const int extra = 1 + gen() % 50;
      for (int j = 0; j < extra; ++j) r.prompt.push_back(tok(gen));
      r.max_tokens = 1 + gen() % 24;
      requests_->push_back(r);
    }
    // The oracle: each request alone through the static generator.
    oracle_ = new std::vector<std::vector<int32_t>>();
    for (const auto& r : *requests_) oracle_->push_back(Alone(r));
  }
  static void TearDownTestSuite() {
    delete oracle_;
    delete requests_;
    delete weights_;
    delete config_;
    delete backend_;
  }

  static std::vector<int32_t> Alone(const GenerateRequest& r) {
    auto kv = KvStorage::Create(backend_, KvLayoutFor(*config_, 64, 16, DType::kF32));
    BlockPool pool(64);
    MoeModel model(weights_, backend_);
    Generator gen(&model, &*kv, &pool);
    GenerationRequest g;
    g.prompt = r.prompt;
    g.max_tokens = r.max_tokens;
    g.sampling = r.sampling;
    g.stop_ids = r.stop_ids;
    auto res = gen.Run({g});
    EXPECT_TRUE(res.ok()) << res.status();
    return (*res)[0].tokens;
  }

  struct Collected {
    std::mutex mu;
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, RequestEvent> final_events;
    std::map<uint64_t, int> finals;
  };

  static EventCallback Collect(Collected* c) {
    return [c](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(c->mu);
      auto& t = c->tokens[ev.request_id];
      t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        c->final_events[ev.request_id] = ev;
        c->finals[ev.request_id]++;
      }
    };
  }

  // Runs all requests (half submitted up front, half after a few steps) and checks each
  // against the oracle. Returns the engine's stats.
  EngineStats RunAndCompare(EngineConfig cfg) {
    auto engine = Engine::Create(cfg, weights_, backend_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    Collected c;
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < requests_->size(); ++i) {
      if (i == requests_->size() / 2) {
        for (int s = 0; s < 5; ++s) EXPECT_TRUE((*engine)->Step().ok());
      }
      auto id = (*engine)->Submit((*requests_)[i], Collect(&c));
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    EXPECT_TRUE((*engine)->RunUntilIdle().ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(c.tokens[ids[i]], (*oracle_)[i]) << "request " << i << " differs from its run alone";
      EXPECT_EQ(c.finals[ids[i]], 1) << "request " << i << " must end exactly once";
      EXPECT_EQ(c.final_events[ids[i]].reason, FinishReason::kLength);
    }
    EXPECT_TRUE((*engine)->CheckAccounting());
    return (*engine)->GetStats();
  }

  static CpuBackend* backend_;
  static ModelConfig* config_;
  static ModelWeights* weights_;
  static std::vector<GenerateRequest>* requests_;
  static std::vector<std::vector<int32_t>>* oracle_;
};

CpuBackend* EngineTest::backend_ = nullptr;
ModelConfig* EngineTest::config_ = nullptr;
ModelWeights* EngineTest::weights_ = nullptr;
std::vector<GenerateRequest>* EngineTest::requests_ = nullptr;
std::vector<std::vector<int32_t>>* EngineTest::oracle_ = nullptr;

TEST_F(EngineTest, ChunkedPrefillMatchesEachRequestAlone) {
  EngineConfig cfg;
  cfg.scheduler.max_tokens_per_step = 48;
  cfg.scheduler.max_num_seqs = 12;
  cfg.scheduler.prefix_caching = false;
  cfg.num_kv_blocks = 400;
  auto stats = RunAndCompare(cfg);
  EXPECT_EQ(stats.cached_prompt_tokens, 0);
  EXPECT_EQ(stats.finished_length, 60);
}

TEST_F(EngineTest, WholePromptPrefillMatchesEachRequestAlone) {
  EngineConfig cfg;
  cfg.scheduler.max_tokens_per_step = 256;
  cfg.scheduler.chunked_prefill = false;
  cfg.scheduler.prefix_caching = false;
  cfg.num_kv_blocks = 400;
  RunAndCompare(cfg);
}

TEST_F(EngineTest, PrefixCacheHitsMatchEachRequestAlone) {
  EngineConfig cfg;
  cfg.scheduler.max_tokens_per_step = 64;
  cfg.block_size = 8;
  cfg.num_kv_blocks = 300;
  auto stats = RunAndCompare(cfg);
  EXPECT_GT(stats.cached_prompt_tokens, 200) << "shared prefixes must hit the cache";
}

// A pool of 30 blocks of 4 tokens (120 tokens) for up to 16 sequences: preemption is certain.
EngineConfig PreemptingConfig() {
  EngineConfig cfg;
  cfg.scheduler.max_tokens_per_step = 64;
  cfg.scheduler.max_num_seqs = 16;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 30;
  return cfg;
}

TEST_F(EngineTest, PreemptionUnderATinyPoolMatchesEachRequestAlone) {
  EngineConfig cfg = PreemptingConfig();
  auto stats = RunAndCompare(cfg);
  EXPECT_GT(stats.preemptions, 0) << "the pool was meant to be small enough to preempt";
}

// Swap-based preemption: a victim's KV (partial last block included) goes to host DDR and
// comes back when it is readmitted; the output is still each request's output alone.
TEST_F(EngineTest, SwapPreemptionMatchesEachRequestAlone) {
  EngineConfig cfg = PreemptingConfig();
  cfg.kv_tiers.host_bytes = 8ull << 20;
  cfg.kv_tiers.preemption = PreemptionMode::kSwap;
  auto stats = RunAndCompare(cfg);
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(stats.swaps, stats.preemptions) << "every victim had KV and DDR had room";
  EXPECT_EQ(stats.tiers.swapped_out, stats.swaps);
  EXPECT_EQ(stats.tiers.swapped_in, stats.swaps) << "every swapped sequence came back";
  EXPECT_GT(stats.tiers.swap_in_blocks, 0);
  EXPECT_EQ(stats.tiers.host.swap_blocks, 0) << "swap space leaked";
}

// --preemption auto asks the cost model: over a link of 1 byte/s recomputing always wins; over
// an absurdly fast one swapping does. The outputs are the same either way.
TEST_F(EngineTest, AutoPreemptionFollowsTheCostModel) {
  for (const double link : {1.0, 1e15}) {
    EngineConfig cfg = PreemptingConfig();
    cfg.kv_tiers.host_bytes = 8ull << 20;
    cfg.hardware = *roofline::HardwarePreset("h100-sxm");
    cfg.hardware->host_link_bandwidth = link;
    auto stats = RunAndCompare(cfg);
    ASSERT_GT(stats.preemptions, 0);
    if (link < 10) {
      EXPECT_EQ(stats.tiers.swap_decisions, 0);
      EXPECT_EQ(stats.swaps, 0);
      EXPECT_GT(stats.tiers.recompute_decisions, 0);
    } else {
      EXPECT_GT(stats.swaps, 0);
      EXPECT_EQ(stats.tiers.recompute_decisions, 0);
    }
  }
}

// A seeded request's tokens do not depend on its batch mates, with every sampling parameter
// (top_k, min_p, top_p, the penalties, logit_bias, bad words, min_tokens) and mates that use
// them too.
TEST_F(EngineTest, SeededSamplingDoesNotDependOnBatchMates) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 400;
  GenerateRequest r = (*requests_)[5];
  r.sampling.temperature = 0.9f;
  r.sampling.top_k = 50;
  r.sampling.top_p = 0.95f;
  r.sampling.min_p = 0.01f;
  r.sampling.seed = 31337;
  r.sampling.repetition_penalty = 1.3f;
  r.sampling.frequency_penalty = 0.4f;
  r.sampling.presence_penalty = 0.2f;
  r.sampling.logit_bias = {{3, 2.0f}, {17, -3.0f}};
  r.bad_words = {{r.prompt[0], r.prompt[1]}, {99}};
  r.stop_ids = {7};
  r.min_tokens = 10;
  r.max_tokens = 20;
  std::vector<int32_t> alone, crowded;
  {
    auto e = *Engine::Create(cfg, weights_, backend_);
    Collected c;
    auto id = e->Submit(r, Collect(&c));
    ASSERT_TRUE(e->RunUntilIdle().ok());
    alone = c.tokens[*id];
  }
  {
    auto e = *Engine::Create(cfg, weights_, backend_);
    Collected c;
    for (int i = 0; i < 8; ++i) {
      GenerateRequest mate = (*requests_)[i];
      mate.sampling.temperature = 1.0f;
      if (i % 2) mate.sampling.frequency_penalty = 1.0f, mate.sampling.logit_bias = {{3, -50.0f}};
      ASSERT_TRUE(e->Submit(mate, Collect(&c)).ok());
    }
    auto id = e->Submit(r, Collect(&c));
    ASSERT_TRUE(e->RunUntilIdle().ok());
    crowded = c.tokens[*id];
  }
  EXPECT_GE(alone.size(), 11u);
  EXPECT_EQ(alone, crowded);
}

TEST_F(EngineTest, CancellationAndDeadlinesFreeBlocksOnTheLoopThread) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 100;
  cfg.scheduler.max_num_seqs = 2;
  auto e = *Engine::Create(cfg, weights_, backend_);
  Collected c;
  GenerateRequest long_req = (*requests_)[0];
  long_req.max_tokens = static_cast<int32_t>(config_->max_position_embeddings - long_req.prompt.size());
  e->Start();
  // Cancel it mid-stream: its 4th token's callback holds the loop thread until the cancel is in,
  // so it cannot finish first however fast the steps are.
  std::promise<void> fourth, cancel_sent;
  std::shared_future<void> cancel_in = cancel_sent.get_future().share();
  auto collect = Collect(&c);
  int seen = 0;
  auto running = e->Submit(long_req, [&, cancel_in](const RequestEvent& ev) {
    collect(ev);
    if (!ev.finished && ++seen == 4) {
      fourth.set_value();
      cancel_in.wait();
    }
  });
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(fourth.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  e->Cancel(*running);
  cancel_sent.set_value();
  GenerateRequest late = (*requests_)[1];
  late.deadline = Clock::now() - std::chrono::milliseconds(1);  // already past
  auto expired = e->Submit(late, Collect(&c));
  ASSERT_TRUE(expired.ok());
  for (int i = 0; i < 5000 && !e->Idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(e->Idle());
  e->Stop();
  EXPECT_EQ(c.final_events[*running].reason, FinishReason::kCancelled);
  EXPECT_LT(c.tokens[*running].size(), 1000u);
  EXPECT_EQ(c.final_events[*expired].reason, FinishReason::kDeadline);
  EXPECT_EQ(c.finals[*running] + c.finals[*expired], 2);
  EXPECT_TRUE(e->CheckAccounting());
  EXPECT_EQ(e->GetStats().kv_blocks_used, 0);
}

TEST_F(EngineTest, CancellingAWaitingRequestAndStoppingWithWorkInFlight) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 100;
  auto e = *Engine::Create(cfg, weights_, backend_);
  Collected c;
  auto a = e->Submit((*requests_)[2], Collect(&c));
  auto b = e->Submit((*requests_)[3], Collect(&c));
  e->Cancel(*a);  // still waiting: never scheduled
  ASSERT_TRUE(e->Step().ok());
  EXPECT_EQ(c.final_events[*a].reason, FinishReason::kCancelled);
  e->Stop("shutting down");
  EXPECT_EQ(c.final_events[*b].reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final_events[*b].message, "shutting down");
  EXPECT_TRUE(e->CheckAccounting());
}

// vLLM's integer priority reaches the scheduler: one sequence at a time, requests submitted
// together finish in the order of their ranks.
TEST_F(EngineTest, IntegerRanksOrderRequestsOfALane) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 100;
  cfg.scheduler.max_num_seqs = 1;
  auto e = *Engine::Create(cfg, weights_, backend_);
  std::vector<uint64_t> finished;
  std::mutex mu;
  std::vector<uint64_t> ids;
  for (int32_t rank : {5, -1, 3}) {
    GenerateRequest r = (*requests_)[0];
    r.max_tokens = 2;
    r.rank = rank;
    ids.push_back(*e->Submit(r, [&](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.finished) finished.push_back(ev.request_id);
    }));
  }
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(finished, (std::vector<uint64_t>{ids[1], ids[2], ids[0]}));
}

// As vLLM: max_tokens is bounded by what the context leaves (serve's default limit is the
// context), and a prompt plus max_tokens past it is refused, not silently cut.
TEST(RequestLimitsTest, MaxTokensIsBoundedByTheContextNotAFixedNumber) {
  ModelConfig c = *PresetConfig("tiny");
  c.max_position_embeddings = 100000;
  RequestLimits limits;
  limits.max_tokens = limits.Context(c);
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 50000;
  EXPECT_TRUE(ValidateRequest(r, c, limits).ok());
  r.max_tokens = 99998;
  const absl::Status past = ValidateRequest(r, c, limits);
  EXPECT_FALSE(past.ok());
  EXPECT_NE(past.message().find("exceed the model length of 100000"), std::string::npos) << past;
  limits.max_model_len = 1000;
  EXPECT_EQ(limits.Context(c), 1000);
  r.max_tokens = 998;
  EXPECT_NE(ValidateRequest(r, c, limits).message().find("--max-model-len"), std::string::npos);
}

TEST_F(EngineTest, RefusesBadRequestsAndAFullQueue) {
  EngineConfig cfg;
  cfg.num_kv_blocks = 20;
  cfg.scheduler.max_waiting = 3;
  cfg.limits.max_tokens = 64;
  auto e = *Engine::Create(cfg, weights_, backend_);
  auto expect_invalid = [&](GenerateRequest r, const std::string& needle) {
    auto id = e->Submit(r, nullptr);
    ASSERT_FALSE(id.ok()) << needle;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(id.status().message()).find(needle), std::string::npos) << id.status();
  };
  GenerateRequest ok = (*requests_)[4];
  GenerateRequest r = ok;
  r.prompt.clear();
  expect_invalid(r, "prompt: the prompt is empty");
  r = ok;
  r.prompt[0] = static_cast<int32_t>(config_->vocab_size);
  expect_invalid(r, "outside the vocabulary");
  r = ok;
  r.max_tokens = 0;
  expect_invalid(r, "max_tokens: must be in [1, 64]");
  r = ok;
  r.sampling.top_p = 1.5f;
  expect_invalid(r, "sampling.top_p: must be in (0, 1]");
  r = ok;
  r.prompt.assign(400, 3);
  expect_invalid(r, "KV cache");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->Submit(ok, nullptr).ok());
  auto full = e->Submit(ok, nullptr);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_TRUE(e->Submit(ok, nullptr).ok()) << "the queue drains and accepts again";
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_TRUE(e->CheckAccounting());
}

}  // namespace
}  // namespace moeserve
