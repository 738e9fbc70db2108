// The routing of the last N engine steps (vLLM's EPLB window, --eplb-window): what re-placing
// experts while serving evens out (runner/expert_replacement.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/placement.h"

namespace moeserve {

class ExpertLoadWindow {
 public:
  // The counts of `steps` steps of a model of `layers` x `experts`, kept exactly (a ring of one
  // row per step). Refused where that ring would exceed kMaxBytes, with the flag's limit named.
  static absl::StatusOr<ExpertLoadWindow> Create(int64_t layers, int64_t experts, int64_t steps);
  static constexpr int64_t kMaxBytes = int64_t{256} << 20;

  // One step's tokens per (layer, expert), [layers x experts] (ForwardStats::layer_expert_rows);
  // empty: a step that routed nothing. The oldest step leaves once the window is full.
  void Add(const std::vector<int64_t>& step);
  // The window's tokens per (layer, expert).
  const ExpertLoad& load() const { return sum_; }
  int64_t steps_held() const { return held_; }
  int64_t capacity() const { return steps_; }

 private:
  ExpertLoadWindow() = default;
  int64_t steps_ = 0, held_ = 0, next_ = 0;
  std::vector<int32_t> ring_;  // [steps x layers x experts]
  ExpertLoad sum_;
};

}  // namespace moeserve
