#include "engine/expert_rebalancer.h"

#include "core/status.h"

namespace moeserve {

absl::StatusOr<std::unique_ptr<ExpertRebalancer>> ExpertRebalancer::Create(const ParallelConfig& p,
                                                                          const ModelConfig& c,
                                                                          ParallelExecutor* ranks) {
  if (ranks == nullptr || p.eplb_interval == 0) return nullptr;
  ASSIGN_OR_RETURN(ExpertLoadWindow w, ExpertLoadWindow::Create(c.num_hidden_layers, c.num_local_experts, p.eplb_window));
  return std::unique_ptr<ExpertRebalancer>(new ExpertRebalancer(std::move(w), p.eplb_interval, ranks));
}

std::optional<absl::StatusOr<ExpertReplacement>> ExpertRebalancer::Observe(const std::vector<int64_t>& routed) {
  window_.Add(routed);
  if (++steps_ % interval_ != 0) return std::nullopt;
  return ranks_->ReplaceExperts(window_.load());
}

}  // namespace moeserve
