// Parallel executor.
#include "runner/parallel_executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/status.h"
#include "roofline/cost_model.h"
#include "runner/remote_kv.h"

namespace moeserve {

absl::Status ParallelConfig::Validate(const ModelConfig& c, int processes) const {
  if (ep < 1 || ep > c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("--ep must be in [1, ", c.num_local_experts,
                                                   "] (the model's experts), got ", ep));
  }
  if (pp < 1 || pp > c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--pp must be in [1, ", c.num_hidden_layers,
                                                   "] (the model's layers), got ", pp));
  }
  RETURN_IF_ERROR(roofline::CheckDomainSize(roofline::ParallelLayout{ep, pp, domain_size}, "--domain-size"));
  if (placement == ExpertPlacement::kBalanced) {
    if (expert_load == nullptr) {
      return absl::InvalidArgumentError("--expert-placement balanced needs --expert-load FILE (bench --expert-load-out)");
    }
    if (expert_load->layers != c.num_hidden_layers || expert_load->experts != c.num_local_experts) {
      return absl::InvalidArgumentError(absl::StrCat("--expert-load: recorded for ", expert_load->layers, " layers x ",
                                                     expert_load->experts, " experts, the model has ",
                                                     c.num_hidden_layers, " x ", c.num_local_experts));
    }
  }
  if (expert_replicas != 0) {
    const int64_t e = c.num_local_experts;
    if ((placement != ExpertPlacement::kBalanced && !(eplb_interval > 0 && placement == ExpertPlacement::kContiguous)) ||
        ep < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert-replicas copies the hottest experts of a recorded load: it needs --ep 2 or more and "
          "--expert-placement balanced --expert-load FILE (or --eplb-interval N); got --expert-replicas ",
          expert_replicas, " with --ep ", ep));
    }
    const int64_t most = MaxReplicas(e, ep, EpDomainSize());
    if (expert_replicas < 0 || expert_replicas > most || (e + expert_replicas) % ep != 0) {
      const std::string each = EpDomainSize() > 0 ? absl::StrCat("each expert in at most ", ep / EpDomainSize(),
                                                                 " domains of --domain-size ", domain_size, ", one copy each")
                                                  : absl::StrCat("each expert on at most --ep ", ep, " ranks");
      return absl::InvalidArgumentError(absl::StrCat("--expert-replicas must be in [1, ", most, "] (", each,
                                                     ") with the model's ", e,
                                                     " experts plus the replicas a multiple of --ep, got ", expert_replicas));
    }
  }
  RETURN_IF_ERROR(ValidateEplb());
  if (micro_batches < 0 || micro_batches > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--micro-batches must be in [0, 64], got ", micro_batches));
  }
  if (!nccl_devices.empty() && static_cast<int64_t>(nccl_devices.size()) != ep * pp) {
    return absl::InvalidArgumentError(absl::StrCat("parallel layout: ", nccl_devices.size(), " GPUs for ", ep * pp,
                                                   " NCCL ranks (--ep x --pp)"));
  }
  if (processes > 0 && processes != ep * pp) {
    return absl::InvalidArgumentError(absl::StrCat("mpirun started ", processes, " processes but --ep ", ep,
                                                   " x --pp ", pp, " is ", ep * pp, " ranks"));
  }
  return absl::OkStatus();
}

std::string ParallelConfig::Name() const {
  const char* how = placement == ExpertPlacement::kRoundRobin ? " round-robin"
                    : placement == ExpertPlacement::kBalanced ? " balanced"
                                                              : "";
  return absl::StrCat("ep", ep, " pp", pp, how,
                      expert_replicas > 0 ? absl::StrCat(" +", expert_replicas, " replicas") : "");
}

