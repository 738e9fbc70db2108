// `moeserve bench --tier-scenario`: time to first token for one long prompt when its prefix
// is computed (cold), found on the device, brought back from host DDR, and brought back from
// flash, with each tier's measured copy bandwidth beside the hardware profile's.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "roofline/hardware.h"

namespace moeserve::tools {

struct TierScenarioOptions {
  int64_t prompt_tokens = 4096;
  std::string flash_dir;  // a fresh temporary directory when empty
  bool progress = true;
};

// `base` supplies the scheduler and KV settings; the scenario sizes the device pool and the
// tiers itself. `hw` (optional) gives the bandwidths to compare with.
absl::StatusOr<nlohmann::json> RunTierScenario(const EngineConfig& base, const ModelWeights* weights,
                                               Backend* backend, const TierScenarioOptions& options,
                                               const std::optional<roofline::HardwareProfile>& hw);

}  // namespace moeserve::tools
