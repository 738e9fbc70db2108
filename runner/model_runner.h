// Runs one step's forward pass: on the engine's own device, or on the ranks of a parallel
// layout. The engine builds the batch once and hands it to whichever runner it has.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runner/parallel_executor.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"

namespace moeserve {

struct RunnerOutput {
  std::vector<float>* logits = nullptr;     // [logit rows, vocab], when the input asks for them
  std::vector<int32_t>* sampled = nullptr;  // a token per logit row
  ForwardStats stats;
  ParallelStepStats parallel;  // zeros on one device
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // `seq_ranks`: the expert-parallel rank (pool segment) of each sequence of the batch.
  virtual absl::Status Execute(const ForwardInput& in, const std::vector<uint64_t>& seq_ranks,
                               RunnerOutput* out) = 0;
};

// The whole model on one device, over the engine's own KV cache.
class SingleDeviceRunner final : public ModelRunner {
 public:
  SingleDeviceRunner(MoeModel* model, KvStorage* kv) : model_(model), kv_(kv) {}
  absl::Status Execute(const ForwardInput& in, const std::vector<uint64_t>&,
                       RunnerOutput* out) override {
    return model_->Forward(in, kv_->layout(), kv_->data(), out->logits, &out->stats, out->sampled);
  }

 private:
  MoeModel* model_;
  KvStorage* kv_;
};

// The ranks of an --ep/--pp layout (runner/parallel_executor.h).
class ParallelRunner final : public ModelRunner {
 public:
  explicit ParallelRunner(ParallelExecutor* executor) : executor_(executor) {}
  absl::Status Execute(const ForwardInput& in, const std::vector<uint64_t>& seq_ranks,
                       RunnerOutput* out) override {
    return executor_->Forward(in, seq_ranks, out->logits, &out->stats, &out->parallel,
                              out->sampled);
  }

 private:
  ParallelExecutor* executor_;
};

}  // namespace moeserve
