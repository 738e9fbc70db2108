// RunCompletion (server/http_completions.h) in process, on an engine stepped by the test: a
// streamed answer is whole however early the engine's events come, even when every event of the
// request (its last included) is turned into chunks before the handler has started the stream.
// The HTTP soak once saw that race end a greedy stream empty (status 200, no [DONE]): the chunks
// written before the stream started were refused as if the client had left, and the request
// was cancelled.
#include "server/http_completions.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_protocol.h"
#include "server/stream_encoder.h"
#include "tests/engine/tiny_f32_model.h"
#include "tests/test_util.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// HttpReply's contract as ReplyState keeps it: a chunk is taken only between StartStream and End,
// and an answer is given once. `before_answer` runs where RunCompletion registers OnGone: after
// it has submitted the choices, before it answers.
class RecordingReply : public HttpReply {
 public:
  enum class Kind { kNone, kWhole, kStream };
  std::function<void()> before_answer;

  void Send(int status, std::string, std::string body, std::vector<std::pair<std::string, std::string>>) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (kind_ != Kind::kNone) return;
    kind_ = Kind::kWhole;
    status_ = status;
    text_ = std::move(body);
  }
  void StartStream(int status, std::string, std::vector<std::pair<std::string, std::string>>) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (kind_ != Kind::kNone) return;
    kind_ = Kind::kStream;
    status_ = status;
  }
  bool Write(std::string chunk) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (kind_ != Kind::kStream || ended_) {
      ++refused_;
      return false;
    }
    text_ += chunk;
    return true;
  }
  void End() override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  void OnGone(std::function<void()>) override {
    if (before_answer) before_answer();
  }
  bool CheckGone() override { return false; }

  Kind kind() const { std::lock_guard<std::mutex> lock(mu_); return kind_; }
  int status() const { std::lock_guard<std::mutex> lock(mu_); return status_; }
  bool ended() const { std::lock_guard<std::mutex> lock(mu_); return ended_; }
  int refused() const { std::lock_guard<std::mutex> lock(mu_); return refused_; }
  std::string text() const { std::lock_guard<std::mutex> lock(mu_); return text_; }

 private:
  mutable std::mutex mu_;
  Kind kind_ = Kind::kNone;
  int status_ = 0, refused_ = 0;
  bool ended_ = false;
  std::string text_;
};

// Waits until every task posted to `encoder` so far has run (it runs them in order).
void Flush(StreamEncoder& encoder) {
  std::promise<void> done;
  encoder.Post([&done] { done.set_value(); });
  done.get_future().wait();
}

// The text of a completions event stream, checking its shape: data events, exactly one finish
// reason, then [DONE] and nothing more.
std::string StreamText(const std::string& raw, std::string* finish_reason) {
  std::string text;
  int finishes = 0;
  size_t at = 0;
  bool done = false;
  while (at < raw.size()) {
    const size_t end = raw.find("\n\n", at);
    EXPECT_TRUE(end != std::string::npos && raw.compare(at, 6, "data: ") == 0) << "not an event at byte " << at;
    if (end == std::string::npos) break;
    const std::string data = raw.substr(at + 6, end - at - 6);
    at = end + 2;
    if (data == "[DONE]") {
      done = true;
      EXPECT_EQ(at, raw.size()) << "bytes after [DONE]";
      break;
    }
    const Json j = Json::parse(data);
    const Json& c = j["choices"][0];
    text += c["text"].get<std::string>();
    if (c["finish_reason"].is_string()) {
      ++finishes;
      *finish_reason = c["finish_reason"];
    }
  }
  EXPECT_TRUE(done) << "the stream does not end with [DONE]: " << raw;
  EXPECT_EQ(finishes, 1) << raw;
  return text;
}

