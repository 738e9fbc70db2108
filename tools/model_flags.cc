// Flags shared by several commands: the model to load, and integer lists.
#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/commands.h"

namespace moeserve::tools {

absl::StatusOr<std::vector<int64_t>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int64_t> v;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(part, &x) || x < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", part, "' is not an integer >= 1"));
    }
    v.push_back(x);
  }
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": the list is empty"));
  std::sort(v.begin(), v.end());
  return v;
}

void AddModelFlags(CLI::App* cmd, ModelSpec* spec, std::string* dtype_flag, std::string* load_format) {
  cmd->add_option("--model", spec->model_dir,
                  "Checkpoint directory (config.json + model.safetensors or a sharded index), or with "
                  "--load-format dummy a config.json alone. Default: the embedded model, preset 'small' "
                  "generated in memory from seed 0");
  cmd->add_option("--preset", spec->preset,
                  "Built-in model to generate in memory when --model is not given: " +
                      absl::StrJoin(PresetNames(), ", "))
      ->capture_default_str();
  cmd->add_option("--model-seed", spec->seed, "Seed of generated weights (a preset's, or --load-format dummy)")
      ->capture_default_str();
  cmd->add_option("--load-format", *load_format,
                  "auto: read --model's safetensors; dummy: generate random weights for --model's "
                  "config.json (a directory or the JSON file itself), to measure an architecture "
                  "without its checkpoint")
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype_flag,
                  "Weight storage dtype: f32 or bf16 (default: the checkpoint's torch_dtype); serve also takes "
                  "vLLM's spellings (auto, bfloat16, float16, half, float32, float)");
  cmd->add_option("--quantization,-q", spec->quantization,
                  "none, or fp8: the linear layers' weights stored as float8_e4m3fn with a scale per 128 x 128 "
                  "block, quantized at load (half the bytes of bf16 read per token; activations are not quantized). An "
                  "FP8 checkpoint (quantization_config fp8) is read as FP8 either way; embeddings and lm_head "
                  "stay bf16")
      ->capture_default_str();
}

absl::Status FinishModelSpec(const std::string& dtype_flag, const std::string& load_format, ModelSpec* spec) {
  if (load_format != "auto" && load_format != "dummy") {
    return absl::InvalidArgumentError(
        absl::StrCat("--load-format: \"", load_format, "\" is not one of auto, dummy"));
  }
  if (spec->quantization != "none" && spec->quantization != "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization: \"", spec->quantization, "\" is not one of none, fp8 (other methods are not implemented)"));
  }
  spec->dummy_weights = load_format == "dummy";
  if (spec->dummy_weights && spec->model_dir.empty()) {
    return absl::InvalidArgumentError("--load-format dummy needs --model (a checkpoint directory or a config.json)");
  }
  if (dtype_flag.empty()) return absl::OkStatus();
  auto dt = DTypeFromShortName(dtype_flag);
  if (!dt.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dt.status().message()));
  spec->dtype = *dt;
  return absl::OkStatus();
}

absl::Status ResolveKvDtype(const ModelSpec& model, std::string* kv_dtype) {
  if (*kv_dtype == "f32" || *kv_dtype == "bf16") return absl::OkStatus();
  if (*kv_dtype != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: \"", *kv_dtype, "\" is not one of auto, f32, bf16"));
  }
  DType computed = DType::kBF16;
  if (model.dtype) {
    computed = *model.dtype;
  } else {
    auto config = LoadModelConfig(model);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model.model_dir.empty() ? "--preset: " : "--model: ", config.status().message()));
    }
    computed = config->torch_dtype;
  }
  // f16 weights are kept in f32; FP8 ones (a checkpoint's, or --quantization fp8) compute in bf16.
  const bool fp8 = model.quantization == "fp8";
  *kv_dtype = !fp8 && (computed == DType::kF32 || computed == DType::kF16) ? "f32" : "bf16";
  return absl::OkStatus();
}

}  // namespace moeserve::tools
