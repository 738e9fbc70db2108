// Analysis-only model configs.
#include "roofline/model_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moeserve::roofline {

std::vector<std::string> AnalysisPresetNames() {
  std::vector<std::string> names = {"mixtral-8x7b", "deepseek-v3-like"};
  for (const std::string& n : PresetNames()) names.push_back(n);
  return names;
}

absl::StatusOr<ModelConfig> AnalysisPreset(const std::string& name) {
  ModelConfig c;
  c.torch_dtype = DType::kBF16;
  c.rms_norm_eps = 1e-6;
  if (name == "mixtral-8x7b") {
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.num_local_experts = 8;
    c.num_experts_per_tok = 2;
    c.vocab_size = 32000;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1e6;
  } else if (name == "deepseek-v3-like") {
    // DeepSeek-V3's sizes in this architecture: 256 routed experts top-8 plus one shared expert,
    // hidden 7168, expert width 2048, 128 heads. Its 3 dense layers are folded into 58 MoE
    // layers, and MLA's compressed KV (about 70 KB per token) is approximated by 2 KV heads
    // (59 KB per token in bf16). About 672B total and 39B active parameters.
    c.hidden_size = 7168;
    c.intermediate_size = 2048;
    c.shared_expert_intermediate_size = 2048;
    c.num_hidden_layers = 58;
    c.num_attention_heads = 128;
    c.num_key_value_heads = 2;
    c.head_dim = 128;
    c.num_local_experts = 256;
    c.num_experts_per_tok = 8;
    c.norm_topk_prob = true;
    c.vocab_size = 129280;
    c.max_position_embeddings = 163840;
    c.rope_theta = 10000;
  } else {
    auto p = PresetConfig(name);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--preset: unknown '", name, "' (", absl::StrJoin(AnalysisPresetNames(), ", "), ")"));
    }
    return p;
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

}  // namespace moeserve::roofline
