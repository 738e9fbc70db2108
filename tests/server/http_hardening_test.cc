// End-to-end tests of the HTTP API's hardening (docs/hardening.md: its move from cpp-httplib to
// libmicrohttpd): each test guards one finding of the probe that failed on the old server. Raw
// sockets where the bytes matter (raw_http.h); every wait is bounded, time bounds are generous
// (seconds).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <functional>
#include <latch>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "tests/server/raw_http.h"
#include "tests/server/server_process.h"

namespace moeserve::testing {
namespace {

using namespace raw_http;  // NOLINT: the raw client (raw_http.h)

// One tiny server shared by the tests that need no flags.
class HttpHardeningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    started_ = server_->Start({"--preset", "tiny"}) && server_->http_port() > 0;
  }
  static void TearDownTestSuite() {
    if (started_) {
      EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    }
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(started_) << server_->log(); }
  static int port() { return server_->http_port(); }
  static inline ServerProcess* server_ = nullptr;
  static inline bool started_ = false;
};

// 1. {"prompt": [[[...[1]...]]]} 100,000 deep crashed the server (unbounded recursion); now the
// depth is bounded before parsing (a 400 naming the limit) and the server keeps serving.
TEST_F(HttpHardeningTest, DeeplyNestedJsonIsRefusedAndTheServerKeepsServing) {
  constexpr int kDepth = 100000;
  const std::string body = R"({"prompt": )" + std::string(kDepth, '[') + "1" + std::string(kDepth, ']') + "}";
  const auto [status, j] = Post(port(), "/v1/completions", body);
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_NE(Message(j).find("nested deeper than 64"), std::string::npos) << j.dump();
  // A number past double's range is valid JSON syntax the parser cannot hold (found by
  // fuzz/http_fuzz.cc): a 400, not an exception that ends the server.
  const auto [huge, h] = Post(port(), "/v1/completions", R"({"prompt": "hi", "retain_seconds": 1e400})");
  EXPECT_EQ(huge, 400) << h.dump();
  // More the fuzzer found, each an exception that ended the server: a body of one byte 0xFF
  // (the syntax error quoted it, and the answer's JSON could not hold it), and a "type" that is
  // not a string where text was checked for.
  for (const std::string& body : {std::string("\xff"), std::string(R"({"prompt": "hi", "response_format": {"type": 1}})")}) {
    const auto [st, e] = Post(port(), "/v1/completions", body);
    EXPECT_EQ(st, 400) << e.dump();
  }
  const auto [parts, pj] = Post(port(), "/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": 1}]}]})");
  EXPECT_EQ(parts, 400) << pj.dump();
  EXPECT_NE(Message(pj).find("only text content parts"), std::string::npos) << pj.dump();
  const auto [ok, k] = Post(port(), "/v1/completions", kSmall);
  EXPECT_EQ(ok, 200) << k.dump();
}

// 3. Slowloris: 128 connections dribbling a header line every 2 s held all 64 threads of the
// old server (/health unanswered); now they cost a socket each and others are answered.
TEST_F(HttpHardeningTest, SlowlorisClientsDoNotStarveOthers) {
  constexpr int kSlow = 128;
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawConn>(port()));
    ASSERT_TRUE(slow.back()->ok()) << "connection " << i;
    ASSERT_TRUE(slow.back()->Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-0: a"));
  }
  const auto t0 = Clock::now();
  auto at = [&](double s) { return t0 + std::chrono::milliseconds(static_cast<int>(s * 1000)); };
  std::thread dribble([&] {  // ends the partial header line and starts another, at 2, 4 and 6 s
    for (int tick = 1; tick <= 3; ++tick) {
      std::this_thread::sleep_until(at(2.0 * tick));
      for (auto& c : slow) c->Send("a\r\nX-Slow-" + std::to_string(tick) + ": a");
    }
  });
  for (int round = 0; round < 3; ++round) {  // at 1, 3 and 5 s into the dribble
    std::this_thread::sleep_until(at(1.0 + 2.0 * round));
    auto start = Clock::now();
    auto health = Client(port()).Get("/health");
    const double health_s = SecondsSince(start);
    EXPECT_TRUE(health && health->status == 200) << "round " << round;
    EXPECT_LT(health_s, 2.0) << "round " << round << ": /health took " << health_s << " s";
    start = Clock::now();
    const auto [status, j] = Post(port(), "/v1/completions", kSmall);
    const double post_s = SecondsSince(start);
    EXPECT_EQ(status, 200) << "round " << round << ": " << j.dump();
    EXPECT_LT(post_s, 2.0) << "round " << round << ": the completion took " << post_s << " s";
  }
  dribble.join();
  // Still dribbling (well within the 10 s header timeout): the test measured something.
  int open = 0;
  for (auto& c : slow) open += c->StillOpen() ? 1 : 0;
  EXPECT_EQ(open, kSlow);
}

