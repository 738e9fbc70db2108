// quantization_config reading.
#include "models/quantization_config.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::Status ReadQuantizationConfig(const config_json::Json& j, bool* fp8) {
  using config_json::Json;
  *fp8 = false;
  const Json* q = config_json::Find(j, "quantization_config");
  if (q == nullptr) return absl::OkStatus();
  if (!q->is_object()) return config_json::TypeError("quantization_config", "an object", *q);
  auto refuse = [](const std::string& key, const Json& v, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: quantization_config.", key, " ", v.dump(), " is not supported (", why, ")"));
  };
  const Json* method = config_json::Find(*q, "quant_method");
  if (method == nullptr || *method != "fp8") {
    return refuse("quant_method", method ? *method : Json(), "this build reads FP8 block-scaled weights only");
  }
  for (const auto& [key, v] : q->items()) {
    if (key == "quant_method") continue;
    if (key == "fmt") {
      if (v != "e4m3") return refuse(key, v, "e4m3 only");
    } else if (key == "weight_block_size") {
      if (v != Json::array({128, 128})) return refuse(key, v, "[128, 128] only");
    } else if (key == "activation_scheme") {
      // Activations stay fp32 here; a dynamic scheme lets the serving engine pick, so no
      // checkpoint value is ignored. A static one carries activation scales this build lacks.
      if (v != "dynamic") return refuse(key, v, "dynamic only");
    } else if (key == "modules_to_not_convert" || key == "ignored_layers") {
      // Which layers stayed unquantized: read per tensor from the checkpoint (a weight is FP8
      // exactly when it is stored as F8_E4M3 with its scales).
      if (!v.is_null() && !v.is_array()) return config_json::TypeError(key, "a list", v);
    } else {
      return refuse(key, v, "not a key of the fp8 method this build reads");
    }
  }
  if (config_json::Find(*q, "weight_block_size") == nullptr) {
    return refuse("weight_block_size", Json(), "per-tensor FP8 is not implemented; [128, 128] blocks only");
  }
  *fp8 = true;
  return absl::OkStatus();
}

}  // namespace moeserve
