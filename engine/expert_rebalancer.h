// Re-placing the experts while serving (vLLM's EPLB; --eplb-interval, --eplb-window): the
// engine hands every model step's routing to an ExpertRebalancer, which keeps the last window
// of it and, every interval steps, has the ranks re-place their experts for it
// (ParallelExecutor::ReplaceExperts).
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "parallel/expert_load_window.h"
#include "runner/parallel_executor.h"

namespace moeserve {

class ExpertRebalancer {
 public:
  // Null when `ranks` is null or the layout does not ask for it (eplb_interval 0).
  static absl::StatusOr<std::unique_ptr<ExpertRebalancer>> Create(const ParallelConfig& p, const ModelConfig& c,
                                                                  ParallelExecutor* ranks);

  // After each model step, with its tokens per (layer, expert) (ForwardStats::layer_expert_rows).
  // On every interval-th step, the re-placement: what it did, or its error (the placement is
  // then kept, and serving goes on).
  std::optional<absl::StatusOr<ExpertReplacement>> Observe(const std::vector<int64_t>& routed);
  int64_t window_steps() const { return window_.steps_held(); }

 private:
  ExpertRebalancer(ExpertLoadWindow window, int64_t interval, ParallelExecutor* ranks)
      : window_(std::move(window)), interval_(interval), ranks_(ranks) {}
  ExpertLoadWindow window_;
  int64_t interval_;
  int64_t steps_ = 0;
  ParallelExecutor* ranks_;
};

}  // namespace moeserve
