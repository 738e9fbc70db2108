// Prometheus metrics over HTTP (GET /metrics, text exposition format). The metric families and
// their serialisation come from prometheus-cpp (core); the HTTP side is a small loopback-grade
// responder of our own, because prometheus-cpp's pull exposer runs on civetweb, whose Debian
// build gives its threads a fixed 100 KB stack, which the static TLS of the CUDA libraries
// (cuBLASLt alone ~94 KB) exceeds, so its threads cannot start in a CUDA build. Every scrape
// reads Engine::GetStats(): request and token counters, queue and
// KV gauges, KV tier and preemption counters, latency histograms (queue, TTFT, TPOT, end to
// end, step), and the last step's roofline ratio and parallel imbalance. Names follow vLLM's
// where one exists, with the moeserve_ prefix.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace prometheus {
struct MetricFamily;
}  // namespace prometheus

namespace moeserve::server {

// The metric families for one stats snapshot (what a scrape returns).
std::vector<prometheus::MetricFamily> EngineMetrics(const EngineStats& stats);
// The same, serialised in the Prometheus text format.
std::string EngineMetricsText(const EngineStats& stats);

// INVALID_ARGUMENT naming --metrics-listen unless `listen` is IPV4-HOST:PORT.
absl::Status CheckMetricsListen(const std::string& listen);

class MetricsExporter {
 public:
  // Serves GET /metrics on `listen` (IPv4 host:port; port 0 picks a free one) from a thread of
  // its own, one request at a time, until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen, const Engine* engine);
  ~MetricsExporter();
  int port() const { return port_; }

 private:
  MetricsExporter() = default;
  void Serve();

  int fd_ = -1;
  int port_ = 0;
  const Engine* engine_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts after everything it uses
};

}  // namespace moeserve::server
