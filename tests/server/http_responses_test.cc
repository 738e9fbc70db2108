// The OpenAI HTTP API's answers as vLLM's: the chosen token's logprob on every token (streamed
// entries of held-back text carried, none dropped), stop_reason, system_fingerprint, /version,
// n choices (each the request alone with seed + i), min_p reaching the sampler, and logit_bias
// with min_tokens (stop tokens and stop strings held off).
#include <algorithm>
#include <regex>

#include "tests/server/http_test_util.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HttpResponsesTest : public TinyHttpTest {};

constexpr int kMaxChoicesForTest = 32;  // the documented limit of n (docs/vllm-flags.md)

// The chosen token's logprob on every token (logprobs 0 on completions, logprobs true with no
// top_logprobs on chat), streamed or not; streamed entries of held-back text come later, none
// dropped (temperature 1 over the byte tokenizer makes partial characters).
TEST_F(HttpResponsesTest, LogprobsCoverEveryTokenStreamedOrNot) {
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
    for (size_t i = 0; i < chosen.size(); ++i) {
      const Json& v = chat ? chosen[i]["logprob"] : chosen[i];
      ASSERT_TRUE(v.is_number()) << lp.dump();
      EXPECT_LE(v.get<double>(), 0.0);
      if (!chat) {  // logprobs 0: the chosen token alone among the alternatives, as vLLM
        const Json& alternatives = lp["top_logprobs"][i];
        ASSERT_EQ(alternatives.size(), 1u) << alternatives.dump();
        EXPECT_EQ(alternatives[lp["tokens"][i].get<std::string>()], v) << alternatives.dump();
      }
    }
    body["stream"] = true;
    const std::string streamed = PostRaw(path, body);
    size_t entries = 0;
    for (const Json& e : SseObjects(streamed)) {
      if (!e.contains("choices") || e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
      const Json& l = e["choices"][0]["logprobs"];
      entries += chat ? l["content"].size() : l["token_logprobs"].size();
    }
    EXPECT_EQ(entries, 48u) << streamed;
  }
  // top_logprobs needs logprobs, as vLLM.
  const auto [status, j] = Post("/v1/chat/completions", {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}, {"top_logprobs", 2}});
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_EQ(j["error"]["param"], "top_logprobs") << j.dump();
}

// vLLM's response fields: stop_reason (the stop string, the stop token id, or null for the
// length limit), system_fingerprint (the same for every answer of one server), and /version.
TEST_F(HttpResponsesTest, StopReasonSystemFingerprintAndVersion) {
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
  const std::string streamed = PostRaw("/v1/completions", by_text);
  Json last_choice;
  for (const Json& e : SseObjects(streamed)) {
    EXPECT_EQ(e["system_fingerprint"], fp);
    if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) last_choice = e["choices"][0];
  }
  EXPECT_EQ(last_choice["stop_reason"], stop) << streamed;
  httplib::Client c("127.0.0.1", server_->http_port());
  auto v = c.Get("/version");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->status, 200);
  const std::string version = Json::parse(v->body)["version"];
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+\.\d+)"))) << version;
}

