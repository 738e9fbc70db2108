// Deterministic random weights for a config, held in host memory: what `make-model` writes and
// what the embedded default model is built from. Every tensor's values depend only on the seed
// and its name, so generation order and thread count do not matter.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_pool.h"
#include "models/model_config.h"
#include "models/safetensors.h"

namespace moeserve {

// Named tensors owned in host memory.
class HostTensorSet : public TensorSource {
 public:
  // Adds a zero-filled tensor and returns a pointer to its bytes.
  void* Add(const std::string& name, DType dtype, std::vector<int64_t> shape);
  const TensorView* Find(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  // Views in insertion order, for writing a checkpoint.
  std::vector<TensorView> Ordered() const;

 private:
  std::map<std::string, TensorView> views_;
  std::vector<std::string> order_;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;
};

// A config's random weights made one tensor at a time, when first found (the same values as
// GenerateRandomWeights): a shard of a large model (a process rank's, or the experts a
// re-placement moves) is generated without the rest of the model. Has() answers without
// generating. Safe to use from several threads.
class GeneratedTensors : public TensorSource {
 public:
  GeneratedTensors(const ModelConfig& config, uint64_t seed, DType dtype);
  const TensorView* Find(const std::string& name) const override;
  bool Has(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  int64_t generated() const;  // tensors made so far

 private:
  ModelConfig config_;
  uint64_t seed_;
  DType dtype_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::vector<std::string> order_;
  mutable std::mutex mu_;
  mutable HostTensorSet made_;  // under mu_; its views never move
};

// Scales chosen so activations stay well-conditioned through the layers (fan-in scaling, with
// residual projections divided by sqrt(2 * layers)) and logits vary enough that greedy decoding
// does not collapse onto one token. Values are uniform with the stated standard deviation.
std::unique_ptr<HostTensorSet> GenerateRandomWeights(const ModelConfig& config, uint64_t seed,
                                                     DType dtype, ThreadPool* pool = nullptr);

}  // namespace moeserve
