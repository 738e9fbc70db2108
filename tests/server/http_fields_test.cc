// The OpenAI HTTP API against vLLM 0.32's request schemas: every field of its
// ChatCompletionRequest and CompletionRequest (read from vLLM's pydantic models) is either
// implemented or refused with a 400 naming it, a field of no schema is refused by name, and the
// request fields implemented for vLLM users behave as vLLM's do: stop strings kept with
// include_stop_str_in_output, chat_template_kwargs reaching the template (Qwen3's
// enable_thinking against transformers' rendering), add_generation_prompt,
// continue_final_message, add_special_tokens, the integer priority 0 and generation_config.json's
// defaults. The answers' shapes are in http_responses_test.cc.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "tests/server/http_test_util.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HttpFieldsTest : public TinyHttpTest {};

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
      "routed_experts_prompt_start", "mm_payload", "cache_salt", "stream_interval", "return_mm_kwargs", "min_p",
      "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens",
      "prompt_logprobs", "echo", "return_token_ids", "return_tokens_as_token_ids", "bad_words"};
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
      if (Accepted().count(field) && !(chat && field == "echo")) {  // echo: completions only
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
  EXPECT_GT(accepted, 50);
  EXPECT_GT(refused, 40);
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
  // Integer priorities are vLLM's (within the normal lane); past int32 or not whole: refused.
  const auto [p1, j3] = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"priority", -7}});
  EXPECT_EQ(p1, 200) << j3.dump();
  for (const Json& bad : {Json(int64_t{1} << 40), Json(1.5)}) {
    const auto [p2, j4] = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"priority", bad}});
    EXPECT_EQ(p2, 400) << j4.dump();
    EXPECT_EQ(j4["error"]["param"], "priority") << j4.dump();
  }
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
      std::string got;
      if (!stream) {
        const auto [status, j] = Post("/v1/completions", body);
        ASSERT_EQ(status, 200) << j.dump();
        got = j["choices"][0]["text"];
      } else {
        for (const Json& e : SseObjects(PostRaw("/v1/completions", body))) {
          if (e.contains("choices") && !e["choices"].empty()) got += e["choices"][0]["text"].get<std::string>();
        }
      }
      EXPECT_EQ(got, text.substr(0, at + (include ? stop.size() : 0)));
    }
  }
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
  // continue_final_message through a template: the rendering ends with the final message's
  // content, also when it has trailing whitespace the template may trim (as transformers finds it).
  for (const std::string content : {"The answer is", "The answer is\n"}) {
    const Json messages = {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", content}}};
    const auto [s1, ids] = PostTo(server, "/tokenize", {{"messages", messages}, {"add_generation_prompt", false},
                                                        {"continue_final_message", true}});
    ASSERT_EQ(s1, 200) << ids.dump();
    const auto [s2, text] = PostTo(server, "/detokenize", {{"tokens", ids["tokens"]}});
    ASSERT_EQ(s2, 200) << text.dump();
    const std::string rendered = text["prompt"];
    EXPECT_TRUE(absl::EndsWith(rendered, "The answer is") || absl::EndsWith(rendered, "The answer is\n")) << rendered;
  }
}

// generation_config.json's sampling defaults, as vLLM applies them (--generation-config auto):
// top_k 1 there makes a request that sets no sampling parameter greedy; with
// --generation-config vllm the same seeded request samples. Its repetition_penalty is a default
// too: the greedy answer under auto is the one vllm mode gives when the request names it.
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
      EXPECT_NE(server.log().find("request defaults repetition_penalty 1.05, top_k 1"), std::string::npos)
          << server.log();
    }
    const auto [s1, sampled] = PostTo(server, "/v1/completions", request);
    const auto [s2, greedy] = PostTo(server, "/v1/completions", greedy_request);
    ASSERT_EQ(s1, 200) << sampled.dump();
    ASSERT_EQ(s2, 200) << greedy.dump();
    texts.push_back(sampled["choices"][0]["text"]);
    texts.push_back(greedy["choices"][0]["text"]);
    if (std::string(mode) == "vllm") {
      Json named = greedy_request;
      named["repetition_penalty"] = 1.05;
      const auto [s3, penalised] = PostTo(server, "/v1/completions", named);
      ASSERT_EQ(s3, 200) << penalised.dump();
      texts.push_back(penalised["choices"][0]["text"]);
    }
  }
  EXPECT_EQ(texts[0], texts[1]) << "top_k 1 from generation_config.json makes sampling greedy";
  EXPECT_EQ(texts[1], texts[4]) << "the checkpoint's repetition_penalty is the request's default";
  EXPECT_NE(texts[2], texts[3]) << "without the defaults the seeded request samples";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::testing
