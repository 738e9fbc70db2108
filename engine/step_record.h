// What one engine step did, observed and predicted, kept in a bounded ring for stats and
// written to traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace moeserve {

struct StepRecord {
  int64_t step = 0;
  double start_seconds = 0.0;  // since the engine started
  double duration_seconds = 0.0;
  // Batch shape.
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t context_tokens = 0;  // sum of attended context lengths
  int64_t experts_hit = 0;
  int64_t preempted = 0;
  // Observed phase times.
  double schedule_seconds = 0.0;   // scheduling and building the batch
  double attention_seconds = 0.0;
  double moe_seconds = 0.0;
  double head_seconds = 0.0;       // embedding, final norm, lm_head, sampling (on the device)
  double sampling_seconds = 0.0;   // after the forward: tokens and logprobs into events, streaming
  double comm_seconds = 0.0;       // collective communication (0 on one rank), the slowest rank's
  double comm_min_seconds = 0.0;   // ... the rank that waited least (ParallelStepStats)
  double comm_after_last_seconds = 0.0;  // the EP exchanges once every rank had arrived
  double transfer_seconds = 0.0;   // KV moved between the device and the tiers (inside scheduling)
  // Parallel layouts: bytes actually sent between ranks (all-to-all and stage hand-offs), and
  // how unevenly the experts and the EP ranks were loaded (max over mean; 0 on one rank).
  int64_t comm_bytes_observed = 0;
  // ... of which crossed between scale-up domains (--domain-size): all-to-all and hand-offs.
  int64_t scale_out_bytes_observed = 0;
  std::vector<int64_t> expert_tokens;  // [experts] rows each expert computed, over layers (EP only)
  double expert_imbalance = 0.0;
  double rank_imbalance = 0.0;       // expert rows per EP rank, busiest per layer over the mean
  double attention_imbalance = 0.0;  // tokens per EP rank (where the sequences live)
  // Work of the step, from the cost model.
  double flops = 0.0;
  double weight_bytes = 0.0, kv_read_bytes = 0.0, kv_write_bytes = 0.0, comm_bytes = 0.0, transfer_bytes = 0.0;
  double scale_out_bytes = 0.0;  // of comm_bytes, across domains (the all-to-all's and stage hand-offs')
  // Predicted by the roofline of the configured hardware profile (0 when there is none).
  double predicted_compute_seconds = 0.0;
  double predicted_memory_seconds = 0.0;
  double predicted_comm_seconds = 0.0;
  double predicted_transfer_seconds = 0.0;
  double predicted_bound_seconds = 0.0;  // at the peaks
  double predicted_seconds = 0.0;        // with the profile's efficiencies (the bound if none)
  double observed_over_predicted() const {
    return predicted_seconds > 0 ? duration_seconds / predicted_seconds : 0.0;
  }
};

class StepRecorder {
 public:
  explicit StepRecorder(size_t capacity = 256) : capacity_(capacity) {}
  void Add(const StepRecord& r) {
    if (ring_.size() == capacity_) ring_.pop_front();
    ring_.push_back(r);
  }
  std::vector<StepRecord> Recent() const { return {ring_.begin(), ring_.end()}; }

 private:
  size_t capacity_;
  std::deque<StepRecord> ring_;
};

}  // namespace moeserve
