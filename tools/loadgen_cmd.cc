// `moeserve loadgen`: drives a running server over gRPC with open-loop (Poisson or gamma
// arrivals) or closed-loop (fixed concurrency) load, sweeping over a list of levels, and
// reports vLLM-style serving metrics, goodput, the server's own view of each level, and cost.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/status.h"
#include "engine/workload.h"
#include "tools/commands.h"
#include "tools/loadgen/report.h"

namespace moeserve::tools {
namespace {

namespace v1 = moeserve::v1;
using loadgen::LevelSpec;

struct LoadgenOptions {
  std::string target = "127.0.0.1:50051";
  std::string api_key;
  std::string tls_ca;
  double timeout = 0;
  std::string rates;
  std::string concurrency;
  int64_t num_requests = 64;
  double burstiness = 1.0;
  std::string prompt_len = "128";
  std::string output_len = "64";
  int64_t shared_prefix = 0;
  double retain_seconds = 0;
  std::string priority = "normal";
  uint64_t seed = 0;
  std::string slo;
  double price_per_hour = 2.0;
  std::string out;
  std::string csv;
  bool no_progress = false;
  double connect_timeout = 10;
};

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

// "1,2,4,inf" -> levels; rates must be > 0, concurrencies >= 1.
absl::StatusOr<std::vector<LevelSpec>> ParseLevels(const LoadgenOptions& o) {
  if (!o.rates.empty() && !o.concurrency.empty()) {
    return absl::InvalidArgumentError("give either --rate (open loop) or --concurrency (closed loop), not both");
  }
  std::vector<LevelSpec> levels;
  const bool closed = !o.concurrency.empty();
  const std::string list = closed ? o.concurrency : (o.rates.empty() ? "inf" : o.rates);
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    LevelSpec l;
    l.closed_loop = closed;
    if (closed) {
      if (!absl::SimpleAtoi(part, &l.concurrency) || l.concurrency < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--concurrency: '", part, "' is not an integer >= 1"));
      }
    } else if (part == "inf") {
      l.rate = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(part, &l.rate) || !(l.rate > 0) || std::isinf(l.rate)) {
      return absl::InvalidArgumentError(absl::StrCat("--rate: '", part, "' is not a positive number or 'inf'"));
    }
    levels.push_back(l);
  }
  if (levels.empty()) return absl::InvalidArgumentError("--rate/--concurrency: the list is empty");
  return levels;
}

absl::StatusOr<v1::Priority> ParsePriority(const std::string& s) {
  if (s == "normal") return v1::PRIORITY_NORMAL;
  if (s == "fast") return v1::PRIORITY_FAST;
  if (s == "high") return v1::PRIORITY_HIGH;
  if (s == "low") return v1::PRIORITY_LOW;
  return absl::InvalidArgumentError(absl::StrCat("--priority: '", s, "' is not normal, fast, high or low"));
}

void PrintRow(const loadgen::LevelReport& r) {
  const auto& m = r.metrics;
  std::printf("%-16s %6lld %6lld %6lld %8.2f %9.1f %8.2f %9.1f %9.1f %8.2f %8.2f %9.1f %7.2f %9.3f\n",
              r.level.Label().c_str(), static_cast<long long>(m.sent), static_cast<long long>(m.ok),
              static_cast<long long>(m.failed), m.request_throughput, m.output_throughput, m.goodput,
              m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median, m.itl_ms.p99, m.e2e_ms.median,
              r.server ? r.server->MeanBatchSize() : 0.0,
              loadgen::UsdPerMillion(r.price_per_hour, m.duration_seconds, m.output_tokens));
  for (const auto& [code, n] : m.failures_by_code) {
    std::printf("    %lld x %s: %s\n", static_cast<long long>(n), code.c_str(), m.first_error.at(code).c_str());
  }
}

// The server's gRPC stub, and the metadata of its unary calls (the API key, a 30 s deadline).
struct Client {
  std::unique_ptr<v1::Moeserve::Stub> stub;
  std::string api_key;
  void Prepare(grpc::ClientContext* ctx) const {
    if (!api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + api_key);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  grpc::Status GetStats(v1::Stats* out) const {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return stub->GetStats(&ctx, v1::GetStatsRequest(), out);
  }
};

// Connects to --target (TLS with --tls-ca), within --connect-timeout.
absl::StatusOr<Client> Connect(const LoadgenOptions& o) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!o.tls_ca.empty()) {
    ASSIGN_OR_RETURN(const std::string pem, ReadFileToString(o.tls_ca));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(o.target, creds, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout * 1e3)))) {
    return absl::UnavailableError(absl::StrCat("--target: cannot connect to ", o.target, " within ",
                                               o.connect_timeout, " s (is `moeserve serve` running?)"));
  }
  return Client{v1::Moeserve::NewStub(channel), o.api_key};
}

