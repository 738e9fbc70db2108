// ParallelExecutor::ReplaceExperts: re-placing the experts while serving (vLLM's EPLB).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "runner/parallel_executor.h"
#include "runner/step_channel.h"

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

// Experts read again for a re-placement must be the bytes the job loaded at start (every
// rank's digests were shared then): else a host's copy of the checkpoint differs, or the files
// changed since, and the rank would compute something else.
absl::Status SameAsLoaded(const ModelWeights& read, const ModelWeights& loaded) {
  for (const auto& [key, digest] : read.tensor_digests()) {
    const auto it = loaded.tensor_digests().find(key);
    if (it == loaded.tensor_digests().end() || it->second != digest) {
      std::string name;  // the stacked tensors' names, NUL-terminated each
      for (char ch : key) name += ch == '\0' ? std::string(", ") : std::string(1, ch);
      if (name.size() >= 2) name.resize(name.size() - 2);
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's \"", name, "\" is not what the job loaded at start (the files changed, or this host's copy "
          "differs)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParallelConfig::ValidateEplb() const {
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
  return absl::OkStatus();
}

absl::StatusOr<ExpertReplacement> ParallelExecutor::ReplaceExperts(const ExpertLoad& load) {
  const Stopwatch watch;
  if (lost_) return absl::UnavailableError(absl::StrCat("re-placing experts: the job was lost: ", lost_why_));
  if (processes_ != nullptr && !expert_source_) {
    return absl::FailedPreconditionError("re-placing experts under mpirun: no source for the experts it moves");
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
    FollowHolders();
    traffic_ = ExpectedTraffic(holders_, &load, ep, domain);
    r.imbalance_after = Imbalance(RankImbalance(holders_, load, ep), load);
  }
  r.seconds = watch.Seconds();
  if (lost_) return failed;  // the job is lost (LoseStep's status): nothing more to say
  if (!failed.ok()) {
    return absl::Status(failed.code(), absl::StrCat("re-placing experts stopped after ", r.layers_changed, " of ",
                                                    changed.size(), " layers (each switched on every rank; the others "
                                                    "keep their placement): ", failed.message()));
  }
  return r;
}

absl::Status ParallelExecutor::SwitchLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row,
                                           ExpertReplacement* r) {
  const bool processes = processes_ != nullptr;
  ReplaceReply copied;
  absl::Status failed;
  if (processes) {
    channel_->BeginStep();  // the job's step timeout bounds a re-placement's waits as a step's
    RETURN_IF_ERROR(SendPhase({ReplaceOp::Phase::kStage, layer, row}));
  }
  if (absl::Status s = StageLayer(layer, row, &copied); !s.ok()) {  // while the workers stage theirs
    failed = processes ? absl::Status(s.code(), absl::StrCat(channel_->DescribeRank(0), ": ", s.message())) : s;
  }
  if (processes) {
    RETURN_IF_ERROR(ReceivePhase(&failed, &copied));
    absl::Status also;
    ReplaceReply none;
    RETURN_IF_ERROR(SendPhase({failed.ok() ? ReplaceOp::Phase::kCommit : ReplaceOp::Phase::kDrop, layer, {}}));
    RETURN_IF_ERROR(ReceivePhase(&also, &none, /*committed=*/failed.ok()));
    channel_->EndStep();
    if (!also.ok()) return LoseStep(also);  // a worker that could not follow: the ranks disagree
  }
  if (!failed.ok()) {
    staged_.clear();  // the copies are freed: the layer keeps its placement on every rank
    staged_layer_ = -1;
    return absl::Status(failed.code(), absl::StrCat("layer ", layer, ", ", failed.message()));
  }
  CommitLayer(layer, row);
  r->experts_copied += copied.experts;
  r->bytes_copied += copied.bytes;
  return absl::OkStatus();
}

absl::Status ParallelExecutor::StageLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row,
                                          ReplaceReply* reply) {
  staged_.clear();
  staged_layer_ = layer;
  staged_row_ = row;
  const ExpertHolderTable one{row};  // the layer's new holders, as a table of one layer
  // Thread ranks copy what they gain from the ranks of their stage that hold it now (the staging
  // copy of the weights is freed once the ranks hold their shards).
  std::vector<ModelWeights::ExpertOrigin> peers;
  for (const Rank& peer : ranks_) {
    if (processes_ == nullptr && layer >= peer.layout.layer_begin && layer < peer.layout.layer_end) {
      peers.push_back({peer.weights.get(), peer.backend.get()});
    }
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& rank = ranks_[i];
    const RankLayout& l = rank.layout;
    if (layer < l.layer_begin || layer >= l.layer_end) continue;
    const WeightShard ws{layer, layer + 1, ExpertsOfRank(one, l.ep_rank, 0, 1)};
    std::vector<ModelWeights::ExpertOrigin> sources = peers;
    std::unique_ptr<ModelWeights> read;  // a process holds only its shard: it reads what it gains
    if (processes_ != nullptr) {
      std::vector<int32_t> gained;
      for (int32_t e : ws.experts[0]) {
        if (rank.weights->layer(layer).w13[static_cast<size_t>(e)].data == nullptr) gained.push_back(e);
      }
      sources = {{rank.weights.get(), rank.backend.get()}};  // nothing gained: only experts to drop
      if (!gained.empty()) {
        if (!expert_source_) return absl::FailedPreconditionError("no source for the experts a re-placement moves");
        auto loaded = expert_source_(WeightShard{layer, layer + 1, {gained}, /*experts_only=*/true});
        if (!loaded.ok()) return loaded.status();
        read = std::move(*loaded);
        RETURN_IF_ERROR(SameAsLoaded(*read, *weights_));
        sources = {{read.get(), weights_backend_}};
      }
    }
    auto s = rank.weights->StageExperts(sources, ws, rank.backend.get());
    if (!s.ok()) {  // thread ranks are named here, process ranks by the channel
      return processes_ != nullptr ? s.status()
                                   : absl::Status(s.status().code(), absl::StrCat("rank ", l.rank, ": ", s.status().message()));
    }
    reply->experts += static_cast<int64_t>(s->copies.size());
    reply->bytes += static_cast<double>(s->bytes);
    staged_.emplace_back(i, std::move(*s));
  }
  return absl::OkStatus();
}

