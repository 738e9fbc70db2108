// The prompt side of /v1/completions, as vLLM answers it: a batch of prompts (choice k answers
// prompt k / n with seed + k % n, and equals that prompt sent alone, whole or streamed; the
// usage counts each prompt once), echo (the prompt's text and logprobs first) and
// prompt_logprobs (their values are tested against a naive forward in
// tests/engine/logprobs_test.cc; here their shape and their agreement with echo's).
#include "tests/server/http_test_util.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HttpPromptsTest : public TinyHttpTest {};

TEST_F(HttpPromptsTest, EachChoiceOfABatchIsItsPromptAlone) {
  const Json prompts = Json::array({"The quick", "hello", Json::array({5, 6, 7, 8}), "x"});
  const Json base = {{"max_tokens", 6}, {"temperature", 1.0}, {"ignore_eos", true}};
  const int n = 2, choices = 4 * n;
  std::vector<std::string> alone;
  int prompt_tokens = 0, completion_tokens = 0;
  for (int k = 0; k < choices; ++k) {
    Json one = base;
    one["prompt"] = prompts[static_cast<size_t>(k / n)];
    one["seed"] = 70 + k % n;
    const auto [s, j] = Post("/v1/completions", one);
    ASSERT_EQ(s, 200) << j.dump();
    alone.push_back(j["choices"][0]["text"]);
    if (k % n == 0) prompt_tokens += j["usage"]["prompt_tokens"].get<int>();
    completion_tokens += j["usage"]["completion_tokens"].get<int>();
  }
  Json batch = base;
  batch["prompt"] = prompts;
  batch["n"] = n;
  batch["seed"] = 70;
  const auto [s, j] = Post("/v1/completions", batch);
  ASSERT_EQ(s, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), static_cast<size_t>(choices)) << j.dump();
  for (int k = 0; k < choices; ++k) {
    EXPECT_EQ(j["choices"][k]["index"], k);
    EXPECT_EQ(j["choices"][k]["text"], alone[static_cast<size_t>(k)]) << "choice " << k;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);
  batch["stream"] = true;
  std::vector<std::string> streamed(choices);
  for (const Json& e : SseObjects(PostRaw("/v1/completions", batch))) {
    for (const Json& ch : e["choices"]) {
      const size_t k = ch["index"];
      ASSERT_LT(k, streamed.size());
      streamed[k] += ch["text"].get<std::string>();
    }
  }
  for (int k = 0; k < choices; ++k) EXPECT_EQ(streamed[static_cast<size_t>(k)], alone[static_cast<size_t>(k)]) << k;
}

TEST_F(HttpPromptsTest, ABadPromptOfABatchIsNamedAndNothingRuns) {
  for (const auto& [prompt, what] : std::vector<std::pair<Json, std::string>>{
           {Json::array({"ok", Json::array({1, 99999999})}), "prompt[1]"},
           {Json::array({"ok", 5}), "prompt"},
           {Json::array({"ok", Json::array()}), "prompt[1]"}}) {
    const auto [s, j] = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}});
    EXPECT_EQ(s, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], what) << j.dump();
  }
  Json many = Json::array();
  for (int i = 0; i < 257; ++i) many.push_back("a");
  const auto [s, j] = Post("/v1/completions", {{"prompt", many}, {"max_tokens", 2}});
  EXPECT_EQ(s, 400) << j.dump();
  EXPECT_TRUE(EventuallyIdle(v1::Moeserve::NewStub(server_->channel()).get()));
}

// echo: the prompt's text, then the answer without echo; with logprobs, the prompt's tokens
// first (the first with null logprobs), their logprobs those prompt_logprobs gives; with
// max_tokens 0, the prompt alone; streamed, the prompt's text opens the stream.
TEST_F(HttpPromptsTest, EchoPrependsThePromptsTextTokensAndLogprobs) {
  const Json base = {{"prompt", "The quick brown"}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
  const auto [s0, plain] = Post("/v1/completions", base);
  ASSERT_EQ(s0, 200) << plain.dump();
  Json echo = base;
  echo["echo"] = true;
  const auto [s1, echoed] = Post("/v1/completions", echo);
  ASSERT_EQ(s1, 200) << echoed.dump();
  EXPECT_EQ(echoed["choices"][0]["text"], "The quick brown" + plain["choices"][0]["text"].get<std::string>());

  Json scored = echo;
  scored["logprobs"] = 1;
  scored["prompt_logprobs"] = 1;
  const auto [s2, j] = Post("/v1/completions", scored);
  ASSERT_EQ(s2, 200) << j.dump();
  const Json& lp = j["choices"][0]["logprobs"];
  const Json& prompt_lp = j["choices"][0]["prompt_logprobs"];
  const size_t prompt_len = j["usage"]["prompt_tokens"];
  ASSERT_EQ(lp["tokens"].size(), prompt_len + 5) << lp.dump();
  ASSERT_EQ(prompt_lp.size(), prompt_len) << prompt_lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_TRUE(prompt_lp[0].is_null());
  const auto [ts, tok] = Post("/tokenize", {{"prompt", "The quick brown"}});
  ASSERT_EQ(ts, 200) << tok.dump();
  for (size_t i = 1; i < prompt_len; ++i) {
    const std::string id = std::to_string(tok["tokens"][i].get<int>());
    ASSERT_TRUE(prompt_lp[i].contains(id)) << i << ": " << prompt_lp[i].dump();
    EXPECT_LE(prompt_lp[i].size(), 2u);
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), prompt_lp[i][id]["logprob"].get<float>()) << i;
    EXPECT_GE(prompt_lp[i][id]["rank"].get<int>(), 1);
  }
  Json plain_lp = base;
  plain_lp["logprobs"] = 1;
  const auto [s3, g] = Post("/v1/completions", plain_lp);
  ASSERT_EQ(s3, 200) << g.dump();
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp["token_logprobs"][prompt_len + i], g["choices"][0]["logprobs"]["token_logprobs"][i]) << i;
  }

  Json only = echo;
  only["max_tokens"] = 0;
  const auto [s4, o] = Post("/v1/completions", only);
  ASSERT_EQ(s4, 200) << o.dump();
  EXPECT_EQ(o["choices"][0]["text"], "The quick brown");

  echo["stream"] = true;
  std::string streamed;
  for (const Json& e : SseObjects(PostRaw("/v1/completions", echo))) {
    if (e.contains("choices") && !e["choices"].empty()) streamed += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, echoed["choices"][0]["text"]);
}

