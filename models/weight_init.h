// Deterministic random weights for a config, held in host memory: what `make-model` writes and
// what the embedded default model is built from. Every tensor's values depend only on the seed
// and its name, so generation order and thread count do not matter.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_pool.h"
#include "models/model_config.h"
#include "models/model_weights.h"
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
// making anything. Safe from several threads; different tensors are made in parallel.
class GeneratedTensors : public TensorSource {
 public:
  GeneratedTensors(const ModelConfig& config, uint64_t seed, DType dtype);
  const TensorView* Find(const std::string& name) const override;
  bool Has(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  // Makes these tensors now, on every thread of `pool` (a load then reads them one by one).
  void Make(const std::vector<std::string>& names, ThreadPool& pool) const;
  int64_t generated() const { return generated_.load(); }  // tensors made so far

 private:
  struct Entry {
    std::vector<int64_t> shape;
    mutable std::once_flag once;
    mutable std::unique_ptr<uint8_t[]> data;
    mutable TensorView view;  // valid once made
  };
  ModelConfig config_;
  uint64_t seed_;
  DType dtype_;
  std::map<std::string, Entry> entries_;  // fixed at construction: lookups need no lock
  std::vector<std::string> order_;
  mutable std::atomic<int64_t> generated_{0};
};

// The tensors ModelWeights::Load reads for `only` (its layers' tensors but the experts it does
// not hold; the embedding, final norm and lm_head where its stage needs them; with
// experts_only, its experts alone): what a load of a generated shard makes first, on every core
// (GeneratedTensors::Make).
absl::StatusOr<std::vector<std::string>> ShardTensorNames(const ModelConfig& c, const WeightShard& only);

// Scales chosen so activations stay well-conditioned through the layers (fan-in scaling, with
// residual projections divided by sqrt(2 * layers)) and logits vary enough that greedy decoding
// does not collapse onto one token. Values are uniform with the stated standard deviation.
std::unique_ptr<HostTensorSet> GenerateRandomWeights(const ModelConfig& config, uint64_t seed,
                                                     DType dtype, ThreadPool* pool = nullptr);

}  // namespace moeserve
