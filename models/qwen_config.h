// The Qwen-MoE keys of config.json that go beyond the common ones: dense MLP layers between the
// MoE layers (mlp_only_layers, decoder_sparse_step, their MLP's intermediate_size) and the
// experts' count as transformers 5 writes it for Qwen3-MoE (num_local_experts, its attribute
// map of num_experts), read with transformers' meaning and defaults.
#pragma once

#include "models/config_json.h"
#include "models/model_config.h"

namespace moeserve {

// Reads them into `c` (a Qwen2- or Qwen3-MoE config whose common keys are read).
absl::Status ReadQwenConfig(const config_json::Json& j, ModelConfig* c);

// The key holding the experts' count: num_experts, or Qwen3-MoE's num_local_experts when only
// that one is given (both given must agree: checked by ReadQwenConfig).
const char* QwenExpertsKey(const config_json::Json& j);

// Writes the dense-layer keys of `c` into a config.json object.
void WriteQwenConfig(const ModelConfig& c, config_json::Json* j);

}  // namespace moeserve
