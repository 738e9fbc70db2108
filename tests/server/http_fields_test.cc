// The OpenAI HTTP API against vLLM 0.32's request schemas: every field of its
// ChatCompletionRequest and CompletionRequest (read from vLLM's pydantic models) is either
// implemented or refused with a 400 naming it, a field of no schema is refused by name, and the
// fields implemented for vLLM users behave as vLLM's do: stop strings kept with
// include_stop_str_in_output, chat_template_kwargs reaching the template (Qwen3's
// enable_thinking against transformers' rendering), add_generation_prompt,
// continue_final_message, add_special_tokens and the integer priority 0.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

std::pair<int, Json> PostTo(const ServerProcess& s, const std::string& path, const Json& body) {
  httplib::Client c("127.0.0.1", s.http_port());
  c.set_read_timeout(60, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) return {-1, Json()};
  return {r->status, Json::parse(r->body, nullptr, false)};
}

class HttpFieldsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--preset", "tiny"})) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    delete server_;
    server_ = nullptr;
  }
  static std::pair<int, Json> Post(const std::string& path, const Json& body) { return PostTo(*server_, path, body); }
  static ServerProcess* server_;
};
ServerProcess* HttpFieldsTest::server_ = nullptr;

constexpr int kMaxChoicesForTest = 32;  // the documented limit of n (docs/vllm-flags.md)

