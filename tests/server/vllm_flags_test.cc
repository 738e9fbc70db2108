// `moeserve serve` started with vLLM's launch line: the positional model, --host/--port for the
// HTTP API, --max-model-len enforced on requests and reported by /v1/models, vLLM's --dtype
// spellings, -tp N --enable-expert-parallel as N expert-parallel ranks (the same tokens as one
// process); flags that mean something else here refused by name.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>
#include <tuple>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "tests/server/grpc_client.h"

namespace moeserve::testing {
namespace {

// A loopback port free at the time of asking.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(E2eVllmFlagsTest, TheVllmLaunchLineServes) {
  const std::string dir = MakeTempDir("vllm_flags");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--seed", "3", "--out", dir + "/ck"}, &out, &err), 0) << err;
  const int port = FreePort();
  ServerProcess server;
  server.set_http_listen(false);
  ASSERT_TRUE(server.Start({dir + "/ck", "--host", "127.0.0.1", "--port", std::to_string(port), "--max-model-len",
                            "64", "--dtype", "bfloat16", "-tp", "2", "--enable-expert-parallel"}))
      << server.log();
  EXPECT_NE(server.log().find("each rank holds its shard"), std::string::npos) << "not expert-parallel\n" << server.log();
  // Two expert-parallel ranks stream what one process generates from the same checkpoint.
  const std::vector<int32_t> prompt = {256, 7, 99, 13, 42};
  const GeneratedIds want = GenerateIds(
      {"--model", dir + "/ck", "--dtype", "bf16", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens", "10"});
  ASSERT_EQ(want.rc, 0) << want.err;
  auto stub = v1::Moeserve::NewStub(server.channel());
  const Streamed got = Stream(stub.get(), IdsRequest(prompt, 10));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, want.ids);
  // The HTTP API listens on --host/--port and reports --max-model-len.
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30, 0);
  auto models = http.Get("/v1/models");
  ASSERT_TRUE(models) << "no HTTP API on port " << port;
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["max_model_len"], 64) << models->body;
  // A request past it is refused naming max_tokens and the flag; one within it is served.
  auto past = http.Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 60})", "application/json");
  ASSERT_TRUE(past);
  EXPECT_EQ(past->status, 400) << past->body;
  EXPECT_NE(past->body.find("--max-model-len"), std::string::npos) << past->body;
  EXPECT_NE(past->body.find("\"param\":\"max_tokens\""), std::string::npos) << past->body;
  auto within = http.Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 8})", "application/json");
  ASSERT_TRUE(within);
  EXPECT_EQ(within->status, 200) << within->body;
}