// 5. 100 streaming clients at one instant saw resets (the old listen backlog was 5); now the
// backlog takes the burst and every stream is served to its [DONE].
TEST_F(HttpHardeningTest, ABurstOf100StreamsIsServedWithoutResets) {
  constexpr int kClients = 100;
  const std::string body = R"({"prompt": "hi", "max_tokens": 8, "stream": true})";
  std::latch go(kClients);
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = Client(port());
      go.arrive_and_wait();
      auto r = c.Post("/v1/completions", body, "application/json");
      if (!r) {
        failures[i] = "no response: " + httplib::to_string(r.error());
      } else if (r->status != 200 || !EndsWith(r->body, "data: [DONE]\n\n")) {
        failures[i] = "status " + std::to_string(r->status) + ": " + r->body.substr(0, 300);
      }
    });
  }
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int i = 0; i < kClients; ++i) {
    if (!failures[i].empty() && ++failed <= 3) ADD_FAILURE() << "client " << i << ": " << failures[i];
  }
  EXPECT_EQ(failed, 0);
}

// 6. Integers past 2^32 wrapped (token 2^32 + 72 served as 72, max_tokens 2^64 - 1 as -1); now
// every integer field is range-checked before narrowing: a 400 naming the field and quoting the
// value as sent. Valid values pass (a seed up to 2^64 - 1; top_k -1, "off").
TEST_F(HttpHardeningTest, IntegersOutOfRangeAreRefusedNamingTheFieldNeverWrapped) {
  enum Outcome { kRefused, kAccepted };
  constexpr Outcome R = kRefused, A = kAccepted;
  const std::vector<std::string> values = {"2147483648",          "4294967296",           "4294967368", "9007199254740992",
                                           "9223372036854775808", "18446744073709551615", "-1"};
  struct Row {
    std::string field, path, body;  // V in the body stands for the value
    std::vector<Outcome> expected;  // per value: 2^31, 2^32, 2^32+72, 2^53, 2^63, 2^64-1, -1
  };
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": true, )";
  const std::vector<Row> rows = {
      {"prompt", "/v1/completions", R"({"prompt": [1, V], "max_tokens": 2})", {R, R, R, R, R, R, R}},
      {"max_tokens", "/v1/completions", R"({"prompt": "hi", "max_tokens": V})", {R, R, R, R, R, R, R}},
      {"top_k", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "top_k": V})", {R, R, R, R, R, R, A}},
      {"stop_token_ids", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [V]})",
       {R, R, R, R, R, R, R}},
      {"logprobs", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "logprobs": V})", {R, R, R, R, R, R, R}},
      // top_logprobs -1 must be refused (OpenAI: 0-20); the server clamps it to 1 (a bug).
      {"top_logprobs", "/v1/chat/completions", chat + R"("top_logprobs": V})", {R, R, R, R, R, R, R}},
      {"seed", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "seed": V})", {A, A, A, A, A, A, R}},
  };
  for (const Row& row : rows) {
    ASSERT_EQ(row.expected.size(), values.size()) << row.field;
    for (size_t v = 0; v < values.size(); ++v) {
      std::string body = row.body;
      body.replace(body.find('V'), 1, values[v]);
      const auto [status, j] = Post(port(), row.path, body);
      const std::string what = row.field + " = " + values[v] + ": " + j.dump();
      if (row.expected[v] == kAccepted) {
        EXPECT_EQ(status, 200) << what;
        continue;
      }
      EXPECT_EQ(status, 400) << what;
      if (status != 400) continue;
      EXPECT_EQ(Message(j).rfind(row.field + ": ", 0), 0u) << what;
      EXPECT_NE(Message(j).find("got " + values[v]), std::string::npos) << "the value as sent: " << what;
    }
  }
}

