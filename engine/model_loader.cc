// Model loading.
#include "engine/model_loader.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "models/safetensors.h"
#include "models/weight_init.h"

namespace moeserve {

ModelSpec DefaultModelSpec() { return ModelSpec{"", "small", 0, std::nullopt, false}; }

std::string DescribeModelSpec(const ModelSpec& spec) {
  if (!spec.model_dir.empty() && spec.dummy_weights) {
    return absl::StrCat(spec.model_dir, " (dummy weights, seed ", spec.seed, ", generated in memory)");
  }
  if (!spec.model_dir.empty()) return spec.model_dir;
  return absl::StrCat("preset ", spec.preset, " (seed ", spec.seed, ", generated in memory)");
}

namespace {

// The storage dtype: --dtype, else the checkpoint's (f16 widened to f32); FP8 for the linear
// layers with --quantization fp8 (or a dummy model of an FP8 checkpoint's config).
DType StorageDType(const ModelConfig& config, const ModelSpec& spec) {
  if (spec.quantization == "fp8") return DType::kF8E4M3;
  return spec.dtype.value_or(config.torch_dtype == DType::kF16 ? DType::kF32 : config.torch_dtype);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> GenerateModel(ModelConfig config, const ModelSpec& spec,
                                                           Backend* backend, const WeightShard& only) {
  // Generated weights are plain: a config's fp8 quantization_config becomes FP8 storage.
  DType dtype = StorageDType(config, spec);
  if (config.fp8_checkpoint) dtype = DType::kF8E4M3;
  config.fp8_checkpoint = false;
  // FP8 is quantized at load from weights generated in the config's dtype (as make-model
  // --quantization fp8 writes them).
  const DType generated = dtype != DType::kF8E4M3         ? dtype
                          : config.torch_dtype == DType::kF16 ? DType::kF32
                                                              : config.torch_dtype;
  config.torch_dtype = generated;
  // Only what the load reads is made (a process rank's shard, or the experts a re-placement
  // moves: not the whole model), on every core before the load reads it tensor by tensor.
  const GeneratedTensors tensors(config, spec.seed, generated);
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ShardTensorNames(config, only));
  ThreadPool pool(0);
  tensors.Make(names, pool);
  return ModelWeights::Load(config, tensors, backend, dtype, only);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const ModelSpec& spec, Backend* backend,
                                                        const WeightShard& only) {
  if (spec.dummy_weights) {
    if (spec.model_dir.empty()) {
      return absl::InvalidArgumentError("--load-format dummy needs --model (a checkpoint directory or a config.json)");
    }
    const std::filesystem::path p(spec.model_dir);
    const std::string config_path =
        std::filesystem::is_directory(p) ? (p / "config.json").string() : p.string();
    auto config = ModelConfig::FromFile(config_path);
    if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat("--model: ", config.status().message()));
    return GenerateModel(std::move(*config), spec, backend, only);
  }
  if (!spec.model_dir.empty()) {
    if (std::filesystem::is_regular_file(spec.model_dir)) {
      return absl::InvalidArgumentError(absl::StrCat("--model: ", spec.model_dir,
                                                     " is a file; a checkpoint directory is expected (to run a "
                                                     "config.json alone with generated weights, add --load-format dummy)"));
    }
    const std::string config_path = (std::filesystem::path(spec.model_dir) / "config.json").string();
    ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(config_path));
    ASSIGN_OR_RETURN(auto checkpoint, SafetensorsCheckpoint::Open(spec.model_dir));
    auto w = ModelWeights::Load(config, *checkpoint, backend, StorageDType(config, spec), only);
    if (!w.ok()) return absl::Status(w.status().code(), absl::StrCat(spec.model_dir, ": ", w.status().message()));
    if ((*w)->skipped_mtp_tensors() > 0 && !only.experts_only) {
      std::fprintf(stderr, "%s: skipped %lld tensors of %lld multi-token-prediction layer(s), which the forward does not use\n",
                   spec.model_dir.c_str(), static_cast<long long>((*w)->skipped_mtp_tensors()),
                   static_cast<long long>(config.num_nextn_predict_layers));
    }
    return w;
  }
  ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(spec.preset));
  return GenerateModel(std::move(config), spec, backend, only);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const ModelSpec& spec) {
  if (spec.model_dir.empty()) return PresetConfig(spec.preset);
  const std::filesystem::path p(spec.model_dir);
  return ModelConfig::FromFile(std::filesystem::is_directory(p) ? (p / "config.json").string() : p.string());
}

absl::StatusOr<ModelTokenizer> LoadModelTokenizer(const ModelSpec& spec, int64_t model_vocab) {
  if (spec.skip_tokenizer_init) return ModelTokenizer::IdsOnly(spec.model_dir, model_vocab);
  if (spec.model_dir.empty() || !std::filesystem::is_directory(spec.model_dir)) {
    return ModelTokenizer::Bytes();
  }
  return ModelTokenizer::FromDirectory(spec.model_dir, model_vocab);
}

}  // namespace moeserve