// vLLM's load balancer flags: the experts re-placed every two steps from the last four steps'
// routing, with two redundant copies, and the tokens still those of one process.
TEST(E2eVllmFlagsTest, EplbFlagsRePlaceExpertsWhileServing) {
  const std::string dir = MakeTempDir("vllm_eplb");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--seed", "4", "--out", dir + "/ck"}, &out, &err), 0) << err;
  ServerProcess server;
  server.set_http_listen(false);
  ASSERT_TRUE(server.Start({dir + "/ck", "--dtype", "bfloat16", "-tp", "2", "--enable-expert-parallel", "--enable-eplb",
                            "--eplb-config",
                            R"({"window_size": 4, "step_interval": 2, "num_redundant_experts": 2, "log_balancedness": true})"}))
      << server.log();
  // Re-placements copy from the ranks that hold the experts: the staging copy is not kept.
  EXPECT_NE(server.log().find("freed the"), std::string::npos) << "the staging copy was kept\n" << server.log();
  const std::vector<int32_t> prompt = {256, 9, 31, 77, 5, 120, 64};
  const GeneratedIds want = GenerateIds(
      {"--model", dir + "/ck", "--dtype", "bf16", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens", "12"});
  ASSERT_EQ(want.rc, 0) << want.err;
  auto stub = v1::Moeserve::NewStub(server.channel());
  const Streamed got = Stream(stub.get(), IdsRequest(prompt, 12));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_NE(server.log().find("EPLB at step 1:"), std::string::npos) << server.log();
}

// Several --served-model-name: /v1/models lists each, a request may name any (and is answered
// under that name), one naming another model gets 404 listing them, none gets the first.
TEST(E2eVllmFlagsTest, SeveralServedModelNames) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--served-model-name", "alpha", "beta"})) << server.log();
  httplib::Client http("127.0.0.1", server.http_port());
  http.set_read_timeout(30, 0);
  auto models = http.Get("/v1/models");
  ASSERT_TRUE(models);
  const auto list = nlohmann::json::parse(models->body)["data"];
  ASSERT_EQ(list.size(), 2u) << models->body;
  EXPECT_EQ(list[0]["id"], "alpha");
  EXPECT_EQ(list[1]["id"], "beta");
  for (const auto& [body, status, model] : std::vector<std::tuple<std::string, int, std::string>>{
           {R"({"model": "beta", "prompt": "hi", "max_tokens": 2})", 200, "beta"},
           {R"({"prompt": "hi", "max_tokens": 2})", 200, "alpha"},
           {R"({"model": "gamma", "prompt": "hi", "max_tokens": 2})", 404, ""}}) {
    auto r = http.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    if (status == 200) {
      EXPECT_EQ(nlohmann::json::parse(r->body)["model"], model) << r->body;
    } else {
      EXPECT_NE(r->body.find(R"(\"alpha\", \"beta\")"), std::string::npos) << r->body;
    }
  }
}

// --seed: the same seed and the same unseeded sampled requests give the same tokens; another
// seed gives other tokens.
TEST(E2eVllmFlagsTest, SeedMakesUnseededSamplingReproducible) {
  auto run = [](const std::string& seed) {
    ServerProcess server;
    EXPECT_TRUE(server.Start({"--preset", "tiny", "--seed", seed})) << server.log();
    auto stub = v1::Moeserve::NewStub(server.channel());
    std::vector<int32_t> all;
    for (int i = 0; i < 3; ++i) {
      v1::GenerateRequest req = IdsRequest({1, 2, 3}, 16);
      req.mutable_sampling()->set_temperature(1.0f);
      req.set_ignore_eos(true);
      const Streamed got = Stream(stub.get(), req);
      EXPECT_TRUE(got.status.ok()) << got.status.error_message();
      all.insert(all.end(), got.ids.begin(), got.ids.end());
    }
    return all;
  };
  const std::vector<int32_t> a = run("11"), b = run("11"), c = run("12");
  ASSERT_EQ(a.size(), 48u);
  EXPECT_EQ(a, b) << "the same seed";
  EXPECT_NE(a, c) << "another seed";
}

TEST(E2eVllmFlagsTest, FlagsThatMeanSomethingElseHereAreRefusedByName) {
  const std::string dir = MakeTempDir("vllm_flags");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--out", dir + "/ck"}, &out, &err), 0) << err;
  const std::string ck = dir + "/ck";
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"serve", ck, "-tp", "2"}, "no tensor parallelism"},
           {{"serve", ck, "--gpu-memory-utilization", "0.9"}, "--kv-cache-mb"},
           {{"serve", ck, "--enable-eplb"}, "--enable-eplb balances experts over EP ranks"},
           {{"serve", ck, "--num-redundant-experts", "4"}, "--num-redundant-experts needs --enable-eplb"},
           {{"serve", ck, "-tp", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-config", "{\"policy\": \"flashlb\"}"},
            "policy \"flashlb\""},
           {{"serve", ck, "-tp", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-config", "{\"window\": 5}"},
            "unknown key \"window\""},
           {{"serve", ck, "-tp", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-config", "{\"step_interval\": 0}"},
            "\"step_interval\" must be an integer >= 1, got 0"},
           {{"serve", ck, "-tp", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-interval", "7"}, "disagree"},
           {{"serve", ck, "--dtype", "fp8"}, "--dtype: 'fp8'"},
           {{"serve", "mistralai/Mixtral-8x7B-v0.1"}, "huggingface-cli download"},
           {{"serve", ck, "--port", "8001", "--http-listen", "127.0.0.1:8002"}, "not both"},
           {{"serve", ck, "--model", dir}, "different checkpoints"},
           {{"serve", ck, "--max-model-len", "1"}, "--max-model-len"},
           {{"serve", ck, "-tp", "2", "--enable-expert-parallel", "--ep", "4"}, "disagree"}}) {
    EXPECT_EQ(RunCommand(args, &out, &err), 2) << absl::StrJoin(args, " ") << "\n" << err;
    EXPECT_NE(err.find(says), std::string::npos) << absl::StrJoin(args, " ") << "\n" << err;
  }
}

// vLLM's --kv-cache-dtype: auto is the weights' dtype (GetModelInfo's KV dtype says which),
// bfloat16 is bf16; fp8 and a disagreeing --kv-dtype are refused by name. moeserve's own
// --kv-dtype defaults to auto, and f32 keeps the exact cache.
TEST(E2eVllmFlagsTest, KvCacheDtypeAutoFollowsTheWeights) {
  const std::string dir = MakeTempDir("vllm_flags");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--dtype", "bf16", "--out", dir + "/ck"}, &out, &err), 0)
      << err;
  const std::string ck = dir + "/ck";
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{ck, "--kv-cache-dtype", "auto"}, "bf16"},
           {{ck, "--kv-cache-dtype", "auto", "--dtype", "float32"}, "f32"},
           {{ck, "--kv-cache-dtype", "bfloat16", "--dtype", "float32"}, "bf16"},
           {{ck}, "bf16"},  // moeserve's own --kv-dtype defaults to auto too
           {{ck, "--kv-dtype", "f32"}, "f32"}}) {
    ServerProcess server;
    ASSERT_TRUE(server.Start(args)) << absl::StrJoin(args, " ") << "\n" << server.log();
    auto stub = v1::Moeserve::NewStub(server.channel());
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.kv_capacity().dtype(), want) << absl::StrJoin(args, " ");
  }
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"serve", ck, "--kv-cache-dtype", "fp8"}, "--kv-cache-dtype: 'fp8'"},
           {{"serve", ck, "--kv-cache-dtype", "auto", "--kv-dtype", "f32"}, "disagree"}}) {
    EXPECT_EQ(RunCommand(args, &out, &err), 2) << absl::StrJoin(args, " ") << "\n" << err;
    EXPECT_NE(err.find(says), std::string::npos) << absl::StrJoin(args, " ") << "\n" << err;
  }
  std::filesystem::remove_all(dir);
}

