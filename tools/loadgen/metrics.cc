// Serving metrics.
#include "tools/loadgen/metrics.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moeserve::loadgen {

absl::StatusOr<Slo> Slo::Parse(const std::string& text) {
  Slo slo;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(part, ':');
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slo: '", part, "' is not NAME:MILLISECONDS with a positive number (e.g. ttft:200)"));
    }
    if (kv[0] == "ttft") {
      slo.ttft_ms = ms;
    } else if (kv[0] == "tpot") {
      slo.tpot_ms = ms;
    } else if (kv[0] == "e2e" || kv[0] == "e2el") {
      slo.e2e_ms = ms;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--slo: unknown metric '", kv[0], "' (ttft, tpot or e2e)"));
    }
  }
  return slo;
}

std::string Slo::ToString() const {
  std::string s;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (v) absl::StrAppend(&s, s.empty() ? "" : ",", name, ":", *v);
  };
  add("ttft", ttft_ms);
  add("tpot", tpot_ms);
  add("e2e", e2e_ms);
  return s;
}

namespace {
double TpotSeconds(const RequestResult& r) {
  return r.output_tokens > 1 ? (r.e2e_seconds - r.ttft_seconds) / static_cast<double>(r.output_tokens - 1) : 0.0;
}
}  // namespace

bool MeetsSlo(const RequestResult& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms && r.ttft_seconds * 1e3 > *slo.ttft_ms) return false;
  if (slo.tpot_ms && TpotSeconds(r) * 1e3 > *slo.tpot_ms) return false;
  if (slo.e2e_ms && r.e2e_seconds * 1e3 > *slo.e2e_ms) return false;
  return true;
}

std::string StatusCodeName(int code) {
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                       "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                       "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return absl::StrCat("CODE_", code);
}

void ReceiptParts::Add(const ReceiptParts& o) {
  device_seconds += o.device_seconds;
  prefill_device_seconds += o.prefill_device_seconds;
  decode_device_seconds += o.decode_device_seconds;
  transfer_device_seconds += o.transfer_device_seconds;
  kv_gb_seconds += o.kv_gb_seconds;
  cost_usd += o.cost_usd;
}

LevelMetrics ComputeMetrics(const std::vector<RequestResult>& results, double duration_seconds, const Slo& slo) {
  LevelMetrics m;
  m.duration_seconds = duration_seconds;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestResult& r : results) {
    ++m.sent;
    if (!r.ok()) {
      ++m.failed;
      const std::string name = StatusCodeName(r.status_code);
      ++m.failures_by_code[name];
      m.first_error.emplace(name, r.error);
      continue;
    }
    ++m.ok;
    m.prompt_tokens += r.prompt_tokens;
    m.output_tokens += r.output_tokens;
    m.cached_prompt_tokens += r.cached_prompt_tokens;
    m.receipts.Add(r.receipt);
    if (r.output_tokens > 0) ttft.push_back(r.ttft_seconds * 1e3);
    if (r.output_tokens > 1) tpot.push_back(TpotSeconds(r) * 1e3);
    for (double g : r.itl_seconds) itl.push_back(g * 1e3);
    e2e.push_back(r.e2e_seconds * 1e3);
    if (MeetsSlo(r, slo)) ++m.good;
  }
  if (duration_seconds > 0) {
    m.request_throughput = static_cast<double>(m.ok) / duration_seconds;
    m.output_throughput = static_cast<double>(m.output_tokens) / duration_seconds;
    m.total_token_throughput = static_cast<double>(m.prompt_tokens + m.output_tokens) / duration_seconds;
    m.goodput = static_cast<double>(m.good) / duration_seconds;
  }
  m.ttft_ms = Summarize(ttft);
  m.tpot_ms = Summarize(tpot);
  m.itl_ms = Summarize(itl);
  m.e2e_ms = Summarize(e2e);
  return m;
}

}  // namespace moeserve::loadgen
