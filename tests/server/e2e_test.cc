// End-to-end tests over real gRPC: the `moeserve serve` binary on an ephemeral loopback port,
// driven by generated C++ stubs, the `moeserve generate` and `moeserve loadgen` binaries, and
// the Python client when python3-grpcio is installed.
#include <arpa/inet.h>
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "tests/server/proto/health.grpc.pb.h"
#include "tests/server/proto/reflection.grpc.pb.h"
#include "tests/server/server_process.h"
#include "core/file_util.h"

namespace moeserve::testing {
namespace {

namespace v1 = moeserve::v1;

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  int messages = 0;
  v1::GenerateResponse last;
};

Streamed Stream(v1::Moeserve::Stub* stub, const v1::GenerateRequest& req, grpc::ClientContext* ctx) {
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

Streamed Stream(v1::Moeserve::Stub* stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return Stream(stub, req, &ctx);
}

v1::GenerateRequest IdsRequest(const std::vector<int32_t>& ids, int max_tokens) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  r.set_max_tokens(max_tokens);
  return r;
}

v1::Stats GetStats(v1::Moeserve::Stub* stub) {
  grpc::ClientContext ctx;
  v1::Stats s;
  EXPECT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &s).ok());
  return s;
}

// Polls GetStats until no request runs or waits and no KV block is in use.
::testing::AssertionResult EventuallyIdle(v1::Moeserve::Stub* stub) {
  v1::Stats s;
  for (int i = 0; i < 200; ++i) {
    s = GetStats(stub);
    if (s.running_requests() == 0 && s.queue_depth() == 0 && s.kv_blocks_used() == 0) {
      if (s.kv_blocks_free() + s.kv_blocks_cached() != s.kv_blocks_total()) {
        return ::testing::AssertionFailure() << "free " << s.kv_blocks_free() << " + cached " << s.kv_blocks_cached()
                                             << " != total " << s.kv_blocks_total();
      }
      return ::testing::AssertionSuccess();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ::testing::AssertionFailure() << "not idle after 2 s: running " << s.running_requests() << ", waiting "
                                       << s.queue_depth() << ", KV blocks used " << s.kv_blocks_used();
}

uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

class E2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--preset", "tiny", "--kv-cache-mb", "64"})) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->log();
    EXPECT_NE(server_->log().find("stopped cleanly"), std::string::npos) << server_->log();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Moeserve::NewStub(server_->channel());
  }

  static ServerProcess* server_;
  std::unique_ptr<v1::Moeserve::Stub> stub_;
};
ServerProcess* E2eTest::server_ = nullptr;

TEST_F(E2eTest, ConcurrentGreedyStreamsEqualGenerateCommand) {
  const uint64_t seed = FreshSeed();
  std::mt19937_64 gen(seed);
  struct Case {
    std::vector<int32_t> prompt;
    int max_tokens;
    std::vector<int32_t> expected;
  };
  std::vector<Case> cases(6);
  for (Case& c : cases) {
    c.prompt = {256};  // BOS
    const int len = std::uniform_int_distribution<int>(1, 60)(gen);
    for (int i = 0; i < len; ++i) c.prompt.push_back(std::uniform_int_distribution<int>(0, 255)(gen));
    c.max_tokens = std::uniform_int_distribution<int>(1, 40)(gen);
    std::string out, err;
    ASSERT_EQ(RunCommand({"generate", "--preset", "tiny", "--prompt-ids", absl::StrJoin(c.prompt, ","), "--max-tokens",
                          std::to_string(c.max_tokens), "--ids"},
                         &out, &err),
              0)
        << err;
    for (absl::string_view t : absl::StrSplit(absl::StripAsciiWhitespace(out), ',', absl::SkipEmpty())) {
      c.expected.push_back(std::stoi(std::string(t)));
    }
    ASSERT_FALSE(c.expected.empty()) << "generate printed no ids: " << out << err;
  }
  // Every case twice, all at once, so the server batches them together.
  std::vector<Streamed> got(cases.size() * 2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      const Case& c = cases[i % cases.size()];
      got[i] = Stream(stub_.get(), IdsRequest(c.prompt, c.max_tokens));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    const Case& c = cases[i % cases.size()];
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, c.expected) << "stream " << i << ", seed " << seed << ", prompt of " << c.prompt.size();
    EXPECT_EQ(got[i].last.usage().completion_tokens(), static_cast<int64_t>(got[i].ids.size()));
    EXPECT_EQ(got[i].last.usage().prompt_tokens(), static_cast<int64_t>(c.prompt.size()));
    EXPECT_FALSE(got[i].last.finish_reason().empty());
  }
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
}

