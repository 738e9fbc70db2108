// Model configs for roofline analysis only (never instantiated): public architectures whose
// sizes the lecture-style numbers are usually quoted for, besides the built-in presets.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"

namespace moeserve::roofline {

// "mixtral-8x7b", "deepseek-v3-like", then the built-in presets (tiny, small, medium).
std::vector<std::string> AnalysisPresetNames();
absl::StatusOr<ModelConfig> AnalysisPreset(const std::string& name);

}  // namespace moeserve::roofline