TEST(HttpCompletionsTest, AStreamIsWholeWhenEveryEventComesBeforeItStarts) {
  const uint64_t seed = testing::FreshSeed();
  testing::TinyF32Model m(seed);
  std::unique_ptr<Engine> engine = m.MakeEngine(testing::F32KvConfig());  // never Start()ed: the test steps it
  ASSERT_NE(engine, nullptr);
  StreamEncoder encoder;
  OpenStreams streams;
  auto tokenizer = std::make_shared<const ModelTokenizer>(ModelTokenizer::Bytes());

  // The same greedy request answered whole, then streamed; each time the engine runs it to its
  // end, and the encoder turns every event into the answer, before RunCompletion goes on.
  std::string whole_text, stream_raw;
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    const Json body = {{"prompt", Json::array({256, 72, 105, 33, 10, 200, 17})}, {"max_tokens", 9},
                       {"temperature", 0},  {"ignore_eos", true}, {"stream", stream}};
    auto parsed = ParseCompletion(body.dump(), false, engine->model_config(), RequestLimits{}, tokenizer);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto reply = std::make_shared<RecordingReply>();
    bool ran = false;
    reply->before_answer = [&] {
      ran = true;
      EXPECT_FALSE(engine->Idle()) << "the choices were not submitted yet: this test would not see the race";
      EXPECT_TRUE(engine->RunUntilIdle().ok());
      Flush(encoder);
    };
    auto ended = std::make_shared<std::promise<void>>();  // outlives a failed wait
    RunCompletion(engine.get(), &encoder, &streams, *std::move(parsed), reply, [ended] { ended->set_value(); });
    ASSERT_TRUE(ran);
    ASSERT_EQ(ended->get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the completion never ended (seed " << seed << ")";
    Flush(encoder);
    EXPECT_EQ(reply->status(), 200) << reply->text();
    EXPECT_EQ(reply->kind(), stream ? RecordingReply::Kind::kStream : RecordingReply::Kind::kWhole);
    EXPECT_EQ(reply->refused(), 0) << "chunks refused (seed " << seed << ")";
    (stream ? stream_raw : whole_text) = reply->text();
  }
  const Json whole = Json::parse(whole_text);
  std::string reason;
  EXPECT_EQ(StreamText(stream_raw, &reason), whole["choices"][0]["text"].get<std::string>()) << "seed " << seed;
  EXPECT_EQ(reason, "length");
  const EngineStats stats = engine->GetStats();
  EXPECT_EQ(stats.finished_length, 2);
  EXPECT_EQ(stats.cancelled, 0) << "a request was cancelled as if its client had left (seed " << seed << ")";
}

// A choice the engine refuses (its waiting queue full) ends the completion: the client gets the
// refusal, the choices submitted before it are cancelled, and the completion still ends once
// their last events have come (the server counts it in flight until then).
TEST(HttpCompletionsTest, ARefusedChoiceCancelsTheOthersAndTheCompletionEnds) {
  const uint64_t seed = testing::FreshSeed();
  testing::TinyF32Model m(seed);
  EngineConfig cfg = testing::F32KvConfig();
  cfg.scheduler.max_waiting = 2;  // choices 0 and 1 wait, choice 2 is refused
  std::unique_ptr<Engine> engine = m.MakeEngine(cfg);
  ASSERT_NE(engine, nullptr);
  StreamEncoder encoder;
  OpenStreams streams;
  auto tokenizer = std::make_shared<const ModelTokenizer>(ModelTokenizer::Bytes());
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    const Json body = {{"prompt", Json::array({256, 72, 105})}, {"max_tokens", 6}, {"n", 3},
                       {"temperature", 0.8},  {"seed", 5},       {"stream", stream}};
    auto parsed = ParseCompletion(body.dump(), false, engine->model_config(), RequestLimits{}, tokenizer);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto reply = std::make_shared<RecordingReply>();
    auto ended = std::make_shared<std::promise<void>>();
    RunCompletion(engine.get(), &encoder, &streams, *std::move(parsed), reply, [ended] { ended->set_value(); });
    EXPECT_EQ(reply->kind(), RecordingReply::Kind::kWhole);
    EXPECT_NE(reply->status(), 200);
    EXPECT_NE(reply->text().find("waiting queue is full"), std::string::npos) << reply->text();
    EXPECT_FALSE(engine->Idle());  // the two submitted choices, their cancellation not yet applied
    ASSERT_TRUE(engine->RunUntilIdle().ok());
    ASSERT_EQ(ended->get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "the completion never ended";
    Flush(encoder);
    EXPECT_EQ(reply->refused(), 0);
  }
  const EngineStats stats = engine->GetStats();
  EXPECT_EQ(stats.cancelled, 4);
  EXPECT_EQ(stats.finished_length + stats.finished_stop, 0);
  EXPECT_TRUE(engine->Idle());
  EXPECT_TRUE(engine->CheckAccounting());
}

}  // namespace
}  // namespace moeserve::server