// A value other than the field's default, for each field of vLLM 0.32's two request models.
const std::vector<std::pair<std::string, Json>>& VllmFieldProbes() {
  static const std::vector<std::pair<std::string, Json>> probes = {
      {"frequency_penalty", 0.5}, {"logit_bias", {{"65", 5}}}, {"logprobs", 2},
      {"top_logprobs", 2}, {"max_tokens", 3}, {"max_completion_tokens", 3}, {"n", 2},
      {"presence_penalty", 0.5}, {"response_format", {{"type", "json_object"}}}, {"seed", 7},
      {"stop", "zz"}, {"stream", false}, {"stream_options", Json::object()}, {"temperature", 0.5},
      {"top_p", 0.9}, {"tools", Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
      {"tool_choice", "required"}, {"reasoning_effort", "low"}, {"thinking_token_budget", 10},
      {"include_reasoning", false}, {"parallel_tool_calls", false}, {"user", "u1"},
      {"use_beam_search", true}, {"top_k", 5}, {"min_p", 0.1}, {"repetition_penalty", 1.2},
      {"watermarking", Json::object()}, {"length_penalty", 0.5}, {"stop_token_ids", {7}},
      {"include_stop_str_in_output", true}, {"ignore_eos", true}, {"min_tokens", 2},
      {"skip_special_tokens", false}, {"spaces_between_special_tokens", false},
      {"truncate_prompt_tokens", 4}, {"truncation_side", "left"}, {"prompt_logprobs", 1},
      {"logprob_token_ids", {5}}, {"allowed_token_ids", {5, 6}}, {"bad_words", {"x"}},
      {"echo", true}, {"add_generation_prompt", false}, {"continue_final_message", false},
      {"add_special_tokens", false}, {"documents", Json::array()}, {"chat_template", "{{ 1 }}"},
      {"chat_template_kwargs", {{"enable_thinking", false}}}, {"media_io_kwargs", Json::object()},
      {"mm_processor_kwargs", Json::object()}, {"structured_outputs", {{"json", Json::object()}}},
      {"priority", 0}, {"request_id", "r-1"}, {"session_id", "s-1"},
      {"return_tokens_as_token_ids", true}, {"return_token_ids", true},
      {"routed_experts_prompt_start", 1}, {"return_token_offsets", true},
      {"return_prompt_text", true}, {"mm_payload", "tensors"}, {"return_mm_kwargs", true},
      {"cache_salt", "salt"}, {"kv_transfer_params", Json::object()},
      {"ec_transfer_params", Json::object()}, {"vllm_xargs", Json::object()},
      {"repetition_detection", Json::object()}, {"stream_interval", 2}, {"suffix", "end"},
      {"prompt_embeds", "AAAA"},
  };
  return probes;
}

// What moeserve must do with each probe: the fields it implements (or that cannot change an
// answer) succeed; every other one is refused naming the field. (chat_template_kwargs is refused
// here because the tiny model has no template to pass them to; the Qwen3 test below uses them.)
const std::set<std::string>& Accepted() {
  static const std::set<std::string> ok = {
      "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "seed", "stop", "stream",
      "stream_options", "temperature", "top_p", "include_reasoning", "parallel_tool_calls", "user",
      "top_k", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "truncation_side",
      "add_generation_prompt", "continue_final_message", "add_special_tokens", "priority", "n", "request_id", "session_id",
      "routed_experts_prompt_start", "mm_payload", "cache_salt", "stream_interval", "return_mm_kwargs"};
  return ok;
}

// vLLM 0.32's field lists (vllm/entrypoints/openai/{chat_completion,completion}/protocol.py).
const std::set<std::string> kChatOnly = {"top_logprobs", "max_completion_tokens", "tools",
                                         "tool_choice", "reasoning_effort", "include_reasoning",
                                         "parallel_tool_calls", "add_generation_prompt",
                                         "continue_final_message", "documents", "chat_template",
                                         "chat_template_kwargs", "media_io_kwargs",
                                         "mm_processor_kwargs", "return_prompt_text"};
const std::set<std::string> kCompletionOnly = {"suffix", "prompt_embeds"};

TEST_F(HttpFieldsTest, EveryVllmFieldIsImplementedOrRefusedByName) {
  int accepted = 0, refused = 0;
  for (const bool chat : {false, true}) {
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    Json base = {{"model", "moeserve-tiny"}, {"max_tokens", 3}};
    if (chat) {
      base["messages"] = Json::array({{{"role", "user"}, {"content", "hi"}}});
    } else {
      base["prompt"] = "hi";
    }
    for (const auto& [field, value] : VllmFieldProbes()) {
      if ((chat && kCompletionOnly.count(field)) || (!chat && kChatOnly.count(field))) continue;
      Json body = base;
      body[field] = chat && field == "logprobs" ? Json(true) : value;  // a boolean in chat
      if (chat && field == "top_logprobs") body["logprobs"] = true;      // which top_logprobs needs
      SCOPED_TRACE(path + " " + field + " = " + value.dump());
      const auto [status, j] = Post(path, body);
      if (Accepted().count(field)) {
        EXPECT_EQ(status, 200) << j.dump();
        ++accepted;
      } else {
        EXPECT_EQ(status, 400) << j.dump();
        EXPECT_EQ(j["error"]["param"], field) << j.dump();
        ++refused;
      }
    }
    // Every field at null is the request without it.
    Json nulls = base;
    for (const auto& [field, value] : VllmFieldProbes()) {
      if ((chat && kCompletionOnly.count(field)) || (!chat && kChatOnly.count(field))) continue;
      nulls[field] = nullptr;
    }
    const auto [ok_status, ok] = Post(path, nulls);
    EXPECT_EQ(ok_status, 200) << ok.dump();
  }
  EXPECT_GT(accepted, 40);
  EXPECT_GT(refused, 60);
}

TEST_F(HttpFieldsTest, AFieldOfNoSchemaIsRefusedByName) {
  const Json body = {{"model", "moeserve-tiny"}, {"prompt", "hi"}, {"max_token", 5}};
  const auto [status, j] = Post("/v1/completions", body);
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "max_token") << j.dump();
  // A chat-only field on the completions endpoint is not of its schema either.
  Json chat_only = {{"model", "moeserve-tiny"}, {"prompt", "hi"}, {"add_generation_prompt", true}};
  const auto [status2, j2] = Post("/v1/completions", chat_only);
  EXPECT_EQ(status2, 400) << j2.dump();
  EXPECT_EQ(j2["error"]["param"], "add_generation_prompt") << j2.dump();
  // Integer priorities: vLLM's default 0 is the normal lane; others have no lane.
  const auto [p1, j3] = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"priority", 1}});
  EXPECT_EQ(p1, 400) << j3.dump();
  EXPECT_EQ(j3["error"]["param"], "priority") << j3.dump();
}

