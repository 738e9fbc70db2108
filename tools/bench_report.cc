// The bench report (see bench_report.h).
#include "tools/bench_report.h"

#include <algorithm>
#include <cstdio>

#include "core/summary.h"
#include "tools/bench_parallel.h"

namespace moeserve::tools {
namespace {

nlohmann::json Percentiles(const std::vector<double>& v) {
  return {{"p50", Percentile(v, 50)}, {"p90", Percentile(v, 90)}, {"p99", Percentile(v, 99)}};
}

// Per step: its time, its batch, and its time shared between prefill and decode tokens.
void AddSteps(const EngineStats& stats, nlohmann::json* j) {
  std::vector<double> step_ms, batch;
  double prefill_s = 0, decode_s = 0, mean_batch = 0;
  int64_t prefill_tok = 0, decode_tok = 0;
  for (const auto& s : stats.recent_steps) {
    step_ms.push_back(s.duration_seconds * 1e3);
    batch.push_back(static_cast<double>(s.num_seqs));
    mean_batch += static_cast<double>(s.num_seqs);
    // Attribute each step's time to prefill and decode in proportion to their tokens.
    const double frac = s.num_tokens ? static_cast<double>(s.prefill_tokens) / s.num_tokens : 0.0;
    prefill_s += s.duration_seconds * frac;
    decode_s += s.duration_seconds * (1 - frac);
    prefill_tok += s.prefill_tokens;
    decode_tok += s.decode_tokens;
  }
  mean_batch = batch.empty() ? 0 : mean_batch / batch.size();
  (*j)["throughput"]["prefill_tokens_per_s"] = prefill_s > 0 ? prefill_tok / prefill_s : 0.0;
  (*j)["throughput"]["decode_tokens_per_s"] = decode_s > 0 ? decode_tok / decode_s : 0.0;
  (*j)["batch_size"] = {{"mean", mean_batch}, {"max", batch.empty() ? 0.0 : *std::max_element(batch.begin(), batch.end())}};
  nlohmann::json steps = Percentiles(step_ms);
  steps["count"] = step_ms.size();
  steps["max"] = Percentile(step_ms, 100);
  (*j)["step_ms"] = steps;
}

// Observed against predicted, step by step, when a hardware profile was given.
void AddPrediction(const EngineStats& stats, nlohmann::json* j) {
  std::vector<double> ratio, bound_ratio;
  for (const auto& s : stats.recent_steps) {
    if (s.predicted_seconds > 0) ratio.push_back(s.duration_seconds / s.predicted_seconds);
    if (s.predicted_bound_seconds > 0) bound_ratio.push_back(s.duration_seconds / s.predicted_bound_seconds);
  }
  if (ratio.empty()) return;
  const Summary r = Summarize(ratio), b = Summarize(bound_ratio);
  (*j)["observed_over_predicted"] = {{"median", r.median}, {"p90", r.p90}, {"min", r.min}, {"max", r.max}};
  (*j)["observed_over_bound"] = {{"median", b.median}, {"min", b.min}, {"max", b.max}};
}

}  // namespace

nlohmann::json BenchReportJson(const BenchRun& run, const EngineStats& stats, const Engine& engine,
                               const EngineConfig& config, const ModelWeights& weights, const std::string& model,
                               const std::string& backend, nlohmann::json workload) {
  int64_t prompt_tokens = 0, cached = 0, generated = 0;
  double seq_tokens = 0;
  std::vector<double> ttft, tpot;
  for (const auto& r : run.requests) {
    if (!r.done) continue;
    const RequestUsage& u = r.final_event.usage;
    prompt_tokens += u.prompt_tokens;
    cached += u.cached_prompt_tokens;
    generated += u.completion_tokens;
    seq_tokens += u.prompt_tokens + u.completion_tokens;
    ttft.push_back(r.final_event.timing.ttft_seconds * 1e3);
    tpot.push_back(r.final_event.timing.tpot_seconds * 1e3);
  }
  const double ok = static_cast<double>(ttft.size()), elapsed = run.elapsed;
  const ModelConfig& c = weights.config();
  nlohmann::json j;
  j["model"] = model;
  j["backend"] = backend;
  j["total_params"] = c.TotalParams();
  j["active_params"] = c.ActiveParams();
  j["workload"] = std::move(workload);
  j["engine"] = {{"max_num_seqs", config.scheduler.max_num_seqs},
                 {"max_tokens_per_step", config.scheduler.max_tokens_per_step},
                 {"chunked_prefill", config.scheduler.chunked_prefill},
                 {"prefix_caching", config.scheduler.prefix_caching},
                 {"block_size", config.block_size},
                 {"kv_blocks", engine.num_kv_blocks()}};
  j["elapsed_seconds"] = elapsed;
  j["requests_ok"] = static_cast<int64_t>(ttft.size());
  j["requests_refused"] = run.refused;
  j["prompt_tokens"] = prompt_tokens;
  j["generated_tokens"] = generated;
  j["throughput"] = {{"requests_per_s", ok / elapsed},
                     {"total_tokens_per_s", (prompt_tokens - cached + generated) / elapsed},
                     {"output_tokens_per_s", generated / elapsed}};
  AddSteps(stats, &j);
  j["ttft_ms"] = Percentiles(ttft);
  j["tpot_ms"] = Percentiles(tpot);
  j["prefix_cache"] = {{"cached_prompt_tokens", cached},
                       {"hit_rate", prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0.0}};
  j["preemptions"] = stats.preemptions;
  j["swaps"] = stats.swaps;
  j["parallel"] = ParallelReport(engine, weights.dtype(), stats.recent_steps, seq_tokens / std::max(1.0, ok), elapsed,
                                 config.hardware);
  if (stats.has_tiers) {
    const KvTierStats& t = stats.tiers;
    j["swap"] = {{"swapped_out", t.swapped_out},
                 {"swapped_in", t.swapped_in},
                 {"swap_decisions", t.swap_decisions},
                 {"recompute_decisions", t.recompute_decisions},
                 {"out_bytes_per_s", t.swap_out_seconds > 0 ? t.swap_out_blocks * t.block_bytes / t.swap_out_seconds : 0.0},
                 {"in_bytes_per_s", t.swap_in_seconds > 0 ? t.swap_in_blocks * t.block_bytes / t.swap_in_seconds : 0.0}};
  }
  AddPrediction(stats, &j);
  return j;
}

void PrintBenchReport(const nlohmann::json& j) {
  const nlohmann::json &tp = j["throughput"], &steps = j["step_ms"], &ttft = j["ttft_ms"], &tpot = j["tpot_ms"];
  const auto cached = j["prefix_cache"]["cached_prompt_tokens"].get<int64_t>();
  const auto prompt = j["prompt_tokens"].get<int64_t>();
  std::printf("bench: %lld requests in %.2f s on %s\n", static_cast<long long>(j["requests_ok"].get<int64_t>()),
              j["elapsed_seconds"].get<double>(), j["backend"].get<std::string>().c_str());
  if (const auto refused = j["requests_refused"].get<int64_t>(); refused > 0) {
    std::printf("  refused: %lld requests (their reasons above); the figures below are the others'\n",
                static_cast<long long>(refused));
  }
  std::printf("  throughput: %.2f req/s, %.1f total tok/s, %.1f output tok/s\n", tp["requests_per_s"].get<double>(),
              tp["total_tokens_per_s"].get<double>(), tp["output_tokens_per_s"].get<double>());
  std::printf("  prefill %.1f tok/s, decode %.1f tok/s (step time shared by token kind)\n",
              tp["prefill_tokens_per_s"].get<double>(), tp["decode_tokens_per_s"].get<double>());
  std::printf("  batch size: mean %.2f, max %.0f over %zu steps\n", j["batch_size"]["mean"].get<double>(),
              j["batch_size"]["max"].get<double>(), steps["count"].get<size_t>());
  std::printf("  step ms: p50 %.2f, p90 %.2f, p99 %.2f, max %.2f\n", steps["p50"].get<double>(),
              steps["p90"].get<double>(), steps["p99"].get<double>(), steps["max"].get<double>());
  std::printf("  ttft ms: p50 %.1f, p99 %.1f | tpot ms: p50 %.2f, p99 %.2f\n", ttft["p50"].get<double>(),
              ttft["p99"].get<double>(), tpot["p50"].get<double>(), tpot["p99"].get<double>());
  std::printf("  prefix cache: %lld of %lld prompt tokens (%.1f%%) | preemptions: %lld (%lld swapped to DDR)\n",
              static_cast<long long>(cached), static_cast<long long>(prompt), prompt ? 100.0 * cached / prompt : 0.0,
              static_cast<long long>(j["preemptions"].get<int64_t>()), static_cast<long long>(j["swaps"].get<int64_t>()));
  PrintParallelReport(j["parallel"]);
  if (j.contains("observed_over_predicted")) {
    const nlohmann::json &r = j["observed_over_predicted"], &b = j["observed_over_bound"];
    std::printf("  observed / predicted step time: median %.3f, p90 %.3f (min %.3f, max %.3f); "
                "observed / roofline bound: median %.2f, min %.2f\n",
                r["median"].get<double>(), r["p90"].get<double>(), r["min"].get<double>(), r["max"].get<double>(),
                b["median"].get<double>(), b["min"].get<double>());
  }
}

}  // namespace moeserve::tools
