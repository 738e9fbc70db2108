// End-to-end tests of servers started with flags of their own: dummy weights, expert and
// pipeline parallelism, Prometheus metrics, a full queue, an API key, TLS and a graceful drain.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_join.h"
#include "tests/server/grpc_client.h"
#include "tests/server/proto/health.grpc.pb.h"

namespace moeserve::testing {
namespace {

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
  const GeneratedIds want =
      GenerateIds({"--model", dir + "/ck", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens", "10"});
  ASSERT_EQ(want.rc, 0) << want.err;
  const std::vector<int32_t>& expected = want.ids;
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
  const GeneratedIds want =
      GenerateIds({"--preset", "tiny", "--prompt-ids", absl::StrJoin(prompt, ","), "--max-tokens", "12"});
  ASSERT_EQ(want.rc, 0) << want.err;
  const std::vector<int32_t>& expected = want.ids;
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
  std::string out, err;
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
  const pid_t pid = Spawn({"serve", "--preset", "tiny", "--listen", "127.0.0.1:0", "--port-file", port_file, "--http-listen", "127.0.0.1:0",
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
