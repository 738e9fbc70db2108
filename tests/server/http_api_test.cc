// End-to-end tests of the OpenAI-compatible HTTP API against a real `moeserve serve`: greedy
// completions equal the gRPC API's, streamed chat equals the whole answer and ends in [DONE],
// stop strings cut the text, every bad input gets the right status and error object and the next
// request succeeds, a client that leaves mid-stream frees its KV blocks, API keys, the small
// endpoints, and the official `openai` Python SDK (from the virtualenv setup.sh creates).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

using Json = nlohmann::json;

class HttpApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--preset", "tiny"})) << server_->log();
    ASSERT_GT(server_->http_port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    delete server_;
    server_ = nullptr;
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->http_port());
    c.set_read_timeout(60, 0);
    return c;
  }
  // POSTs `body`; returns (status, parsed JSON body).
  std::pair<int, Json> Post(const std::string& path, const Json& body) {
    auto c = Client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
  // The text of a streamed response's events, and whether it ended in [DONE].
  struct Sse {
    std::vector<Json> events;
    bool done = false;
  };
  Sse PostStream(const std::string& path, const Json& body) {
    auto c = Client();
    std::string raw;
    auto r = c.Post(path.c_str(), httplib::Headers{}, body.dump(), "application/json");
    Sse out;
    if (!r) return out;
    raw = r->body;
    for (size_t at = 0; (at = raw.find("data: ", at)) != std::string::npos;) {
      const size_t end = raw.find("\n\n", at);
      const std::string data = raw.substr(at + 6, end - at - 6);
      at = end;
      if (data == "[DONE]") {
        out.done = true;
      } else {
        out.events.push_back(Json::parse(data, nullptr, false));
      }
    }
    return out;
  }
  static ServerProcess* server_;
};
ServerProcess* HttpApiTest::server_ = nullptr;

TEST_F(HttpApiTest, GreedyCompletionEqualsTheGrpcApisAndStreamsTheSameText) {
  auto stub = v1::Moeserve::NewStub(server_->channel());
  v1::GenerateRequest g;
  g.set_text("The quick brown fox");
  g.set_max_tokens(24);
  g.set_ignore_eos(true);
  const Streamed grpc_out = Stream(stub.get(), g);
  ASSERT_TRUE(grpc_out.status.ok()) << grpc_out.status.error_message();
  const Json body = {{"model", "moeserve-tiny"},
                     {"prompt", "The quick brown fox"},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  const auto [status, j] = Post("/v1/completions", body);
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["text"], grpc_out.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 20);  // BOS + 19 bytes
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  // Streamed: the deltas add up to the same text, then the finish reason, usage and [DONE].
  Json stream_body = body;
  stream_body["stream"] = true;
  stream_body["stream_options"] = {{"include_usage", true}};
  const Sse s = PostStream("/v1/completions", stream_body);
  ASSERT_TRUE(s.done);
  std::string text;
  std::string finish;
  bool usage = false;
  for (const Json& e : s.events) {
    if (e.contains("usage")) {
      usage = true;
      EXPECT_EQ(e["usage"]["completion_tokens"], 24);
      continue;
    }
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, grpc_out.text);
  EXPECT_EQ(finish, "length");
  EXPECT_TRUE(usage);
}