// 7. A 413 said "code": 400 and a syntax error "not a JSON object"; now the syntax error names
// its line and column, and a 413 is the API's error object with "code": 413.
TEST_F(HttpHardeningTest, ErrorFormatNamesTheLineAndColumnAndThe413Code) {
  const auto [status, j] = Post(port(), "/v1/completions", "{\"prompt\": \"hi\",\n \"max_tokens\": 4,,}");
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_NE(Message(j).find("line 2, column"), std::string::npos) << j.dump();
  RawConn conn(port());
  ASSERT_TRUE(conn.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Content-Length: 4194305\r\n\r\n"));  // one byte over 4 MiB; no body sent
  const RawResponse r = ParseResponse(conn.Read(10, WholeResponse));
  EXPECT_EQ(r.status, 413) << r.headers << r.body;
  EXPECT_EQ(Code(r.body), 413) << r.body;
}

// 2b. docs/hardening.md: "a chunked body is discarded from the byte that crosses [the limit] and
// answered 413". A 5 MiB chunked body, sent whole, must get a 413, not silence until a timeout.
TEST_F(HttpHardeningTest, AChunkedBodyCrossingTheLimitGets413) {
  RawConn conn(port());
  ASSERT_TRUE(conn.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "10000\r\n" + std::string(1 << 16, 'a') + "\r\n";
  for (int i = 0; i < 80 && conn.Send(chunk); ++i) {  // stops early if the server closes
  }
  conn.Send("0\r\n\r\n");
  const RawResponse r = ParseResponse(conn.Read(10, WholeResponse));
  EXPECT_EQ(r.status, 413) << r.headers << r.body;
  EXPECT_EQ(Code(r.body), 413) << r.body;
}

// 9. An HTTP/1.0 stream was chunked (which 1.0 clients cannot read) and of pipelined requests
// only the first was answered; now a 1.0 stream is close-delimited and all are answered in order.
TEST_F(HttpHardeningTest, Http10AndPipeliningAreServed) {
  {
    RawConn conn(port());
    ASSERT_TRUE(conn.Send(PostBytes("HTTP/1.0", R"({"prompt": "hi", "max_tokens": 8, "stream": true})")));
    const RawResponse r = ParseResponse(conn.Read(30));
    EXPECT_TRUE(conn.eof()) << "the server did not close the HTTP/1.0 stream";
    EXPECT_EQ(r.status, 200) << r.headers;
    EXPECT_EQ(r.headers.find("transfer-encoding: chunked"), std::string::npos) << r.headers;
    EXPECT_TRUE(EndsWith(r.body, "data: [DONE]\n\n")) << r.body;
  }
  RawConn conn(port());
  ASSERT_TRUE(conn.Send(PostBytes("HTTP/1.1", R"({"prompt": "hi", "max_tokens": 2})") +
                        PostBytes("HTTP/1.1", R"({"prompt": "hi", "max_tokens": 3})") +
                        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
  const std::vector<RawResponse> answers = SplitResponses(conn.Read(30));  // until closed after /health
  ASSERT_EQ(answers.size(), 3u);
  for (const RawResponse& a : answers) EXPECT_EQ(a.status, 200) << a.headers << a.body;
  EXPECT_NE(answers[0].body.find(R"("completion_tokens":2)"), std::string::npos) << answers[0].body;
  EXPECT_NE(answers[1].body.find(R"("completion_tokens":3)"), std::string::npos) << answers[1].body;
  EXPECT_NE(answers[2].body.find(R"("status":"ok")"), std::string::npos) << answers[2].body;
}

// A server that requires --api-key s3cret.
class HttpHardeningAuthTest : public HttpHardeningTest {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    started_ = server_->Start({"--preset", "tiny", "--api-key", "s3cret"}) && server_->http_port() > 0;
  }
};

// 2. The body was read (chunked: past the limit) before the key was checked; now the key is
// checked on the headers (401 before any body byte), and a declared length over the limit is
// refused at once with 413 naming the limit.
TEST_F(HttpHardeningAuthTest, AuthBeforeBodyAndAnOversizedLengthGets413AtOnce) {
  {
    RawConn conn(port());
    ASSERT_TRUE(conn.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n"));  // and not a byte of the body
    const auto t0 = Clock::now();
    const RawResponse r = ParseResponse(conn.Read(10, WholeResponse));
    EXPECT_EQ(r.status, 401) << r.headers << r.body;
    EXPECT_LT(SecondsSince(t0), 2.0) << "the 401 waited for the body";
  }
  RawConn big(port());  // with the key, declaring 99,999,999 bytes and sending none
  ASSERT_TRUE(big.Send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret\r\n"
                       "Content-Type: application/json\r\nContent-Length: 99999999\r\n\r\n"));
  const auto t0 = Clock::now();
  const RawResponse r = ParseResponse(big.Read(10, WholeResponse));
  EXPECT_LT(SecondsSince(t0), 2.0);
  EXPECT_EQ(r.status, 413) << r.headers << r.body;
  EXPECT_EQ(Code(r.body), 413) << r.body;
  EXPECT_NE(r.body.find("over the limit of 4194304 bytes"), std::string::npos) << r.body;
}

// 10. "bearer KEY" (lowercase) was refused; the scheme is case-insensitive (RFC 9110). A wrong
// key is still refused.
TEST_F(HttpHardeningAuthTest, TheBearerSchemeIsCaseInsensitive) {
  auto c = Client(port());
  for (const std::string scheme : {"Bearer", "bearer", "BEARER"}) {
    auto r = c.Get("/v1/models", httplib::Headers{{"Authorization", scheme + " s3cret"}});
    ASSERT_TRUE(r) << scheme;
    EXPECT_EQ(r->status, 200) << scheme << ": " << r->body;
  }
  auto wrong = c.Get("/v1/models", httplib::Headers{{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401) << wrong->body;
}

// 4. With SO_REUSEPORT a second server started on the same ports and took half the requests;
// now it fails at start naming the process holding the port, for the HTTP and the gRPC port.
TEST(HttpHardeningPortsTest, ASecondServerOnTakenPortsFailsNamingTheHolder) {
  ServerProcess first;
  ASSERT_TRUE(first.Start({"--preset", "tiny"})) << first.log();
  const std::string http = "127.0.0.1:" + std::to_string(first.http_port());
  const std::string holder = "held by pid " + std::to_string(first.pid());
  for (const auto& [name, listen, http_listen] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"the HTTP port", "127.0.0.1:0", http}, {"the gRPC port", first.target(), "127.0.0.1:0"}}) {
    std::string out, err;  // `timeout`: a second server that did start is stopped after 60 s
    const int rc = RunProgram({"/usr/bin/timeout", "60", MOESERVE_BIN, "serve", "--preset", "tiny", "--listen", listen,
                               "--http-listen", http_listen},
                              &out, &err);
    EXPECT_NE(rc, 0) << name << ": the second server started\n" << out << err;
    EXPECT_NE(rc, 124) << name << ": the second server was still running after 60 s";
    EXPECT_NE(err.find("cannot listen"), std::string::npos) << name << ": " << err;
    EXPECT_NE(err.find(holder), std::string::npos) << name << ": expected \"" << holder << "\" in " << err;
  }
  auto health = Client(first.http_port()).Get("/health");
  EXPECT_TRUE(health && health->status == 200) << "the first server stopped serving";
  EXPECT_EQ(first.Stop(SIGTERM), 0) << first.log();
}

// 8. At the drain's end, streams were cut without an error or [DONE]; now each ends with an
// error event and [DONE]. (The small preset cannot make 4000 tokens in the 1 s grace.)
TEST(HttpHardeningDrainTest, StreamsOpenPastTheGraceEndWithAnErrorEventAndDone) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "small", "--kv-cache-mb", "256", "--grace-seconds", "1"})) << server.log();
  constexpr int kStreams = 5;
  std::vector<std::string> bodies(kStreams), errors(kStreams);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = R"({"prompt": "keep going", "max_tokens": 4000, "ignore_eos": true, "stream": true})";
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (bodies[i].empty()) ++started;
        bodies[i].append(data, n);
        return true;
      };
      auto r = Client(server.http_port()).send(req);
      if (!r || r->status != 200) errors[i] = r ? "status " + std::to_string(r->status) : httplib::to_string(r.error());
    });
  }
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (started.load() < kStreams && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int streaming = started.load();
  kill(server.pid(), SIGTERM);  // in any case: the streams end with the server
  for (auto& t : threads) t.join();
  EXPECT_EQ(streaming, kStreams) << "not every stream had started before SIGTERM";
  EXPECT_EQ(server.WaitExit(60), 0) << server.log();
  for (int i = 0; i < kStreams; ++i) {
    const std::string& b = bodies[i];
    EXPECT_EQ(errors[i], "") << "stream " << i;
    ASSERT_TRUE(EndsWith(b, "\n\ndata: [DONE]\n\n")) << "stream " << i << " ends: " << b.substr(b.size() - std::min<size_t>(b.size(), 300));
    const size_t error = b.rfind("data: {\"error\"");
    ASSERT_NE(error, std::string::npos) << "stream " << i << " has no error event";
    EXPECT_EQ(b.find("data: ", error + 1), b.size() - 14) << "stream " << i << ": the error event is not the last";
  }
}

}  // namespace
}  // namespace moeserve::testing
