// Price sheet output.
#include "tools/price_report.h"

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moeserve::tools {
namespace {

nlohmann::json Unit(const roofline::UnitPrice& u) {
  return {{"usd_per_million", u.usd_per_million}, {"batch", u.batch},         {"prompts", u.prompts},
          {"seconds", u.seconds},                 {"bound", u.compute_bound ? "compute" : "memory"},
          {"target_met", u.target_met},           {"kv_fits", u.kv_fits},
          {"limited_by", u.limited_by}};
}

// The figures compared between a predicted and a measured sheet, by name.
std::vector<std::pair<std::string, double>> Headline(const roofline::PriceSheet& s) {
  std::vector<std::pair<std::string, double>> f = {
      {"input_usd_per_million", s.input.usd_per_million},
      {"output_usd_per_million", s.output.usd_per_million},
      {"output_over_input", s.output_over_input},
      {"operating_batch", static_cast<double>(s.output.batch)},
      {"decode_step_s", s.output.seconds},
      {"prefill_s", s.input.seconds},
  };
  for (const roofline::TierPrice& t : s.tiers) {
    f.emplace_back(t.tier + "_cached_usd_per_million", t.usd_per_million);
    f.emplace_back(t.tier + "_discount", t.discount);
    f.emplace_back(t.tier + "_break_even_s", t.break_even_retention_seconds);
  }
  f.emplace_back("long_over_short", s.long_over_short);
  f.emplace_back("max_speed_multiple", s.max_speed_multiple);
  f.emplace_back("usd_per_request", s.usd_per_request);
  return f;
}

}  // namespace

nlohmann::json PriceSheetToJson(const roofline::PriceSheet& s, const roofline::PriceInputs& in) {
  nlohmann::json j;
  j["input"] = Unit(s.input);
  j["output"] = Unit(s.output);
  j["output_over_input"] = s.output_over_input;
  j["usd_per_request"] = s.usd_per_request;
  for (const roofline::TierPrice& t : s.tiers) {
    j["cached_input"].push_back({{"tier", t.tier},
                                 {"usd_per_gb_hour", t.usd_per_gb_hour},
                                 {"retention_s", t.retention_seconds},
                                 {"restore_s_per_token", t.restore_seconds_per_token},
                                 {"hold_usd_per_million", t.hold_usd_per_million},
                                 {"restore_usd_per_million", t.restore_usd_per_million},
                                 {"usd_per_million", t.usd_per_million},
                                 {"discount", t.discount},
                                 {"break_even_retention_s", t.break_even_retention_seconds}});
  }
  j["context"] = {{"kv_equals_weights_context", s.kv_equals_weights_context},
                  {"batch_shrinks_context", s.batch_shrinks_context},
                  {"doubling_context", s.doubling_context},
                  {"long_over_short", s.long_over_short}};
  for (const roofline::ContextPoint& p : s.context_curve) {
    j["context"]["curve"].push_back({{"context", p.context},
                                     {"batch", p.batch},
                                     {"memory_limited", p.memory_limited},
                                     {"fits", p.fits},
                                     {"step_s", p.step_seconds},
                                     {"usd_per_million_output", p.usd_per_million_output},
                                     {"kv_over_weight_bytes", p.kv_over_weight_bytes}});
  }
  j["fast_mode"] = {{"max_speed_multiple", s.max_speed_multiple}, {"latency_floor_s", s.latency_floor_seconds}};
  for (const roofline::FastPoint& f : s.fast_curve) {
    j["fast_mode"]["curve"].push_back({{"batch", f.batch},
                                       {"step_s", f.step_seconds},
                                       {"price_multiple", f.price_multiple},
                                       {"speed_multiple", f.speed_multiple},
                                       {"at_floor", f.at_floor}});
  }
  j["reading"] = roofline::ReadPriceSheet(s, in);
  return j;
}

std::string PriceCurvesCsv(const roofline::PriceSheet& s, const std::string& source) {
  std::string csv;
  for (const roofline::ContextPoint& p : s.context_curve) {
    absl::StrAppend(&csv, source, ",context,", p.context, ",", p.batch, ",", p.step_seconds, ",",
                    p.usd_per_million_output, ",", p.memory_limited ? 1 : 0, "\n");
  }
  for (const roofline::FastPoint& f : s.fast_curve) {
    absl::StrAppend(&csv, source, ",fast,", f.batch, ",", f.batch, ",", f.step_seconds, ",", f.price_multiple, ",",
                    f.speed_multiple, "\n");
  }
  return csv;
}

void PrintPriceSheet(const roofline::PriceSheet& s, const roofline::PriceInputs& in, const std::string& title) {
  std::printf("\n== %s ==\n", title.c_str());
  std::printf("  input   $%10.4g /M tokens  (%lld tokens per prefill step, %lld prompt(s), %.1f ms, %s-bound%s)\n",
              s.input.usd_per_million, static_cast<long long>(s.input.batch), static_cast<long long>(s.input.prompts),
              s.input.seconds * 1e3, s.input.compute_bound ? "compute" : "memory",
              s.input.target_met ? "" : ", TTFT target missed");
  std::printf("  output  $%10.4g /M tokens  (batch %lld, limited by %s; step %.2f ms, %s-bound%s%s)\n",
              s.output.usd_per_million, static_cast<long long>(s.output.batch), s.output.limited_by.c_str(),
              s.output.seconds * 1e3,
              s.output.compute_bound ? "compute" : "memory", s.output.target_met ? "" : ", TPOT target missed",
              s.output.kv_fits ? "" : ", KV does not fit");
  std::printf("  output / input: %.2fx    per request of the mix: $%.4g\n", s.output_over_input, s.usd_per_request);
  std::printf("  cached input   %8s %12s %10s %12s %12s %10s %14s\n", "$/GB-h", "retention s", "hold $/M",
              "restore $/M", "total $/M", "discount", "break-even s");
  for (const roofline::TierPrice& t : s.tiers) {
    std::printf("    %-6s %14.6g %12.0f %10.4g %12.4g %12.4g %9.2fx %14.0f\n", t.tier.c_str(), t.usd_per_gb_hour,
                t.retention_seconds, t.hold_usd_per_million, t.restore_usd_per_million, t.usd_per_million,
                t.discount, t.break_even_retention_seconds);
  }
  std::printf("  context: KV = weights at %.0f tokens, memory full at %.0f; longest / shortest %.2fx; doubles at %s\n",
              s.kv_equals_weights_context, s.batch_shrinks_context, s.long_over_short,
              s.doubling_context > 0 ? std::to_string(s.doubling_context).c_str() : "none on the curve");
  std::printf("    %10s %8s %12s %14s %10s\n", "context", "batch", "step ms", "$/M output", "KV/weights");
  for (const roofline::ContextPoint& p : s.context_curve) {
    std::printf("    %10lld %8lld %12.4g %14.4g %10.3g%s\n", static_cast<long long>(p.context),
                static_cast<long long>(p.batch), p.step_seconds * 1e3, p.usd_per_million_output,
                p.kv_over_weight_bytes, p.fits ? (p.memory_limited ? "  (memory-limited batch)" : "") : "  (does not fit)");
  }
  std::printf("  fast mode at context %lld: at most %.2fx the speed; floor %.3f ms\n",
              static_cast<long long>(in.mix.DecodeContext()), s.max_speed_multiple, s.latency_floor_seconds * 1e3);
  std::printf("    %8s %12s %14s %14s\n", "batch", "step ms", "price x", "speed x");
  for (const roofline::FastPoint& f : s.fast_curve) {
    std::printf("    %8lld %12.3f %14.2f %14.3f%s\n", static_cast<long long>(f.batch), f.step_seconds * 1e3,
                f.price_multiple, f.speed_multiple, f.at_floor ? "  (floor)" : "");
  }
  std::printf("  %s\n", roofline::ReadPriceSheet(s, in).c_str());
}

void PrintFastLane(const nlohmann::json& lane, const roofline::PriceSheet& sheet) {
  const int64_t cap = lane["fast_lane_max_batch"].get<int64_t>();
  std::printf("\n== fast lane under load: %lld bulk requests, then one fast-lane request among them (batch cap %lld) ==\n",
              static_cast<long long>(lane["bulk_requests"].get<int64_t>()), static_cast<long long>(cap));
  std::printf("  bulk alone: TPOT %.2f ms, decode $%.4g/M; fast: TPOT %.2f ms, decode $%.4g/M (from receipts)\n",
              lane["bulk_alone"]["tpot_s"].get<double>() * 1e3, lane["bulk_alone"]["decode_usd_per_million"].get<double>(),
              lane["fast"]["tpot_s"].get<double>() * 1e3, lane["fast"]["decode_usd_per_million"].get<double>());
  std::printf("  the fast lane buys %.2fx the speed at %.2fx the decode price", lane["speed_multiple"].get<double>(),
              lane["price_multiple"].get<double>());
  for (const roofline::FastPoint& f : sheet.fast_curve) {
    if (f.batch == cap) {
      std::printf("; the sheet's batch %lld: %.2fx the speed at %.2fx the price", static_cast<long long>(f.batch),
                  f.speed_multiple, f.price_multiple);
    }
  }
  std::printf("\n");
}

nlohmann::json ComparePriceSheets(const roofline::PriceSheet& predicted, const roofline::PriceSheet& measured) {
  nlohmann::json rows = nlohmann::json::array();
  const auto p = Headline(predicted), m = Headline(measured);
  for (size_t i = 0; i < p.size(); ++i) {
    nlohmann::json row = {{"figure", p[i].first}, {"predicted", p[i].second}, {"measured", m[i].second}};
    row["error"] = nullptr;
    if (p[i].second != 0 && std::isfinite(m[i].second)) row["error"] = m[i].second / p[i].second - 1;
    rows.push_back(row);
  }
  return rows;
}

void PrintComparison(const nlohmann::json& comparison) {
  std::printf("\n== predicted against measured ==\n    %-32s %14s %14s %10s\n", "figure", "predicted", "measured",
              "error");
  for (const auto& r : comparison) {
    const std::string err = r["error"].is_null() ? "n/a" : absl::StrFormat("%+.1f%%", r["error"].get<double>() * 100);
    std::printf("    %-32s %14.6g %14.6g %10s\n", r["figure"].get<std::string>().c_str(), r["predicted"].get<double>(),
                r["measured"].get<double>(), err.c_str());
  }
}

}  // namespace moeserve::tools