void ParallelExecutor::CommitLayer(int64_t layer, const std::vector<std::vector<int32_t>>& row) {
  for (auto& [i, s] : staged_) ranks_[i].weights->CommitExperts(std::move(s));
  staged_.clear();
  staged_layer_ = -1;
  holders_[static_cast<size_t>(layer)] = row;
}

void ParallelExecutor::FollowHolders() {
  for (RankLayout& l : layout_) l.experts = ExpertsOfRank(holders_, l.ep_rank, l.layer_begin, l.layer_end);
  for (Rank& rank : ranks_) {
    RankLayout& l = rank.layout;
    l.experts = layout_[static_cast<size_t>(l.rank)].experts;
    l.weight_bytes = static_cast<double>(rank.weights->total_bytes());
    layout_[static_cast<size_t>(l.rank)].weight_bytes = l.weight_bytes;
    rank.model->SetExpertHolders(ExpertHolderTable(holders_.begin() + l.layer_begin, holders_.begin() + l.layer_end));
  }
}

absl::Status ParallelExecutor::ServeReplace(const ReplaceOp& op, ReplaceReply* reply) {
  const ModelConfig& c = weights_->config();
  if (op.layer < 0 || op.layer >= c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("re-placement: layer ", op.layer, " of ", c.num_hidden_layers));
  }
  switch (op.phase) {
    case ReplaceOp::Phase::kStage: {
      if (c.dense_layer(op.layer)) {
        return absl::InvalidArgumentError(absl::StrCat("re-placement: layer ", op.layer, " has no routed experts"));
      }
      if (static_cast<int64_t>(op.row.size()) != c.num_local_experts) {
        return absl::InvalidArgumentError(absl::StrCat("re-placement: holders of ", op.row.size(), " experts, not ",
                                                       c.num_local_experts));
      }
      for (const std::vector<int32_t>& ranks : op.row) {
        for (int32_t q : ranks) {
          if (q < 0 || q >= config_.ep) return absl::InvalidArgumentError(absl::StrCat("re-placement: EP rank ", q));
        }
      }
      return StageLayer(op.layer, op.row, reply);
    }
    case ReplaceOp::Phase::kCommit: {
      if (staged_layer_ != op.layer) {
        return absl::FailedPreconditionError(absl::StrCat("re-placement: commit of layer ", op.layer, ", staged ",
                                                          staged_layer_));
      }
      CommitLayer(op.layer, staged_row_);
      FollowHolders();
      for (const Rank& rank : ranks_) reply->bytes += static_cast<double>(rank.weights->total_bytes());  // its weights now
      return absl::OkStatus();
    }
    case ReplaceOp::Phase::kDrop:
      staged_.clear();
      staged_layer_ = -1;
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("re-placement: unknown phase");
}

absl::Status ParallelExecutor::SendPhase(const ReplaceOp& op) {
  auto* channel = static_cast<ProcessChannel*>(channel_.get());
  for (int w = 1; w < static_cast<int>(layout_.size()); ++w) {
    if (absl::Status s = channel->SendReplace(w, op); !s.ok()) return LoseStep(s);
  }
  return absl::OkStatus();
}

absl::Status ParallelExecutor::ReceivePhase(absl::Status* failed, ReplaceReply* total, bool committed) {
  auto* channel = static_cast<ProcessChannel*>(channel_.get());
  for (int w = 1; w < static_cast<int>(layout_.size()); ++w) {
    absl::Status theirs;
    ReplaceReply reply;
    if (absl::Status s = channel->ReceiveReplace(w, &theirs, &reply); !s.ok()) return LoseStep(s);
    if (!theirs.ok() && failed->ok()) *failed = theirs;
    total->experts += reply.experts;
    total->bytes += reply.bytes;
    if (committed && theirs.ok()) layout_[static_cast<size_t>(w)].weight_bytes = reply.bytes;  // rank w's weights now
  }
  return absl::OkStatus();
}

}  // namespace moeserve