TEST_F(E2eTest, TextPromptStreamsTextLogprobsUsageAndTiming) {
  v1::GenerateRequest req;
  req.set_text("Hello, moeserve");
  req.set_max_tokens(12);
  req.set_logprobs(3);
  req.set_ignore_eos(true);
  Streamed s = Stream(stub_.get(), req);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.ids.size(), 12u);
  EXPECT_EQ(s.last.finish_reason(), "length");
  EXPECT_EQ(s.last.usage().prompt_tokens(), 16);  // BOS + 15 bytes
  EXPECT_EQ(s.last.usage().completion_tokens(), 12);
  const v1::Timing& t = s.last.timing();
  EXPECT_GT(t.time_to_first_token_seconds(), 0.0);
  EXPECT_GE(t.e2e_seconds(), t.time_to_first_token_seconds());
  EXPECT_GE(t.time_to_first_token_seconds(), t.queue_seconds());
  // Alone on the server: the prompt fits one step, then one step per further token.
  const v1::Receipt& rc = s.last.receipt();
  EXPECT_EQ(rc.steps(), 12);
  EXPECT_DOUBLE_EQ(rc.mean_batch_size(), 1.0);
  EXPECT_GT(rc.device_seconds(), 0.0);
  EXPECT_LE(rc.device_seconds(), t.e2e_seconds());
  // Logprobs: per token, top 3 in descending order, the greedy choice first.
  Streamed again;
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      ASSERT_EQ(r.logprobs_size(), r.token_ids_size());
      for (int i = 0; i < r.token_ids_size(); ++i) {
        const auto& top = r.logprobs(i).top_logprobs();
        ASSERT_EQ(top.size(), 3);
        EXPECT_EQ(top[0].token_id(), r.token_ids(i));
        EXPECT_GE(top[0].logprob(), top[1].logprob());
        EXPECT_GE(top[1].logprob(), top[2].logprob());
        EXPECT_LE(top[0].logprob(), 0.0f);
        again.ids.push_back(r.token_ids(i));
      }
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  EXPECT_EQ(again.ids, s.ids);
}

TEST_F(E2eTest, BadInputsNameTheFieldAndTheServerKeepsServing) {
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  }
  const int vocab = info.vocab_size();
  struct Bad {
    std::string name;
    std::function<void(v1::GenerateRequest*)> mutate;
    std::string field;
  };
  const std::vector<Bad> bads = {
      {"no prompt", [](v1::GenerateRequest* r) { r->clear_prompt(); }, "prompt"},
      {"empty text", [](v1::GenerateRequest* r) { r->set_text(""); }, "text"},
      {"empty ids", [](v1::GenerateRequest* r) { r->mutable_token_ids()->clear_ids(); }, "token_ids"},
      {"id past vocab", [&](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(vocab); }, "token_ids"},
      {"negative id", [](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(-1); }, "token_ids"},
      {"prompt longer than context",
       [&](v1::GenerateRequest* r) {
         for (int i = 0; i < info.max_context() + 5; ++i) r->mutable_token_ids()->add_ids(7);
       },
       "token_ids"},
      {"negative max_tokens", [](v1::GenerateRequest* r) { r->set_max_tokens(-3); }, "max_tokens"},
      {"huge max_tokens", [](v1::GenerateRequest* r) { r->set_max_tokens(1 << 30); }, "max_tokens"},
      {"negative temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       "sampling.temperature"},
      {"NaN temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(std::nanf("")); },
       "sampling.temperature"},
      {"top_p zero", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(0.0f); }, "sampling.top_p"},
      {"top_p above one", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p"},
      {"negative top_k", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_k(-1); }, "sampling.top_k"},
      {"logprobs too many", [](v1::GenerateRequest* r) { r->set_logprobs(21); }, "logprobs"},
      {"negative retain_seconds", [](v1::GenerateRequest* r) { r->set_retain_seconds(-1); }, "retain_seconds"},
      {"retain_seconds past the limit", [](v1::GenerateRequest* r) { r->set_retain_seconds(1e9); }, "retain_seconds"},
      {"stop id past vocab", [&](v1::GenerateRequest* r) { r->add_stop_token_ids(vocab + 10); }, "stop_token_ids"},
      {"unknown priority", [](v1::GenerateRequest* r) { r->set_priority(static_cast<v1::Priority>(42)); },
       "priority"},
  };
  const v1::GenerateRequest good = IdsRequest({256, 65, 66}, 5);
  for (const Bad& b : bads) {
    v1::GenerateRequest req = good;
    b.mutate(&req);
    Streamed s = Stream(stub_.get(), req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.name << ": " << s.status.error_message();
    EXPECT_EQ(s.status.error_message().rfind(b.field + ":", 0), 0u)
        << b.name << ": message should start with the field '" << b.field << "': " << s.status.error_message();
    EXPECT_TRUE(s.ids.empty()) << b.name;
    Streamed ok = Stream(stub_.get(), good);
    EXPECT_TRUE(ok.status.ok()) << "after " << b.name << ": " << ok.status.error_message();
    EXPECT_FALSE(ok.ids.empty()) << "after " << b.name;
  }
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
}