ExpertHolderTable ParallelConfig::Holders(const ModelConfig& model) const {
  if (expert_replicas > 0 && placement != ExpertPlacement::kBalanced) {
    // --eplb-interval without a recorded load: the copies start as the balanced placement of
    // even routing, until the first re-placement.
    const int64_t l = model.num_hidden_layers, e = model.num_local_experts;
    const ExpertLoad even{l, e, std::vector<int64_t>(static_cast<size_t>(l * e), 1)};
    return ExpertHolders(l, e, ep, ExpertPlacement::kBalanced, &even, expert_replicas, EpDomainSize());
  }
  return ExpertHolders(model.num_hidden_layers, model.num_local_experts, ep, placement, expert_load.get(),
                       expert_replicas, EpDomainSize());
}

WeightShard RankWeightShard(const ParallelConfig& config, const ModelConfig& model, int64_t rank) {
  const int64_t stage = rank / config.ep, ep_rank = rank % config.ep;
  const auto layers = StageLayers(model.num_hidden_layers, config.pp)[static_cast<size_t>(stage)];
  return WeightShard{layers.first, layers.second, ExpertsOfRank(config.Holders(model), ep_rank, layers.first, layers.second)};
}

void ParallelExecutor::PlanLayout(const ModelConfig& c) {
  const int64_t ep = config_.ep, pp = config_.pp;
  const auto stages = StageLayers(c.num_hidden_layers, pp);
  holders_ = config_.Holders(c);  // once: a balanced placement's search is not free
  traffic_ = ExpectedTraffic(holders_, config_.expert_load.get(), config_.ep, config_.EpDomainSize());
  // The segments of BlockPool(kv.num_blocks, ep): equal, the last one taking the remainder.
  const int64_t seg = kv_.num_blocks / ep;
  cut_.block_size = kv_.block_size;
  cut_.micro_batches = pp == 1 ? 1 : (config_.micro_batches > 0 ? config_.micro_batches : pp);
  for (int64_t e = 0; e < ep; ++e) cut_.segment_begin.push_back(e * seg);
  cut_.segment_begin.push_back(kv_.num_blocks);
  const double kv_token_bytes = static_cast<double>(c.KvElemsPerToken()) * static_cast<double>(DTypeSize(kv_.dtype));
  for (int64_t s = 0; s < pp; ++s) {
    for (int64_t e = 0; e < ep; ++e) {
      RankLayout l;
      l.rank = s * ep + e;
      l.stage = s;
      l.ep_rank = e;
      l.layer_begin = stages[s].first;
      l.layer_end = stages[s].second;
      l.experts = ExpertsOfRank(holders_, e, l.layer_begin, l.layer_end);
      l.kv_bytes_per_token = kv_token_bytes * static_cast<double>(l.layer_end - l.layer_begin);
      layout_.push_back(l);
    }
  }
}

absl::Status ParallelExecutor::JoinProcesses(Backend* weights_backend, const BackendFactory& backends) {
  // This process is one rank: its EP group (its stage's ranks, ordered by EP index) and its
  // pipeline (its EP index's stages), each one MPI communicator made by every process at once.
  ProcessRanks* world = processes_;
  const RankLayout mine = layout_[static_cast<size_t>(world->rank())];
  // With GPUs, NCCL between the processes' devices, bootstrapped over MPI.
  auto split = [&](int color, int key) {
    return config_.nccl_devices.empty()
               ? world->Split(color, key)
               : world->SplitNccl(color, key, config_.nccl_devices[static_cast<size_t>(world->rank())]);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> ep_group, split(static_cast<int>(mine.stage), static_cast<int>(mine.ep_rank)));
  ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> pp_group, split(static_cast<int>(mine.ep_rank), static_cast<int>(mine.stage)));
  ep_comms_.push_back(std::move(ep_group));
  pp_comms_.push_back(std::move(pp_group));
  RETURN_IF_ERROR(AddRank(mine, weights_backend, backends));
  // Every rank's weight bytes, for the layout rank 0 describes.
  ASSIGN_OR_RETURN(std::vector<double> bytes, world->AllGather(ranks_[0].layout.weight_bytes));
  for (size_t r = 0; r < bytes.size(); ++r) layout_[r].weight_bytes = bytes[r];
  auto channel = std::make_unique<ProcessChannel>(world);
  remote_kv_ = std::make_unique<RemoteKvPieces>(channel.get(), [this](const absl::Status& s) { (void)LoseStep(s); });
  channel_ = std::move(channel);
  return ChooseDispatchWire();
}

