// Token ids in and out, as vLLM: return_token_ids (each choice's generated ids and its prompt's,
// whole or streamed), return_tokens_as_token_ids, and `serve --skip-tokenizer-init`, which reads
// no tokenizer files and serves token-id prompts with the ids `moeserve generate` produces for
// them; what needs text (text prompts, chat, stop strings, token text in logprobs,
// /detokenize) is refused naming the field.
#include "absl/strings/str_join.h"
#include "tests/server/http_test_util.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

std::string PostRawTo(const ServerProcess& s, const std::string& path, const Json& body) {
  httplib::Client c("127.0.0.1", s.http_port());
  c.set_read_timeout(60, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  return r ? r->body : std::string();
}

TEST(HttpTokenIdsTest, SkipTokenizerInitServesTheIdsGenerateProduces) {
  const std::string dir = MakeTempDir("token_ids");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--seed", "5", "--out", dir + "/ck"}, &out, &err), 0) << err;
  const std::vector<int32_t> prompt = {256, 7, 99, 13, 42};
  const GeneratedIds want = GenerateIds(
      {"--model", dir + "/ck", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens", "6"});
  ASSERT_EQ(want.rc, 0) << want.err;
  ServerProcess server;
  ASSERT_TRUE(server.Start({dir + "/ck", "--skip-tokenizer-init"})) << server.log();
  const Json base = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"return_token_ids", true}};
  const auto [s, j] = PostTo(server, "/v1/completions", base);
  ASSERT_EQ(s, 200) << j.dump();
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["text"], "");
  EXPECT_EQ(choice["token_ids"].get<std::vector<int32_t>>(), want.ids);
  EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], static_cast<int>(want.ids.size()));

  Json streamed = base;
  streamed["stream"] = true;
  std::vector<int32_t> ids;
  int with_prompt = 0;
  for (const Json& e : SseObjects(PostRawTo(server, "/v1/completions", streamed))) {
    for (const Json& ch : e["choices"]) {
      for (int32_t id : ch.value("token_ids", Json::array()).get<std::vector<int32_t>>()) ids.push_back(id);
      with_prompt += ch.contains("prompt_token_ids");
    }
  }
  EXPECT_EQ(ids, want.ids);
  EXPECT_EQ(with_prompt, 1) << "the first chunk carries the prompt's ids";

  Json as_ids = base;
  as_ids["logprobs"] = 1;
  as_ids["return_tokens_as_token_ids"] = true;
  const auto [ls, l] = PostTo(server, "/v1/completions", as_ids);
  ASSERT_EQ(ls, 200) << l.dump();
  for (size_t i = 0; i < want.ids.size(); ++i) {
    EXPECT_EQ(l["choices"][0]["logprobs"]["tokens"][i], "token_id:" + std::to_string(want.ids[i]));
  }

  for (const auto& [path, body, param] : std::vector<std::tuple<std::string, Json, std::string>>{
           {"/v1/completions", {{"prompt", "hello"}}, "prompt"},
           {"/v1/completions", {{"prompt", prompt}, {"stop", "x"}}, "stop"},
           {"/v1/completions", {{"prompt", prompt}, {"logprobs", 1}}, "logprobs"},
           {"/v1/chat/completions", {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}}, "messages"},
           {"/detokenize", {{"tokens", {1, 2}}}, "tokens"}}) {
    const auto [bs, bad] = PostTo(server, path, body);
    EXPECT_EQ(bs, 400) << path << " " << body.dump() << " -> " << bad.dump();
    EXPECT_EQ(bad["error"]["param"], param) << bad.dump();
  }
  const auto [ok, again] = PostTo(server, "/v1/completions", base);
  EXPECT_EQ(ok, 200) << "a good request after the bad ones: " << again.dump();
}

}  // namespace
}  // namespace moeserve::testing
