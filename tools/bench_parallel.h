// The parallel-layout part of a `moeserve bench` report (--ep / --pp): what each device holds
// and what the layout cost in communication, so that the claims about expert parallelism and
// pipelining can be read off the output.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "roofline/hardware.h"

namespace moeserve::tools {

// `mean_seq_tokens`: prompt plus output tokens of a mean request; `steps`: the run's records.
nlohmann::json ParallelReport(const Engine& engine, DType weight_dtype, const std::vector<StepRecord>& steps,
                              double mean_seq_tokens, double elapsed_seconds,
                              const std::optional<roofline::HardwareProfile>& hw);
// Prints the report's human-readable lines.
void PrintParallelReport(const nlohmann::json& j);

}  // namespace moeserve::tools
