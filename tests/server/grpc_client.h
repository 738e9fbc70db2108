// Client-side helpers of the end-to-end tests: streaming a Generate call over the generated
// C++ stub, stats polling, and running `moeserve generate` for the expected token ids.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace moeserve::testing {

namespace v1 = moeserve::v1;

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  int messages = 0;
  v1::GenerateResponse last;
};

inline Streamed Stream(v1::Moeserve::Stub* stub, const v1::GenerateRequest& req, grpc::ClientContext* ctx) {
  Streamed s;
  auto reader = stub->Generate(ctx, req);
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    s.ids.insert(s.ids.end(), r.token_ids().begin(), r.token_ids().end());
    s.text += r.text();
    ++s.messages;
    s.last = r;
  }
  s.status = reader->Finish();
  return s;
}

inline Streamed Stream(v1::Moeserve::Stub* stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return Stream(stub, req, &ctx);
}

inline v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids, int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  r.set_max_tokens(max_tokens);
  return r;
}

// The server's stats; `key` for a server that requires one.
inline v1::Stats GetStats(v1::Moeserve::Stub* stub, const std::string& key = "") {
  grpc::ClientContext ctx;
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::Stats s;
  const grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &s);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return s;
}

// Requests the engine has ended, whatever the outcome (refusals never reached it).
inline int64_t EndedRequests(const v1::Stats& s) {
  int64_t n = 0;
  for (const auto& [outcome, count] : s.requests_by_outcome()) n += outcome == "refused" ? 0 : count;
  return n;
}

// Polls GetStats until no request runs or waits, no KV block or swap slot is in use (normally
// within milliseconds; the bound is generous for a loaded CI machine, since it returns early),
// and at least `ended` requests ended: a call its client gave up on may still be on its way into
// the server (its accept backlog) after every client thread has returned, so an idle engine
// alone does not mean every request that reached the server has ended.
inline ::testing::AssertionResult EventuallyIdle(v1::Moeserve::Stub* stub, int64_t ended = 0,
                                                 const std::string& key = "") {
  v1::Stats s;
  for (int i = 0; i < 3000; ++i) {
    s = GetStats(stub, key);
    if (s.running_requests() == 0 && s.queue_depth() == 0 && s.kv_blocks_used() == 0 &&
        s.kv_tiers().ddr_swap_blocks() == 0 && EndedRequests(s) >= ended) {
      if (s.kv_blocks_free() + s.kv_blocks_cached() != s.kv_blocks_total()) {
        return ::testing::AssertionFailure() << "free " << s.kv_blocks_free() << " + cached " << s.kv_blocks_cached()
                                             << " != total " << s.kv_blocks_total();
      }
      return ::testing::AssertionSuccess();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ::testing::AssertionFailure() << "not idle after 30 s: running " << s.running_requests() << ", waiting "
                                       << s.queue_depth() << ", KV blocks used " << s.kv_blocks_used()
                                       << ", swap slots " << s.kv_tiers().ddr_swap_blocks() << ", ended "
                                       << EndedRequests(s) << " of " << ended;
}

// `moeserve generate ARGS... --ids`: its exit code, the token ids it printed and its stderr.
struct GeneratedIds {
  int rc = -1;
  std::vector<int32_t> ids;
  std::string err;
};
inline GeneratedIds GenerateIds(std::vector<std::string> args) {
  args.insert(args.begin(), "generate");
  args.push_back("--ids");
  GeneratedIds g;
  std::string out;
  g.rc = RunCommand(args, &out, &g.err);
  for (absl::string_view t : absl::StrSplit(absl::StripAsciiWhitespace(out), ',', absl::SkipEmpty())) {
    g.ids.push_back(std::stoi(std::string(t)));
  }
  return g;
}

}  // namespace moeserve::testing
