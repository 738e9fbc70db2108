// The Hugging Face tensor names and shapes a checkpoint of a config's family must hold.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "models/safetensors.h"

namespace moeserve {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;  // [out_features, in_features] for matrices
};

namespace tensor_names {
std::string Embed();
std::string FinalNorm();
std::string LmHead();
std::string Layer(int64_t layer, const std::string& suffix);  // model.layers.N.<suffix>
std::string Expert(int64_t layer, int64_t expert, const std::string& w);  // Mixtral's w1, w2, w3
// The family's names: Mixtral's block_sparse_moe.gate and experts.E.w1/w2/w3, the others'
// mlp.gate and mlp.experts.E.gate_proj/down_proj/up_proj (w1, w2, w3 here).
std::string Router(const ModelConfig& c, int64_t layer);
std::string Expert(const ModelConfig& c, int64_t layer, int64_t expert, const std::string& w);
}  // namespace tensor_names

// Every tensor of the model in checkpoint order (lm_head omitted when embeddings are tied).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Every expected tensor (`shapes`, by name) is in `source`, and every tensor of `source` is
// expected (an FP8 weight's scales and the multi-token-prediction layers aside): NOT_FOUND or
// INVALID_ARGUMENT naming the first that is not. Returns how many MTP tensors were skipped.
absl::StatusOr<int64_t> CheckCheckpointTensors(const ModelConfig& config, const TensorSource& source,
                                               const std::map<std::string, std::vector<int64_t>>& shapes);
// A dense layer's MLP: mlp.gate_proj, up_proj, down_proj of dense_intermediate_size.
void AddDenseMlpTensors(const ModelConfig& c, int64_t l, std::vector<ExpectedTensor>* out);

}  // namespace moeserve
