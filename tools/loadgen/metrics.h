// Serving metrics of one load level, defined as vLLM's benchmark_serving.py defines them:
// TTFT (send to first token), TPOT ((e2e - TTFT) / (output tokens - 1)), ITL (gaps between
// successive streamed messages that carry tokens), end-to-end latency, throughput over the
// level's wall time, and goodput (requests per second that meet every SLO).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/summary.h"

namespace moeserve::loadgen {

// The server's receipt of a request (engine/request.h RequestReceipt), or their sum.
struct ReceiptParts {
  double device_seconds = 0, prefill_device_seconds = 0, decode_device_seconds = 0, transfer_device_seconds = 0;
  double kv_gb_seconds = 0, cost_usd = 0;
  void Add(const ReceiptParts& o);
};

// What happened to one request, as the client saw it.
struct RequestResult {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // from the server's usage
  ReceiptParts receipt;              // from the server's last message
  double send_seconds = 0.0;         // when it was sent, from the level's start
  double ttft_seconds = 0.0;
  double e2e_seconds = 0.0;
  std::vector<double> itl_seconds;
  int status_code = 0;  // grpc::StatusCode; 0 is OK
  std::string error;

  bool ok() const { return status_code == 0; }
};

// Service-level objectives for goodput; an unset bound is not checked.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2e_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2e_ms; }
  // "ttft:200,tpot:50,e2e:5000" (milliseconds). Errors name the flag and the bad part.
  static absl::StatusOr<Slo> Parse(const std::string& text);
  std::string ToString() const;
};

struct LevelMetrics {
  int64_t sent = 0, ok = 0, failed = 0, good = 0;
  std::map<std::string, int64_t> failures_by_code;  // status code name -> count
  std::map<std::string, std::string> first_error;   // status code name -> one message
  double duration_seconds = 0.0;
  int64_t prompt_tokens = 0, output_tokens = 0, cached_prompt_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0, goodput = 0;
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  ReceiptParts receipts;  // summed over the successful requests
};

// Token counts and latencies come from successful requests only; failures are counted.
LevelMetrics ComputeMetrics(const std::vector<RequestResult>& results, double duration_seconds, const Slo& slo);

// Whether a successful request meets every bound of `slo`.
bool MeetsSlo(const RequestResult& r, const Slo& slo);

// "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "CODE_<n>" for unknown values.
std::string StatusCodeName(int code);

}  // namespace moeserve::loadgen
