// `moeserve serve --model DIR` on Hugging Face directories written by transformers
// (tests/models/fixtures/hf, scripts/make-hf-fixtures.py): text prompts go through the
// checkpoint's tokenizer (the ids the tokenizers package produced), greedy generation over gRPC
// gives transformers' greedy tokens, chat messages go through the checkpoint's chat template
// (the ids of transformers' rendering), generation stops at the checkpoint's EOS, and a
// template's own error (Mixtral's alternating roles) is a 400 naming messages.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HfCheckpointServeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfCheckpointServeTest, TokenizerTemplateEosAndGreedyTokensAreTheCheckpoints) {
  const std::string fixture =
      std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/hf/" + GetParam();
  const Json expected = Json::parse(std::ifstream(fixture + "/expected.json"));
  // A copy whose generation_config.json names a list of EOS ids: the fixture's 2 and the 4th
  // greedy token of the first prompt, so that generation must stop there.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    absl::StrCat("moeserve_hf_", GetParam(), "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::copy(fixture, dir);
  const int32_t stop_id = expected["cases"][0]["greedy"][3].get<int32_t>();
  std::ofstream(dir / "generation_config.json") << Json({{"eos_token_id", {2, stop_id}}}).dump();
  ServerProcess server;
  // Exact kernels: transformers' tokens come from fp32 activations, which the variants that round
  // them to bf16 (for FP8 weights) would not reproduce token for token.
  ASSERT_TRUE(server.Start({"--model", dir.string(), "--kv-blocks", "64", "--cpu-kernel", "exact"})) << server.log();
  EXPECT_NE(server.log().find(absl::StrCat("tokenizer: tokenizer.json (vocab 1201, eos 2,", stop_id,
                                           ", chat template)")),
            std::string::npos)
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  httplib::Client http("127.0.0.1", server.http_port());
  http.set_read_timeout(60, 0);

  for (const Json& c : expected["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(c["prompt"].get<std::string>());
    // The prompt text through the server's tokenizer.
    auto r = http.Post("/tokenize", Json({{"prompt", c["prompt"]}}).dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(Json::parse(r->body)["tokens"].get<std::vector<int32_t>>(), ids) << r->body;
    // Greedy over gRPC from the text (ignoring EOS, as transformers' run did).
    v1::GenerateRequest req;
    req.set_text(c["prompt"].get<std::string>());
    req.set_max_tokens(8);
    req.set_ignore_eos(true);
    Streamed s = Stream(stub.get(), req);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.last.usage().prompt_tokens(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(s.ids, c["greedy"].get<std::vector<int32_t>>());
    // The same tokens stop at the first EOS id among them.
    const auto greedy = c["greedy"].get<std::vector<int32_t>>();
    const auto eos = std::find_if(greedy.begin(), greedy.end(),
                                  [&](int32_t id) { return id == 2 || id == stop_id; });
    req.set_ignore_eos(false);
    Streamed stopped = Stream(stub.get(), req);
    ASSERT_TRUE(stopped.status.ok());
    EXPECT_EQ(stopped.ids,
              std::vector<int32_t>(greedy.begin(), eos == greedy.end() ? eos : eos + 1));
    EXPECT_EQ(stopped.last.finish_reason(), eos == greedy.end() ? "length" : "stop");
  }
  // Chat messages through the checkpoint's template: transformers' rendering, tokenized.
  const Json& chat = expected["chat"];
  auto t =
      http.Post("/tokenize", Json({{"messages", chat["messages"]}}).dump(), "application/json");
  ASSERT_TRUE(t);
  EXPECT_EQ(Json::parse(t->body)["tokens"], chat["ids"]) << t->body;
  auto done = http.Post(
      "/v1/chat/completions",
      Json({{"messages", chat["messages"]}, {"max_tokens", 4}, {"temperature", 0}}).dump(),
      "application/json");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_EQ(Json::parse(done->body)["usage"]["prompt_tokens"], chat["ids"].size());
  if (GetParam() == "mixtral") {  // its template raises on two user turns in a row
    auto bad = http.Post(
        "/v1/chat/completions",
        Json({{"messages",
               {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}},
              {"max_tokens", 2}})
            .dump(),
        "application/json");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << bad->body;
    const Json err = Json::parse(bad->body)["error"];
    EXPECT_EQ(err["param"], "messages") << bad->body;
    EXPECT_NE(err["message"].get<std::string>().find("alternate"), std::string::npos) << bad->body;
  }
  EXPECT_TRUE(EventuallyIdle(stub.get()));
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  std::filesystem::remove_all(dir);
}

// --chat-template replaces the checkpoint's template (here the preset's ChatML rendering); one
// that uses what the subset does not implement stops the server at start, naming the flag.
TEST(ChatTemplateFlagTest, ReplacesTheTemplateOrRefusesToStart) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("moeserve_chat_flag_", getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "good.jinja")
      << "{{ bos_token }}X{% for m in messages %}{{ m.content | upper }}{% endfor %}";
  std::ofstream(dir / "bad.jinja") << "{% macro f() %}{% endmacro %}";
  {
    ServerProcess server;
    ASSERT_TRUE(
        server.Start({"--preset", "tiny", "--chat-template", (dir / "good.jinja").string()}))
        << server.log();
    httplib::Client http("127.0.0.1", server.http_port());
    auto r = http.Post("/tokenize", R"({"messages": [{"role": "user", "content": "ab"}]})",
                       "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(Json::parse(r->body)["tokens"], Json({256, 'X', 'A', 'B'})) << r->body;
    EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  }
  ServerProcess bad;
  EXPECT_FALSE(bad.Start({"--preset", "tiny", "--chat-template", (dir / "bad.jinja").string()}));
  EXPECT_NE(bad.log().find("--chat-template"), std::string::npos) << bad.log();
  EXPECT_NE(bad.log().find("{% macro %} is not supported"), std::string::npos) << bad.log();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, HfCheckpointServeTest,
                         ::testing::Values("mixtral", "qwen2moe", "qwen3moe", "olmoe", "deepseekv3", "deepseekv3fp8", "glm4moe",
                                           "deepseekv2lite", "deepseekv2group"));

}  // namespace
}  // namespace moeserve::testing