// serve --help in vLLM's groups: every flag in one (none left in "Other" or the default group,
// which holds --help alone).
TEST(E2eVllmFlagsTest, ServeHelpGroupsEveryFlag) {
  std::string out, err;
  ASSERT_EQ(RunCommand({"serve", "--help"}, &out, &err), 0) << err;
  for (const char* group : {"Model:", "Cache (KV blocks and tiers):", "Parallel:", "Scheduler:", "Device and kernels:",
                            "Frontend (OpenAI HTTP API, gRPC):", "Observability and cost:"}) {
    EXPECT_NE(out.find(std::string("\n") + group + "\n"), std::string::npos) << group << "\n" << out;
  }
  EXPECT_EQ(out.find("\nOther:\n"), std::string::npos) << out;
  const size_t options = out.find("\nOptions:\n");
  ASSERT_NE(options, std::string::npos) << out;
  const size_t end = out.find("\n\n", options + 1);
  EXPECT_EQ(out.substr(options, end - options).find("--", out.find("--help", options) + 6), std::string::npos)
      << "the default group holds --help alone:\n" << out.substr(options, end - options);
}

// A KV cache shorter than the model's context: without --max-model-len the server serves what
// it holds and says so (a chat request that leaves max_tokens out then fits); a --max-model-len
// past it is refused at start.
TEST(E2eVllmFlagsTest, AKvCacheShorterThanTheContextBoundsTheModelLength) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--kv-blocks", "8", "--block-size", "16"})) << server.log();
  EXPECT_NE(server.log().find("--max-model-len is 128"), std::string::npos) << server.log();
  httplib::Client http("127.0.0.1", server.http_port());
  http.set_read_timeout(30, 0);
  auto models = http.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(nlohmann::json::parse(models->body)["data"][0]["max_model_len"], 128) << models->body;
  auto chat = http.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true})",
                        "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200) << chat->body;
  std::string out, err;
  EXPECT_EQ(RunCommand({"serve", "--preset", "tiny", "--kv-blocks", "8", "--max-model-len", "512"}, &out, &err), 2);
  EXPECT_NE(err.find("raise --kv-cache-mb"), std::string::npos) << err;
}

}  // namespace
}  // namespace moeserve::testing
