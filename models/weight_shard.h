// Which part of a model a rank holds (WeightShard, models/model_weights.h), checked against the
// config; shared by ModelWeights::Load and ModelWeights::Shard.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "models/model_weights.h"

namespace moeserve {

// Checks a shard against the config (its layers a range within the model, its experts real
// ones) and says which routed experts it holds in each of its layers ([layer - layer_begin]).
absl::StatusOr<std::vector<std::vector<bool>>> HeldExperts(const ModelConfig& c, const WeightShard& shard);

}  // namespace moeserve
