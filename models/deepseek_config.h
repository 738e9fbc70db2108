// The DeepSeek-V2 / V3 keys of config.json (multi-head latent attention, grouped routing,
// shared and dense layers, YaRN), read with transformers' meaning and defaults.
#pragma once

#include "models/config_json.h"
#include "models/model_config.h"

namespace moeserve {

// The keys only DeepSeek configs carry (accepted by the unknown-key check, read below).
bool IsDeepseekKey(const std::string& key);

// Reads the DeepSeek keys into `c`, whose common keys (hidden size, heads, experts as
// n_routed_experts, moe_intermediate_size, ...) are already read; refuses settings this build
// does not compute, naming the key.
absl::Status ReadDeepseekConfig(const config_json::Json& j, ModelConfig* c);

// A DeepSeek or GLM model of a preset's shape (`c.family` set to V2, V3 or GLM): for DeepSeek,
// MLA with a latent of twice the head width and a rotary part of half of it (query compression
// at half the hidden size for V3); for GLM the preset's attention with q/k/v biases, q/k norms
// and half-head RoPE; then the first layer dense at twice the expert width, one shared expert
// (two for V2), and V3's grouped sigmoid routing (V2: greedy softmax).
ModelConfig DeepseekShape(ModelConfig c);

// Writes the DeepSeek keys of `c` into a config.json object (as transformers reads them).
void WriteDeepseekConfig(const ModelConfig& c, config_json::Json* j);

// GLM-4.5's keys (Glm4MoeConfig): q/k/v biases (attention_bias), per-head q/k norms
// (use_qk_norm), RoPE on the first partial_rotary_factor of each head, and DeepSeek-V3's MoE
// with GLM's defaults.
bool IsGlmKey(const std::string& key);
absl::Status ReadGlmConfig(const config_json::Json& j, ModelConfig* c);

// rope_scaling (transformers 4) or rope_parameters (5): "default" or "yarn" with its keys (a
// missing factor is max_position_embeddings / original_max_position_embeddings, as transformers
// derives it).
absl::Status ReadRopeScaling(const config_json::Json& j, int64_t max_position_embeddings, RopeScaling* out);

}  // namespace moeserve
