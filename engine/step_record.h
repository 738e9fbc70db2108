// What one engine step did, kept in a bounded ring for stats and traces.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace moeserve {

struct StepRecord {
  int64_t step = 0;
  double start_seconds = 0.0;  // since the engine started
  double duration_seconds = 0.0;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t context_tokens = 0;  // sum of attended context lengths
  int64_t experts_hit = 0;
  int64_t preempted = 0;
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