TEST_F(HttpFieldsTest, IncludeStopStrInOutputKeepsTheStopString) {
  const Json base = {{"model", "moeserve-tiny"}, {"prompt", "The quick brown fox"},
                     {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  const auto [s0, whole] = Post("/v1/completions", base);
  ASSERT_EQ(s0, 200) << whole.dump();
  const std::string text = whole["choices"][0]["text"];
  ASSERT_GE(text.size(), 12u) << text;
  // A stop string from the middle of the greedy text (whose first occurrence is where it cuts):
  // two whole characters, none of them U+FFFD (the tiny model's text is random bytes, and the
  // answer replaces invalid ones).
  auto char_end = [&](size_t i) {
    do ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80);
    return i;
  };
  std::string stop;
  for (size_t i = 4; i < text.size() && stop.empty(); i = char_end(i)) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;
    const std::string two = text.substr(i, char_end(char_end(i)) - i);
    if (two.find("\xEF\xBF\xBD") == std::string::npos && char_end(char_end(i)) <= text.size()) stop = two;
  }
  ASSERT_FALSE(stop.empty()) << text;
  const size_t at = text.find(stop);
  for (const bool stream : {false, true}) {
    for (const bool include : {false, true}) {
      Json body = base;
      body["stop"] = stop;
      body["include_stop_str_in_output"] = include;
      body["stream"] = stream;
      SCOPED_TRACE(absl::StrCat("stream ", stream, " include ", include));
      httplib::Client c("127.0.0.1", server_->http_port());
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      std::string got;
      if (!stream) {
        got = Json::parse(r->body)["choices"][0]["text"];
      } else {
        for (size_t p = 0; (p = r->body.find("data: {", p)) != std::string::npos; ++p) {
          const Json e = Json::parse(r->body.substr(p + 6, r->body.find("\n\n", p) - p - 6));
          if (e.contains("choices") && !e["choices"].empty()) got += e["choices"][0]["text"].get<std::string>();
        }
      }
      EXPECT_EQ(got, text.substr(0, at + (include ? stop.size() : 0)));
    }
  }
}

// The chosen token's logprob on every token (logprobs 0 on completions, logprobs true with no
// top_logprobs on chat), streamed or not; streamed entries of held-back text come later, none
// dropped (temperature 1 over the byte tokenizer makes partial characters).
TEST_F(HttpFieldsTest, LogprobsCoverEveryTokenStreamedOrNot) {
  for (const bool chat : {false, true}) {
    Json body = {{"max_tokens", 48}, {"temperature", 1.0}, {"seed", 3}, {"ignore_eos", true}};
    if (chat) {
      body["messages"] = Json::array({{{"role", "user"}, {"content", "hi"}}});
      body["logprobs"] = true;
    } else {
      body["prompt"] = "hi";
      body["logprobs"] = 0;
    }
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    SCOPED_TRACE(path);
    const auto [status, whole] = Post(path, body);
    ASSERT_EQ(status, 200) << whole.dump();
    const Json& lp = whole["choices"][0]["logprobs"];
    const Json& chosen = chat ? lp["content"] : lp["token_logprobs"];
    ASSERT_EQ(chosen.size(), 48u) << lp.dump();
    for (const Json& c : chosen) {
      const Json& v = chat ? c["logprob"] : c;
      ASSERT_TRUE(v.is_number()) << lp.dump();
      EXPECT_LE(v.get<double>(), 0.0);
    }
    body["stream"] = true;
    httplib::Client c("127.0.0.1", server_->http_port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    ASSERT_TRUE(r);
    size_t entries = 0;
    for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
      const Json e = Json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6));
      if (!e.contains("choices") || e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
      const Json& l = e["choices"][0]["logprobs"];
      entries += chat ? l["content"].size() : l["token_logprobs"].size();
    }
    EXPECT_EQ(entries, 48u) << r->body;
  }
  // top_logprobs needs logprobs, as vLLM.
  const auto [status, j] = Post("/v1/chat/completions", {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}, {"top_logprobs", 2}});
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "top_logprobs") << j.dump();
}

