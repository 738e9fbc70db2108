// ModelConfig parsing, validation and presets.
#include "models/model_config.h"

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status.h"
#include "models/config_json.h"
#include "models/deepseek_config.h"
#include "models/qwen_config.h"
#include "models/quantization_config.h"
#include "core/byte_tokens.h"

namespace moeserve {
namespace {

using config_json::Json;
using config_json::ReadBool;
using config_json::ReadDouble;
using config_json::ReadInt;
using config_json::TypeError;

absl::Status Positive(absl::string_view key, int64_t v, int64_t limit = 1) {
  if (v < limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"", key, "\" must be at least ", limit, ", got ", v));
  }
  return absl::OkStatus();
}

// Keys that change nothing at inference (training knobs, token ids the tokenizer files own,
// bookkeeping): read past. Every other key is either read below or refused by name, so that no
// checkpoint runs with a setting this build does not implement.
constexpr const char* kIgnoredKeys[] = {
    "attention_dropout",   "bos_token_id",       "eos_token_id",      "pad_token_id",  "initializer_range",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "transformers_version", "use_cache",
    "_name_or_path",       "return_dict",        "torchscript",       "chunk_size_feed_forward", "is_encoder_decoder",
    "tokenizer_class",     "keys_to_ignore_at_inference"};
constexpr const char* kReadKeys[] = {
    "architectures",      "model_type",          "hidden_size",       "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim",          "num_experts_per_tok",
    "rms_norm_eps",       "rope_theta",          "rope_parameters",   "rope_scaling",      "vocab_size",
    "max_position_embeddings", "tie_word_embeddings", "norm_topk_prob",
    "torch_dtype",        "dtype",               "hidden_act",        "sliding_window",    "attention_bias",
    "mlp_bias",           "quantization_config"};
// Keys of one family only.
constexpr const char* kMixtralKeys[] = {"num_local_experts", "shared_expert_intermediate_size"};
constexpr const char* kQwen2MoeKeys[] = {"num_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
                                         "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
                                         "max_window_layers", "qkv_bias", "layer_types"};
constexpr const char* kQwen3MoeKeys[] = {"num_experts", "num_local_experts", "moe_intermediate_size", "decoder_sparse_step",
                                         "mlp_only_layers", "use_sliding_window", "max_window_layers",
                                         "layer_types"};
constexpr const char* kOlmoeKeys[] = {"num_experts", "clip_qkv"};

struct FamilyName {
  ModelFamily family;
  const char* architecture;
  const char* model_type;
};
constexpr FamilyName kFamilies[] = {{ModelFamily::kMixtral, "MixtralForCausalLM", "mixtral"},
                                    {ModelFamily::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
                                    {ModelFamily::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
                                    {ModelFamily::kOlmoe, "OlmoeForCausalLM", "olmoe"},
                                    {ModelFamily::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
                                    {ModelFamily::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
                                    {ModelFamily::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe"}};

bool OneOf(const std::string& key, const auto& list) {
  for (const char* k : list) {
    if (key == k) return true;
  }
  return false;
}

// The family `architectures` and `model_type` name (they must agree); Mixtral when neither is
// given (moeserve's first checkpoints).
absl::StatusOr<ModelFamily> DetectFamily(const Json& j) {
  std::optional<ModelFamily> by_arch, by_type;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    for (const FamilyName& f : kFamilies) {
      if (it->is_array() && it->size() == 1 && (*it)[0] == f.architecture) by_arch = f.family;
    }
    if (!by_arch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: architectures ", it->dump(),
          " is not supported (this build implements MixtralForCausalLM, Qwen2MoeForCausalLM, "
          "Qwen3MoeForCausalLM, OlmoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM and "
          "Glm4MoeForCausalLM)"));
    }
  }
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    for (const FamilyName& f : kFamilies) {
      if (*it == f.model_type) by_type = f.family;
    }
    // Kimi-K2 ships DeepSeek-V3's architecture under a model_type of its own.
    if (*it == "kimi_k2") by_type = ModelFamily::kDeepseekV3;
    if (!by_type) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: model_type ", it->dump(), " is not supported (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, glm4_moe)"));
    }
  }
  if (by_arch && by_type && *by_arch != *by_type) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: architectures ", j["architectures"].dump(),
                                                   " and model_type ", j["model_type"].dump(), " disagree"));
  }
  return by_arch.value_or(by_type.value_or(ModelFamily::kMixtral));
}

