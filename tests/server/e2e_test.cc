// End-to-end tests over real gRPC against one shared server: the `moeserve serve` binary on an
// ephemeral loopback port, driven by generated C++ stubs, the `moeserve generate` and
// `moeserve loadgen` binaries, and the Python client when python3-grpcio is installed. Servers
// started with flags of their own are in server_flags_test.cc, the offline tools in tools_test.cc,
// requests that outlive a test's action (cancelling, deadlines) in e2e_long_request_test.cc.
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "tests/server/grpc_client.h"
#include "tests/server/proto/health.grpc.pb.h"
#include "tests/server/proto/reflection.grpc.pb.h"

namespace moeserve::testing {
namespace {

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
    const GeneratedIds g = GenerateIds(
        {"--preset", "tiny", "--prompt-ids", absl::StrJoin(c.prompt, ","), "--max-tokens", std::to_string(c.max_tokens)});
    ASSERT_EQ(g.rc, 0) << g.err;
    c.expected = g.ids;
    ASSERT_FALSE(c.expected.empty()) << "generate printed no ids: " << g.err;
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

// Stop strings on gRPC, as on HTTP (one request stream serves both): the text is cut before
// the first occurrence (kept with include_stop_str_in_output), finish_reason "stop", the stop
// string named, the tokens a prefix of the uncut answer and the usage counting them. The oracle
// is the uncut greedy text.
TEST_F(E2eTest, StopStringsCutTheText) {
  v1::GenerateRequest req;
  req.set_text("Stop strings, over gRPC");
  req.set_max_tokens(40);
  req.set_ignore_eos(true);
  const Streamed whole = Stream(stub_.get(), req);
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  const std::string& answer = whole.text;
  ASSERT_GE(answer.size(), 8u);
  // Two whole characters from the middle (the tiny model's bytes are full of U+FFFD).
  size_t from = answer.size() / 2;
  while (from > 0 && (static_cast<unsigned char>(answer[from]) & 0xC0) == 0x80) --from;
  size_t to = from;
  for (int chars = 0; chars < 2 && to < answer.size(); ++chars) {
    ++to;
    while (to < answer.size() && (static_cast<unsigned char>(answer[to]) & 0xC0) == 0x80) ++to;
  }
  const std::string stop = answer.substr(from, to - from);
  const std::string before = answer.substr(0, answer.find(stop));
  for (const bool include : {false, true}) {
    v1::GenerateRequest cut = req;
    cut.add_stop(stop);
    cut.add_stop("a stop string the answer never has \x01\x02");
    cut.set_include_stop_str_in_output(include);
    const Streamed s = Stream(stub_.get(), cut);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.text, include ? before + stop : before) << "stop \"" << stop << "\", include " << include;
    EXPECT_EQ(s.last.finish_reason(), "stop");
    EXPECT_EQ(s.last.stop_string(), stop);
    ASSERT_LE(s.ids.size(), whole.ids.size());
    EXPECT_TRUE(std::equal(s.ids.begin(), s.ids.end(), whole.ids.begin())) << "the tokens are not the answer's";
    EXPECT_LT(s.ids.size(), whole.ids.size()) << "the tokens after the stop string were sent";
    EXPECT_EQ(s.last.usage().completion_tokens(), static_cast<int64_t>(s.ids.size()));
  }
  // A stop string that never comes changes nothing.
  v1::GenerateRequest never = req;
  never.add_stop("\x01\x02\x03 never");
  const Streamed same = Stream(stub_.get(), never);
  ASSERT_TRUE(same.status.ok()) << same.status.error_message();
  EXPECT_EQ(same.text, answer);
  EXPECT_EQ(same.ids, whole.ids);
  EXPECT_EQ(same.last.finish_reason(), "length");
  EXPECT_EQ(same.last.stop_string(), "");
  // Refused by name: an empty one, too many, too long.
  for (int bad = 0; bad < 3; ++bad) {
    v1::GenerateRequest b = req;
    if (bad == 0) b.add_stop("");
    if (bad == 1) for (int i = 0; i < 65; ++i) b.add_stop("x" + std::to_string(i));
    if (bad == 2) b.add_stop(std::string(1025, 'x'));
    const Streamed r = Stream(stub_.get(), b);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_EQ(r.status.error_message().rfind("stop: ", 0), 0u) << r.status.error_message();
  }
  EXPECT_TRUE(EventuallyIdle(stub_.get()));
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
      {"presence_penalty 3", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_presence_penalty(3); },
       "sampling.presence_penalty"},
      {"repetition_penalty 0", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(0); },
       "sampling.repetition_penalty"},
      {"logit_bias outside the vocabulary",
       [](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[1 << 20] = 1; },
       "sampling.logit_bias"},
      {"min_tokens above max_tokens", [](v1::GenerateRequest* r) { r->set_max_tokens(4); r->set_min_tokens(5); },
       "min_tokens"},
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
      // The requests' receipts add up to the server's busy time over the level, in parts.
      const auto& rc = lv["receipts"];
      EXPECT_NEAR(rc["over_busy_seconds"].get<double>(), 1.0, 0.02) << rc.dump() << lv["server"].dump();
      EXPECT_NEAR(rc["prefill_device_seconds"].get<double>() + rc["decode_device_seconds"].get<double>() +
                      rc["transfer_device_seconds"].get<double>(),
                  rc["device_seconds"].get<double>(), 1e-9 * rc["device_seconds"].get<double>());
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

}  // namespace
}  // namespace moeserve::testing
