// A soak test of our own: a real server with a tiny KV pool (preemption with swap to a small
// DDR tier) takes thousands of mixed requests from many threads: greedy repeats, seeded
// sampling, priorities, retention, cancellations mid-stream and deadlines. Afterwards every
// request ended exactly once, the server's outcome counters match what the clients saw, no KV
// block or swap slot is in use, every greedy repeat equals its solo run, and the server's
// resident memory has levelled off. CI runs a short version; benchmarks/soak.sh a long one
// (MOESERVE_SOAK_REQUESTS, MOESERVE_SOAK_THREADS).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

std::vector<int32_t> RandomPrompt(std::mt19937& gen, int min_len, int max_len) {
  std::vector<int32_t> p = {256};
  const int n = std::uniform_int_distribution<int>(min_len, max_len)(gen);
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(gen() % 256));
  return p;
}

TEST(E2eSoakTest, MixedLoadEndsEveryRequestOnceAndLeavesNothingBehind) {
  const int64_t total = EnvInt("MOESERVE_SOAK_REQUESTS", 3000);
  const int64_t threads = EnvInt("MOESERVE_SOAK_THREADS", 16);
  ASSERT_GT(total, 0);
  ASSERT_GT(threads, 0);
  ServerProcess server;
  server.set_env(RssFollowsTheHeapEnv());
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--kv-blocks", "48", "--host-kv-mb", "4",
                            "--preemption", "swap", "--max-num-seqs", "16"}))
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  const uint64_t seed = std::random_device{}();
  std::mt19937 gen(static_cast<uint32_t>(seed));

  // Greedy prompts and their solo outputs, before any load.
  std::vector<v1::GenerateRequest> greedy;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 8; ++i) {
    greedy.push_back(IdsRequest(RandomPrompt(gen, 20, 60), 12));
    greedy.back().set_ignore_eos(true);
    const Streamed s = Stream(stub.get(), greedy.back());
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    expected.push_back(s.ids);
  }
  const int64_t solo = static_cast<int64_t>(greedy.size());

  std::atomic<int64_t> next{0}, ok{0}, cancelled{0}, deadline{0}, other{0}, greedy_runs{0},
      greedy_wrong{0};
  std::mutex mu;
  std::string failures;
  std::vector<double> rss;  // at each quarter of the run
  rss.push_back(RssMiB(server.pid()));
  const auto started = std::chrono::steady_clock::now();
  auto worker = [&](int t) {
    std::mt19937 g(static_cast<uint32_t>(seed) + 1000 + t);
    for (int64_t i = next++; i < total; i = next++) {
      if (i > 0 && i % std::max<int64_t>(1, total / 4) == 0) {
        std::lock_guard<std::mutex> lock(mu);
        rss.push_back(RssMiB(server.pid()));
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      const int kind = static_cast<int>(g() % 10);
      v1::GenerateRequest req;
      bool expect_cancel = false;
      int greedy_index = -1;
      if (kind < 3) {  // a greedy repeat
        greedy_index = static_cast<int>(g() % greedy.size());
        req = greedy[greedy_index];
      } else if (kind == 3) {  // cancelled after its first tokens
        req = IdsRequest(RandomPrompt(g, 10, 80), 400);
        req.set_ignore_eos(true);
        expect_cancel = true;
      } else if (kind == 4) {  // a deadline it cannot meet
        // Long enough that the call always reaches the server (a deadline that expires in the
        // client's own channel is counted by the client only), far too short for 600 tokens.
        req = IdsRequest(RandomPrompt(g, 10, 80), 600);
        req.set_ignore_eos(true);
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(100 + g() % 200));
      } else {  // sampled, with a priority and sometimes retention
        req = IdsRequest(RandomPrompt(g, 1, 150), 1 + static_cast<int>(g() % 60));
        req.mutable_sampling()->set_temperature(0.8f);
        req.mutable_sampling()->set_top_p(0.9f);
        req.mutable_sampling()->set_seed(g());
        req.set_priority(static_cast<v1::Priority>(g() % 4));
        if (g() % 10 == 0) req.set_retain_seconds(60);
      }
      Streamed s;
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse r;
      while (reader->Read(&r)) {
        s.ids.insert(s.ids.end(), r.token_ids().begin(), r.token_ids().end());
        s.last = r;
        if (expect_cancel && s.ids.size() >= 2) ctx.TryCancel();
      }
      s.status = reader->Finish();
      switch (s.status.error_code()) {
        case grpc::StatusCode::OK:
          ++ok;
          if (greedy_index >= 0) {
            ++greedy_runs;
            if (s.ids != expected[greedy_index]) ++greedy_wrong;
          }
          break;
        case grpc::StatusCode::CANCELLED:
          ++cancelled;
          break;
        case grpc::StatusCode::DEADLINE_EXCEEDED:
          ++deadline;
          break;
        default: {
          ++other;
          std::lock_guard<std::mutex> lock(mu);
          failures +=
              "\n  " + std::to_string(s.status.error_code()) + ": " + s.status.error_message();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_TRUE(EventuallyIdle(stub.get(), total + solo));
  rss.push_back(RssMiB(server.pid()));

  EXPECT_EQ(other.load(), 0) << "unexpected outcomes:" << failures;

  EXPECT_GT(greedy_runs.load(), 0);
  EXPECT_EQ(greedy_wrong.load(), 0)
      << "greedy repeats that differ from their solo run (seed " << seed << ")";
  const v1::Stats st = GetStats(stub.get());
  const auto& out = st.requests_by_outcome();
  const int64_t finished = out.at("length") + out.at("stop");
  // Every call the client saw end OK finished on the server. The other way round a request can
  // finish on the server just as its client's deadline or cancellation fires (the client then
  // sees that status): those are the only disagreements allowed. Cancellation and deadline race
  // on the server too (the engine's deadline check, or the call's cancellation when gRPC
  // enforces the deadline first): their sum is compared.
  EXPECT_GE(finished, ok + solo) << "a request the client saw finish OK did not finish on the server";
  EXPECT_EQ(finished - (ok + solo), (cancelled + deadline) - (out.at("cancelled") + out.at("deadline_exceeded")))
      << "the server's finished count against the clients' OK count";
  EXPECT_EQ(out.at("error"), 0);
  EXPECT_EQ(out.at("refused"), 0);
  // Exactly once on the server: every request it took ended in exactly one outcome.
  EXPECT_EQ(finished + out.at("cancelled") + out.at("deadline_exceeded"), total + solo)
      << "the server ended more or fewer requests than were sent";
  EXPECT_EQ(st.kv_blocks_used(), 0);
  EXPECT_EQ(st.kv_tiers().ddr_swap_blocks(), 0) << "swap slots still held";
  EXPECT_GT(st.preemptions(), 0)
      << "the KV pool was never short: the test did not exercise preemption";
  // Resident memory levels off: from the last quarter's sample to the end it grows by at
  // most 10% (or 16 MiB, for short runs still warming the allocator).
  ASSERT_GE(rss.size(), 3u);
  const double mid = rss[rss.size() - 2], end = rss.back();
  EXPECT_LE(end, std::max(mid * 1.10, mid + 16.0))
      << "RSS grew from " << mid << " to " << end << " MiB";
  std::string rss_text;
  for (double r : rss) rss_text += " " + std::to_string(static_cast<int>(r));
  std::printf(
      "soak: %lld requests, %lld threads, %.1f s (%.0f requests/s): ok %lld, cancelled %lld, "
      "deadline %lld, "
      "other %lld; greedy repeats %lld (all equal their solo run: %s); server preemptions %lld, "
      "swaps %lld, "
      "KV blocks used %lld, swap slots %lld; RSS MiB at start, quarters and end:%s\n",
      static_cast<long long>(total), static_cast<long long>(threads), seconds, total / seconds,
      static_cast<long long>(ok.load()), static_cast<long long>(cancelled.load()),
      static_cast<long long>(deadline.load()), static_cast<long long>(other.load()),
      static_cast<long long>(greedy_runs.load()), greedy_wrong.load() == 0 ? "yes" : "NO",
      static_cast<long long>(st.preemptions()), static_cast<long long>(st.swaps()),
      static_cast<long long>(st.kv_blocks_used()),
      static_cast<long long>(st.kv_tiers().ddr_swap_blocks()), rss_text.c_str());
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

}  // namespace
}  // namespace moeserve::testing
