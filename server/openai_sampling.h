// The sampling fields of an OpenAI request, with vLLM's names and meanings: temperature, top_p,
// top_k, min_p, seed, the presence, frequency and repetition penalties, logit_bias and
// min_tokens; generation_config.json's defaults (temperature, top_p, top_k, min_p,
// repetition_penalty) where the request leaves them out. Ranges are checked by
// ValidateRequest; here only the JSON shapes.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "engine/request.h"
#include "models/generation_defaults.h"

namespace moeserve::server {

absl::Status ReadSampling(const nlohmann::json& j, const GenerationDefaults& defaults, GenerateRequest* r);

}  // namespace moeserve::server
