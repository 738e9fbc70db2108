// `moeserve bench`'s report on a workload run: the JSON written with --out (requests, tokens/s,
// batch sizes, step times, TTFT and TPOT percentiles, prefix cache, preemptions and swaps, the
// parallel layout's traffic, observed against predicted step time) and the lines printed from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "engine/engine.h"

namespace moeserve::tools {

// What the run left behind: each request's final event (if it ended), those refused at submit,
// and the run's time from its start to the last request's end.
struct BenchRun {
  struct Request {
    RequestEvent final_event;
    bool done = false;
  };
  std::vector<Request> requests;
  int64_t refused = 0;
  absl::Status first_refusal;  // why the first refused request was
  double elapsed = 0;
};

// `workload`: the workload's own settings, written as they are. `stats`: the engine's, after
// the run.
nlohmann::json BenchReportJson(const BenchRun& run, const EngineStats& stats, const Engine& engine,
                               const EngineConfig& config, const ModelWeights& weights, const std::string& model,
                               const std::string& backend, nlohmann::json workload);

// The report's summary lines on stdout.
void PrintBenchReport(const nlohmann::json& j);

}  // namespace moeserve::tools
