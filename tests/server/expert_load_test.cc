// `bench --expert-load-out` and `--expert-placement balanced --expert-load`, run as the real
// binary: the routing recorded on one rank (every (token, slot) of every MoE layer counted
// once), fed to a balanced placement over two EP ranks (whose ranks' counts add up to the same
// routing, as do two stages' and those of a placement with replicated experts), and every misuse
// of the flags named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "tests/server/grpc_client.h"
#include "tests/server/server_process.h"

namespace moeserve::testing {
namespace {

TEST(E2eExpertLoadTest, RecordedRoutingFeedsABalancedPlacement) {
  const std::string dir = MakeTempDir("expert-load");
  const std::string load = dir + "/load.json";
  std::string out, err;
  // tiny: 2 layers of 4 experts, top-2. 6 requests of 20 prompt tokens and 5 output tokens are
  // 6 x (20 + 4) tokens through the model (the last token is sampled, never fed back).
  ASSERT_EQ(RunCommand({"bench", "--preset", "tiny", "--num-requests", "6", "--prompt-len", "20", "--output-len", "5",
                        "--seed", "3", "--expert-load-out", load},
                       &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("ep 2: busiest rank over the mean"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(*ReadFileToString(load));
  ASSERT_EQ(j["layers"], 2);
  ASSERT_EQ(j["experts"], 4);
  int64_t total = 0;
  for (const auto& row : j["tokens"]) {
    ASSERT_EQ(row.size(), 4u);
    int64_t layer = 0;
    for (const auto& v : row) layer += v.get<int64_t>();
    EXPECT_EQ(layer, 6 * (20 + 4) * 2) << "every token's two slots in every layer";
    total += layer;
  }
  EXPECT_EQ(total, 2 * 6 * (20 + 4) * 2);
  // The recorded load places the experts of a two-rank run, which routes as one rank does: its
  // ranks' counts add up to the same file, and so do those of two stages.
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--ep", "2", "--expert-placement", "balanced", "--expert-load", load},
        std::vector<std::string>{"--ep", "2", "--expert-placement", "balanced", "--expert-load", load,
                                 "--expert-replicas", "2"},
        std::vector<std::string>{"--pp", "2"}}) {
    std::vector<std::string> args = {"bench", "--preset", "tiny", "--num-requests", "6", "--prompt-len", "20",
                                     "--output-len", "5", "--seed", "3", "--expert-load-out", dir + "/again.json"};
    args.insert(args.end(), layout.begin(), layout.end());
    ASSERT_EQ(RunCommand(args, &out, &err), 0) << err;
    if (layout[0] == "--ep") EXPECT_NE(out.find("layout ep2 pp1 balanced"), std::string::npos) << out;
    if (layout.size() > 6) EXPECT_NE(out.find("layout ep2 pp1 balanced +2 replicas"), std::string::npos) << out;
    EXPECT_EQ(nlohmann::json::parse(*ReadFileToString(dir + "/again.json"))["tokens"], j["tokens"]) << layout[0];
  }
  // Misuse, each named.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--ep", "2", "--expert-placement", "balanced"}, "--expert-placement balanced needs --expert-load"},
      {{"--ep", "2", "--expert-load", load}, "--expert-load is read only with --expert-placement balanced"},
      {{"--ep", "2", "--expert-placement", "balanced", "--expert-load", dir + "/none.json"}, "--expert-load"},
      {{"--ep", "2", "--expert-placement", "evenly"}, "must be contiguous, round-robin or balanced"},
      {{"--sweep-batch", "1", "--expert-load-out", dir + "/x.json"}, "not with --tier-scenario or --sweep-batch"},
      {{"--ep", "2", "--expert-replicas", "2"}, "--expert-replicas copies the hottest experts of a recorded load"},
      {{"--expert-placement", "balanced", "--expert-load", load, "--expert-replicas", "2"}, "with --ep 1"},
      {{"--ep", "2", "--expert-placement", "balanced", "--expert-load", load, "--expert-replicas", "-2"},
       "a count >= 0; got --expert-replicas -2"},
      {{"--ep", "2", "--expert-placement", "balanced", "--expert-load", load, "--expert-replicas", "1"},
       "--expert-replicas must be in [1, 4]"},
      {{"--ep", "2", "--expert-placement", "balanced", "--expert-load", load, "--expert-replicas", "6"},
       "--expert-replicas must be in [1, 4]"},
  };
  for (const auto& [flags, message] : bad) {
    std::vector<std::string> args = {"bench", "--preset", "tiny", "--num-requests", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    EXPECT_NE(RunCommand(args, &out, &err), 0) << flags[2];
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
  // A load recorded for another model is refused.
  ASSERT_EQ(RunCommand({"bench", "--preset", "small", "--num-requests", "1", "--prompt-len", "4", "--output-len", "1",
                        "--expert-load-out", dir + "/small.json"},
                       &out, &err),
            0)
      << err;
  EXPECT_NE(RunCommand({"bench", "--preset", "tiny", "--num-requests", "1", "--ep", "2", "--expert-placement", "balanced",
                        "--expert-load", dir + "/small.json"},
                       &out, &err),
            0);
  EXPECT_NE(err.find("recorded for 8 layers x 8 experts, the model has 2 x 4"), std::string::npos) << err;
}

// serve records too, and writes the file at a clean shutdown: two requests of 10 prompt ids and
// 4 output tokens are (10 + 3) tokens each through both MoE layers of tiny, top-2.
TEST(E2eExpertLoadTest, ServeWritesTheRoutingAtShutdown) {
  const std::string dir = MakeTempDir("serve-expert-load");
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--expert-load-out", dir + "/load.json"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  for (int i = 0; i < 2; ++i) {
    const Streamed got = Stream(stub.get(), IdsRequest({5, 6, 7, 8, 9, 10, 11, 12, 13, 14 + i}, 4));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_EQ(got.ids.size(), 4u);
  }
  EXPECT_EQ(server.Stop(), 0) << server.log();
  const auto j = nlohmann::json::parse(*ReadFileToString(dir + "/load.json"));
  int64_t total = 0;
  for (const auto& row : j["tokens"]) {
    for (const auto& v : row) total += v.get<int64_t>();
  }
  EXPECT_EQ(total, 2 * (10 + 3) * 2 * 2) << j.dump();
}

}  // namespace
}  // namespace moeserve::testing
