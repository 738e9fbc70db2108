// Loads a model for serving: from a checkpoint directory (config.json + safetensors), from a
// built-in preset whose weights are generated in memory from a seed (the embedded default), or,
// with dummy weights, from any config.json with generated weights (vLLM's --load-format dummy):
// for measuring an architecture without its checkpoint.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/backend.h"
#include "text/model_tokenizer.h"
#include "models/model_weights.h"

namespace moeserve {

struct ModelSpec {
  std::string model_dir;  // when set, load this checkpoint
  std::string preset = "small";
  uint64_t seed = 0;
  std::optional<DType> dtype;  // storage dtype; default: the config's torch_dtype (f16 -> f32)
  // Generate the weights from `seed` for model_dir's config.json (or model_dir itself when it
  // names a JSON file) instead of reading safetensors.
  bool dummy_weights = false;
  // "fp8": store the linear layers' weights in FP8 with 128 x 128 block scales, quantizing a
  // bf16/f32 checkpoint at load (an FP8 checkpoint is FP8 already); "none": as stored.
  std::string quantization = "none";
  // vLLM's --skip-tokenizer-init: read no tokenizer files (ModelTokenizer::IdsOnly).
  bool skip_tokenizer_init = false;
};

// The model the main command runs when no model is named.
ModelSpec DefaultModelSpec();

// A one-line description, e.g. "preset small (seed 0)" or the directory.
std::string DescribeModelSpec(const ModelSpec& spec);

// With a shard (a rank of a parallel layout), only its tensors are read (ModelWeights::Load).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const ModelSpec& spec, Backend* backend,
                                                        const WeightShard& only = WeightShard());
// The config of the model `spec` names, without its weights (to check a layout before loading).
absl::StatusOr<ModelConfig> LoadModelConfig(const ModelSpec& spec);

// The tokenizer, EOS ids and chat template of the model `spec` names: a checkpoint directory's
// files (ModelTokenizer::FromDirectory), else the byte tokenizer (presets, a config.json alone).
absl::StatusOr<ModelTokenizer> LoadModelTokenizer(const ModelSpec& spec, int64_t model_vocab);

}  // namespace moeserve