// The numeric flags, checked.
absl::Status CheckLoadgenFlags(const LoadgenOptions& o) {
  if (o.num_requests < 1) return absl::InvalidArgumentError("--num-requests must be >= 1");
  if (!(o.burstiness > 0)) return absl::InvalidArgumentError("--burstiness must be > 0");
  if (o.shared_prefix < 0) return absl::InvalidArgumentError("--shared-prefix must be >= 0");
  if (!(o.retain_seconds >= 0)) return absl::InvalidArgumentError("--retain-seconds must be >= 0");
  if (o.timeout < 0) return absl::InvalidArgumentError("--timeout must be >= 0");
  if (o.price_per_hour < 0) return absl::InvalidArgumentError("--price-per-hour must be >= 0");
  return absl::OkStatus();
}

// One level of load: its requests (fresh prompts, so one level's cache does not serve the next),
// the client's metrics, and the server's statistics over the level.
loadgen::LevelReport RunOneLevel(const LoadgenOptions& o, const Client& client, const v1::ModelInfo& info,
                                 WorkloadSpec w, size_t li, size_t levels, const LevelSpec& level,
                                 v1::Priority priority, const loadgen::Slo& slo) {
  w.rate = level.closed_loop || std::isinf(level.rate) ? 0.0 : level.rate;
  w.vocab = std::min<int32_t>(info.vocab_size(), 256);
  w.seed = o.seed + li;
  const auto items = MakeWorkload(w);
  loadgen::LevelReport rep;
  rep.level = level;
  rep.price_per_hour = o.price_per_hour;
  v1::Stats before;
  const grpc::Status sb = client.GetStats(&before);
  loadgen::RunOptions ro;
  ro.call.api_key = o.api_key;
  ro.call.timeout_seconds = o.timeout;
  ro.priority = priority;
  ro.retain_seconds = o.retain_seconds;
  ro.progress = !o.no_progress;
  ro.progress_label = absl::StrCat("level ", li + 1, "/", levels, " ", level.Label());
  const loadgen::LevelRun run = loadgen::RunLevel(client.stub.get(), level, items, ro);
  rep.metrics = loadgen::ComputeMetrics(run.results, run.duration_seconds, slo);
  // The last response can reach us before the server has booked the step that made it:
  // wait (briefly) for the server to go idle so the level's deltas are complete.
  v1::Stats after;
  grpc::Status sa = client.GetStats(&after);
  for (int i = 0; i < 200 && sa.ok() && (after.running_requests() > 0 || after.queue_depth() > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    sa = client.GetStats(&after);
  }
  if (sb.ok() && sa.ok()) {
    rep.server = loadgen::Difference(before, after);
    rep.stats = after;
  } else {
    rep.stats_error = (sb.ok() ? sa : sb).error_message();
  }
  return rep;
}

int RunLoadgen(const LoadgenOptions& o) {
  auto levels = ParseLevels(o);
  if (!levels.ok()) return Fail(levels.status());
  auto priority = ParsePriority(o.priority);
  if (!priority.ok()) return Fail(priority.status());
  auto slo = loadgen::Slo::Parse(o.slo);
  if (!slo.ok()) return Fail(slo.status());
  WorkloadSpec w;
  w.num_requests = o.num_requests;
  w.shared_prefix_len = o.shared_prefix;
  w.burstiness = o.burstiness;
  auto pl = LengthDist::Parse("--prompt-len", o.prompt_len);
  if (!pl.ok()) return Fail(pl.status());
  auto ol = LengthDist::Parse("--output-len", o.output_len);
  if (!ol.ok()) return Fail(ol.status());
  w.prompt_len = *pl;
  w.output_len = *ol;
  if (absl::Status s = CheckLoadgenFlags(o); !s.ok()) return Fail(s);
  auto client = Connect(o);
  if (!client.ok()) return Fail(client.status());
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    client->Prepare(&ctx);
    grpc::Status s = client->stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) return Fail(FromGrpc(s, "GetModelInfo"));
  }
  const int64_t longest = o.shared_prefix + pl->Max() + ol->Max();
  if (longest > info.max_context()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--shared-prefix + --prompt-len + --output-len can reach ", longest, " tokens; the model's context is ",
        info.max_context())));
  }
  std::fprintf(stderr, "loadgen: %s serves %s (%s, %.1fM params, %.1fM active)\n", o.target.c_str(),
               info.model().c_str(), info.backend().c_str(), info.total_params() / 1e6, info.active_params() / 1e6);
  nlohmann::json report;
  report["target"] = o.target;
  report["model_info"] = loadgen::ProtoToJson(info);
  report["workload"] = {{"num_requests", o.num_requests}, {"prompt_len", pl->ToString()},
                        {"output_len", ol->ToString()}, {"shared_prefix", o.shared_prefix},
                        {"retain_seconds", o.retain_seconds},
                        {"burstiness", o.burstiness}, {"priority", o.priority}, {"seed", o.seed}};
  report["slo"] = slo->ToString();
  report["price_per_hour"] = o.price_per_hour;
  report["levels"] = nlohmann::json::array();
  std::string csv = loadgen::CsvHeader() + "\n";
  std::printf("%-16s %6s %6s %6s %8s %9s %8s %9s %9s %8s %8s %9s %7s %9s\n", "level", "sent", "ok", "failed",
              "req/s", "out tok/s", "goodput", "ttft p50", "ttft p99", "tpot p50", "itl p99", "e2e p50",
              "batch", "$/Mtok");
  for (size_t li = 0; li < levels->size(); ++li) {
    const loadgen::LevelReport rep = RunOneLevel(o, *client, info, w, li, levels->size(), (*levels)[li], *priority, *slo);
    PrintRow(rep);
    std::fflush(stdout);
    report["levels"].push_back(loadgen::ToJson(rep));
    csv += loadgen::CsvRow(rep) + "\n";
  }
  if (!o.out.empty()) {
    if (absl::Status s = WriteFileAtomically(o.out, report.dump(2) + "\n"); !s.ok()) return Fail(s);
    std::fprintf(stderr, "loadgen: wrote %s\n", o.out.c_str());
  }
  if (!o.csv.empty()) {
    if (absl::Status s = WriteFileAtomically(o.csv, csv); !s.ok()) return Fail(s);
    std::fprintf(stderr, "loadgen: wrote %s\n", o.csv.c_str());
  }
  return 0;
}

}  // namespace

void AddLoadgenCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<LoadgenOptions>();
  CLI::App* cmd = app.add_subcommand(
      "loadgen", "Load a running server over gRPC and report TTFT, TPOT, ITL, E2E, throughput, goodput and cost");
  cmd->add_option("--target", o->target, "Server address HOST:PORT")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Sent as \"authorization: Bearer KEY\"");
  cmd->add_option("--tls-ca", o->tls_ca, "PEM root certificate; connects with TLS when given");
  cmd->add_option("--timeout", o->timeout, "Per-request deadline in seconds (0: none)")->capture_default_str();
  cmd->add_option("--rate", o->rates,
                  "Open loop: comma-separated request rates per second to sweep, 'inf' sends all at once "
                  "(default: inf)");
  cmd->add_option("--concurrency", o->concurrency,
                  "Closed loop: comma-separated numbers of requests kept in flight to sweep");
  cmd->add_option("--num-requests", o->num_requests, "Requests per level")->capture_default_str();
  cmd->add_option("--burstiness", o->burstiness,
                  "Gamma shape of open-loop inter-arrival times: 1 is Poisson, below 1 burstier, above 1 steadier")
      ->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt tokens: N, MIN:MAX (uniform) or normal:MEAN:STD")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len,
                  "Output tokens (generated exactly, EOS ignored): N, MIN:MAX or normal:MEAN:STD")
      ->capture_default_str();
  cmd->add_option("--retain-seconds", o->retain_seconds,
                  "Ask the server to keep every prompt's KV cached this long (prompt-cache retention; 0: none)")
      ->capture_default_str();
  cmd->add_option("--shared-prefix", o->shared_prefix, "Tokens every prompt starts with (prefix-cache workload)")
      ->capture_default_str();
  cmd->add_option("--priority", o->priority, "Priority of every request: normal, fast, high or low")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Workload seed (level i uses seed + i)")->capture_default_str();
  cmd->add_option("--slo", o->slo, "Goodput objectives in ms, e.g. ttft:500,tpot:50,e2e:10000");
  cmd->add_option("--price-per-hour", o->price_per_hour,
                  "Price of the serving machine in $/hour, for cost per million output tokens")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Write the full report as JSON to this file");
  cmd->add_option("--csv", o->csv, "Write one CSV row per level to this file");
  cmd->add_flag("--no-progress", o->no_progress, "Do not draw the progress line on stderr");
  cmd->add_option("--connect-timeout", o->connect_timeout, "Seconds to wait for the server to accept")
      ->capture_default_str();
  cmd->callback([o, exit_code] { *exit_code = RunLoadgen(*o); });
}

}  // namespace moeserve::tools
