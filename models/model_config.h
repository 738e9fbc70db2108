// ModelConfig: the hyperparameters of a Mixture-of-Experts transformer of one of the supported
// Hugging Face families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), read from its config.json with
// that family's key names and defaults, validated once; plus the built-in presets (Mixtral) and
// parameter counts.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace moeserve {

// The families differ only in the attention's extras and the tensor names: Qwen2-MoE adds
// q/k/v biases and a shared expert, Qwen3-MoE an RMSNorm per head on q and k, OLMoE an RMSNorm
// over the whole q and k projections.
enum class ModelFamily { kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe };
enum class QkNorm { kNone, kPerHead, kWhole };

struct ModelConfig {
  ModelFamily family = ModelFamily::kMixtral;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per routed expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // defaults to hidden_size / num_attention_heads
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e6;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 4096;
  DType torch_dtype = DType::kBF16;
  bool tie_word_embeddings = false;
  // Mixtral renormalises the top-k router probabilities; Qwen2-MoE may not.
  bool norm_topk_prob = true;
  // Optional shared expert (Qwen2-MoE style): applied to every token, scaled by
  // sigmoid(shared_expert_gate . x). 0 means none.
  int64_t shared_expert_intermediate_size = 0;
  bool qkv_bias = false;        // Qwen2-MoE
  QkNorm qk_norm = QkNorm::kNone;  // Qwen3-MoE per head, OLMoE whole

  // Checks every field; the error names the key and the limit.
  absl::Status Validate() const;

  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json_text);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // "MixtralForCausalLM", ... and "mixtral", ...
  const char* architecture() const;
  const char* model_type() const;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  // Parameters of one routed expert (w1, w2, w3).
  int64_t ExpertParams() const { return 3 * hidden_size * intermediate_size; }
  int64_t TotalParams() const;
  // Parameters touched per token: everything but the routed experts a token is not sent to.
  int64_t ActiveParams() const;
};

// Names of the built-in presets: "tiny", "small", "medium".
std::vector<std::string> PresetNames();
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// "mixtral", "qwen2_moe", "qwen3_moe" or "olmoe" (config.json's model_type).
absl::StatusOr<ModelFamily> FamilyFromModelType(absl::string_view model_type);
// Turns a (preset) config into the same shape in `family`: its attention extras, routing
// default and, for Qwen2-MoE, a shared expert (twice the routed size when it has none).
ModelConfig WithFamily(ModelConfig c, ModelFamily family);

}  // namespace moeserve
