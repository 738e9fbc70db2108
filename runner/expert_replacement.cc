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

absl::Status ParallelConfig::ValidateEplb(int processes) const {
  if (eplb_interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--eplb-interval must be >= 0 steps, got ", eplb_interval));
  }
  if (eplb_interval == 0) return absl::OkStatus();
  if (ep < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eplb-interval re-places experts over EP ranks: it needs --ep 2 or more, got --ep ", ep));
  }
  if (eplb_window < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--eplb-window must be >= 1 step, got ", eplb_window));
  }
  if (processes > 0) {
    return absl::InvalidArgumentError(
        "--eplb-interval under mpirun: a process would have to read the experts a re-placement gives it from the "
        "checkpoint, which moeserve does not do; run the EP ranks as threads (without mpirun)");
  }
  return absl::OkStatus();
}

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
  std::vector<int64_t> changed;  // the MoE layers where the busiest rank gets kEplbMinGain lighter
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (!c.dense_layer(l) && then[i] < now[i] * (1 - kEplbMinGain)) changed.push_back(l);
  }
  r.imbalance_before = r.imbalance_after = Imbalance(now, load);
  absl::Status failed;
  for (int64_t l : changed) {
    failed = SwitchLayer(l, best[static_cast<size_t>(l)], &r);
    if (!failed.ok()) break;
    ++r.layers_changed;
  }
  if (r.layers_changed > 0) {  // every rank's dispatch and layout follow the layers switched
    for (Rank& rank : ranks_) {
      RankLayout& l = rank.layout;
      l.experts = ExpertsOfRank(holders_, l.ep_rank, l.layer_begin, l.layer_end);
      l.weight_bytes = static_cast<double>(rank.weights->total_bytes());
      layout_[static_cast<size_t>(l.rank)] = l;
      rank.model->SetExpertHolders(ExpertHolderTable(holders_.begin() + l.layer_begin, holders_.begin() + l.layer_end));
    }
    traffic_ = ExpectedTraffic(holders_, &load, ep, domain);
    r.imbalance_after = Imbalance(RankImbalance(holders_, load, ep), load);
  }
  r.seconds = watch.Seconds();
  if (!failed.ok()) {
    return absl::Status(failed.code(), absl::StrCat("re-placing experts stopped after ", r.layers_changed, " of ",
                                                    changed.size(), " layers (each switched on every rank; the others "
                                                    "keep their placement): ", failed.message()));
  }
  return r;
}

absl::Status ParallelExecutor::SwitchLayer(int64_t layer, const std::vector<std::vector<int32_t>>& holders,
                                           ExpertReplacement* r) {
  ExpertHolderTable next = holders_;
  next[static_cast<size_t>(layer)] = holders;
  // Every rank of the layer's stage copies the layer's experts it gains first: a copy that fails
  // frees the others' (their StagedExperts) and leaves the layer as it was.
  std::vector<std::pair<size_t, StagedExperts>> staged;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& rank = ranks_[i];
    const RankLayout& l = rank.layout;
    if (layer < l.layer_begin || layer >= l.layer_end) continue;
    const WeightShard ws{layer, layer + 1, ExpertsOfRank(next, l.ep_rank, layer, layer + 1)};
    auto s = rank.weights->StageExperts(*weights_, weights_backend_, ws, rank.backend.get());
    if (!s.ok()) {
      return absl::Status(s.status().code(), absl::StrCat("layer ", layer, ", rank ", l.rank, ": ", s.status().message()));
    }
    r->experts_copied += static_cast<int64_t>(s->copies.size());
    r->bytes_copied += static_cast<double>(s->bytes);
    staged.emplace_back(i, std::move(*s));
  }
  for (auto& [i, s] : staged) ranks_[i].weights->CommitExperts(std::move(s));
  holders_ = std::move(next);
  return absl::OkStatus();
}

}  // namespace moeserve
