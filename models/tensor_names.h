// The Hugging Face Mixtral tensor names and shapes a checkpoint must hold for a config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_config.h"

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
std::string Expert(int64_t layer, int64_t expert, const std::string& w);  // w1, w2 or w3
}  // namespace tensor_names

// Every tensor of the model in checkpoint order (lm_head omitted when embeddings are tied).
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

}  // namespace moeserve