TEST_F(HttpPromptsTest, PromptLogprobsOnChatAndTheirLimits) {
  const Json chat = {{"messages", Json::array({{{"role", "user"}, {"content", "hi there"}}})},
                     {"max_tokens", 3}, {"prompt_logprobs", 2}};
  const auto [s, j] = Post("/v1/chat/completions", chat);
  ASSERT_EQ(s, 200) << j.dump();
  ASSERT_TRUE(j.contains("prompt_logprobs")) << j.dump();
  EXPECT_EQ(j["prompt_logprobs"].size(), j["usage"]["prompt_tokens"].get<size_t>());
  for (const auto& [extra, param] : std::vector<std::pair<Json, std::string>>{
           {{{"prompt_logprobs", -1}}, "prompt_logprobs"},
           {{{"prompt_logprobs", 21}}, "prompt_logprobs"},
           {{{"prompt_logprobs", 1}, {"stream", true}}, "prompt_logprobs"},
           {{{"echo", true}, {"logprobs", 1}, {"stream", true}}, "echo"}}) {
    Json body = {{"prompt", "hi"}, {"max_tokens", 2}};
    body.update(extra);
    const auto [bs, bad] = Post("/v1/completions", body);
    EXPECT_EQ(bs, 400) << bad.dump();
    EXPECT_EQ(bad["error"]["param"], param) << bad.dump();
  }
  const auto [cs, c] = Post("/v1/chat/completions", {{"messages", chat["messages"]}, {"echo", true}});
  EXPECT_EQ(cs, 400) << c.dump();
}

// best_of: the n of best_of candidates (seed + i) with the highest mean logprob per token, as
// OpenAI defines it; the oracle ranks the candidates sent alone. The usage counts every
// candidate's tokens; the answer has no logprobs unless asked.
TEST_F(HttpPromptsTest, BestOfAnswersTheCandidatesWithTheHighestMeanLogprob) {
  const Json base = {{"prompt", "The quick"}, {"max_tokens", 8}, {"temperature", 1.0}, {"ignore_eos", true}};
  std::vector<std::pair<double, std::string>> candidates;
  int tokens = 0;
  for (int i = 0; i < 4; ++i) {
    Json one = base;
    one["seed"] = 30 + i;
    one["logprobs"] = 0;
    const auto [s, j] = Post("/v1/completions", one);
    ASSERT_EQ(s, 200) << j.dump();
    double sum = 0;
    for (const Json& lp : j["choices"][0]["logprobs"]["token_logprobs"]) sum += lp.get<double>();
    candidates.emplace_back(sum / 8, j["choices"][0]["text"]);
    tokens += j["usage"]["completion_tokens"].get<int>();
  }
  std::vector<size_t> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return candidates[a].first > candidates[b].first; });
  ASSERT_FALSE(order[0] == 0 && order[1] == 1) << "the seeds must rank out of order for the test to see the ranking";
  Json best = base;
  best["seed"] = 30;
  best["best_of"] = 4;
  best["n"] = 2;
  const auto [s, j] = Post("/v1/completions", best);
  ASSERT_EQ(s, 200) << j.dump();
  ASSERT_EQ(j["choices"].size(), 2u) << j.dump();
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(j["choices"][k]["index"], k);
    EXPECT_EQ(j["choices"][k]["text"], candidates[order[static_cast<size_t>(k)]].second) << "choice " << k;
    EXPECT_TRUE(j["choices"][k]["logprobs"].is_null());
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], tokens);
  for (const auto& [extra, param] : std::vector<std::pair<Json, std::string>>{
           {{{"best_of", 1}, {"n", 2}}, "best_of"},
           {{{"best_of", 3}, {"stream", true}}, "best_of"},
           {{{"best_of", 33}}, "best_of"}}) {
    Json body = base;
    body.update(extra);
    const auto [bs, bad] = Post("/v1/completions", body);
    EXPECT_EQ(bs, 400) << bad.dump();
    EXPECT_EQ(bad["error"]["param"], param) << bad.dump();
  }
  const Json messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  const auto [cs, c] = Post("/v1/chat/completions", {{"messages", messages}, {"best_of", 2}});
  EXPECT_EQ(cs, 400) << c.dump();
  const auto [ns, nc] = Post("/v1/chat/completions", {{"messages", messages}, {"n", 2}, {"best_of", 1}, {"max_tokens", 2}});
  EXPECT_EQ(ns, 200) << "best_of 1 changes nothing on chat: " << nc.dump();
}

}  // namespace
}  // namespace moeserve::testing
