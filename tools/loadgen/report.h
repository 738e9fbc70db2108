// Loadgen output: one JSON object per level (metrics, server-side deltas, cost) and a CSV row
// per level with the same numbers, for spreadsheets and the plotting script.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/proto/moeserve.pb.h"
#include "tools/loadgen/metrics.h"
#include "tools/loadgen/runner.h"

namespace moeserve::loadgen {

// What the server did during a level: the difference of two GetStats snapshots.
struct ServerDelta {
  int64_t steps = 0, batched_seqs = 0, prefill_tokens = 0, decode_tokens = 0, preemptions = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  double busy_seconds = 0;
  double MeanBatchSize() const { return steps ? static_cast<double>(batched_seqs) / steps : 0.0; }
};
ServerDelta Difference(const moeserve::v1::Stats& before, const moeserve::v1::Stats& after);

struct LevelReport {
  LevelSpec level;
  LevelMetrics metrics;
  std::optional<ServerDelta> server;        // absent when GetStats failed
  std::optional<moeserve::v1::Stats> stats;  // the snapshot after the level
  std::string stats_error;
  double price_per_hour = 0;
};

nlohmann::json ToJson(const LevelReport& r);
// Serializes a proto message with every field present (proto3 JSON mapping).
nlohmann::json ProtoToJson(const google::protobuf::Message& m);

// Dollars per million tokens when the machine costs `price_per_hour` for `seconds`.
double UsdPerMillion(double price_per_hour, double seconds, int64_t tokens);

std::string CsvHeader();
std::string CsvRow(const LevelReport& r);

}  // namespace moeserve::loadgen
