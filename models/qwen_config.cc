// Qwen-MoE config keys (see qwen_config.h).
#include "models/qwen_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve {

using config_json::Json;

const char* QwenExpertsKey(const Json& j) {
  return !j.contains("num_experts") && j.contains("num_local_experts") ? "num_local_experts" : "num_experts";
}

absl::Status ReadQwenConfig(const Json& j, ModelConfig* c) {
  if (j.contains("num_experts") && j.contains("num_local_experts")) {
    int64_t a = 0, b = 0;
    RETURN_IF_ERROR(config_json::ReadInt(j, "num_experts", true, &a));
    RETURN_IF_ERROR(config_json::ReadInt(j, "num_local_experts", true, &b));
    if (a != b) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: num_experts ", a, " and num_local_experts ", b,
                                                     " disagree (transformers reads them as one)"));
    }
  }
  RETURN_IF_ERROR(config_json::ReadInt(j, "decoder_sparse_step", false, &c->decoder_sparse_step));
  if (c->decoder_sparse_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"decoder_sparse_step\" must be >= 1, got ", c->decoder_sparse_step));
  }
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return config_json::TypeError("mlp_only_layers", "an array of layer indices", *it);
    for (const Json& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c->num_hidden_layers) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: \"mlp_only_layers\" holds ", v.dump(),
                                                       ", not a layer index in [0, ", c->num_hidden_layers, ")"));
      }
      c->mlp_only_layers.push_back(v.get<int64_t>());
    }
    std::sort(c->mlp_only_layers.begin(), c->mlp_only_layers.end());
    c->mlp_only_layers.erase(std::unique(c->mlp_only_layers.begin(), c->mlp_only_layers.end()),
                             c->mlp_only_layers.end());
  }
  // The dense layers' MLP width, when there are any: intermediate_size, whose transformers
  // defaults differ by family (0 otherwise: no workspace is sized for it).
  if (c->num_dense_layers() == 0) return absl::OkStatus();
  c->dense_intermediate_size = c->family == ModelFamily::kQwen3Moe ? 6144 : 5632;
  return config_json::ReadInt(j, "intermediate_size", false, &c->dense_intermediate_size);
}

void WriteQwenConfig(const ModelConfig& c, Json* j) {
  (*j)["decoder_sparse_step"] = c.decoder_sparse_step;
  (*j)["mlp_only_layers"] = c.mlp_only_layers;
  (*j)["intermediate_size"] = c.dense_intermediate_size;
}

}  // namespace moeserve
