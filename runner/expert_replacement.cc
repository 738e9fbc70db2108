// ParallelExecutor::ReplaceExperts: re-placing the experts while serving (vLLM's EPLB).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "runner/parallel_executor.h"

namespace moeserve {
namespace {

// The busiest rank's tokens over the mean rank's, summed over the layers that routed any:
// RankImbalance's per-layer ratios weighted by each layer's tokens.
double Imbalance(const std::vector<double>& per_layer, const ExpertLoad& load) {
  double busiest = 0, mean = 0;
  for (int64_t l = 0; l < load.layers; ++l) {
    double tokens = 0;
    for (int64_t e = 0; e < load.experts; ++e) tokens += static_cast<double>(load.at(l, e));
    busiest += per_layer[static_cast<size_t>(l)] * tokens;
    mean += tokens;
  }
  return mean > 0 ? busiest / mean : 1.0;
}

}  // namespace

absl::StatusOr<ExpertReplacement> ParallelExecutor::ReplaceExperts(const ExpertLoad& load) {
  const Stopwatch watch;
  if (processes_ != nullptr) {
    return absl::FailedPreconditionError(
        "re-placing experts while serving: under mpirun each process would read its new experts from the "
        "checkpoint, which moeserve does not do; run the ranks as threads (without mpirun)");
  }
  const ModelConfig& c = weights_->config();
  if (load.layers != c.num_hidden_layers || load.experts != c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("re-placing experts: a load of ", load.layers, " layers x ",
                                                   load.experts, " experts for a model of ", c.num_hidden_layers,
                                                   " x ", c.num_local_experts));
  }
  const int64_t ep = config_.ep, domain = config_.EpDomainSize();
  const ExpertHolderTable best = ExpertHolders(c.num_hidden_layers, c.num_local_experts, ep, ExpertPlacement::kBalanced,
                                               &load, config_.expert_replicas, domain);
  const std::vector<double> now = RankImbalance(holders_, load, ep), then = RankImbalance(best, load, ep);
  ExpertReplacement r;
  ExpertHolderTable next = holders_;
  for (size_t l = 0; l < next.size(); ++l) {
    if (c.dense_layer(static_cast<int64_t>(l))) continue;  // no routed experts to move
    if (then[l] < now[l] * (1 - kEplbMinGain)) {  // only where the busiest rank gets lighter
      next[l] = best[l];
      ++r.layers_changed;
    }
  }
  r.imbalance_before = Imbalance(now, load);
  r.imbalance_after = Imbalance(RankImbalance(next, load, ep), load);
  if (r.layers_changed == 0) return r;
  // Every rank's new experts are copied first: a failed copy leaves all ranks as they were.
  std::vector<StagedExperts> staged;
  for (const Rank& rank : ranks_) {
    const RankLayout& l = rank.layout;
    const WeightShard ws{l.layer_begin, l.layer_end, ExpertsOfRank(next, l.ep_rank, l.layer_begin, l.layer_end)};
    auto s = rank.weights->StageExperts(*weights_, weights_backend_, ws, rank.backend.get());
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          absl::StrCat("re-placing experts, rank ", l.rank, ": ", s.status().message()));
    }
    r.experts_copied += static_cast<int64_t>(s->copies.size());
    r.bytes_copied += static_cast<double>(s->bytes);
    staged.push_back(std::move(*s));
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& rank = ranks_[i];
    RankLayout& l = rank.layout;
    rank.weights->CommitExperts(std::move(staged[i]));
    l.experts = ExpertsOfRank(next, l.ep_rank, l.layer_begin, l.layer_end);
    l.weight_bytes = static_cast<double>(rank.weights->total_bytes());
    layout_[static_cast<size_t>(l.rank)] = l;
    rank.model->SetExpertHolders(ExpertHolderTable(next.begin() + l.layer_begin, next.begin() + l.layer_end));
  }
  holders_ = std::move(next);
  traffic_ = ExpectedTraffic(holders_, &load, ep, domain);
  r.seconds = watch.Seconds();
  return r;
}

}  // namespace moeserve