// The settings this build implements only one way: anything else is refused, naming the key.
absl::Status CheckUnsupported(const Json& j, ModelFamily family) {
  for (const auto& [key, value] : j.items()) {
    const bool family_key = family == ModelFamily::kMixtral    ? OneOf(key, kMixtralKeys)
                            : family == ModelFamily::kQwen2Moe ? OneOf(key, kQwen2MoeKeys)
                            : family == ModelFamily::kQwen3Moe ? OneOf(key, kQwen3MoeKeys)
                            : family == ModelFamily::kOlmoe    ? OneOf(key, kOlmoeKeys)
                            : family == ModelFamily::kGlm4Moe  ? IsGlmKey(key)
                                                               : IsDeepseekKey(key);
    if (!OneOf(key, kIgnoredKeys) && !OneOf(key, kReadKeys) && !family_key) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: key \"", key, "\" is not understood by this build; refusing rather than guessing "
          "whether it changes the model's arithmetic"));
    }
  }
  auto at = [&](const char* key) -> const Json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* v = at("use_sliding_window"); v && *v != false) {
    return absl::InvalidArgumentError("config.json: use_sliding_window true is not supported: attention here is full");
  }
  if (const Json* v = at("clip_qkv")) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: clip_qkv ", v->dump(),
                                                   " is not supported (only null: no clipping)"));
  }
  if (const Json* v = at("layer_types")) {
    if (!v->is_array() || std::any_of(v->begin(), v->end(), [](const Json& t) { return t != "full_attention"; })) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types ", v->dump(),
                                                     " is not supported (only full_attention layers)"));
    }
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null() && *it != "silu") {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_act ", it->dump(), " is not supported (silu)"));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (family == ModelFamily::kGlm4Moe && std::string(bias) == "attention_bias") continue;  // q/k/v biases
    if (auto it = j.find(bias); it != j.end() && !it->is_null() && *it != false) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", bias, " ", it->dump(),
                                                     " is not supported (projections without bias)"));
    }
  }
  // DeepSeek reads YaRN (deepseek_config.cc); the other families' attention has plain RoPE only.
  const bool deepseek = family == ModelFamily::kDeepseekV2 || family == ModelFamily::kDeepseekV3;
  for (const char* rope : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(rope);
    if (deepseek) continue;
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return TypeError(rope, "an object", *it);
    for (const auto& [k, v] : it->items()) {
      const bool default_type = (k == "rope_type" || k == "type") && v == "default";
      const bool partial = family == ModelFamily::kGlm4Moe && k == "partial_rotary_factor";
      if (!default_type && k != "rope_theta" && !partial) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: ", rope, ".", k, " ", v.dump(),
                                                       " is not supported (only default rotary embeddings)"));
      }
    }
  }
  return absl::OkStatus();
}

// transformers 5 writes the RoPE base under rope_parameters; both places must agree.
absl::Status ReadRopeParameters(const Json& j, double* rope_theta) {
  auto it = j.find("rope_parameters");
  if (it == j.end() || !it->is_object() || !it->contains("rope_theta")) return absl::OkStatus();
  double theta = 0;
  RETURN_IF_ERROR(ReadDouble(*it, "rope_theta", &theta));
  if (j.contains("rope_theta") && !j["rope_theta"].is_null() && theta != *rope_theta) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: rope_theta ", *rope_theta,
                                                   " and rope_parameters.rope_theta ", theta, " disagree"));
  }
  *rope_theta = theta;
  return absl::OkStatus();
}

