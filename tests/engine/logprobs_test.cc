// Log-probabilities from the engine against a float64 log-softmax of an independent naive
// forward's logits (tests/models/naive_forward.h): the chosen token's own logprob on every
// sampled token, also where it is outside the top n (temperature 1 samples those), and each of
// the top n; with `logprobs` alone (top 0) the chosen token's only.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "tests/engine/tiny_f32_model.h"
#include "tests/models/naive_forward.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

std::vector<double> LogSoftmax(const std::vector<double>& logits) {
  double mx = -1e300, sum = 0;
  for (double v : logits) mx = std::max(mx, v);
  for (double v : logits) sum += std::exp(v - mx);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - mx - std::log(sum);
  return out;
}

TEST(LogprobsTest, ChosenAndTopLogprobsEqualAFloat64LogSoftmax) {
  const uint64_t seed = std::random_device{}();  // fresh inputs each run; the seed is in the trace
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  testing::TinyF32Model tiny(seed);
  const ModelConfig& config = tiny.config;
  auto engine = tiny.MakeEngine(testing::F32KvConfig());
  ASSERT_NE(engine, nullptr);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  struct Got {
    std::vector<int32_t> tokens;
    std::vector<float> chosen;
    std::vector<std::vector<TokenLogprob>> top;
  };
  std::mutex mu;
  std::map<uint64_t, Got> got;
  std::map<uint64_t, GenerateRequest> sent;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    for (int t = 0; t < 5 + i; ++t) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 12;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed + static_cast<uint64_t>(i);
    r.logprobs = true;
    r.top_logprobs = i % 2 == 0 ? 1 : 0;  // top 1: the chosen one is often not it
    auto id = engine->Submit(r, [&](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      Got& g = got[ev.request_id];
      g.tokens.insert(g.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      g.chosen.insert(g.chosen.end(), ev.token_logprobs.begin(), ev.token_logprobs.end());
      g.top.insert(g.top.end(), ev.logprobs.begin(), ev.logprobs.end());
    });
    ASSERT_TRUE(id.ok()) << id.status();
    sent[*id] = r;
  }
  ASSERT_TRUE(engine->RunUntilIdle().ok());
  const testing::NaiveMixtral naive(config, *tiny.tensors);
  double worst = 0, worst_rel = 0;
  int outside_top = 0;
  for (const auto& [id, r] : sent) {
    const Got& g = got[id];
    ASSERT_EQ(g.chosen.size(), g.tokens.size()) << "request " << id;
    ASSERT_EQ(g.top.size(), g.tokens.size()) << "request " << id;
    std::vector<int32_t> seq = r.prompt;
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
    const auto logits = naive.Logits(seq);
    for (size_t i = 0; i < g.tokens.size(); ++i) {
      const std::vector<double> want = LogSoftmax(logits[r.prompt.size() - 1 + i]);
      const double err = std::fabs(g.chosen[i] - want[g.tokens[i]]);
      worst = std::max(worst, err);
      worst_rel = std::max(worst_rel, err / std::max(1e-9, std::fabs(want[g.tokens[i]])));
      ASSERT_EQ(static_cast<int>(g.top[i].size()), r.top_logprobs);
      std::vector<double> sorted = want;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<double>());
      for (const TokenLogprob& t : g.top[i]) {
        const int32_t best = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
        // (Which of two tokens within fp32 rounding of each other is first is not the test's.)
        if (sorted[0] - sorted[1] > 1e-4) {
          EXPECT_EQ(t.token, best) << "request " << id << " token " << i;
        }
        worst = std::max(worst, std::fabs(t.logprob - want[t.token]));
        if (t.token != g.tokens[i]) ++outside_top;
      }
    }
  }
  EXPECT_LE(worst, 1e-3) << "max abs logprob error " << worst << " (max rel " << worst_rel << ")";
  EXPECT_GT(outside_top, 0) << "temperature 1 should sample some token outside the top 1";
}

// prompt_logprobs: every prompt token after the first, its logprob and rank and the top n at
// its position, against a float64 log-softmax of the naive forward; across chunks of a chunked
// prefill, and whole although the same prompt's blocks are in the prefix cache.
TEST(LogprobsTest, PromptLogprobsEqualAFloat64LogSoftmaxAcrossChunksAndCacheHits) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  testing::TinyF32Model tiny(seed);
  const ModelConfig& config = tiny.config;
  EngineConfig cfg = testing::F32KvConfig();
  cfg.block_size = 4;
  cfg.scheduler.max_tokens_per_step = 8;  // a 30-token prompt in four chunks
  auto engine = tiny.MakeEngine(cfg);
  ASSERT_NE(engine, nullptr);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  GenerateRequest r;
  for (int t = 0; t < 30; ++t) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
  r.max_tokens = 2;
  std::mutex mu;
  std::vector<std::vector<PromptLogprob>> got;
  auto run = [&](const GenerateRequest& req) {
    auto id = engine->Submit(req, [&](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (!ev.prompt_logprobs.empty()) got.push_back(ev.prompt_logprobs);
    });
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(engine->RunUntilIdle().ok());
  };
  run(r);  // caches the prompt's blocks, and asks for no prompt logprobs
  EXPECT_TRUE(got.empty());
  r.prompt_logprobs = 3;
  run(r);
  r.prompt_logprobs = 0;
  run(r);
  ASSERT_EQ(got.size(), 2u);
  const testing::NaiveMixtral naive(config, *tiny.tensors);
  const auto logits = naive.Logits(r.prompt);
  double worst = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const int top = k == 0 ? 3 : 0;
    ASSERT_EQ(got[k].size(), r.prompt.size() - 1);
    for (size_t i = 0; i + 1 < r.prompt.size(); ++i) {
      const std::vector<double> want = LogSoftmax(logits[i]);
      const int32_t token = r.prompt[i + 1];
      const PromptLogprob& p = got[k][i];
      worst = std::max(worst, std::fabs(p.logprob - want[token]));
      int rank = 1;
      for (double v : want) rank += v > want[token] + 1e-6;
      EXPECT_NEAR(p.rank, rank, 1) << "position " << i;  // (within fp32 rounding of a near tie)
      ASSERT_EQ(static_cast<int>(p.top.size()), top);
      for (const TokenLogprob& t : p.top) worst = std::max(worst, std::fabs(t.logprob - want[t.token]));
    }
  }
  EXPECT_LE(worst, 1e-3) << "max abs prompt logprob error " << worst;
}

}  // namespace
}  // namespace moeserve
