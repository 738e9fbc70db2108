// The logits processors (penalties, logit_bias, min_tokens) against vLLM's definitions written
// out independently here: the editor's edits applied by the backend against the formulas of
// vLLM's apply_penalties and its logit-bias and min-tokens processors, and the engine's greedy
// tokens against the arg-max of a naive forward's logits under the same formulas.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/logit_edits.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "tests/engine/tiny_f32_model.h"
#include "tests/models/naive_forward.h"
#include "tests/test_util.h"

namespace moeserve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// vLLM's order: bad words, logit bias and the min-tokens ban (logits processors), then
// repetition (prompt and output tokens), then frequency and presence (output tokens only).
std::vector<double> VllmProcessed(std::vector<double> l, const GenerateRequest& r,
                                  const std::vector<int32_t>& output) {
  const SamplingParams& s = r.sampling;
  for (const auto& [token, bias] : s.logit_bias) l[token] += bias;
  if (static_cast<int32_t>(output.size()) < r.min_tokens) {
    for (int32_t t : r.stop_ids) l[t] = -kInf;
  }
  // vLLM's _apply_bad_words_single_batch.
  for (const std::vector<int32_t>& word : r.bad_words) {
    if (word.size() > output.size() + 1) continue;
    const size_t prefix = word.size() - 1;
    const std::vector<int32_t> actual(output.end() - static_cast<std::ptrdiff_t>(prefix), output.end());
    if (actual == std::vector<int32_t>(word.begin(), word.end() - 1)) l[word.back()] = -kInf;
  }
  std::map<int32_t, int> count;
  for (int32_t t : output) ++count[t];
  std::set<int32_t> seen(r.prompt.begin(), r.prompt.end());
  seen.insert(output.begin(), output.end());
  for (int32_t t : seen) l[t] = l[t] > 0 ? l[t] / s.repetition_penalty : l[t] * s.repetition_penalty;
  for (const auto& [t, n] : count) l[t] -= s.frequency_penalty * n + s.presence_penalty;
  return l;
}

GenerateRequest RandomRequest(std::mt19937& gen, int64_t vocab) {
  GenerateRequest r;
  std::uniform_real_distribution<float> u(-1, 1);
  for (int i = 0; i < 12; ++i) r.prompt.push_back(static_cast<int32_t>(gen() % 40));  // repeats
  r.sampling.repetition_penalty = 1.0f + std::fabs(u(gen));
  r.sampling.frequency_penalty = 2 * u(gen);
  r.sampling.presence_penalty = 2 * u(gen);
  std::set<int32_t> biased;
  for (int i = 0; i < 6; ++i) biased.insert(static_cast<int32_t>(gen() % vocab));
  for (int32_t t : biased) r.sampling.logit_bias.emplace_back(t, 100 * u(gen));
  r.stop_ids = {static_cast<int32_t>(gen() % 40), static_cast<int32_t>(vocab - 1), static_cast<int32_t>(vocab - 1)};
  r.min_tokens = 3;
  r.max_tokens = 16;
  for (int i = 0; i < 6; ++i) {  // words of 1-3 tokens over the ids the outputs repeat
    std::vector<int32_t> word;
    for (int k = 0, n = 1 + static_cast<int>(gen() % 3); k < n; ++k) word.push_back(static_cast<int32_t>(gen() % 40));
    r.bad_words.push_back(word);
  }
  return r;
}

TEST(LogitEditsTest, EditedLogitsEqualVllmsFormulas) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  const int64_t vocab = 300, rows = 4;
  CpuBackend backend;
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> outputs(rows);
  std::vector<LogitEdit> edits;
  for (int64_t row = 0; row < rows; ++row) {
    reqs.push_back(RandomRequest(gen, vocab));
    LogitEditor editor(reqs.back());
    for (int i = 0; i < static_cast<int>(row) * 2; ++i) {  // rows 0 and 1 are before min_tokens
      outputs[row].push_back(static_cast<int32_t>(gen() % 40));
      editor.Observe(outputs[row].back());
    }
    editor.Append(static_cast<int32_t>(row), static_cast<int64_t>(outputs[row].size()), &edits);
  }
  std::set<std::pair<int32_t, int32_t>> cells;
  for (const LogitEdit& e : edits) EXPECT_TRUE(cells.insert({e.row, e.token}).second) << "one edit per cell";
  std::vector<float> logits(rows * vocab);
  std::normal_distribution<float> n(0, 4);
  for (float& v : logits) v = n(gen);
  const std::vector<float> before = logits;
  backend.EditLogits(logits.data(), vocab, edits.data(), static_cast<int64_t>(edits.size()));
  double worst = 0;
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<double> l(before.begin() + row * vocab, before.begin() + (row + 1) * vocab);
    const std::vector<double> want = VllmProcessed(l, reqs[row], outputs[row]);
    for (int64_t t = 0; t < vocab; ++t) {
      const double got = logits[row * vocab + t];
      if (std::isinf(want[t])) {
        EXPECT_EQ(got, want[t]) << "row " << row << " token " << t;
        continue;
      }
      const double err = std::fabs(got - want[t]);
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-4 * std::max(1.0, std::fabs(want[t])))
          << "row " << row << " token " << t << ": got " << got << ", want " << want[t];
    }
  }
  RecordProperty("max_abs_error", std::to_string(worst));
}