// The checkpoint's dtype: "torch_dtype", or "dtype" as transformers 5 writes it (both must agree).
absl::Status ReadTorchDtype(const Json& j, DType* out) {
  std::optional<DType> dtype;
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) return TypeError(key, "a string", *it);
    auto dt = DTypeFromTorchName(it->get<std::string>());
    if (!dt.ok()) return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, ": ", dt.status().message()));
    if (dtype.has_value() && *dtype != *dt) {
      return absl::InvalidArgumentError("config.json: torch_dtype and dtype disagree");
    }
    dtype = *dt;
  }
  if (dtype.has_value()) *out = *dtype;
  return absl::OkStatus();
}

// A sliding window shorter than the context changes attention; this build attends to all of it.
// (Qwen configs carry a window that use_sliding_window, checked apart, leaves unused.)
absl::Status CheckSlidingWindow(const Json& j, int64_t context) {
  auto it = j.find("sliding_window");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  int64_t window = 0;
  RETURN_IF_ERROR(ReadInt(j, "sliding_window", false, &window));
  if (window < context) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: sliding_window ", window, " (shorter than the ",
                                                   context, "-token context) is not supported: attention here is full"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  RETURN_IF_ERROR(Positive("num_hidden_layers", num_hidden_layers));
  RETURN_IF_ERROR(Positive("num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(Positive("num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(Positive("head_dim", head_dim, 2));
  RETURN_IF_ERROR(Positive("num_local_experts", num_local_experts));
  RETURN_IF_ERROR(Positive("num_experts_per_tok", num_experts_per_tok));
  RETURN_IF_ERROR(Positive("vocab_size", vocab_size, kByteMinVocab));
  RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  RETURN_IF_ERROR(Positive("shared_expert_intermediate_size", shared_expert_intermediate_size, 0));
  if (num_dense_layers() > 0) RETURN_IF_ERROR(Positive("intermediate_size (the dense layers')", dense_intermediate_size));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: \"num_attention_heads\" (", num_attention_heads,
        ") must be a multiple of \"num_key_value_heads\" (", num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"head_dim\" must be even for rotary embeddings, got ", head_dim));
  }
  if (num_experts_per_tok > num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: \"num_experts_per_tok\" (", num_experts_per_tok,
        ") must not exceed \"num_local_experts\" (", num_local_experts, ")"));
  }
  if (!(rms_norm_eps > 0.0) || rms_norm_eps > 1e-1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"rms_norm_eps\" must be in (0, 0.1], got ", rms_norm_eps));
  }
  if (!(rope_theta > 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"rope_theta\" must be greater than 1, got ", rope_theta));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(absl::string_view json_text) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: top level must be an object");
  ASSIGN_OR_RETURN(const ModelFamily family, DetectFamily(j));
  RETURN_IF_ERROR(CheckUnsupported(j, family));
  ModelConfig c;
  c.family = family;
  const bool qwen = family == ModelFamily::kQwen2Moe || family == ModelFamily::kQwen3Moe;
  const bool deepseek = c.is_deepseek(), deepseek_moe = c.deepseek_moe();
  // Each family's names, and transformers' defaults for the keys it may leave out.
  const char* experts_key = family == ModelFamily::kMixtral ? "num_local_experts"
                            : deepseek_moe                  ? "n_routed_experts"
                            : qwen                          ? QwenExpertsKey(j)
                                                            : "num_experts";
  const char* inter_key = qwen || deepseek_moe ? "moe_intermediate_size" : "intermediate_size";
  c.rope_theta = family == ModelFamily::kMixtral ? 1e6 : 1e4;
  c.rms_norm_eps = qwen || deepseek ? 1e-6 : 1e-5;
  // Mixtral always renormalises; DeepseekV3Config defaults to it.
  c.norm_topk_prob = family == ModelFamily::kMixtral || family == ModelFamily::kDeepseekV3 ||
                     family == ModelFamily::kGlm4Moe;
  c.qkv_bias = family == ModelFamily::kQwen2Moe;
  c.qk_norm = family == ModelFamily::kQwen3Moe ? QkNorm::kPerHead
              : family == ModelFamily::kOlmoe  ? QkNorm::kWhole
                                               : QkNorm::kNone;
  RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c.hidden_size));
  RETURN_IF_ERROR(ReadInt(j, inter_key, true, &c.intermediate_size));
  RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c.num_hidden_layers));
  RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.num_key_value_heads));
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (family == ModelFamily::kQwen3Moe) c.head_dim = 128;  // Qwen3MoeConfig's default
  RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim));
  RETURN_IF_ERROR(ReadInt(j, experts_key, true, &c.num_local_experts));
  RETURN_IF_ERROR(ReadInt(j, "num_experts_per_tok", true, &c.num_experts_per_tok));
  RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta));
  RETURN_IF_ERROR(ReadRopeParameters(j, &c.rope_theta));
  RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c.vocab_size));
  RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c.max_position_embeddings));
  RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &c.norm_topk_prob));
  if (!deepseek_moe) {
    RETURN_IF_ERROR(ReadInt(j, "shared_expert_intermediate_size", family == ModelFamily::kQwen2Moe,
                            &c.shared_expert_intermediate_size));
  }
  RETURN_IF_ERROR(ReadBool(j, "qkv_bias", &c.qkv_bias));
  RETURN_IF_ERROR(ReadTorchDtype(j, &c.torch_dtype));
  if (deepseek) RETURN_IF_ERROR(ReadDeepseekConfig(j, &c));
  if (qwen) RETURN_IF_ERROR(ReadQwenConfig(j, &c));
  if (family == ModelFamily::kGlm4Moe) RETURN_IF_ERROR(ReadGlmConfig(j, &c));
  RETURN_IF_ERROR(ReadQuantizationConfig(j, &c.fp8_checkpoint));
  if (!qwen) RETURN_IF_ERROR(CheckSlidingWindow(j, c.max_position_embeddings));
  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto c = FromJson(text);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", c.status().message()));
  return c;
}

