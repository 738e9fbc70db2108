// Loadgen reports.
#include "tools/loadgen/report.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moeserve::loadgen {

ServerDelta Difference(const moeserve::v1::Stats& a, const moeserve::v1::Stats& b) {
  ServerDelta d;
  d.steps = b.steps() - a.steps();
  d.batched_seqs = b.batched_seqs() - a.batched_seqs();
  d.prefill_tokens = b.prefill_tokens() - a.prefill_tokens();
  d.decode_tokens = b.decode_tokens() - a.decode_tokens();
  d.preemptions = b.preemptions() - a.preemptions();
  d.prompt_tokens = b.prompt_tokens() - a.prompt_tokens();
  d.cached_prompt_tokens = b.cached_prompt_tokens() - a.cached_prompt_tokens();
  d.busy_seconds = b.busy_seconds() - a.busy_seconds();
  return d;
}

nlohmann::json ProtoToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &s, opts).ok()) return nullptr;
  return nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
}

namespace {

nlohmann::json SummaryJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median}, {"p90", s.p90},
          {"p99", s.p99},     {"min", s.min},   {"max", s.max}};
}

}  // namespace

double UsdPerMillion(double price_per_hour, double seconds, int64_t tokens) {
  return tokens > 0 ? price_per_hour / 3600.0 * seconds / static_cast<double>(tokens) * 1e6 : 0.0;
}

nlohmann::json ToJson(const LevelReport& r) {
  const LevelMetrics& m = r.metrics;
  nlohmann::json j;
  j["label"] = r.level.Label();
  j["mode"] = r.level.closed_loop ? "closed" : "open";
  if (r.level.closed_loop) {
    j["concurrency"] = r.level.concurrency;
  } else {
    j["rate"] = std::isinf(r.level.rate) ? nlohmann::json("inf") : nlohmann::json(r.level.rate);
  }
  j["sent"] = m.sent;
  j["ok"] = m.ok;
  j["failed"] = m.failed;
  j["failures_by_code"] = m.failures_by_code;
  j["first_error_by_code"] = m.first_error;
  j["duration_s"] = m.duration_seconds;
  j["prompt_tokens"] = m.prompt_tokens;
  j["output_tokens"] = m.output_tokens;
  j["cached_prompt_tokens"] = m.cached_prompt_tokens;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["good"] = m.good;
  j["goodput"] = m.goodput;
  j["ttft_ms"] = SummaryJson(m.ttft_ms);
  j["tpot_ms"] = SummaryJson(m.tpot_ms);
  j["itl_ms"] = SummaryJson(m.itl_ms);
  j["e2e_ms"] = SummaryJson(m.e2e_ms);
  j["cost"] = {{"price_per_hour", r.price_per_hour},
               {"usd_per_million_output_tokens", UsdPerMillion(r.price_per_hour, m.duration_seconds, m.output_tokens)}};
  if (r.server) {
    const ServerDelta& d = *r.server;
    j["server"] = {{"steps", d.steps},
                   {"mean_batch_size", d.MeanBatchSize()},
                   {"busy_seconds", d.busy_seconds},
                   {"utilization", m.duration_seconds > 0 ? d.busy_seconds / m.duration_seconds : 0.0},
                   {"prefill_tokens", d.prefill_tokens},
                   {"decode_tokens", d.decode_tokens},
                   {"preemptions", d.preemptions},
                   {"prefix_hit_rate", d.prompt_tokens ? static_cast<double>(d.cached_prompt_tokens) / d.prompt_tokens : 0.0},
                   {"usd_per_million_output_tokens_busy",
                    UsdPerMillion(r.price_per_hour, d.busy_seconds, m.output_tokens)}};
  }
  // The receipts of the successful requests, in parts; against the server's busy time they
  // should add up to the machine's cost of the level (failed requests carry no receipt).
  const ReceiptParts& rc = m.receipts;
  j["receipts"] = {{"device_seconds", rc.device_seconds},
                   {"prefill_device_seconds", rc.prefill_device_seconds},
                   {"decode_device_seconds", rc.decode_device_seconds},
                   {"transfer_device_seconds", rc.transfer_device_seconds},
                   {"kv_gb_seconds", rc.kv_gb_seconds},
                   {"cost_usd", rc.cost_usd}};
  if (r.server && r.server->busy_seconds > 0) {
    j["receipts"]["over_busy_seconds"] = rc.device_seconds / r.server->busy_seconds;
  }
  if (r.stats) j["server_stats_after"] = ProtoToJson(*r.stats);
  if (!r.stats_error.empty()) j["server_stats_error"] = r.stats_error;
  return j;
}

std::string CsvHeader() {
  std::vector<std::string> cols = {"label", "mode", "rate", "concurrency", "sent", "ok", "failed", "duration_s",
                                   "request_throughput", "output_throughput", "total_token_throughput", "goodput"};
  for (const char* metric : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    for (const char* stat : {"mean", "median", "p90", "p99"}) cols.push_back(absl::StrCat(metric, "_", stat));
  }
  for (const char* c : {"mean_batch_size", "utilization", "usd_per_million_output_tokens"}) cols.push_back(c);
  return absl::StrJoin(cols, ",");
}

std::string CsvRow(const LevelReport& r) {
  const LevelMetrics& m = r.metrics;
  std::vector<std::string> v = {
      r.level.Label(),
      r.level.closed_loop ? "closed" : "open",
      r.level.closed_loop ? "" : (std::isinf(r.level.rate) ? "inf" : absl::StrCat(r.level.rate)),
      r.level.closed_loop ? absl::StrCat(r.level.concurrency) : "",
      absl::StrCat(m.sent), absl::StrCat(m.ok), absl::StrCat(m.failed), absl::StrCat(m.duration_seconds),
      absl::StrCat(m.request_throughput), absl::StrCat(m.output_throughput), absl::StrCat(m.total_token_throughput),
      absl::StrCat(m.goodput)};
  for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2e_ms}) {
    for (double x : {s->mean, s->median, s->p90, s->p99}) v.push_back(absl::StrCat(x));
  }
  v.push_back(r.server ? absl::StrCat(r.server->MeanBatchSize()) : "");
  v.push_back(r.server && m.duration_seconds > 0 ? absl::StrCat(r.server->busy_seconds / m.duration_seconds) : "");
  v.push_back(absl::StrCat(UsdPerMillion(r.price_per_hour, m.duration_seconds, m.output_tokens)));
  return absl::StrJoin(v, ",");
}

}  // namespace moeserve::loadgen