// vLLM's response fields: stop_reason (the stop string, the stop token id, or null for the
// length limit), system_fingerprint (the same for every answer of one server), and /version.
TEST_F(HttpFieldsTest, StopReasonSystemFingerprintAndVersion) {
  const Json base = {{"model", "moeserve-tiny"}, {"prompt", "The quick brown fox"},
                     {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true},
                     {"logprobs", 0}};
  const auto [s0, whole] = Post("/v1/completions", base);
  ASSERT_EQ(s0, 200) << whole.dump();
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(whole["choices"][0]["stop_reason"].is_null()) << whole.dump();
  const std::string fp = whole["system_fingerprint"];
  EXPECT_EQ(fp.rfind("fp_", 0), 0u) << fp;
  // The greedy text's 4th token as a stop token id: it ends there and is named.
  const Json& tokens = whole["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 12u);
  Json by_id = base;
  // The ids come from a greedy gRPC run of the same prompt (the HTTP answer gives text).
  auto stub = v1::Moeserve::NewStub(server_->channel());
  v1::GenerateRequest g;
  g.set_text("The quick brown fox");
  g.set_max_tokens(12);
  g.set_ignore_eos(true);
  const Streamed greedy = Stream(stub.get(), g);
  ASSERT_TRUE(greedy.status.ok()) << greedy.status.error_message();
  ASSERT_EQ(greedy.ids.size(), 12u);
  const int32_t stop_id = greedy.ids[3];
  by_id["stop_token_ids"] = {stop_id};
  const auto [s1, j1] = Post("/v1/completions", by_id);
  ASSERT_EQ(s1, 200) << j1.dump();
  EXPECT_EQ(j1["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j1["choices"][0]["stop_reason"], stop_id) << j1.dump();
  EXPECT_EQ(j1["system_fingerprint"], fp);
  // As vLLM, the stop token's own text is left out, unless include_stop_str_in_output.
  const size_t first = std::find(greedy.ids.begin(), greedy.ids.end(), stop_id) - greedy.ids.begin();
  for (const bool include : {false, true}) {
    const std::vector<int32_t> ids(greedy.ids.begin(), greedy.ids.begin() + first + (include ? 1 : 0));
    const auto [sd, detok] = Post("/detokenize", {{"tokens", ids}});
    ASSERT_EQ(sd, 200) << detok.dump();
    by_id["include_stop_str_in_output"] = include;
    const auto [si, ji] = Post("/v1/completions", by_id);
    ASSERT_EQ(si, 200) << ji.dump();
    EXPECT_EQ(ji["choices"][0]["text"], detok["prompt"]) << "include " << include;
  }
  by_id.erase("include_stop_str_in_output");
  // A stop string, whole and streamed.
  const std::string text = whole["choices"][0]["text"];
  std::string stop;
  for (size_t i = 2; i + 1 < text.size() && stop.empty(); ++i) {
    if (static_cast<unsigned char>(text[i]) < 0x80 && static_cast<unsigned char>(text[i + 1]) < 0x80)
      stop = text.substr(i, 2);
  }
  if (stop.empty()) GTEST_SKIP() << "no two ASCII characters in a row in the greedy text: " << text;
  Json by_text = base;
  by_text["stop"] = Json::array({"\u0001never", stop});
  const auto [s2, j2] = Post("/v1/completions", by_text);
  ASSERT_EQ(s2, 200) << j2.dump();
  EXPECT_EQ(j2["choices"][0]["stop_reason"], stop) << j2.dump();
  by_text["stream"] = true;
  httplib::Client c("127.0.0.1", server_->http_port());
  auto r = c.Post("/v1/completions", by_text.dump(), "application/json");
  ASSERT_TRUE(r);
  Json last_choice;
  for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
    const Json e = Json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6));
    EXPECT_EQ(e["system_fingerprint"], fp);
    if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) last_choice = e["choices"][0];
  }
  EXPECT_EQ(last_choice["stop_reason"], stop) << r->body;
  auto v = c.Get("/version");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->status, 200);
  const std::string version = Json::parse(v->body)["version"];
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+\.\d+)"))) << version;
}