absl::Status ParallelExecutor::StartThreads(Backend* weights_backend, const BackendFactory& backends) {
  const int64_t ep = config_.ep, pp = config_.pp;
  // One group per stage (its EP ranks) and per EP index (its stages): NCCL over the ranks' GPUs,
  // or in-process; a group of one never communicates.
  auto make_group = [&](const std::vector<int64_t>& ranks) -> absl::StatusOr<std::unique_ptr<CommGroup>> {
    if (config_.nccl_devices.empty() || ranks.size() == 1) return MakeLocalGroup(static_cast<int>(ranks.size()));
    std::vector<int> devices;
    for (int64_t r : ranks) devices.push_back(config_.nccl_devices[r]);
    return MakeNcclGroup(devices);
  };
  for (int64_t s = 0; s < pp; ++s) {
    std::vector<int64_t> members;
    for (int64_t e = 0; e < ep; ++e) members.push_back(s * ep + e);
    ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> g, make_group(members));
    ep_comms_.push_back(std::move(g));
  }
  for (int64_t e = 0; e < ep; ++e) {
    std::vector<int64_t> members;
    for (int64_t s = 0; s < pp; ++s) members.push_back(s * ep + e);
    ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> g, make_group(members));
    pp_comms_.push_back(std::move(g));
  }
  for (const RankLayout& l : std::vector<RankLayout>(layout_)) RETURN_IF_ERROR(AddRank(l, weights_backend, backends));
  RETURN_IF_ERROR(ChooseDispatchWire());
  channel_ = std::make_unique<ThreadChannel>(static_cast<int>(ranks_.size()));
  for (int r = 1; r < static_cast<int>(ranks_.size()); ++r) {
    worker_threads_.emplace_back([this, r] { (void)WorkerLoop(r, static_cast<size_t>(r)); });
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParallelExecutor>> ParallelExecutor::Create(const ParallelConfig& config,
                                                                           const ModelWeights* weights,
                                                                           Backend* weights_backend,
                                                                           const KvLayout& kv,
                                                                           const BackendFactory& backends,
                                                                           ProcessRanks* processes,
                                                                           ExpertSource expert_source) {
  if (weights->released()) {
    return absl::FailedPreconditionError("parallel layout: the weights to shard were released");
  }
  const ModelConfig& c = weights->config();
  RETURN_IF_ERROR(config.Validate(c, processes != nullptr ? processes->size() : 0));
  if (!backends) return absl::InvalidArgumentError("parallel layout: no backend factory for the ranks");
  if (kv.num_blocks < config.ep) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep ", config.ep, " needs at least that many KV blocks, got ", kv.num_blocks));
  }
  std::unique_ptr<ParallelExecutor> x(new ParallelExecutor(config, processes));
  x->weights_ = weights;
  x->weights_backend_ = weights_backend;
  x->expert_source_ = std::move(expert_source);
  if (processes != nullptr && config.eplb_interval > 0 && !x->expert_source_) {
    return absl::InvalidArgumentError("--eplb-interval under mpirun: no source for the experts a re-placement moves");
  }
  x->kv_ = kv;
  x->PlanLayout(c);
  RETURN_IF_ERROR(processes != nullptr ? x->JoinProcesses(weights_backend, backends)
                                       : x->StartThreads(weights_backend, backends));
  return x;
}

