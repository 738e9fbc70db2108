// The built-in presets and a preset's shape in another family.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "models/deepseek_config.h"
#include "models/model_config.h"

namespace moeserve {

std::vector<std::string> PresetNames() { return {"tiny", "small", "medium"}; }

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  ModelConfig c;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  if (name == "tiny") {
    // For unit tests: a forward pass takes microseconds. Vocabulary larger than the tokenizer's.
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    c.vocab_size = 272;
    c.max_position_embeddings = 1024;
    c.torch_dtype = DType::kF32;
  } else if (name == "small") {
    // About 100M total parameters, 8 experts top-2 (about 30M active).
    c.hidden_size = 512;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.num_local_experts = 8;
    c.num_experts_per_tok = 2;
    c.vocab_size = 512;
    c.max_position_embeddings = 4096;
    c.torch_dtype = DType::kBF16;
  } else if (name == "medium") {
    // About 0.8B total parameters, 16 experts top-2: clearly memory-bound on a CPU.
    c.hidden_size = 1024;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 10;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.num_local_experts = 16;
    c.num_experts_per_tok = 2;
    c.vocab_size = 1024;
    c.max_position_embeddings = 8192;
    c.torch_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown preset \"", name, "\" (choose one of ",
                                                   absl::StrJoin(PresetNames(), ", "), ")"));
  }
  MS_CHECK_OK(c.Validate());
  return c;
}

ModelConfig WithFamily(ModelConfig c, ModelFamily family) {
  c.family = family;
  c.norm_topk_prob = family == ModelFamily::kMixtral || family == ModelFamily::kQwen3Moe;
  c.qkv_bias = family == ModelFamily::kQwen2Moe;
  c.qk_norm = family == ModelFamily::kQwen3Moe ? QkNorm::kPerHead
              : family == ModelFamily::kOlmoe  ? QkNorm::kWhole
                                               : QkNorm::kNone;
  if (family == ModelFamily::kQwen2Moe && c.shared_expert_intermediate_size == 0) {
    c.shared_expert_intermediate_size = 2 * c.intermediate_size;
  }
  if (family == ModelFamily::kQwen3Moe || family == ModelFamily::kOlmoe) c.shared_expert_intermediate_size = 0;
  if (family == ModelFamily::kDeepseekV2 || family == ModelFamily::kDeepseekV3 || family == ModelFamily::kGlm4Moe) {
    return DeepseekShape(c);
  }
  return c;
}

}  // namespace moeserve