// n choices: choice i is the request alone with seed + i (each run on its own as the oracle),
// streamed or whole; the usage counts every choice's tokens and the prompt once.
TEST_F(HttpFieldsTest, NChoicesAreTheRequestAloneWithSeedPlusI) {
  for (const bool chat : {false, true}) {
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    SCOPED_TRACE(path);
    Json body = {{"max_tokens", 10}, {"temperature", 1.0}, {"ignore_eos", true}};
    if (chat) {
      body["messages"] = Json::array({{{"role", "user"}, {"content", "hi"}}});
    } else {
      body["prompt"] = "hi";
    }
    auto text_of = [&](const Json& choice) {
      return chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
    };
    std::vector<std::string> alone;
    for (int i = 0; i < 3; ++i) {
      Json one = body;
      one["seed"] = 40 + i;
      const auto [st, j] = Post(path, one);
      ASSERT_EQ(st, 200) << j.dump();
      alone.push_back(text_of(j["choices"][0]));
    }
    Json three = body;
    three["seed"] = 40;
    three["n"] = 3;
    const auto [st, j] = Post(path, three);
    ASSERT_EQ(st, 200) << j.dump();
    ASSERT_EQ(j["choices"].size(), 3u) << j.dump();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(j["choices"][i]["index"], i);
      EXPECT_EQ(text_of(j["choices"][i]), alone[static_cast<size_t>(i)]) << "choice " << i;
      EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    }
    EXPECT_EQ(j["usage"]["completion_tokens"], 30);
    EXPECT_NE(alone[0], alone[1]) << "distinct seeds should sample distinct texts";
    // Streamed: each index's deltas add up to its text, each ends with its finish reason.
    three["stream"] = true;
    three["stream_options"] = {{"include_usage", true}};
    httplib::Client c("127.0.0.1", server_->http_port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), three.dump(), "application/json");
    ASSERT_TRUE(r);
    std::vector<std::string> streamed(3);
    std::vector<int> finishes(3, 0);
    int usage_completion = 0;
    for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
      const Json e = Json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6));
      if (e.contains("usage") && e["choices"].empty()) usage_completion = e["usage"]["completion_tokens"];
      for (const Json& ch : e["choices"]) {
        const size_t i = ch["index"];
        ASSERT_LT(i, 3u);
        if (chat) {
          if (ch["delta"].contains("content")) streamed[i] += ch["delta"]["content"].get<std::string>();
        } else {
          streamed[i] += ch["text"].get<std::string>();
        }
        if (!ch["finish_reason"].is_null()) ++finishes[i];
      }
    }
    EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(streamed[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << "streamed choice " << i;
      EXPECT_EQ(finishes[static_cast<size_t>(i)], 1) << "choice " << i;
    }
    EXPECT_EQ(usage_completion, 30);
  }
  const auto [st, j] = Post("/v1/completions", {{"prompt", "hi"}, {"n", kMaxChoicesForTest + 1}});
  EXPECT_EQ(st, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "n") << j.dump();
  EXPECT_TRUE(EventuallyIdle(v1::Moeserve::NewStub(server_->channel()).get()));
}

// Without a chat template (the embedded models): ChatML, the generation prompt optional, the
// final message continued, the BOS unless add_special_tokens is false.
TEST_F(HttpFieldsTest, ChatOptionsRenderTheChatMlFallback) {
  const Json messages = {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "The ans"}}};
  auto tokens = [](const Json& body) {
    const auto [status, j] = Post("/tokenize", body);
    EXPECT_EQ(status, 200) << j.dump();
    return j["tokens"];
  };
  const std::string turns = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe ans";
  EXPECT_EQ(tokens({{"messages", messages}, {"add_generation_prompt", false}, {"continue_final_message", true}}),
            tokens({{"prompt", turns}}));
  EXPECT_EQ(tokens({{"messages", messages}, {"add_generation_prompt", false}}),
            tokens({{"prompt", turns + "<|im_end|>\n"}}));
  EXPECT_EQ(tokens({{"messages", messages}}),
            tokens({{"prompt", turns + "<|im_end|>\n<|im_start|>assistant\n"}}));
  EXPECT_EQ(tokens({{"messages", messages}, {"add_special_tokens", false}}),
            tokens({{"prompt", turns + "<|im_end|>\n<|im_start|>assistant\n"}, {"add_special_tokens", false}}));
  const auto [status, j] = Post("/v1/chat/completions", {{"messages", messages}, {"continue_final_message", true}});
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "continue_final_message") << j.dump();
}

