// A batch of prompts in /v1/completions, as vLLM answers it: choice k answers prompt k / n with
// seed + k % n, and equals that prompt sent alone (the oracle), whole or streamed; the usage
// counts each prompt once and every choice's tokens.
#include "tests/server/http_test_util.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HttpBatchTest : public TinyHttpTest {};

TEST_F(HttpBatchTest, EachChoiceOfABatchIsItsPromptAlone) {
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

TEST_F(HttpBatchTest, ABadPromptOfABatchIsNamedAndNothingRuns) {
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

}  // namespace
}  // namespace moeserve::testing
