// The soak of soak_test.cc over the OpenAI HTTP API: a real server (tiny preset, a 48-block KV
// pool, preemption with swap to a 4 MiB DDR tier, two tenants' API keys) takes thousands of
// mixed requests from many threads over HTTP: completions and chat completions, whole and
// streamed; greedy repeats of fixed prompts recorded solo first (identical every time, and cut
// exactly at a stop string taken from their output); sampled requests with priorities, stop
// strings and retention; clients that leave mid-stream or abandon a request at a read timeout;
// either tenant's keys, a wrong key, no key; and hostile bodies interleaved (JSON nested 100,000
// deep, a body over the limit, an integer past 2^32, broken JSON). Afterwards every request had
// exactly one outcome on its client, every status was the expected one, the server's counters
// agree with the clients' view (allowing only the race of a request that finishes just as its
// client leaves), no KV block or swap slot is in use, and the server's resident memory has
// levelled off. CI runs a short version; `benchmarks/soak.sh http` a long one
// (MOESERVE_HTTP_SOAK_REQUESTS, MOESERVE_HTTP_SOAK_THREADS). The client side is
// http_soak_client.h.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "tests/server/grpc_client.h"
#include "tests/server/http_soak_client.h"

namespace moeserve::testing {
namespace {

using namespace http_soak;  // NOLINT: the soak's client side (http_soak_client.h)

// The kinds of request and how the clients saw them end.
enum Kind { kGreedy, kGreedyStop, kSampled, kDisconnect, kTimeout, kWrongKey, kHostile, kNumKinds };
const char* const kKindNames[] = {"greedy", "greedy+stop", "sampled", "disconnect", "timeout", "wrong key", "hostile"};

TEST(E2eHttpSoakTest, MixedLoadEndsEveryRequestOnceAndLeavesNothingBehind) {
  const int64_t total = EnvInt("MOESERVE_HTTP_SOAK_REQUESTS", 1500);
  const int64_t threads = EnvInt("MOESERVE_HTTP_SOAK_THREADS", 16);
  ASSERT_GT(total, 0);
  ASSERT_GT(threads, 0);
  const std::string dir = MakeTempDir("http_soak");
  const std::string keys = dir + "/keys";
  std::ofstream(keys) << kKeysFile;
  chmod(keys.c_str(), 0600);
  ServerProcess server;
  server.set_env(RssFollowsTheHeapEnv());
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--kv-blocks", "48", "--host-kv-mb", "4", "--preemption", "swap",
                            "--max-num-seqs", "16", "--api-keys-file", keys}))
      << server.log();
  ASSERT_GT(server.http_port(), 0) << server.log();
  const int port = server.http_port();
  auto stub = v1::Moeserve::NewStub(server.channel());
  const uint64_t seed = std::random_device{}();
  auto new_client = [port] {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_connection_timeout(10, 0);
    c->set_write_timeout(30, 0);
    c->set_keep_alive(true);
    return c;
  };

  // Greedy prompts and their solo outputs, before any load.
  std::vector<Greedy> greedy;
  {
    auto client = new_client();
    const Json bodies[] = {
        {{"prompt", "The quick brown fox"}},
        {{"prompt", "moeserve soak over HTTP, prompt two"}},
        {{"prompt", Json::array({256, 72, 101, 108, 108, 111, 1, 2, 3, 250, 251})}},
        {{"messages", Json::array({{{"role", "user"}, {"content", "Hello there"}}})}},
        {{"messages", Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "Count to ten"}}})}},
    };
    for (const Json& b : bodies) {
      Greedy gr;
      gr.chat = b.contains("messages");
      gr.body = b;
      gr.body["max_tokens"] = 12;
      gr.body["temperature"] = 0;
      gr.body["ignore_eos"] = true;
      const Seen s = Post(*client, Path(gr.chat), gr.body.dump(), kKeys[0][0], gr.chat, false);
      ASSERT_TRUE(s.complete && s.status == 200 && s.finish_reason == "length") << s.status << " " << s.problem << s.raw;
      gr.solo = s.text;
      // A stop string: one whole character from the middle of the text; the answer must end
      // where it first occurs.
      std::vector<size_t> starts;
      for (size_t i = 0; i < gr.solo.size(); ++i) {
        if ((static_cast<unsigned char>(gr.solo[i]) & 0xC0) != 0x80) starts.push_back(i);
      }
      ASSERT_GE(starts.size(), 2u) << "greedy text too short: " << gr.solo;
      const size_t k = starts.size() / 2;
      const size_t end = k + 1 < starts.size() ? starts[k + 1] : gr.solo.size();
      gr.stop = gr.solo.substr(starts[k], end - starts[k]);
      gr.cut = gr.solo.substr(0, gr.solo.find(gr.stop));
      greedy.push_back(std::move(gr));
    }
  }
  const int64_t solo = static_cast<int64_t>(greedy.size());

  // Per request: its kind and the one outcome its client saw.
  enum Outcome { kNone, kComplete, kLeft, kRefused, kUnexpected };
  std::vector<std::atomic<int>> outcomes(static_cast<size_t>(total));
  for (auto& o : outcomes) o = kNone;
  std::atomic<int64_t> next{0}, twice{0};
  // By class, for the server's counters: complete answers of requests without stop strings
  // (the server must have finished them), of requests with stop strings (finished, or
  // cancelled once the stop string appeared), and requests whose client left (cancelled, or
  // finished just as the client left).
  std::atomic<int64_t> complete_plain{0}, complete_stop{0}, left{0}, refused{0}, unexpected{0};
  std::atomic<int64_t> by_kind[kNumKinds][3] = {};  // complete, left, refused
  std::atomic<int64_t> greedy_runs{0}, greedy_wrong{0}, status_counts[6] = {};  // 200 400 401 413 other none
  std::mutex mu;
  std::string failures;
  int failures_shown = 0;
  std::vector<double> rss;  // at each quarter of the run
  rss.push_back(RssMiB(server.pid()));
  const auto started = Clock::now();

  auto worker = [&](int t) {
    std::mt19937 g(static_cast<uint32_t>(seed) + 1000 + t);
    auto client = new_client();
    for (int64_t i = next++; i < total; i = next++) {
      if (i > 0 && i % std::max<int64_t>(1, total / 4) == 0) {
        std::lock_guard<std::mutex> lock(mu);
        rss.push_back(RssMiB(server.pid()));
      }
      const int roll = static_cast<int>(g() % 100);
      const Kind kind = roll < 25 ? kGreedy
                        : roll < 33 ? kGreedyStop
                        : roll < 68 ? kSampled
                        : roll < 80 ? kDisconnect
                        : roll < 92 ? kTimeout
                        : roll < 96 ? kWrongKey
                                    : kHostile;
      const int tenant = static_cast<int>(g() % 2);
      const std::string key = kKeys[tenant][g() % 2];
      bool chat = g() % 2 == 0;
      bool stream = g() % 2 == 0;
      bool has_stop = false;
      std::vector<int> allowed = {200};
      const Greedy* gr = nullptr;
      Leave leave;
      Json body;
      std::string text;  // a body that is not JSON built here
      int hostile = -1;
      std::string says;  // what a refusal's message must say
      switch (kind) {
        case kGreedy:
        case kGreedyStop:
          gr = &greedy[g() % greedy.size()];
          chat = gr->chat;
          body = gr->body;
          if (kind == kGreedyStop) {
            body["stop"] = g() % 2 ? Json(gr->stop) : Json::array({gr->stop, "\x01\x02never"});
            has_stop = true;
          }
          break;
        case kSampled:
          SetPrompt(g, chat, 1, 150, &body);
          body["max_tokens"] = 1 + static_cast<int>(g() % 60);
          body["temperature"] = 0.8;
          body["top_p"] = 0.9;
          body["seed"] = g();
          body["priority"] = std::vector<std::string>{"fast", "high", "normal", "low"}[g() % 4];
          if (g() % 10 == 0) body["retain_seconds"] = 60;
          if (g() % 5 == 0) {
            body["stop"] = Json::array({"e", "\n"});
            has_stop = true;
          }
          break;
        case kDisconnect:  // a stream its client leaves after its first events
          SetPrompt(g, chat, 10, 60, &body);
          body["max_tokens"] = 400;
          body["ignore_eos"] = true;
          stream = true;
          leave.events = 1 + static_cast<int>(g() % 4);
          break;
        case kTimeout:  // abandoned at a client-side read timeout
          // At most 60 + 20 bytes of text and 80 of chat turns: with 580 tokens within the 768
          // tokens of KV one request may hold.
          SetPrompt(g, chat, 10, 60, &body);
          body["max_tokens"] = 580;
          body["ignore_eos"] = true;
          leave.seconds = 0.02 + 0.001 * static_cast<double>(g() % 100);
          break;
        case kWrongKey:
          SetPrompt(g, chat, 1, 20, &body);
          body["max_tokens"] = 4;
          allowed = {401};
          break;
        case kHostile:
          hostile = static_cast<int>(g() % 5);
          chat = false;
          stream = false;
          allowed = {hostile == 1 || hostile == 2 ? 413 : 400};
          if (hostile == 0) {
            constexpr int kDepth = 100000;
            text = R"({"prompt": )" + std::string(kDepth, '[') + "1" + std::string(kDepth, ']') + "}";
            says = "nested deeper than 64";
          } else if (hostile == 3) {
            says = "must be an integer in";
            text = g() % 2 ? R"({"prompt": [1, 4294967368], "max_tokens": 2})"
                           : R"({"prompt": "hi", "max_tokens": 18446744073709551615})";
          } else if (hostile == 4) {
            text = "{\"prompt\": \"hi\",\n \"max_tokens\": 4,,}";
            says = "not valid JSON at line 2";
          }
          break;
        default:
          break;
      }
      if (stream) body["stream"] = true;
      if (stream && g() % 4 == 0) body["stream_options"] = {{"include_usage", true}};

      Seen s;
      if (hostile == 1 || hostile == 2) {  // over the 4 MiB limit: declared, or chunked as it comes
        const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + key +
                                 "\r\nContent-Type: application/json\r\n";
        s.status = hostile == 1
                       ? RawStatus(port, head + "Content-Length: 4194305\r\n\r\n", "", 0, 30)
                       : RawStatus(port, head + "Transfer-Encoding: chunked\r\n\r\n",
                                   "10000\r\n" + std::string(1 << 16, 'a') + "\r\n", 80, 30);
        if (s.status < 0) s.problem = "no answer to a body over the limit";
      } else if (kind == kWrongKey) {
        const int how = static_cast<int>(g() % 3);
        s = Post(*client, Path(chat), body.dump(), how == 0 ? "" : how == 1 ? "key-nobody" : std::string(key) + "x",
                 chat, stream);
      } else {
        s = Post(*client, Path(chat), text.empty() ? body.dump() : text, key, chat, stream, leave);
      }
      if (s.left || !s.problem.empty()) client = new_client();  // a fresh connection after a failure

      // The one outcome of this request.
      Outcome o = kUnexpected;
      std::string why = s.problem;
      const bool allowed_status = std::find(allowed.begin(), allowed.end(), s.status) != allowed.end();
      if (s.left && (kind == kDisconnect || kind == kTimeout)) {
        o = kLeft;
      } else if (!s.problem.empty()) {
      } else if (!allowed_status) {
        why = "status " + std::to_string(s.status) + ": " + s.raw.substr(0, 300);
      } else if (s.status == 200) {
        o = kComplete;
        if (gr != nullptr) {
          ++greedy_runs;
          const std::string& want = kind == kGreedyStop ? gr->cut : gr->solo;
          const std::string reason = kind == kGreedyStop ? "stop" : "length";
          if (s.text != want || s.finish_reason != reason) {
            ++greedy_wrong;
            o = kUnexpected;
            why = "greedy " + std::string(stream ? "stream" : "whole") + " answered \"" + s.text + "\" (" +
                  s.finish_reason + "), solo \"" + want + "\" (" + reason + ")";
          }
        }
      } else if (!says.empty() && s.raw.find(says) == std::string::npos) {
        why = "the refusal does not say \"" + says + "\": " + s.raw.substr(0, 300);
      } else {
        o = kRefused;
      }
      int expected_none = kNone;
      if (!outcomes[static_cast<size_t>(i)].compare_exchange_strong(expected_none, o)) ++twice;
      const int st = s.status;
      ++status_counts[st == 200 ? 0 : st == 400 ? 1 : st == 401 ? 2 : st == 413 ? 3 : st < 0 ? 5 : 4];
      switch (o) {
        case kComplete:
          ++(has_stop ? complete_stop : complete_plain);
          ++by_kind[kind][0];
          break;
        case kLeft:
          ++left;
          ++by_kind[kind][1];
          break;
        case kRefused:
          ++refused;
          ++by_kind[kind][2];
          break;
        default: {
          ++unexpected;
          std::lock_guard<std::mutex> lock(mu);
          if (++failures_shown <= 10) {
            failures += "\n  request " + std::to_string(i) + " (" + kKindNames[kind] + (chat ? ", chat" : "") +
                        (stream ? ", stream" : "") + "): " + why;
          }
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& t : pool) t.join();
  const double seconds = SecondsSince(started);
  // A client that timed out may leave its request in the server's accept backlog, read and
  // started only after every client thread has returned: hence the count of ended requests.
  ASSERT_TRUE(EventuallyIdle(stub.get(), solo + complete_plain + complete_stop + left, kKeys[1][0]));
  rss.push_back(RssMiB(server.pid()));

  // Exactly one outcome per request on the client side, each the expected one.
  int64_t none = 0;
  for (const auto& o : outcomes) none += o.load() == kNone ? 1 : 0;
  EXPECT_EQ(none, 0) << "requests without an outcome";
  EXPECT_EQ(twice.load(), 0) << "requests with two outcomes";
  EXPECT_EQ(complete_plain + complete_stop + left + refused + unexpected, total);
  EXPECT_EQ(unexpected.load(), 0) << "unexpected outcomes (seed " << seed << "):" << failures;
  EXPECT_GT(greedy_runs.load(), 0);
  EXPECT_EQ(greedy_wrong.load(), 0) << "greedy answers that differ from their solo run (seed " << seed << ")";

  // The server's counters against the clients' view. Every request that reached the engine
  // ended there exactly once; one whose client saw a complete answer without a stop string
  // finished; one with a stop string finished or was cancelled when the string appeared; one
  // whose client left was cancelled, or finished just as its client left (the only
  // disagreement allowed). Refusals never reached the engine.
  const v1::Stats st = GetStats(stub.get(), kKeys[0][1]);
  const auto& out = st.requests_by_outcome();
  const int64_t finished = out.at("length") + out.at("stop");
  const int64_t cancelled = out.at("cancelled");
  EXPECT_EQ(finished + cancelled + out.at("deadline_exceeded") + out.at("error"),
            solo + complete_plain + complete_stop + left)
      << "the server ended more or fewer requests than reached it";
  EXPECT_GE(finished, solo + complete_plain) << "a request its client saw complete did not finish on the server";
  EXPECT_LE(cancelled, complete_stop + left) << "the server cancelled a request its client did not leave";
  EXPECT_EQ(out.at("deadline_exceeded"), 0);
  EXPECT_EQ(out.at("error"), 0);
  EXPECT_EQ(out.at("refused"), 0);
  // GET /metrics says the same.
  const std::map<std::string, int64_t> metrics = MetricsOutcomes(port);
  for (const auto& [grpc_name, metric_name] : std::vector<std::pair<std::string, std::string>>{
           {"length", "length"}, {"stop", "stop"}, {"cancelled", "cancelled"}, {"deadline_exceeded", "deadline"},
           {"error", "error"}, {"refused", "refused"}}) {
    EXPECT_TRUE(metrics.count(metric_name) && metrics.at(metric_name) == out.at(grpc_name))
        << "/metrics " << metric_name << " against GetStats " << grpc_name << " = " << out.at(grpc_name);
  }
  EXPECT_EQ(st.kv_blocks_used(), 0);
  EXPECT_EQ(st.kv_tiers().ddr_swap_blocks(), 0) << "swap slots still held";
  EXPECT_GT(st.preemptions(), 0) << "the KV pool was never short: the test did not exercise preemption";
  EXPECT_GT(by_kind[kDisconnect][1].load(), 0) << "no client left mid-stream";
  EXPECT_GT(by_kind[kTimeout][1].load(), 0) << "no client abandoned a request at its read timeout";
  // Still serving after all that.
  {
    auto client = new_client();
    const Seen s = Post(*client, Path(false), greedy[0].body.dump(), kKeys[1][0], false, false);
    EXPECT_EQ(s.text, greedy[0].solo) << s.status << " " << s.problem;
  }
  // Resident memory levels off: from the last quarter's sample to the end it grows by at most
  // 10% (or 16 MiB, for short runs still warming the allocator), as in soak_test.cc.
  ASSERT_GE(rss.size(), 3u);
  const double mid = rss[rss.size() - 2], end = rss.back();
  EXPECT_LE(end, std::max(mid * 1.10, mid + 16.0)) << "RSS grew from " << mid << " to " << end << " MiB";

  std::string kinds_text, rss_text;
  for (int k = 0; k < kNumKinds; ++k) {
    kinds_text += std::string(k ? ", " : "") + kKindNames[k] + " " + std::to_string(by_kind[k][0].load()) + "/" +
                  std::to_string(by_kind[k][1].load()) + "/" + std::to_string(by_kind[k][2].load());
  }
  for (double r : rss) rss_text += " " + std::to_string(static_cast<int>(r));
  std::printf(
      "http soak: %lld requests, %lld threads, %.1f s (%.0f requests/s): complete %lld (%lld with stop strings), "
      "left %lld, refused %lld, unexpected %lld; by kind complete/left/refused: %s; statuses 200 %lld, 400 %lld, "
      "401 %lld, 413 %lld, other %lld, none %lld; greedy answers %lld (all equal their solo run: %s); server: "
      "finished %lld, cancelled %lld, preemptions %lld, swaps %lld, KV blocks used %lld, swap slots %lld; RSS MiB at "
      "start, quarters and end:%s\n",
      static_cast<long long>(total), static_cast<long long>(threads), seconds, total / seconds,
      static_cast<long long>(complete_plain + complete_stop), static_cast<long long>(complete_stop.load()),
      static_cast<long long>(left.load()), static_cast<long long>(refused.load()),
      static_cast<long long>(unexpected.load()), kinds_text.c_str(), static_cast<long long>(status_counts[0].load()),
      static_cast<long long>(status_counts[1].load()), static_cast<long long>(status_counts[2].load()),
      static_cast<long long>(status_counts[3].load()), static_cast<long long>(status_counts[4].load()),
      static_cast<long long>(status_counts[5].load()), static_cast<long long>(greedy_runs.load()),
      greedy_wrong.load() == 0 ? "yes" : "NO", static_cast<long long>(finished), static_cast<long long>(cancelled),
      static_cast<long long>(st.preemptions()), static_cast<long long>(st.swaps()),
      static_cast<long long>(st.kv_blocks_used()), static_cast<long long>(st.kv_tiers().ddr_swap_blocks()),
      rss_text.c_str());
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::testing
