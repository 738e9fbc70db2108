// Runs one load level against a server: open loop (requests sent at their arrival times,
// whatever the server's progress) or closed loop (a fixed number of requests in flight).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/workload.h"
#include "server/proto/moeserve.grpc.pb.h"
#include "tools/loadgen/metrics.h"
#include "tools/loadgen/stream_call.h"

namespace moeserve::loadgen {

struct LevelSpec {
  bool closed_loop = false;
  double rate = std::numeric_limits<double>::infinity();  // open loop, requests/s; inf: all at once
  int64_t concurrency = 1;                                // closed loop
  std::string Label() const;  // "rate=4" / "rate=inf" / "concurrency=8"
};

struct LevelRun {
  std::vector<RequestResult> results;  // in completion order
  double duration_seconds = 0.0;       // level start (first arrival at 0) to last completion
};

struct RunOptions {
  CallOptions call;
  moeserve::v1::Priority priority = moeserve::v1::PRIORITY_NORMAL;
  double retain_seconds = 0;  // prompt-cache retention asked with every request (0: none)
  bool progress = true;
  std::string progress_label;
};

// Sends every item (arrival_seconds is honoured in open loop, ignored in closed loop) and
// waits for all of them to end.
LevelRun RunLevel(moeserve::v1::Moeserve::Stub* stub, const LevelSpec& level,
                  const std::vector<WorkloadItem>& items, const RunOptions& options);

}  // namespace moeserve::loadgen