// Prompt-cache retention over gRPC: the prompt's full blocks stay retained in GetStats, a
// repeat of the prompt is a cache hit, and usage reports preemptions and swaps (none here).
TEST_F(E2eTest, RetainSecondsKeepsThePromptCached) {
  std::mt19937_64 gen(FreshSeed());
  std::vector<int32_t> prompt = {256};
  for (int i = 0; i < 47; ++i) prompt.push_back(static_cast<int32_t>(gen() % 256));  // three full blocks
  const int64_t before = GetStats(stub_.get()).kv_blocks_retained();
  v1::GenerateRequest req = IdsRequest(prompt, 3);
  req.set_retain_seconds(300);
  Streamed first = Stream(stub_.get(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.last.usage().preemptions(), 0);
  EXPECT_EQ(first.last.usage().swaps(), 0);
  ASSERT_TRUE(EventuallyIdle(stub_.get()));
  EXPECT_GE(GetStats(stub_.get()).kv_blocks_retained(), before + 2);
  Streamed again = Stream(stub_.get(), IdsRequest(prompt, 3));
  ASSERT_TRUE(again.status.ok());
  EXPECT_GE(again.last.usage().cached_prompt_tokens(), 32);
  EXPECT_EQ(again.ids, first.ids);
}

TEST_F(E2eTest, CancellingMidStreamFreesKvBlocks) {
  const v1::Stats before = GetStats(stub_.get());
  grpc::ClientContext ctx;
  v1::GenerateRequest req = IdsRequest({256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 1000);
  req.set_ignore_eos(true);
  auto reader = stub_->Generate(&ctx, req);
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
}

TEST_F(E2eTest, ShortDeadlineGivesDeadlineExceededAndFreesKvBlocks) {
  const v1::Stats before = GetStats(stub_.get());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(30));
  v1::GenerateRequest req = IdsRequest({256, 40, 41, 42}, 1000);
  req.set_ignore_eos(true);
  Streamed s = Stream(stub_.get(), req, &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.status.error_message();
  EXPECT_LT(s.ids.size(), 1000u);
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
  const v1::Stats after = GetStats(stub_.get());
  // If the call reached the engine (under load the deadline can pass before it does), it ended
  // by the deadline itself or by the client's cancellation, whichever came first.
  const auto ended = [](const v1::Stats& st) {
    return st.requests_by_outcome().at("deadline_exceeded") + st.requests_by_outcome().at("cancelled");
  };
  const auto all = [](const v1::Stats& st) {
    int64_t n = 0;
    for (const auto& [outcome, count] : st.requests_by_outcome()) n += count;
    return n;
  };
  EXPECT_LE(all(after) - all(before), 1);
  EXPECT_EQ(ended(after) - ended(before), all(after) - all(before));
}

TEST_F(E2eTest, HealthAndReflectionAnswer) {
  auto health = grpc::health::v1::Health::NewStub(server_->channel());
  {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  namespace refl = grpc::reflection::v1alpha;
  auto reflection = refl::ServerReflection::NewStub(server_->channel());
  grpc::ClientContext ctx;
  auto stream = reflection->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_NE(std::find(names.begin(), names.end(), "moeserve.v1.Moeserve"), names.end()) << absl::StrJoin(names, ",");
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end()) << absl::StrJoin(names, ",");

  refl::ServerReflectionRequest sym;
  sym.set_file_containing_symbol("moeserve.v1.Moeserve");
  ASSERT_TRUE(stream->Write(sym));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_GE(resp.file_descriptor_response().file_descriptor_proto_size(), 1) << resp.DebugString();
  google::protobuf::FileDescriptorProto fd;
  ASSERT_TRUE(fd.ParseFromString(resp.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(fd.package(), "moeserve.v1");
  ASSERT_EQ(fd.service_size(), 1);
  bool generate_streams = false;
  for (const auto& m : fd.service(0).method()) {
    if (m.name() == "Generate") generate_streams = m.server_streaming();
  }
  EXPECT_TRUE(generate_streams);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(E2eTest, LoadgenSweepCountsAddUpAndPlotsRender) {
  const std::string dir = MakeTempDir("loadgen");
  std::string out, err;
  ASSERT_EQ(RunCommand({"loadgen", "--target", server_->target(), "--rate", "300,inf", "--num-requests", "12",
                        "--prompt-len", "4:24", "--output-len", "6", "--shared-prefix", "16", "--slo",
                        "ttft:60000,tpot:60000", "--out", dir + "/open.json", "--csv", dir + "/open.csv",
                        "--no-progress"},
                       &out, &err),
            0)
      << out << err;
  ASSERT_EQ(RunCommand({"loadgen", "--target", server_->target(), "--concurrency", "1,4", "--num-requests", "8",
                        "--prompt-len", "normal:12:4", "--output-len", "2:8", "--out", dir + "/closed.json",
                        "--retain-seconds", "86400", "--no-progress"},
                       &out, &err),
            0)
      << out << err;
  for (const std::string name : {"open", "closed"}) {
    const auto j = nlohmann::json::parse(ReadAll(dir + "/" + name + ".json"));
    ASSERT_EQ(j["levels"].size(), 2u) << name;
    EXPECT_EQ(j["workload"]["retain_seconds"].get<double>(), name == "closed" ? 86400.0 : 0.0);
    for (const auto& lv : j["levels"]) {
      const int64_t sent = lv["sent"], ok = lv["ok"], failed = lv["failed"];
      EXPECT_EQ(sent, name == "open" ? 12 : 8);
      EXPECT_EQ(sent, ok + failed) << lv.dump();
      int64_t by_code = 0;
      for (const auto& [code, n] : lv["failures_by_code"].items()) by_code += n.get<int64_t>();
      EXPECT_EQ(by_code, failed);
      EXPECT_EQ(failed, 0) << lv["first_error_by_code"].dump();
      EXPECT_EQ(lv["ttft_ms"]["count"].get<int64_t>(), ok);
      EXPECT_EQ(lv["e2e_ms"]["count"].get<int64_t>(), ok);
      EXPECT_LE(lv["ttft_ms"]["median"].get<double>(), lv["e2e_ms"]["max"].get<double>());
      EXPECT_GT(lv["server"]["steps"].get<int64_t>(), 0);
      // Each request's first token comes from its prefill step, the rest from decode steps.
      EXPECT_EQ(lv["server"]["decode_tokens"].get<int64_t>(), lv["output_tokens"].get<int64_t>() - ok) << lv.dump();
      if (name == "open") {
        EXPECT_EQ(lv["output_tokens"].get<int64_t>(), ok * 6);
        EXPECT_EQ(lv["good"].get<int64_t>(), ok);  // generous SLOs
      }
    }
  }
  const std::string csv = ReadAll(dir + "/open.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;

  // The plotting script renders PNGs when matplotlib is installed.
  std::string py_out, py_err;
  if (RunProgram({"/usr/bin/python3", "-c", "import matplotlib, grpc"}, &py_out, &py_err) != 0) {
    GTEST_SKIP() << "python3 matplotlib/grpcio not installed: " << py_err;
  }
  ASSERT_EQ(RunProgram({"/usr/bin/python3", MOESERVE_SOURCE_DIR "/clients/python/plot_loadgen.py", dir + "/open.json",
                        dir + "/closed.json", "--out-dir", dir + "/plots"},
                       &py_out, &py_err),
            0)
      << py_out << py_err;
  for (const char* png : {"/plots/latency_vs_throughput.png", "/plots/cost_vs_batch.png"}) {
    EXPECT_EQ(ReadAll(dir + png).substr(0, 4), "\x89PNG") << png;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(E2eTest, PythonClientStreams) {
  std::string out, err;
  if (RunProgram({"/usr/bin/python3", "-c", "import grpc, google.protobuf"}, &out, &err) != 0) {
    GTEST_SKIP() << "python3-grpcio not installed: " << err;
  }
  ASSERT_EQ(RunProgram({"/usr/bin/python3", MOESERVE_SOURCE_DIR "/clients/python/example_stream.py", "--target",
                        server_->target(), "--max-tokens", "8", "--prompt", "abc"},
                       &out, &err),
            0)
      << out << err;
  EXPECT_NE(err.find("finish="), std::string::npos) << err;
  EXPECT_NE(err.find("prompt=4 "), std::string::npos) << err;  // BOS + 3 bytes
}

// The offline tools.

TEST(E2eToolsTest, RooflineCalibrateAndDecodeSweep) {
  const std::string dir = MakeTempDir("tools");
  std::string out, err;
  ASSERT_EQ(RunCommand({"roofline", "--preset", "deepseek-v3-like", "--hardware", "gb200-nvl72", "--json",
                        dir + "/ds.json"},
                       &out, &err),
            0)
      << err;
  const auto ds = nlohmann::json::parse(ReadAll(dir + "/ds.json"));
  EXPECT_DOUBLE_EQ(ds["flops_per_byte"].get<double>(), 312.5);
  EXPECT_NEAR(ds["critical_batch"].get<double>(), 5400, 300);
  EXPECT_DOUBLE_EQ(ds["critical_batch_routed_experts"].get<double>(), 10000);
  EXPECT_NE(out.find("critical batch"), std::string::npos) << out;

  ASSERT_EQ(RunCommand({"calibrate", "--quick", "--no-progress", "--disk-dir", dir, "--out", dir + "/hw.json"}, &out,
                       &err),
            0)
      << err;
  const auto hw = nlohmann::json::parse(ReadAll(dir + "/hw.json"));
  for (const char* key : {"peak_flops_bf16", "peak_flops_f32", "mem_bandwidth", "mem_capacity", "disk_read_bandwidth",
                          "disk_write_bandwidth", "host_link_bandwidth"}) {
    EXPECT_GT(hw[key].get<double>(), 0) << key;
  }
  EXPECT_FALSE(hw["measurements"]["gemm"].empty());

  ASSERT_EQ(RunCommand({"bench", "--preset", "tiny", "--sweep-batch", "1,2,4", "--context", "8,32", "--hardware",
                        dir + "/hw.json", "--sweep-steps", "1", "--out", dir + "/sweep.json"},
                       &out, &err),
            0)
      << out << err;
  const auto sweep = nlohmann::json::parse(ReadAll(dir + "/sweep.json"));
  ASSERT_EQ(sweep["points"].size(), 6u);
  for (const auto& p : sweep["points"]) {
    EXPECT_GT(p["observed_s"].get<double>(), 0);
    EXPECT_GT(p["bound_s"].get<double>(), 0);
    EXPECT_GT(p["calibrated_s"].get<double>(), 0);
    EXPECT_NEAR(p["observed_over_bound"].get<double>(), p["observed_s"].get<double>() / p["bound_s"].get<double>(),
                1e-9);
  }
  EXPECT_GT(sweep["efficiency"]["compute"].get<double>(), 0);
  EXPECT_EQ(sweep["knees"].size(), 2u);
  for (const auto& k : sweep["knees"]) {
    // tiny: 4 experts, top-2. Expected distinct experts of B tokens: E (1 - (1 - k/E)^B).
    const double b = k["predicted_critical_batch"].get<double>();
    EXPECT_EQ(b, std::floor(b)) << "the critical batch is the smallest compute-bound batch";
    EXPECT_GE(b, 1) << "tiny is compute-bound at some batch on any CPU";
    EXPECT_DOUBLE_EQ(k["experts_hit_batch1"].get<double>(), 2.0);
    EXPECT_NEAR(k["experts_hit_at_critical_batch"].get<double>(), 4.0 * (1.0 - std::pow(0.5, b)), 1e-9) << b;
  }
  // The long-prompt scenario over the KV tiers (short prompt: the tiny model).
  ASSERT_EQ(RunCommand({"bench", "--preset", "tiny", "--tier-scenario", "--tier-prompt", "128", "--flash-kv-dir",
                        dir + "/flash", "--out", dir + "/tiers.json"},
                       &out, &err),
            0)
      << out << err;
  const auto tiers = nlohmann::json::parse(ReadAll(dir + "/tiers.json"));
  EXPECT_EQ(tiers["cold"]["cached_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(tiers["device_hit"]["cached_tokens"].get<int64_t>(), 128 - 16) << "all full blocks but the last token's";
  EXPECT_EQ(tiers["ddr_hit"]["cached_tokens_ddr"].get<int64_t>(), 112);
  EXPECT_EQ(tiers["flash_hit"]["cached_tokens_flash"].get<int64_t>(), 112);
  EXPECT_GT(tiers["measured"]["promote_from_flash_bytes_per_s"].get<double>(), 0);
  // A bad profile is refused with the key named.
  ASSERT_TRUE(WriteFileAtomically(dir + "/bad.json", R"({"peak_flops_bf16": 1})").ok());
  EXPECT_NE(RunCommand({"roofline", "--hardware", dir + "/bad.json"}, &out, &err), 0);
  EXPECT_NE(err.find("mem_bandwidth"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// --load-format dummy generates the weights a checkpoint would hold from its config.json alone:
// with make-model's seed it must produce exactly the checkpoint's tokens (read from safetensors).
TEST(E2eToolsTest, DummyWeightsFromAConfigEqualTheCheckpointOfTheSameSeed) {
  const std::string dir = MakeTempDir("dummy");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--dtype", "f32", "--seed", "3", "--out", dir + "/ck"},
                       &out, &err),
            0)
      << err;
  auto generate = [&](std::vector<std::string> model_args) {
    std::vector<std::string> args = {"generate", "--prompt-ids", "5,9,200,31,7", "--max-tokens", "12", "--ids"};
    args.insert(args.end(), model_args.begin(), model_args.end());
    std::string o, e;
    EXPECT_EQ(RunCommand(args, &o, &e), 0) << e;
    return o;
  };
  const std::string from_checkpoint = generate({"--model", dir + "/ck"});
  const std::vector<std::string> ids =
      absl::StrSplit(absl::StripAsciiWhitespace(from_checkpoint), ',', absl::SkipEmpty());
  ASSERT_GE(ids.size(), 4u) << "too few tokens to tell weights apart: " << from_checkpoint;
  EXPECT_EQ(generate({"--model", dir + "/ck/config.json", "--load-format", "dummy", "--model-seed", "3"}),
            from_checkpoint);
  EXPECT_NE(generate({"--model", dir + "/ck", "--load-format", "dummy", "--model-seed", "4"}), from_checkpoint)
      << "another seed, other weights";
  EXPECT_EQ(RunCommand({"generate", "--model", dir + "/ck", "--load-format", "lazy", "--prompt-ids", "5"}, &out, &err),
            2);
  EXPECT_NE(err.find("--load-format"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"bench", "--load-format", "dummy", "--num-requests", "1"}, &out, &err), 2);
  EXPECT_NE(err.find("--model"), std::string::npos) << err;
  // A config.json without dummy weights, and dummy weights from a file that is not there.
  EXPECT_EQ(RunCommand({"generate", "--model", dir + "/ck/config.json", "--prompt-ids", "5"}, &out, &err), 2);
  EXPECT_NE(err.find("--load-format dummy"), std::string::npos) << err;
  EXPECT_EQ(RunCommand({"generate", "--model", dir + "/missing.json", "--load-format", "dummy", "--prompt-ids", "5"},
                       &out, &err),
            2);
  EXPECT_NE(err.find("--model: "), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// Servers with their own flags.

// A server on dummy weights from a config.json serves what `generate` computes from the
// checkpoint make-model wrote with the same seed, and says in GetModelInfo that they are dummy.
TEST(E2eServerFlagsTest, DummyWeightsServerMatchesTheCheckpoint) {
  const std::string dir = MakeTempDir("dummy_serve");
  std::string out, err;
  ASSERT_EQ(RunCommand({"make-model", "--preset", "tiny", "--dtype", "f32", "--seed", "5", "--out", dir + "/ck"},
                       &out, &err),
            0)
      << err;
  const std::vector<int32_t> prompt = {256, 7, 99, 13, 42};
  ASSERT_EQ(RunCommand({"generate", "--model", dir + "/ck", "--prompt-ids", absl::StrJoin(prompt, ","),
                        "--max-tokens", "10", "--ids"},
                       &out, &err),
            0)
      << err;
  std::vector<int32_t> expected;
  for (absl::string_view t : absl::StrSplit(absl::StripAsciiWhitespace(out), ',', absl::SkipEmpty())) {
    expected.push_back(std::stoi(std::string(t)));
  }
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--model", dir + "/ck/config.json", "--load-format", "dummy", "--model-seed", "5"}))
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_NE(info.model().find("dummy weights, seed 5"), std::string::npos) << info.model();
  const Streamed got = Stream(stub.get(), IdsRequest(prompt, 10));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, expected);
  std::filesystem::remove_all(dir);
}

TEST(E2eServerFlagsTest, ExpertParallelPipelineServerMatchesOneRank) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--ep", "2", "--pp", "2", "--expert-placement", "round-robin"}))
      << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_NE(info.parallel_layout().find("ep2 pp2"), std::string::npos) << info.parallel_layout();
  EXPECT_NE(info.parallel_layout().find("rank 3: stage 1 layers [1, 2) ep 1 experts 1,3"), std::string::npos)
      << info.parallel_layout();
  std::mt19937_64 gen(FreshSeed());
  std::vector<int32_t> prompt = {256};
  for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(gen() % 256));
  std::string out, err;
  ASSERT_EQ(RunCommand({"generate", "--preset", "tiny", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens",
                        "12", "--ids"},
                       &out, &err),
            0)
      << err;
  std::vector<int32_t> expected;
  for (absl::string_view t : absl::StrSplit(absl::StripAsciiWhitespace(out), ',', absl::SkipEmpty())) {
    expected.push_back(std::stoi(std::string(t)));
  }
  std::vector<Streamed> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = Stream(stub.get(), IdsRequest(prompt, 12)); });
  for (auto& t : threads) t.join();
  for (const Streamed& g : got) {
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, expected);
  }
  EXPECT_TRUE(EventuallyIdle(stub.get()));
  // The steps carry the communication they did and the experts' loads.
  const v1::Stats stats = GetStats(stub.get());
  int64_t comm = 0, rows = 0;
  for (const auto& st : stats.recent_steps()) {
    comm += st.comm_bytes();
    for (int64_t t : st.expert_tokens()) rows += t;
  }
  EXPECT_GT(comm, 0);
  EXPECT_GT(rows, 0);
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  // A layout the model cannot take is refused at start with the limit named.
  EXPECT_NE(RunCommand({"bench", "--preset", "tiny", "--ep", "9", "--num-requests", "1"}, &out, &err), 0);
  EXPECT_NE(err.find("--ep must be in [1, 4]"), std::string::npos) << err;
}

// GET `path` from 127.0.0.1:`port` over plain HTTP/1.0; the whole response, headers included.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return response;
}

// The Prometheus endpoint: counters, gauges and latency histograms after three requests, in the
// text format; a bad address is refused naming the flag.
TEST(E2eServerFlagsTest, PrometheusMetricsCountWhatWasServed) {
  const std::string dir = MakeTempDir("metrics");
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                            dir + "/port"}))
      << server.log();
  // Written right after the gRPC port file, once the signal handlers are in place.
  std::string port_text;
  for (int i = 0; i < 250 && (port_text = ReadAll(dir + "/port")).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(port_text.empty()) << server.log();
  const int port = std::stoi(port_text);
  auto stub = v1::Moeserve::NewStub(server.channel());
  for (int i = 0; i < 3; ++i) {
    const Streamed s = Stream(stub.get(), IdsRequest({256, 10 + i, 20, 30}, 5));
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  }
  ASSERT_TRUE(EventuallyIdle(stub.get()));
  const std::string text = HttpGet(port, "/metrics");
  ASSERT_NE(text.find("200 OK"), std::string::npos) << text.substr(0, 200);
  // Whole lines, so that "... 3" cannot match "... 30".
  std::string lines = "\n";
  lines += text.substr(text.find("\r\n\r\n") + 4);
  for (const char* want : {"# TYPE moeserve_time_to_first_token_seconds histogram",
                           "# TYPE moeserve_generation_tokens_total counter",
                           "moeserve_request_success_total{reason=\"length\"} 3",
                           "moeserve_generation_tokens_total 15", "moeserve_prompt_tokens_total 12",
                           "moeserve_time_to_first_token_seconds_count 3",
                           "moeserve_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 3",
                           "moeserve_time_per_output_token_seconds_count 3", "moeserve_kv_blocks_used 0",
                           "moeserve_num_requests_running 0"}) {
    const std::string line = absl::StrCat("\n", want, "\n");
    EXPECT_NE(lines.find(line), std::string::npos) << "missing: " << want << "\n" << text;
  }
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  std::filesystem::remove_all(dir);
  std::string out, err;
  EXPECT_NE(RunCommand({"serve", "--preset", "tiny", "--listen", "127.0.0.1:0", "--metrics-listen", "256.1.1.1:1"}, &out,
                       &err),
            0);
  EXPECT_NE(err.find("--metrics-listen"), std::string::npos) << err;
  EXPECT_EQ(err.find("loading"), std::string::npos) << "refused before the model loads: " << err;
  EXPECT_EQ(HttpGet(port, "/metrics").find("200 OK"), std::string::npos) << "the endpoint outlived its server";
}

TEST(E2eServerFlagsTest, FullQueueGivesResourceExhausted) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--max-num-seqs", "1", "--max-waiting", "2"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  std::vector<Streamed> got(10);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = IdsRequest({256, static_cast<int32_t>(i), 3}, 1000);
      req.set_ignore_eos(true);
      got[i] = Stream(stub.get(), req);
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, exhausted = 0;
  for (const Streamed& s : got) {
    if (s.status.ok()) {
      ++ok;
      EXPECT_GT(s.ids.size(), 0u);
    } else {
      EXPECT_EQ(s.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.status.error_message();
      EXPECT_NE(s.status.error_message().find("queue"), std::string::npos) << s.status.error_message();
      ++exhausted;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(exhausted, 1) << "10 long requests against 1 running slot and 2 waiting places";
  EXPECT_TRUE(Stream(stub.get(), IdsRequest({256, 9}, 4)).status.ok());
  EXPECT_TRUE(EventuallyIdle(stub.get()));
  EXPECT_EQ(server.Stop(SIGINT), 0) << server.log();
}

TEST(E2eServerFlagsTest, ApiKeyIsEnforced) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--api-key", "s3cret"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  const v1::GenerateRequest req = IdsRequest({256, 1, 2}, 3);
  for (const std::string header : {"", "Bearer wrong", "s3cret", "Bearer s3cret"}) {
    grpc::ClientContext ctx;
    if (!header.empty()) ctx.AddMetadata("authorization", header);
    Streamed s = Stream(stub.get(), req, &ctx);
    if (header == "Bearer s3cret") {
      EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    } else {
      EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "header '" << header << "'";
      EXPECT_TRUE(s.ids.empty());
    }
  }
  grpc::ClientContext ctx;
  v1::Stats stats;
  EXPECT_EQ(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Health stays open for probes.
  auto health = grpc::health::v1::Health::NewStub(server.channel());
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckResponse hresp;
  EXPECT_TRUE(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp).ok());
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
}

TEST(E2eServerFlagsTest, TlsServesOnlyTlsClients) {
  const std::string dir = MakeTempDir("tls");
  std::string out, err;
  // A self-signed certificate for the loopback address.
  ASSERT_EQ(RunProgram({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout",
                        dir + "/key.pem", "-out", dir + "/cert.pem"},
                       &out, &err),
            0)
      << err;
  // Start by hand: the helper's readiness check connects without TLS.
  const std::string port_file = dir + "/port";
  const pid_t pid = Spawn({"serve", "--preset", "tiny", "--listen", "127.0.0.1:0", "--port-file", port_file,
                           "--tls-cert", dir + "/cert.pem", "--tls-key", dir + "/key.pem"},
                          dir + "/out", dir + "/err");
  ASSERT_GT(pid, 0);
  std::string port;
  for (int i = 0; i < 3000 && (port.empty() || port.back() != '\n'); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    port = ReadAll(port_file);
  }
  ASSERT_FALSE(port.empty()) << ReadAll(dir + "/err");
  const std::string target = "127.0.0.1:" + std::to_string(std::stoi(port));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(dir + "/cert.pem");
  auto tls = v1::Moeserve::NewStub(grpc::CreateChannel(target, grpc::SslCredentials(ssl)));
  Streamed s = Stream(tls.get(), IdsRequest({256, 1, 2}, 3));
  EXPECT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.ids.size(), 3u);
  auto plain = v1::Moeserve::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  Streamed p = Stream(plain.get(), IdsRequest({256, 1, 2}, 3), &ctx);
  EXPECT_FALSE(p.status.ok()) << "a plaintext client must not be served";
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadAll(dir + "/err");
  std::filesystem::remove_all(dir);
}

TEST(E2eServerFlagsTest, SigtermLetsRunningRequestsFinish) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--preset", "tiny", "--grace-seconds", "30"})) << server.log();
  auto stub = v1::Moeserve::NewStub(server.channel());
  constexpr int kStreams = 4, kTokens = 300;
  std::vector<Streamed> got(kStreams);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      v1::GenerateRequest req = IdsRequest({256, i, i + 1}, kTokens);
      req.set_ignore_eos(true);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse r;
      bool counted = false;
      while (reader->Read(&r)) {
        got[i].ids.insert(got[i].ids.end(), r.token_ids().begin(), r.token_ids().end());
        if (!counted) {
          counted = true;
          ++started;
        }
      }
      got[i].status = reader->Finish();
    });
  }
  while (started.load() < kStreams) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int rc = server.Stop(SIGTERM);
  for (auto& t : threads) t.join();
  EXPECT_EQ(rc, 0) << server.log();
  for (const Streamed& s : got) {
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.ids.size(), static_cast<size_t>(kTokens));
  }
}

}  // namespace
}  // namespace moeserve::testing