absl::Status ParallelExecutor::ChooseDispatchWire() {
  // A rank's experts round their rows to bf16 if its backend does so for their dtype; a rank
  // without experts receives no rows.
  bool rounds = config_.ep > 1 && config_.bf16_dispatch;
  for (const Rank& r : ranks_) {
    for (int64_t l = r.layout.layer_begin; l < r.layout.layer_end && rounds; ++l) {
      for (const WeightRef& w : r.weights->layer(l).w13) {
        if (w.data == nullptr) continue;
        rounds = r.backend->RoundsActivationsToBf16(w.dtype);
        break;
      }
    }
  }
  if (processes_ != nullptr) {  // every process must send what the others expect
    ASSIGN_OR_RETURN(const std::vector<double> all, processes_->AllGather(rounds ? 1.0 : 0.0));
    for (double v : all) rounds = rounds && v != 0;
  }
  bf16_dispatch_ = rounds;
  for (Rank& r : ranks_) r.model->SetBf16Dispatch(rounds);
  return absl::OkStatus();
}

ParallelExecutor::~ParallelExecutor() {
  if (absl::Status s = ShutdownWorkers(); !s.ok()) {
    std::fprintf(stderr, "ending the worker ranks: %s\n", std::string(s.message()).c_str());
  }
  for (std::thread& t : worker_threads_) t.join();
}

KvLayout ParallelExecutor::SegmentLayout(int64_t ep_rank, int64_t layers) const {
  KvLayout l = kv_;
  l.num_layers = layers;
  l.num_blocks = cut_.segment_begin[ep_rank + 1] - cut_.segment_begin[ep_rank];
  return l;
}

absl::Status ParallelExecutor::AddRank(const RankLayout& layout, Backend* weights_backend,
                                       const BackendFactory& backends) {
  const int64_t n = config_.ep * config_.pp, s = layout.stage, e = layout.ep_rank;
  Rank r;
  r.layout = layout;
  r.backend = backends(static_cast<int>(layout.rank), static_cast<int>(n));
  if (r.backend == nullptr) return absl::InternalError(absl::StrCat("no backend for rank ", layout.rank));
  WeightShard ws{layout.layer_begin, layout.layer_end, layout.experts};
  auto shard_weights = ModelWeights::Shard(*weights_, weights_backend, ws, r.backend.get());
  if (!shard_weights.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", layout.rank, " (stage ", s, ", ep ", e, "): ", shard_weights.status().message()));
  }
  r.weights = std::move(*shard_weights);
  r.layout.weight_bytes = static_cast<double>(r.weights->total_bytes());
  layout_[static_cast<size_t>(layout.rank)].weight_bytes = r.layout.weight_bytes;
  // Process ranks hold one group of each kind; in-process ranks index theirs by stage / EP index.
  const bool processes = processes_ != nullptr;
  r.ep = ep_comms_[processes ? 0 : static_cast<size_t>(s)]->rank(static_cast<int>(e));
  r.pp = pp_comms_[processes ? 0 : static_cast<size_t>(e)]->rank(static_cast<int>(s));
  if (r.ep == nullptr || r.pp == nullptr) return absl::InternalError(absl::StrCat("rank ", layout.rank, ": no communicator"));
  ModelShard shard;
  shard.layer_begin = layout.layer_begin;
  shard.layer_end = layout.layer_end;
  shard.ep = r.ep;
  shard.expert_holders.assign(holders_.begin() + layout.layer_begin, holders_.begin() + layout.layer_end);
  shard.ep_domain_size = config_.EpDomainSize();
  r.model = std::make_unique<MoeModel>(r.weights.get(), r.backend.get(), std::move(shard));
  // Its KV arena: its stage's layers, its segment's blocks, on its own device.
  auto arena = KvStorage::Create(r.backend.get(), SegmentLayout(e, layout.layer_end - layout.layer_begin));
  if (!arena.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("rank ", layout.rank, " KV arena: ", arena.status().message()));
  }
  ranks_.push_back(std::move(r));
  rank_kv_.push_back(std::move(*arena));
  return absl::OkStatus();
}

