// End-to-end over real gRPC, requests that cannot finish while the test acts on them (the small
// preset, one sequence at a time, long outputs): cancelling mid-stream and a deadline that passes
// while the request waits both free every KV block.
#include <gtest/gtest.h>

#include <thread>

#include "server/proto/moeserve.grpc.pb.h"
#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

// Requests that cannot finish while a test acts on them, whatever the CPU: the small preset
// (milliseconds a step) asked for 4000 tokens, one sequence at a time, so a second request waits
// in the queue behind the first.
class E2eLongRequestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--preset", "small", "--max-num-seqs", "1", "--kv-cache-mb", "256"}))
        << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Moeserve::NewStub(server_->channel());
    ASSERT_TRUE(EventuallyIdle(stub_.get()));
  }
  static v1::GenerateRequest Long(std::vector<int32_t> prompt) {
    v1::GenerateRequest req = IdsRequest(std::move(prompt), 4000);
    req.set_ignore_eos(true);
    return req;
  }

  static ServerProcess* server_;
  std::unique_ptr<v1::Moeserve::Stub> stub_;
};
ServerProcess* E2eLongRequestTest::server_ = nullptr;

TEST_F(E2eLongRequestTest, CancellingMidStreamFreesKvBlocks) {
  const v1::Stats before = GetStats(stub_.get());
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Long({256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  v1::GenerateResponse r;
  int tokens = 0;
  while (tokens < 3 && reader->Read(&r)) tokens += r.token_ids_size();
  ASSERT_GE(tokens, 3);
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
  const v1::Stats after = GetStats(stub_.get());
  EXPECT_EQ(after.requests_by_outcome().at("cancelled"), before.requests_by_outcome().at("cancelled") + 1);
  EXPECT_EQ(after.kv_blocks_used(), 0);
}

// A deadline that passes while the request waits behind another ends it there: no token, no
// block, one outcome on the server (if the call reached it before its deadline).
TEST_F(E2eLongRequestTest, ShortDeadlineGivesDeadlineExceededAndFreesKvBlocks) {
  const v1::Stats before = GetStats(stub_.get());
  grpc::ClientContext blocker_ctx;
  auto blocker = stub_->Generate(&blocker_ctx, Long({256, 7, 8, 9}));
  v1::GenerateResponse first;
  ASSERT_TRUE(blocker->Read(&first)) << "the blocking request did not start";
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(30));
  Streamed s = Stream(stub_.get(), Long({256, 40, 41, 42}), &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.status.error_message();
  EXPECT_TRUE(s.ids.empty()) << "it waited behind the only running sequence";
  blocker_ctx.TryCancel();
  while (blocker->Read(&first)) {
  }
  EXPECT_EQ(blocker->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
  const v1::Stats after = GetStats(stub_.get());
  // If the call reached the engine (under load the deadline can pass before it does), it ended
  // by the deadline itself or by the client's cancellation, whichever came first; the blocker
  // was cancelled.
  const auto ended = [](const v1::Stats& st) {
    return st.requests_by_outcome().at("deadline_exceeded") + st.requests_by_outcome().at("cancelled");
  };
  const auto all = [](const v1::Stats& st) {
    int64_t n = 0;
    for (const auto& [outcome, count] : st.requests_by_outcome()) n += count;
    return n;
  };
  EXPECT_GE(all(after) - all(before), 1);
  EXPECT_LE(all(after) - all(before), 2);
  EXPECT_EQ(ended(after) - ended(before), all(after) - all(before));
  EXPECT_EQ(after.kv_blocks_used(), 0);
}

}  // namespace
}  // namespace moeserve::testing
