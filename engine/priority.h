// A request's scheduling class, as every front end names it: the one table from the names
// ("fast", "high", "normal", "low") to the classes, for HTTP's strings and gRPC's enum alike.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moeserve {

// Scheduling classes, most urgent first. Requests in the fast lane cap the size of the batch
// they join: lower latency per token, paid for by a larger share of each step.
enum class Priority : int { kFast = 0, kHigh = 1, kNormal = 2, kLow = 3 };

const char* PriorityName(Priority p);
// INVALID_ARGUMENT naming the field "priority" and the names it may take.
absl::StatusOr<Priority> PriorityFromName(absl::string_view name);

}  // namespace moeserve