TEST_F(HttpApiTest, ChatStreamsTheWholeAnswerAndStopStringsCutIt) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Say something"}}});
  const Json body = {{"model", "moeserve-tiny"},
                     {"messages", messages},
                     {"max_tokens", 40},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  const auto [status, whole] = Post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << whole.dump();
  const std::string answer = whole["choices"][0]["message"]["content"];
  ASSERT_GE(answer.size(), 8u);
  Json stream_body = body;
  stream_body["stream"] = true;
  const Sse s = PostStream("/v1/chat/completions", stream_body);
  ASSERT_TRUE(s.done);
  std::string streamed;
  for (const Json& e : s.events) {
    const Json& d = e["choices"][0]["delta"];
    if (d.contains("content")) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, answer);
  EXPECT_EQ(s.events.front()["choices"][0]["delta"]["role"], "assistant");
  // A stop string from the middle of the answer ends it just before, as finish_reason "stop".
  // (Two whole characters: the answer of a random model is full of U+FFFD.)
  size_t from = answer.size() / 2, to = from;
  while (from > 0 && (static_cast<unsigned char>(answer[from]) & 0xC0) == 0x80) --from;
  to = from;
  for (int chars = 0; chars < 2 && to < answer.size(); ++chars) {
    ++to;
    while (to < answer.size() && (static_cast<unsigned char>(answer[to]) & 0xC0) == 0x80) ++to;
  }
  const std::string stop = answer.substr(from, to - from);
  const std::string expected = answer.substr(0, answer.find(stop));
  Json stop_body = body;
  stop_body["stop"] = Json::array({stop});
  const auto [st, cut] = Post("/v1/chat/completions", stop_body);
  ASSERT_EQ(st, 200) << cut.dump();
  EXPECT_EQ(cut["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  stop_body["stream"] = true;
  const Sse ss = PostStream("/v1/chat/completions", stop_body);
  std::string streamed_cut;
  for (const Json& e : ss.events) {
    const Json& d = e["choices"][0]["delta"];
    if (d.contains("content")) streamed_cut += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed_cut, expected);
  EXPECT_TRUE(EventuallyIdle(v1::Moeserve::NewStub(server_->channel()).get()));
}

TEST_F(HttpApiTest, BadInputsGetTheRightStatusAndTheNextRequestSucceeds) {
  const Json good = {{"model", "moeserve-tiny"}, {"prompt", "hi"}, {"max_tokens", 3}};
  struct Case {
    std::string name, path;
    Json body;
    int status;
    std::string param;
  };
  auto with = [&](const char* key, Json v) {
    Json b = good;
    b[key] = std::move(v);
    return b;
  };
  const std::vector<Case> cases = {
      {"negative temperature", "/v1/completions", with("temperature", -1), 400, "temperature"},
      {"top_p zero", "/v1/completions", with("top_p", 0), 400, "top_p"},
      {"huge max_tokens", "/v1/completions", with("max_tokens", 1 << 30), 400, "max_tokens"},
      {"logprobs 21", "/v1/completions", with("logprobs", 21), 400, "logprobs"},
      {"n past its limit", "/v1/completions", with("n", 33), 400, "n"},
      {"a penalty out of range", "/v1/completions", with("presence_penalty", 2.5), 400, "presence_penalty"},
      {"an empty prompt in a batch", "/v1/completions", with("prompt", Json::array({"a", Json::array()})), 400, "prompt[1]"},
      {"token past the vocabulary", "/v1/completions", with("prompt", Json::array({1, 100000})),
       400, "prompt"},
      {"stop not a string", "/v1/completions", with("stop", 5), 400, "stop"},
      {"temperature as text", "/v1/completions", with("temperature", "hot"), 400, "temperature"},
      {"negative retain_seconds", "/v1/completions", with("retain_seconds", -1), 400,
       "retain_seconds"},
      {"unknown priority", "/v1/completions", with("priority", "urgent"), 400, "priority"},
      {"no messages",
       "/v1/chat/completions",
       {{"model", "moeserve-tiny"}, {"messages", Json::array()}},
       400,
       "messages"},
      {"another model", "/v1/completions", with("model", "gpt-9"), 404, "model"},
      {"no such route", "/v1/embeddings", good, 404, ""},
  };
  for (const Case& c : cases) {
    const auto [status, j] = Post(c.path, c.body);
    EXPECT_EQ(status, c.status) << c.name << ": " << j.dump();
    ASSERT_TRUE(j.contains("error")) << c.name << ": " << j.dump();
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << c.name;
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << c.name << ": " << j.dump();
    }
    const auto [ok_status, ok] = Post("/v1/completions", good);
    EXPECT_EQ(ok_status, 200) << "after " << c.name << ": " << ok.dump();
  }
  auto c = Client();
  auto r = c.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
}

// A client that goes away mid-stream cancels its request: no KV block stays in use. The small
// preset asked for 4000 tokens cannot finish before the client leaves, whatever the CPU.
TEST(HttpApiDisconnectTest, ADisconnectMidStreamFreesTheKvBlocks) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "small", "--kv-cache-mb", "256"}))
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  ASSERT_TRUE(EventuallyIdle(stub.get()));
  const int64_t cancelled_before = GetStats(stub.get()).requests_by_outcome().at("cancelled");
  const Json body = {{"model", "moeserve-small"},
                     {"prompt", "keep going"},
                     {"max_tokens", 4000},
                     {"ignore_eos", true},
                     {"stream", true}};
  httplib::Client c("127.0.0.1", server.http_port());
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 3;
  };  // then hang up
  c.send(req);
  EXPECT_GE(chunks, 3);
  EXPECT_TRUE(EventuallyIdle(stub.get())) << "the abandoned stream still holds KV blocks";
  EXPECT_EQ(GetStats(stub.get()).requests_by_outcome().at("cancelled"), cancelled_before + 1)
      << "the stream was not cancelled when its client left";
}

