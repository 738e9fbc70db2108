// What the engine runs its steps on, and all it sees of it: one device, or the ranks of an
// --ep/--pp layout (runner/parallel_executor.h). Execute a batch, say where a KV block's bytes
// are (for the tiers' copies), and whether it can still run (a lost rank process).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kvcache/kv_storage.h"
#include "kvcache/kv_tiers.h"
#include "models/moe_model.h"
#include "runner/step_parts.h"

namespace moeserve {

class ParallelExecutor;

// What the parallel part of one step did.
struct ParallelStepStats {
  double comm_seconds = 0;   // the slowest rank's time in collectives and send/recv
  // The least of the ranks' times there: the rank that waits least on the others, an upper
  // bound on the time the communication itself takes (comm_seconds adds the waits for the
  // slowest rank).
  double comm_min_seconds = 0;
  // The expert-parallel exchanges timed from the last rank's arrival to the last rank's exit,
  // summed over calls: what they cost once every rank is there (no waiting for a slower rank).
  double comm_after_last_seconds = 0;
  int64_t comm_bytes = 0;    // sent between ranks, all ranks (all-to-all and stage hand-offs)
  int64_t a2a_bytes = 0;     // ... of which all-to-all inside the MoE layers
  int64_t a2a_outside_bytes = 0;  // ... of that, to ranks of other scale-up domains (--domain-size)
  int64_t pp_bytes = 0;      // ... of which hidden states between stages
  int64_t pp_outside_bytes = 0;   // ... of that, to a stage in another domain
  std::vector<int64_t> expert_tokens;  // [experts] rows each expert computed, over layers
  double expert_imbalance = 0;  // max over mean of expert_tokens
  // Each MoE layer's busiest EP rank's rows, summed over layers, over the mean rank's
  // (LayerRankImbalance): what the layers waited for.
  double rank_imbalance = 0;
  double rank_hit_imbalance = 0;  // the same for the experts each rank computed (their weights read)
  double attention_imbalance = 0;  // max over mean of tokens per EP rank (its own sequences)
};

struct RunnerOutput {
  std::vector<float>* logits = nullptr;     // [logit rows, vocab], when the input asks for them
  std::vector<int32_t>* sampled = nullptr;  // a token per logit row
  ForwardStats stats;
  ParallelStepStats parallel;  // zeros on one device
};

class Executor {
 public:
  virtual ~Executor() = default;
  // How a step is written for it (the engine's batch builder writes each sequence into its
  // rank's sub-step): its EP ranks' pool segments and micro-batches; one part on one device.
  virtual const StepCut& cut() const = 0;
  // One step, written in cut()'s parts. The logits and tokens come back in the step's order
  // (the parts' logit_dest).
  virtual absl::Status Execute(const StepParts& step, RunnerOutput* out) = 0;
  // Where the KV tiers find each pool block's bytes (its pieces on the devices that hold it, and
  // under mpirun the workers' pieces, reached by messages). FAILED_PRECONDITION on a worker.
  virtual absl::StatusOr<KvTierDevices> TierDevices() = 0;
  // True once a rank of the layout is lost: no step can run again.
  virtual bool lost() const { return false; }
  // The --ep/--pp layout (to describe and measure it); null on one device.
  virtual const ParallelExecutor* parallel() const { return nullptr; }
};

// The whole model on one device, over the engine's own KV cache.
class SingleDeviceExecutor final : public Executor {
 public:
  SingleDeviceExecutor(MoeModel* model, KvStorage* kv, Backend* backend)
      : model_(model), kv_(kv), backend_(backend), cut_(StepCut::One(kv->layout().num_blocks, kv->layout().block_size)) {}
  const StepCut& cut() const override { return cut_; }
  // The cut's one sub-step, whose logit rows are the step's, in order.
  absl::Status Execute(const StepParts& step, RunnerOutput* out) override {
    if (step.parts.size() != 1 || step.parts[0].size() != 1) {
      return absl::InternalError("one device runs a step of one part");
    }
    const SubStep& sub = step.parts[0][0];
    if (static_cast<int64_t>(sub.logit_dest.size()) != step.num_logit_rows) {
      return absl::InternalError("one device's part lacks some of the step's logit rows");
    }
    for (size_t r = 0; r < sub.logit_dest.size(); ++r) {
      if (sub.logit_dest[r] != static_cast<int64_t>(r)) return absl::InternalError("one device's logit rows out of order");
    }
    return model_->Forward(sub.in, kv_->layout(), kv_->data(), out->logits, &out->stats, out->sampled);
  }
  absl::StatusOr<KvTierDevices> TierDevices() override { return KvTierDevices::Single(kv_, backend_); }

 private:
  MoeModel* model_;
  KvStorage* kv_;
  Backend* backend_;
  StepCut cut_;
};

}  // namespace moeserve
