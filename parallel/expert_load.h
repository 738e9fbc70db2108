// The expert-load file: tokens routed to each (layer, expert) over a run, written by
// `moeserve bench --expert-load-out FILE` and read by `--expert-placement balanced
// --expert-load FILE` (parallel/placement.h). JSON:
//   {"layers": L, "experts": E, "tokens": [[t_00, ..., t_0(E-1)], ..., [t_(L-1)0, ...]]}
// with every count a non-negative integer (a dense layer's row all zeros).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "parallel/placement.h"

namespace moeserve {

// Reads `path` (a --expert-load flag's file) and checks its shape: "tokens" a row of "experts"
// counts for each of "layers". The error names the file, the field and what was expected.
// Whether it fits the model is ParallelConfig::Validate's to check.
absl::StatusOr<ExpertLoad> ReadExpertLoad(const std::string& path);

// The JSON above, with `model` (informational) beside it.
std::string ExpertLoadJson(const ExpertLoad& load, const std::string& model);

}  // namespace moeserve
