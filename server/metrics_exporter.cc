// Prometheus exporter.
#include "server/metrics_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = "moeserve_" + std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

ClientMetric Value(MetricType type, double v, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  return m;
}

void Add(std::vector<MetricFamily>* out, std::string name, std::string help, MetricType type, double v) {
  MetricFamily f = Family(std::move(name), std::move(help), type);
  f.metric.push_back(Value(type, v));
  out->push_back(std::move(f));
}

void AddHistogram(std::vector<MetricFamily>* out, std::string name, std::string help, const Histogram& h) {
  MetricFamily f = Family(std::move(name), std::move(help), MetricType::Histogram);
  ClientMetric m;
  m.histogram.sample_count = static_cast<uint64_t>(h.count);
  m.histogram.sample_sum = h.sum;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += static_cast<uint64_t>(h.counts[i]);
    const double le = i < h.bounds.size() ? h.bounds[i] : std::numeric_limits<double>::infinity();
    m.histogram.bucket.push_back({cumulative, le});
  }
  f.metric.push_back(std::move(m));
  out->push_back(std::move(f));
}

// Parses host:port (an IPv4 host; port 0 picks a free one).
absl::StatusOr<sockaddr_in> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  int port = -1;
  if (colon != std::string::npos) {
    const std::string digits = listen.substr(colon + 1);
    if (!digits.empty() && digits.size() <= 5 && digits.find_first_not_of("0123456789") == std::string::npos) {
      port = std::stoi(digits);
    }
  }
  if (colon == std::string::npos || port < 0 || port > 65535 ||
      inet_pton(AF_INET, listen.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen must be IPV4-HOST:PORT with a port in [0, 65535], got '", listen, "'"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

std::vector<MetricFamily> EngineMetrics(const EngineStats& s) {
  std::vector<MetricFamily> out;
  const auto C = MetricType::Counter;
  const auto G = MetricType::Gauge;
  Add(&out, "num_requests_running", "Sequences in the running batch", G, static_cast<double>(s.running));
  Add(&out, "num_requests_waiting", "Requests waiting for admission", G, static_cast<double>(s.waiting));
  {
    MetricFamily f = Family("request_success_total", "Finished requests by reason", C);
    const std::pair<const char*, int64_t> reasons[] = {{"length", s.finished_length}, {"stop", s.finished_stop},
                                                       {"cancelled", s.cancelled},    {"deadline", s.deadline_exceeded},
                                                       {"error", s.errors},           {"refused", s.refused}};
    for (const auto& [reason, n] : reasons) f.metric.push_back(Value(C, static_cast<double>(n), {{"reason", reason}}));
    out.push_back(std::move(f));
  }
  Add(&out, "prompt_tokens_total", "Prompt tokens of finished requests", C, static_cast<double>(s.prompt_tokens));
  Add(&out, "cached_prompt_tokens_total", "Prompt tokens served from the prefix cache (any tier)", C,
      static_cast<double>(s.cached_prompt_tokens));
  Add(&out, "generation_tokens_total", "Generated tokens of finished requests", C,
      static_cast<double>(s.generated_tokens));
  Add(&out, "num_preemptions_total", "Sequences preempted under KV pressure", C, static_cast<double>(s.preemptions));
  Add(&out, "num_swaps_total", "Preemptions that swapped the KV to host DDR", C, static_cast<double>(s.swaps));
  if (s.has_eplb) {
    Add(&out, "eplb_rearrangements_total", "Re-placements of the experts while serving that moved experts", C,
        static_cast<double>(s.eplb_rearrangements));
    Add(&out, "eplb_failures_total", "Re-placements that stopped on an error (the layers not switched kept theirs)",
        C, static_cast<double>(s.eplb_failures));
    Add(&out, "eplb_experts_copied_total", "Experts copied onto EP ranks by re-placements", C,
        static_cast<double>(s.eplb_experts_copied));
    Add(&out, "eplb_copied_bytes_total", "Weight bytes copied by re-placements", C, s.eplb_bytes_copied);
    Add(&out, "eplb_seconds_total", "Time spent re-placing experts (between steps)", C, s.eplb_seconds);
    Add(&out, "eplb_rank_imbalance",
        "Busiest EP rank's tokens over the mean rank's under the last window's routing, after the latest "
        "re-placement (0: none yet)",
        G, s.eplb_rank_imbalance);
  }
  Add(&out, "steps_total", "Engine steps", C, static_cast<double>(s.steps));
  Add(&out, "busy_seconds_total", "Time spent in steps", C, s.busy_seconds);
  Add(&out, "step_sequences_total", "Sequences over all steps (mean batch = this / steps_total)", C,
      static_cast<double>(s.batched_seqs));
  Add(&out, "uptime_seconds", "Seconds since the engine was created", G, s.uptime_seconds);
  {
    MetricFamily f = Family("backend_info", "Where the model runs (CPU: the kernel variant) and its numerics; always 1", G);
    f.metric.push_back(Value(G, 1.0, {{"backend", s.backend}, {"kernel_numerics", s.kernel_numerics}}));
    out.push_back(std::move(f));
  }
  Add(&out, "kv_blocks_capacity", "KV blocks on the device", G, static_cast<double>(s.kv_blocks_total));
  Add(&out, "kv_blocks_used", "KV blocks held by sequences", G, static_cast<double>(s.kv_blocks_used));
  Add(&out, "kv_blocks_cached", "Free KV blocks still holding a cached prefix", G,
      static_cast<double>(s.kv_blocks_cached));
  Add(&out, "kv_cache_usage_perc", "Fraction of KV blocks held by sequences", G,
      s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / static_cast<double>(s.kv_blocks_total) : 0.0);
  if (s.has_tiers) {
    const KvTierStats& t = s.tiers;
    Add(&out, "kv_ddr_blocks", "Cached KV blocks in host DDR", G, static_cast<double>(t.host.blocks));
    Add(&out, "kv_ddr_swap_blocks", "DDR slots lent to swapped-out sequences", G,
        static_cast<double>(t.host.swap_blocks));
    Add(&out, "kv_flash_records", "KV blocks on flash", G, static_cast<double>(t.flash.records));
    Add(&out, "kv_demoted_blocks_total", "Device blocks copied down to DDR on eviction", C,
        static_cast<double>(t.demoted));
    MetricFamily f = Family("kv_promoted_blocks_total", "Blocks brought back to the device, by tier", C);
    f.metric.push_back(Value(C, static_cast<double>(t.promoted_ddr), {{"tier", "ddr"}}));
    f.metric.push_back(Value(C, static_cast<double>(t.promoted_flash), {{"tier", "flash"}}));
    out.push_back(std::move(f));
    MetricFamily failed = Family("kv_transfer_failures_total",
                                 "Tier transfers that failed, by kind: promote and swap (the KV that did not arrive is recomputed), demote (the block is lost to the cache)", C);
    failed.metric.push_back(Value(C, static_cast<double>(t.promote_failures), {{"kind", "promote"}}));
    failed.metric.push_back(Value(C, static_cast<double>(t.swap_failures), {{"kind", "swap"}}));
    failed.metric.push_back(Value(C, static_cast<double>(t.demote_failures), {{"kind", "demote"}}));
    out.push_back(std::move(failed));
  }
  AddHistogram(&out, "request_queue_time_seconds", "Submission to first scheduled step", s.queue);
  AddHistogram(&out, "time_to_first_token_seconds", "Submission to first token", s.ttft);
  AddHistogram(&out, "time_per_output_token_seconds", "Mean time per output token after the first", s.tpot);
  AddHistogram(&out, "e2e_request_latency_seconds", "Submission to the final event", s.e2e);
  AddHistogram(&out, "step_duration_seconds", "Duration of engine steps", s.step);
  if (!s.recent_steps.empty()) {
    const StepRecord& r = s.recent_steps.back();
    Add(&out, "last_step_observed_over_predicted", "Last step's time over the roofline prediction (0 without --hardware)",
        G, r.predicted_seconds > 0 ? r.duration_seconds / r.predicted_seconds : 0.0);
    Add(&out, "last_step_expert_imbalance", "Last step's max over mean rows per expert (0 on one rank)", G,
        r.expert_imbalance);
    Add(&out, "last_step_attention_imbalance", "Last step's max over mean tokens per EP rank (0 on one rank)", G,
        r.attention_imbalance);
  }
  return out;
}

absl::Status CheckMetricsListen(const std::string& listen) { return ParseListen(listen).status(); }

std::string EngineMetricsText(const EngineStats& stats) {
  return prometheus::TextSerializer().Serialize(EngineMetrics(stats));
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const std::string& listen,
                                                                        const Engine* engine) {
  ASSIGN_OR_RETURN(sockaddr_in addr, ParseListen(listen));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("--metrics-listen: socket() failed");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", listen, ": cannot listen there"));
  }
  std::unique_ptr<MetricsExporter> x(new MetricsExporter());
  x->fd_ = fd;
  x->port_ = ntohs(addr.sin_port);
  x->engine_ = engine;
  x->thread_ = std::thread([p = x.get()] { p->Serve(); });
  return x;
}

void MetricsExporter::Serve() {
  using Clock = std::chrono::steady_clock;
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;  // wakes up to notice stop_
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {  // e.g. out of descriptors: back off instead of spinning on a readable socket
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // One short exchange at a time, the whole of it within 2 s, so that a stuck or slow client
    // cannot hold the endpoint (or shutdown) for longer.
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    auto wait = [&](short events) {
      while (!stop_.load()) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd q{c, events, 0};
        const int r = poll(&q, 1, static_cast<int>(std::min<int64_t>(left, 100)));
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return false;
      }
      return false;
    };
    std::string head;
    char buf[1024];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192 && wait(POLLIN)) {
      const ssize_t n = recv(c, buf, sizeof(buf), 0);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    const bool metrics = head.rfind("GET /metrics ", 0) == 0 || head.rfind("GET /metrics?", 0) == 0;
    const std::string body = metrics ? EngineMetricsText(engine_->GetStats()) : "not found: try GET /metrics\n";
    const std::string response = absl::StrCat(
        metrics ? "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
                : "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain; charset=utf-8",
        "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size() && wait(POLLOUT)) {
      const ssize_t n = send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0 && errno != EAGAIN) break;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    close(c);
  }
}

MetricsExporter::~MetricsExporter() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

}  // namespace moeserve::server