TEST(LogitEditsTest, ARequestAskingForNothingEditsNothing) {
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.stop_ids = {2};
  LogitEditor editor(r);
  editor.Observe(5);
  std::vector<LogitEdit> edits;
  editor.Append(0, 1, &edits);
  EXPECT_FALSE(editor.active());
  EXPECT_TRUE(edits.empty());
}

struct EngineRun {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, FinishReason> reasons;
};

EngineRun RunAll(Engine* e, const std::vector<GenerateRequest>& reqs, std::vector<uint64_t>* ids) {
  EngineRun out;
  std::mutex mu;
  for (const GenerateRequest& r : reqs) {
    auto id = e->Submit(r, [&](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = out.tokens[ev.request_id];
      v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) out.reasons[ev.request_id] = ev.reason;
    });
    EXPECT_TRUE(id.ok()) << id.status();
    ids->push_back(*id);
  }
  EXPECT_TRUE(e->RunUntilIdle().ok());
  return out;
}

// Greedy requests with random penalties, biases and min_tokens (and one with none) in one batch:
// each token is the arg-max of the naive forward's logits after vLLM's formulas, given the
// tokens before it; and the penalties change some choice (a test that ignores them fails).
TEST(LogitEditsTest, GreedyTokensAreTheArgMaxOfVllmsProcessedLogits) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  testing::TinyF32Model tiny(seed);
  const ModelConfig& config = tiny.config;
  auto engine = tiny.MakeEngine(testing::F32KvConfig());
  ASSERT_NE(engine, nullptr);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(RandomRequest(gen, config.vocab_size));
    reqs.back().sampling.temperature = 0.0f;
  }
  {  // a batch mate asking for nothing: its prompt alone
    GenerateRequest plain;
    plain.prompt = reqs[0].prompt;
    reqs[0] = plain;
  }
  reqs[0].max_tokens = 16;
  std::vector<uint64_t> ids;
  const EngineRun got = RunAll(engine.get(), reqs, &ids);
  const testing::NaiveMixtral naive(config, *tiny.tensors);
  int changed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateRequest& r = reqs[i];
    const std::vector<int32_t>& toks = got.tokens.at(ids[i]);
    ASSERT_FALSE(toks.empty());
    std::vector<int32_t> seq = r.prompt;
    seq.insert(seq.end(), toks.begin(), toks.end());
    const auto logits = naive.Logits(seq);
    for (size_t k = 0; k < toks.size(); ++k) {
      const std::vector<int32_t> before(toks.begin(), toks.begin() + k);
      const std::vector<double> want = VllmProcessed(logits[r.prompt.size() - 1 + k], r, before);
      std::vector<double> sorted = want;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<double>());
      const auto best = std::max_element(want.begin(), want.end()) - want.begin();
      const auto raw = std::max_element(logits[r.prompt.size() - 1 + k].begin(), logits[r.prompt.size() - 1 + k].end()) -
                       logits[r.prompt.size() - 1 + k].begin();
      changed += best != raw;
      if (sorted[0] - sorted[1] < 1e-3) continue;  // which of a near tie wins is not the test's
      EXPECT_EQ(toks[k], best) << "request " << i << " token " << k << ": processed logit " << want[toks[k]]
                               << " against the best " << sorted[0];
    }
    const bool stopped = std::find(r.stop_ids.begin(), r.stop_ids.end(), toks.back()) != r.stop_ids.end();
    EXPECT_GE(static_cast<int32_t>(toks.size()), stopped ? r.min_tokens + 1 : r.max_tokens) << "request " << i;
  }
  EXPECT_GT(changed, 0) << "the penalties and biases changed no greedy choice: the test would not see them";
}

// logit_bias +100 makes a stop token the only choice; min_tokens holds it off for that many
// tokens, then it ends the request.
TEST(LogitEditsTest, MinTokensHoldsOffAStopTokenThatLogitBiasForces) {
  testing::TinyF32Model tiny(7);
  auto engine = tiny.MakeEngine(EngineConfig());
  ASSERT_NE(engine, nullptr);
  const int32_t stop = 42;
  std::vector<GenerateRequest> reqs(3);
  for (int i = 0; i < 3; ++i) {
    reqs[i].prompt = {1, 2, 3, 4, 5};
    reqs[i].max_tokens = 12;
    reqs[i].stop_ids = {stop};
    reqs[i].sampling.logit_bias = {{stop, 100.0f}};
    reqs[i].sampling.temperature = i == 2 ? 1.0f : 0.0f;  // sampled too: the ban is in the logits
  }
  reqs[1].min_tokens = 5;
  reqs[2].min_tokens = 7;
  std::vector<uint64_t> ids;
  const EngineRun got = RunAll(engine.get(), reqs, &ids);
  const std::vector<int32_t> want_len = {1, 6, 8};
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& toks = got.tokens.at(ids[i]);
    ASSERT_EQ(toks.size(), static_cast<size_t>(want_len[i])) << "request " << i;
    EXPECT_EQ(toks.back(), stop);
    EXPECT_EQ(std::count(toks.begin(), toks.end(), stop), 1) << "request " << i;
    EXPECT_EQ(got.reasons.at(ids[i]), FinishReason::kStop);
  }
}

}  // namespace
}  // namespace moeserve