// n choices: choice i is the request alone with seed + i (each run on its own as the oracle),
// streamed or whole; the usage counts every choice's tokens and the prompt once.
TEST_F(HttpResponsesTest, NChoicesAreTheRequestAloneWithSeedPlusI) {
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
    const std::string body_text = PostRaw(path, three);
    std::vector<std::string> streamed(3);
    std::vector<int> finishes(3, 0);
    int usage_completion = 0;
    for (const Json& e : SseObjects(body_text)) {
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
    EXPECT_NE(body_text.find("data: [DONE]"), std::string::npos);
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

// min_p 1 keeps only the likeliest token: a sampled request at temperature 1 gives the greedy text.
TEST_F(HttpResponsesTest, MinPOneSamplesTheGreedyText) {
  const Json base = {{"prompt", "The quick brown fox"}, {"max_tokens", 12}, {"ignore_eos", true}};
  Json greedy = base, sampled = base, plain = base;
  greedy["temperature"] = 0;
  sampled["temperature"] = 1.0;
  sampled["seed"] = 9;
  sampled["min_p"] = 1.0;
  plain["temperature"] = 1.0;
  plain["seed"] = 9;
  const auto [s0, g] = Post("/v1/completions", greedy);
  const auto [s1, m] = Post("/v1/completions", sampled);
  const auto [s2, p] = Post("/v1/completions", plain);
  ASSERT_EQ(s0, 200) << g.dump();
  ASSERT_EQ(s1, 200) << m.dump();
  ASSERT_EQ(s2, 200) << p.dump();
  EXPECT_EQ(m["choices"][0]["text"], g["choices"][0]["text"]);
  EXPECT_NE(p["choices"][0]["text"], g["choices"][0]["text"]) << "without min_p the seeded request samples";
  const auto [s3, bad] = Post("/v1/completions", {{"prompt", "hi"}, {"min_p", 1.5}});
  EXPECT_EQ(s3, 400) << bad.dump();
  EXPECT_EQ(bad["error"]["param"], "min_p") << bad.dump();
}

// logit_bias +100 on "z" makes it every greedy token. A stop string "z" then ends the text at
// once, unless min_tokens holds it off: the first min_tokens z's are text, the next one stops,
// whole or streamed. As a stop token id, z cannot be sampled before min_tokens tokens (other
// tokens come first), then ends the request (its own text left out).
TEST_F(HttpResponsesTest, LogitBiasAndMinTokensHoldOffStops) {
  const auto [ts, tok] = Post("/tokenize", {{"prompt", "z"}, {"add_special_tokens", false}});
  ASSERT_EQ(ts, 200) << tok.dump();
  ASSERT_EQ(tok["tokens"].size(), 1u) << tok.dump();
  const int z = tok["tokens"][0];
  const Json base = {{"prompt", "The quick"}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true},
                     {"logit_bias", {{std::to_string(z), 100}}}};
  struct Case {
    Json extra;
    std::string text;
    int tokens;
  };
  for (const Case& c : {Case{{{"stop", "z"}}, "", 1}, Case{{{"stop", "z"}, {"min_tokens", 3}}, "zzz", 4},
                        Case{{{"stop_token_ids", {z}}, {"min_tokens", 2}}, "", 3},
                        Case{{{"min_tokens", 2}}, "zzzzzzzzzz", 10}}) {
    SCOPED_TRACE(c.extra.dump());
    Json body = base;
    body.update(c.extra);
    const auto [s, j] = Post("/v1/completions", body);
    ASSERT_EQ(s, 200) << j.dump();
    const std::string text = j["choices"][0]["text"];
    if (c.extra.contains("stop_token_ids")) {
      EXPECT_EQ(text.find('z'), std::string::npos) << text;
      EXPECT_EQ(j["choices"][0]["stop_reason"], z);
    } else {
      EXPECT_EQ(text, c.text);
    }
    // (After a stop string the engine may run a token or two before the cancel reaches it.)
    if (!c.extra.contains("stop")) EXPECT_EQ(j["usage"]["completion_tokens"], c.tokens);
    EXPECT_EQ(j["choices"][0]["finish_reason"], c.tokens < 10 ? "stop" : "length");
    body["stream"] = true;
    std::string streamed;
    for (const Json& e : SseObjects(PostRaw("/v1/completions", body))) {
      if (e.contains("choices") && !e["choices"].empty()) streamed += e["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, text);
  }
}

// bad_words ["zz"] with "z" forced by logit_bias: after each z another token comes, so the text
// alternates and never holds "zz"; ["z"] bans it outright.
TEST_F(HttpResponsesTest, BadWordsBanAWordsLastTokenAfterTheRestOfIt) {
  const auto [ts, tok] = Post("/tokenize", {{"prompt", "z"}, {"add_special_tokens", false}});
  ASSERT_EQ(ts, 200) << tok.dump();
  const int z = tok["tokens"][0];
  const Json base = {{"prompt", "The quick"}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true},
                     {"logit_bias", {{std::to_string(z), 100}}}, {"return_token_ids", true}};
  for (const auto& [word, max_run] : std::vector<std::pair<std::string, int>>{{"zz", 1}, {"z", 0}}) {
    Json body = base;
    body["bad_words"] = {word};
    const auto [s, j] = Post("/v1/completions", body);
    ASSERT_EQ(s, 200) << j.dump();
    const auto ids = j["choices"][0]["token_ids"].get<std::vector<int>>();
    int run = 0, longest = 0, zs = 0;
    for (int id : ids) {
      run = id == z ? run + 1 : 0;
      longest = std::max(longest, run);
      zs += id == z;
    }
    EXPECT_EQ(longest, max_run) << word << ": " << j.dump();
    if (max_run == 1) EXPECT_EQ(zs, 6) << "every other token is the forced z";
  }
  const auto [bs, bad] = Post("/v1/completions", {{"prompt", "hi"}, {"bad_words", {""}}});
  EXPECT_EQ(bs, 400) << bad.dump();
  EXPECT_EQ(bad["error"]["param"], "bad_words");
}

TEST_F(HttpResponsesTest, PenaltyAndBiasValuesOutOfRangeAreRefusedByName) {
  const Json base = {{"prompt", "hi"}, {"max_tokens", 4}};
  for (const auto& [extra, param] : std::vector<std::pair<Json, std::string>>{
           {{{"presence_penalty", 2.5}}, "presence_penalty"},
           {{{"frequency_penalty", -3}}, "frequency_penalty"},
           {{{"repetition_penalty", 0}}, "repetition_penalty"},
           {{{"repetition_penalty", "high"}}, "repetition_penalty"},
           {{{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
           {{{"logit_bias", {{"5", 200}}}}, "logit_bias"},
           {{{"logit_bias", {{"5", 1}, {"05", 1}}}}, "logit_bias"},
           {{{"logit_bias", {{"99999999", 1}}}}, "logit_bias"},
           {{{"logit_bias", Json::array({1})}}, "logit_bias"},
           {{{"min_tokens", 5}}, "min_tokens"},
           {{{"min_tokens", -1}}, "min_tokens"}}) {
    Json body = base;
    body.update(extra);
    const auto [s, j] = Post("/v1/completions", body);
    EXPECT_EQ(s, 400) << body.dump() << " -> " << j.dump();
    EXPECT_EQ(j["error"]["param"], param) << j.dump();
  }
}

}  // namespace
}  // namespace moeserve::testing