// A checkpoint's template (Qwen3-MoE, written by transformers) with chat_template_kwargs:
// enable_thinking false renders as transformers' apply_chat_template did.
TEST(HttpChatTemplateKwargsTest, EnableThinkingFalseRendersAsTransformersDoes) {
  const std::string dir = std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/";
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--model", dir + "hf/qwen3moe", "--kv-blocks", "64"})) << server.log();
  std::ifstream lines(dir + "chat_templates/qwen3moe.expected.jsonl");
  int checked = 0;
  for (std::string line; std::getline(lines, line);) {
    const Json c = Json::parse(line)["context"];
    if (!c.contains("enable_thinking")) continue;
    const std::string rendered = Json::parse(line)["rendered"];
    SCOPED_TRACE(line);
    const Json request = {{"messages", c["messages"]},
                          {"add_generation_prompt", c["add_generation_prompt"]},
                          {"chat_template_kwargs", {{"enable_thinking", c["enable_thinking"]}}}};
    const auto [s1, got] = PostTo(server, "/tokenize", request);
    const auto [s2, want] = PostTo(server, "/tokenize", {{"prompt", rendered}, {"add_special_tokens", false}});
    ASSERT_EQ(s1, 200) << got.dump();
    ASSERT_EQ(s2, 200) << want.dump();
    EXPECT_EQ(got["tokens"], want["tokens"]);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// generation_config.json's sampling defaults, as vLLM applies them (--generation-config auto):
// top_k 1 there makes a request that sets no sampling parameter greedy; with
// --generation-config vllm the same seeded request samples. A default moeserve cannot apply
// (repetition_penalty) is named at start.
TEST(HttpGenerationConfigTest, TheCheckpointsDefaultsApplyUnlessVllmIsAsked) {
  const std::string fixture = std::string(MOESERVE_SOURCE_DIR) + "/tests/models/fixtures/hf/qwen3moe";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("moeserve_genconfig_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::copy(fixture, dir);
  std::ofstream(dir / "generation_config.json")
      << Json({{"eos_token_id", 2}, {"top_k", 1}, {"repetition_penalty", 1.05}}).dump();
  const Json request = {{"prompt", "Hello there"}, {"max_tokens", 10}, {"seed", 11}, {"ignore_eos", true}};
  Json greedy_request = request;
  greedy_request["temperature"] = 0;
  std::vector<Json> texts;
  for (const char* mode : {"auto", "vllm"}) {
    SCOPED_TRACE(mode);
    ServerProcess server;
    ASSERT_TRUE(server.Start({"--model", dir.string(), "--kv-blocks", "64", "--generation-config", mode}))
        << server.log();
    if (std::string(mode) == "auto") {
      EXPECT_NE(server.log().find("request defaults top_k 1; NOT applied"), std::string::npos) << server.log();
      EXPECT_NE(server.log().find("repetition_penalty 1.05"), std::string::npos) << server.log();
    }
    const auto [s1, sampled] = PostTo(server, "/v1/completions", request);
    const auto [s2, greedy] = PostTo(server, "/v1/completions", greedy_request);
    ASSERT_EQ(s1, 200) << sampled.dump();
    ASSERT_EQ(s2, 200) << greedy.dump();
    texts.push_back(sampled["choices"][0]["text"]);
    texts.push_back(greedy["choices"][0]["text"]);
  }
  EXPECT_EQ(texts[0], texts[1]) << "top_k 1 from generation_config.json makes sampling greedy";
  EXPECT_EQ(texts[1], texts[3]) << "greedy does not depend on the defaults";
  EXPECT_NE(texts[2], texts[3]) << "without the defaults the seeded request samples";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::testing