const char* ModelConfig::architecture() const {
  for (const FamilyName& f : kFamilies) {
    if (f.family == family) return f.architecture;
  }
  return "";
}

const char* ModelConfig::model_type() const {
  for (const FamilyName& f : kFamilies) {
    if (f.family == family) return f.model_type;
  }
  return "";
}

std::string ModelConfig::ToJson() const {
  const bool qwen = family == ModelFamily::kQwen2Moe || family == ModelFamily::kQwen3Moe;
  Json j;
  j["architectures"] = Json::array({architecture()});
  j["model_type"] = model_type();
  j["hidden_size"] = hidden_size;
  j[qwen || deepseek_moe() ? "moe_intermediate_size" : "intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j[family == ModelFamily::kMixtral ? "num_local_experts" : deepseek_moe() ? "n_routed_experts" : "num_experts"] =
      num_local_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["torch_dtype"] = std::string(DTypeTorchName(torch_dtype));
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["norm_topk_prob"] = norm_topk_prob;
  if (family == ModelFamily::kMixtral || family == ModelFamily::kQwen2Moe) {
    j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
  }
  if (family == ModelFamily::kQwen2Moe) j["qkv_bias"] = qkv_bias;
  if (qwen && num_dense_layers() > 0) WriteQwenConfig(*this, &j);
  if (deepseek_moe()) WriteDeepseekConfig(*this, &j);
  if (fp8_checkpoint) {
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}},
                                {"activation_scheme", "dynamic"}};
  }
  j["hidden_act"] = "silu";
  j["bos_token_id"] = kByteBos;
  j["eos_token_id"] = kByteEos;
  return j.dump(2) + "\n";
}

absl::StatusOr<ModelFamily> FamilyFromModelType(absl::string_view model_type) {
  for (const FamilyName& f : kFamilies) {
    if (model_type == f.model_type) return f.family;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown family \"", model_type,
                   "\" (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3 or glm4_moe)"));
}

}  // namespace moeserve
