// config.json's quantization_config: FP8 block-scaled weights (DeepSeek-V3/R1, Kimi-K2,
// Qwen3-FP8) are read; every other method is refused by name.
#pragma once

#include "models/config_json.h"

namespace moeserve {

// Sets *fp8 when quantization_config is {quant_method: fp8, fmt: e4m3, weight_block_size:
// [128, 128], activation_scheme: dynamic}; leaves it false without the key.
absl::Status ReadQuantizationConfig(const config_json::Json& j, bool* fp8);

}  // namespace moeserve