// A client that stops waiting for a whole (non-streaming) answer cancels its request too: the
// server looks at the waiting connection's socket each step. 4000 tokens of the small preset
// take longer than the client's one-second read timeout, whatever the CPU.
TEST(HttpApiDisconnectTest, AClientThatLeavesAWholeAnswerCancelsIt) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "small", "--kv-cache-mb", "256"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  ASSERT_TRUE(EventuallyIdle(stub.get()));
  const int64_t cancelled_before = GetStats(stub.get()).requests_by_outcome().at("cancelled");
  const Json body = {{"model", "moeserve-small"}, {"prompt", "keep going"}, {"max_tokens", 4000}, {"ignore_eos", true}};
  httplib::Client c("127.0.0.1", server.http_port());
  c.set_read_timeout(1, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_FALSE(r) << "the answer came before the client left: " << r->status;
  EXPECT_TRUE(EventuallyIdle(stub.get())) << "the abandoned request still holds KV blocks";
  EXPECT_EQ(GetStats(stub.get()).requests_by_outcome().at("cancelled"), cancelled_before + 1)
      << "the request was not cancelled when its client left";
}

TEST_F(HttpApiTest, ModelsHealthMetricsTokenizeDetokenize) {
  auto c = Client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(Json::parse(models->body)["data"][0]["id"], "moeserve-tiny");
  EXPECT_EQ(Json::parse(models->body)["data"][0]["root"], "moeserve-tiny");
  EXPECT_TRUE(Json::parse(models->body)["data"][0]["parent"].is_null());
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto ping = c.Get("/ping");  // vLLM's spelling, GET and POST
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);
  auto post_ping = c.Post("/ping", "", "application/json");
  ASSERT_TRUE(post_ping);
  EXPECT_EQ(post_ping->status, 200);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("moeserve_"), std::string::npos);
  const auto [ts, tok] = Post("/tokenize", {{"prompt", "héllo"}});
  ASSERT_EQ(ts, 200) << tok.dump();
  EXPECT_EQ(tok["count"], 7);  // BOS + 6 bytes
  const auto [ds, detok] = Post("/detokenize", {{"tokens", tok["tokens"]}});
  ASSERT_EQ(ds, 200) << detok.dump();
  EXPECT_EQ(detok["prompt"], "héllo");
}

TEST(HttpApiKeysTest, AKeyIsRequiredWhenConfigured) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--api-key", "s3cret"})) << server.log();
  httplib::Client c("127.0.0.1", server.http_port());
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  auto no_key = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401) << no_key->body;
  auto good = c.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer s3cret"}}, body,
                     "application/json");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  EXPECT_EQ(c.Get("/health")->status, 200) << "health stays open";
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

// The official openai SDK, unchanged, against the server (the virtualenv comes from setup.sh).
TEST_F(HttpApiTest, OpenAiPythonSdkStreamsChatAndCompletions) {
  const std::string python = MOESERVE_SOURCE_DIR "/.venv/bin/python";
  std::string out, err;
  if (RunProgram({python, "-c", "import openai"}, &out, &err) != 0) {
    GTEST_SKIP() << "no openai SDK in " << python << " (scripts/setup.sh installs it): " << err;
  }
  ASSERT_EQ(RunProgram({python, MOESERVE_SOURCE_DIR "/clients/python/openai_e2e.py", "--base-url",
                        "http://127.0.0.1:" + std::to_string(server_->http_port()) + "/v1",
                        "--model", "moeserve-tiny"},
                       &out, &err),
            0)
      << out << err;
  EXPECT_NE(out.find("chat stream ok"), std::string::npos) << out << err;
  EXPECT_NE(out.find("completion ok"), std::string::npos) << out << err;
  EXPECT_NE(out.find("bad request ok"), std::string::npos) << out << err;
}

}  // namespace
}  // namespace moeserve::testing