size_t ParallelExecutor::kv_bytes() const {
  size_t b = 0;
  for (const auto& a : rank_kv_) b += a.bytes();
  return b;
}

void ParallelExecutor::BlockParts(int32_t block, std::vector<KvBlockPart>* parts) const {
  const int64_t ep = config_.ep, e = cut_.RankOf(block);
  const int32_t local = block - static_cast<int32_t>(cut_.segment_begin[e]);  // the arena numbers its segment from 0
  parts->clear();
  for (int64_t s = 0; s < config_.pp; ++s) {
    const int64_t r = s * ep + e;
    const int64_t held = HeldIndex(r);
    if (held < 0) {  // another process's arena
      const size_t bytes = SegmentLayout(e, layout_[r].layer_end - layout_[r].layer_begin).BlockBytes();
      parts->push_back({nullptr, nullptr, bytes, static_cast<int>(r), local});
      continue;
    }
    const KvStorage& arena = rank_kv_[static_cast<size_t>(held)];
    const size_t bytes = arena.layout().BlockBytes();
    parts->push_back({ranks_[held].backend.get(), static_cast<uint8_t*>(arena.data()) + local * bytes, bytes});
  }
}

int64_t ParallelExecutor::HeldIndex(int64_t rank) const {
  if (processes_ == nullptr) return rank;
  return rank == processes_->rank() ? 0 : -1;
}

absl::StatusOr<KvTierDevices> ParallelExecutor::TierDevices() {
  if (processes_ != nullptr && processes_->rank() != 0) {
    return absl::FailedPreconditionError("KV tiers are rank 0's: a worker process has none");
  }
  // A block's pieces are on the stages of its EP rank; under mpirun, rank 0 holds one of them
  // at most and reaches the others through the workers (remote_kv_).
  KvTierDevices d;
  d.layout = kv_;
  d.parts = [this](int32_t block, std::vector<KvBlockPart>* parts) { BlockParts(block, parts); };
  d.backends = backends();
  d.remote = remote_kv_.get();
  return d;
}

std::vector<Backend*> ParallelExecutor::backends() const {
  std::vector<Backend*> out;
  for (const Rank& r : ranks_) out.push_back(r.backend.get());
  return out;
}

std::vector<std::pair<size_t, size_t>> ParallelExecutor::device_bytes() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Rank& r : ranks_) out.emplace_back(r.backend->used_bytes(), r.backend->capacity_bytes());
  return out;
}

std::string ParallelExecutor::Describe() const {
  std::vector<std::string> lines;
  for (const RankLayout& l : layout_) {
    // The experts, as a list where every layer holds the same ones; else each run of layers
    // that holds the same ones (a balanced placement).
    std::string experts;
    for (size_t i = 0; i < l.experts.size(); ++i) {
      if (i > 0 && l.experts[i] == l.experts[i - 1]) continue;
      size_t j = i;
      while (j + 1 < l.experts.size() && l.experts[j + 1] == l.experts[i]) ++j;
      const int64_t first = l.layer_begin + static_cast<int64_t>(i), last = l.layer_begin + static_cast<int64_t>(j);
      if (i == 0 && j + 1 == l.experts.size()) {
        experts = absl::StrJoin(l.experts[i], ",");
        break;
      }
      absl::StrAppend(&experts, i ? "; " : "", first == last ? absl::StrCat("layer ", first) : absl::StrCat("layers ", first, "-", last),
                      ": ", absl::StrJoin(l.experts[i], ","));
    }
    lines.push_back(absl::StrCat("rank ", l.rank, ": stage ", l.stage, " layers [", l.layer_begin, ", ", l.layer_end,
                                 ") ep ", l.ep_rank, " experts ", experts, " (", l.weight_bytes / 1e6, " MB weights)"));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace moeserve
