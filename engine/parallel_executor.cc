// Parallel executor.
#include "engine/parallel_executor.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {
namespace {

// One micro-batch of one EP rank: a sub-step and where its logit rows go in the step's output.
struct SubStep {
  ForwardInput in;
  std::vector<int64_t> logit_dest;  // global logit row of each local logit row
};

}  // namespace

absl::Status ParallelConfig::Validate(const ModelConfig& c) const {
  if (ep < 1 || ep > c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("--ep must be in [1, ", c.num_local_experts,
                                                   "] (the model's experts), got ", ep));
  }
  if (pp < 1 || pp > c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--pp must be in [1, ", c.num_hidden_layers,
                                                   "] (the model's layers), got ", pp));
  }
  if (micro_batches < 0 || micro_batches > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--micro-batches must be in [0, 64], got ", micro_batches));
  }
  if (!nccl_devices.empty() && static_cast<int64_t>(nccl_devices.size()) != ep * pp) {
    return absl::InvalidArgumentError(absl::StrCat("parallel layout: ", nccl_devices.size(), " GPUs for ", ep * pp,
                                                   " NCCL ranks (--ep x --pp)"));
  }
  return absl::OkStatus();
}

std::string ParallelConfig::Name() const {
  return absl::StrCat("ep", ep, " pp", pp, placement == ExpertPlacement::kRoundRobin ? " round-robin" : "");
}

std::vector<int32_t> ExpertOwners(int64_t experts, int64_t ep, ExpertPlacement placement) {
  std::vector<int32_t> owner(experts);
  for (int64_t e = 0; e < experts; ++e) {
    owner[e] = static_cast<int32_t>(placement == ExpertPlacement::kRoundRobin ? e % ep : e * ep / experts);
  }
  return owner;
}

std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t s = 0; s < pp; ++s) {
    const int64_t n = layers / pp + (s < layers % pp ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ParallelExecutor>> ParallelExecutor::Create(const ParallelConfig& config,
                                                                           const ModelWeights* weights,
                                                                           Backend* weights_backend,
                                                                           const KvLayout& kv,
                                                                           const BackendFactory& backends) {
  if (weights->released()) {
    return absl::FailedPreconditionError("parallel layout: the weights to shard were released");
  }
  const ModelConfig& c = weights->config();
  RETURN_IF_ERROR(config.Validate(c));
  if (!backends) return absl::InvalidArgumentError("parallel layout: no backend factory for the ranks");
  std::unique_ptr<ParallelExecutor> x(new ParallelExecutor(config));
  x->weights_ = weights;
  x->stage_block_size_ = kv.block_size;
  const int64_t ep = config.ep, pp = config.pp, n = ep * pp;
  const auto stages = StageLayers(c.num_hidden_layers, pp);
  const std::vector<int32_t> owner = ExpertOwners(c.num_local_experts, ep, config.placement);
  // One group per stage (its EP ranks) and per EP index (its stages): NCCL over the ranks' GPUs,
  // or in-process; a group of one never communicates.
  auto make_group = [&](const std::vector<int64_t>& ranks) -> absl::StatusOr<std::unique_ptr<CommGroup>> {
    if (config.nccl_devices.empty() || ranks.size() == 1) return MakeLocalGroup(static_cast<int>(ranks.size()));
    std::vector<int> devices;
    for (int64_t r : ranks) devices.push_back(config.nccl_devices[r]);
    return MakeNcclGroup(devices);
  };
  for (int64_t s = 0; s < pp; ++s) {
    std::vector<int64_t> members;
    for (int64_t e = 0; e < ep; ++e) members.push_back(s * ep + e);
    ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> g, make_group(members));
    x->ep_comms_.push_back(std::move(g));
  }
  for (int64_t e = 0; e < ep; ++e) {
    std::vector<int64_t> members;
    for (int64_t s = 0; s < pp; ++s) members.push_back(s * ep + e);
    ASSIGN_OR_RETURN(std::unique_ptr<CommGroup> g, make_group(members));
    x->pp_comms_.push_back(std::move(g));
  }
  const double kv_token_bytes = static_cast<double>(2 * c.kv_dim()) * static_cast<double>(DTypeSize(kv.dtype));
  if (kv.num_blocks < ep) {
    return absl::InvalidArgumentError(absl::StrCat("--ep ", ep, " needs at least that many KV blocks, got ", kv.num_blocks));
  }
  // The segments of BlockPool(kv.num_blocks, ep): equal, the last one taking the remainder.
  const int64_t seg = kv.num_blocks / ep;
  for (int64_t e = 0; e < ep; ++e) x->segment_begin_.push_back(e * seg);
  x->segment_begin_.push_back(kv.num_blocks);
  for (int64_t s = 0; s < pp; ++s) {
    for (int64_t e = 0; e < ep; ++e) {
      Rank r;
      RankLayout& l = r.layout;
      l.rank = s * ep + e;
      l.stage = s;
      l.ep_rank = e;
      l.layer_begin = stages[s].first;
      l.layer_end = stages[s].second;
      for (int64_t ex = 0; ex < c.num_local_experts; ++ex) {
        if (owner[ex] == e) l.experts.push_back(static_cast<int32_t>(ex));
      }
      l.kv_bytes_per_token = kv_token_bytes * static_cast<double>(l.layer_end - l.layer_begin);
      r.backend = backends(static_cast<int>(l.rank), static_cast<int>(n));
      if (r.backend == nullptr) return absl::InternalError(absl::StrCat("no backend for rank ", l.rank));
      WeightShard ws{l.layer_begin, l.layer_end, l.experts};
      auto shard_weights = ModelWeights::Shard(*weights, weights_backend, ws, r.backend.get());
      if (!shard_weights.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat("rank ", l.rank, " (stage ", s, ", ep ", e, "): ",
                                                         shard_weights.status().message()));
      }
      r.weights = std::move(*shard_weights);
      l.weight_bytes = static_cast<double>(r.weights->total_bytes());
      r.ep = x->ep_comms_[s]->rank(static_cast<int>(e));
      r.pp = x->pp_comms_[e]->rank(static_cast<int>(s));
      ModelShard shard;
      shard.layer_begin = l.layer_begin;
      shard.layer_end = l.layer_end;
      shard.ep = r.ep;
      shard.expert_owner = owner;
      r.model = std::make_unique<MoeModel>(r.weights.get(), r.backend.get(), std::move(shard));
      x->layout_.push_back(l);
      x->ranks_.push_back(std::move(r));
    }
    // Each rank's KV arena: its stage's layers, its segment's blocks, on its own device.
    for (int64_t e = 0; e < ep; ++e) {
      KvLayout rank_kv = kv;
      rank_kv.num_layers = stages[s].second - stages[s].first;
      rank_kv.num_blocks = x->segment_begin_[e + 1] - x->segment_begin_[e];
      auto arena = KvStorage::Create(x->ranks_[s * ep + e].backend.get(), rank_kv);
      if (!arena.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("rank ", s * ep + e, " KV arena: ", arena.status().message()));
      }
      x->rank_kv_.push_back(std::move(*arena));
    }
  }
  x->workers_ = std::make_unique<RankWorkers>(static_cast<int>(x->ranks_.size()));
  return x;
}

size_t ParallelExecutor::kv_bytes() const {
  size_t b = 0;
  for (const auto& a : rank_kv_) b += a.bytes();
  return b;
}

void ParallelExecutor::BlockParts(int32_t block, std::vector<KvBlockPart>* parts) const {
  const int64_t ep = config_.ep;
  int64_t e = 0;
  while (e + 1 < ep && block >= segment_begin_[e + 1]) ++e;
  const int64_t local = block - segment_begin_[e];  // the arena numbers its segment from 0
  parts->clear();
  for (int64_t s = 0; s < config_.pp; ++s) {
    const size_t r = static_cast<size_t>(s * ep + e);
    const size_t bytes = rank_kv_[r].layout().BlockBytes();
    parts->push_back({ranks_[r].backend.get(), static_cast<uint8_t*>(rank_kv_[r].data()) + local * bytes, bytes});
  }
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
    std::string experts;
    for (size_t i = 0; i < l.experts.size(); ++i) absl::StrAppend(&experts, i ? "," : "", l.experts[i]);
    lines.push_back(absl::StrCat("rank ", l.rank, ": stage ", l.stage, " layers [", l.layer_begin, ", ", l.layer_end,
                                 ") ep ", l.ep_rank, " experts ", experts, " (", l.weight_bytes / 1e6, " MB weights)"));
  }
  return absl::StrJoin(lines, "\n");
}

absl::Status ParallelExecutor::Forward(const ForwardInput& in, const std::vector<uint64_t>& seq_ranks,
                                       std::vector<float>* logits, ForwardStats* stats, ParallelStepStats* pstats,
                                       std::vector<int32_t>* sampled) {
  const ModelConfig& c = weights_->config();
  const int64_t ep = config_.ep, pp = config_.pp;
  if (static_cast<int64_t>(seq_ranks.size()) != in.num_seqs) {
    return absl::InvalidArgumentError("parallel forward: one EP rank per sequence is needed");
  }
  const int64_t micro = pp == 1 ? 1 : (config_.micro_batches > 0 ? config_.micro_batches : pp);

  // Tokens of each sequence (the engine lays them out sequence by sequence).
  std::vector<std::vector<int64_t>> seq_tokens(in.num_seqs);
  for (int64_t i = 0; i < in.num_tokens(); ++i) seq_tokens[in.token_seq[i]].push_back(i);
  std::vector<int64_t> logit_of_token(in.num_tokens(), -1);
  for (size_t r = 0; r < in.logit_rows.size(); ++r) logit_of_token[in.logit_rows[r]] = static_cast<int64_t>(r);
  // Sequences of each EP rank, cut into micro-batches of consecutive sequences.
  std::vector<std::vector<int64_t>> rank_seqs(ep);
  for (int64_t j = 0; j < in.num_seqs; ++j) rank_seqs[seq_ranks[j] % ep].push_back(j);
  std::vector<std::vector<SubStep>> subs(ep, std::vector<SubStep>(micro));
  for (int64_t e = 0; e < ep; ++e) {
    const auto& seqs = rank_seqs[e];
    for (int64_t m = 0; m < micro; ++m) {
      const size_t from = seqs.size() * m / micro, to = seqs.size() * (m + 1) / micro;
      SubStep& sub = subs[e][m];
      sub.in.num_seqs = static_cast<int64_t>(to - from);
      sub.in.logits_to_host = in.logits_to_host;
      sub.in.max_blocks_per_seq = in.max_blocks_per_seq;
      const int64_t base = segment_begin_[e];  // the rank's arena numbers its segment from 0
      const int64_t bs = stage_block_size_;
      for (size_t q = from; q < to; ++q) {
        const int64_t j = seqs[q];
        // Blocks the sequence's tokens reach, translated; the engine's padding stays 0.
        const int64_t used = seq_tokens[j].empty() ? 0 : in.positions[seq_tokens[j].back()] / bs + 1;
        for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) {
          const int32_t id = in.block_tables[j * in.max_blocks_per_seq + b];
          sub.in.block_tables.push_back(b < used ? static_cast<int32_t>(id - base) : 0);
        }
        for (int64_t i : seq_tokens[j]) {
          if (logit_of_token[i] >= 0) {
            sub.in.logit_rows.push_back(static_cast<int32_t>(sub.in.token_ids.size()));
            sub.logit_dest.push_back(logit_of_token[i]);
            if (!in.sample.empty()) sub.in.sample.push_back(in.sample[logit_of_token[i]]);
          }
          sub.in.token_ids.push_back(in.token_ids[i]);
          sub.in.positions.push_back(in.positions[i]);
          sub.in.token_seq.push_back(static_cast<int32_t>(q - from));
          sub.in.slots.push_back(in.slots[i] - base * bs);
        }
      }
      // Checked before any rank starts, so that no rank fails halfway through a collective.
      if (sub.in.num_tokens() > 0) {
        for (int64_t s = 0; s < pp; ++s) {
          RETURN_IF_ERROR(ranks_[s * ep + e].model->Validate(sub.in, rank_kv_[s * ep + e].layout()));
        }
      }
    }
  }

  if (!in.sample.empty() && sampled == nullptr) {
    return absl::InvalidArgumentError("parallel forward: sampling specs but nowhere to put the tokens");
  }
  if (in.logits_to_host) {
    logits->assign(in.logit_rows.size() * static_cast<size_t>(c.vocab_size), 0.0f);
  } else {
    logits->clear();
  }
  if (sampled != nullptr) sampled->assign(in.sample.size(), -1);
  std::vector<ForwardStats> rank_stats(ranks_.size());
  std::vector<CommStats> ep_before(ranks_.size()), pp_before(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ep_before[r] = ranks_[r].ep->stats();
    pp_before[r] = ranks_[r].pp->stats();
  }
  std::vector<absl::Status> status(ranks_.size());
  auto run_rank = [&](size_t r) -> absl::Status {
    Rank& rank = ranks_[r];
    const int64_t s = rank.layout.stage, e = rank.layout.ep_rank;
    const int64_t h = c.hidden_size;
    std::vector<float> local_logits;
    std::vector<int32_t> local_sampled;
    const float* hidden_out = nullptr;
    for (int64_t m = 0; m < micro; ++m) {
      const SubStep& sub = subs[e][m];
      const int64_t t = sub.in.num_tokens();
      const int64_t hidden_bytes = t * h * static_cast<int64_t>(sizeof(float));
      if (s > 0) {  // the previous stage's hidden states, straight into this rank's device memory
        if (rank.hidden_in.bytes() < static_cast<size_t>(hidden_bytes)) {
          rank.hidden_in = DeviceBuffer();
          ASSIGN_OR_RETURN(rank.hidden_in, rank.backend->Allocate(static_cast<size_t>(hidden_bytes)));
        }
        RETURN_IF_ERROR(rank.pp->Recv(rank.hidden_in.data(), hidden_bytes, static_cast<int>(s - 1)));
      }
      ForwardStats fs;
      hidden_out = nullptr;
      if (t > 0 || ep > 1) {  // EP ranks without tokens still join the all-to-alls
        RETURN_IF_ERROR(rank.model->ForwardShard(sub.in, rank_kv_[r].layout(), rank_kv_[r].data(),
                                                 s > 0 ? rank.hidden_in.as<float>() : nullptr, &hidden_out,
                                                 &local_logits, &fs, &local_sampled));
      } else {
        local_logits.clear();
        local_sampled.clear();
      }
      ForwardStats& acc = rank_stats[r];
      acc.tokens += fs.tokens;
      acc.experts_hit += fs.experts_hit;
      acc.expert_assignments += fs.expert_assignments;
      acc.attention_seconds += fs.attention_seconds;
      acc.moe_seconds += fs.moe_seconds;
      acc.head_seconds += fs.head_seconds;
      acc.comm_seconds += fs.comm_seconds;
      acc.comm_bytes += fs.comm_bytes;
      if (!fs.expert_rows.empty()) {
        acc.expert_rows.resize(fs.expert_rows.size(), 0);
        for (size_t x = 0; x < fs.expert_rows.size(); ++x) acc.expert_rows[x] += fs.expert_rows[x];
      }
      if (s < pp - 1) {
        RETURN_IF_ERROR(rank.pp->Send(hidden_out, hidden_bytes, static_cast<int>(s + 1)));
      } else {
        for (size_t q = 0; q < sub.logit_dest.size(); ++q) {
          if (in.logits_to_host) {
            std::copy_n(local_logits.data() + q * c.vocab_size, c.vocab_size,
                        logits->data() + sub.logit_dest[q] * c.vocab_size);
          }
          if (!in.sample.empty()) (*sampled)[sub.logit_dest[q]] = local_sampled[q];
        }
      }
    }
    return absl::OkStatus();
  };
  // A rank that fails aborts its groups, so that its peers return instead of waiting for it;
  // their failures abort their other groups in turn, and every rank comes back.
  auto run_or_abort = [&](size_t r) {
    status[r] = run_rank(r);
    if (!status[r].ok()) {
      ranks_[r].ep->Abort();
      ranks_[r].pp->Abort();
    }
  };
  workers_->Run([&](int r) { run_or_abort(static_cast<size_t>(r)); });  // a barrier, not new threads
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (status[r].ok()) continue;
    // Every rank has returned: clear the groups (flags, barriers, stale hand-offs) for the next
    // step, and report the first failure that was not a consequence of another.
    for (auto& g : ep_comms_) RETURN_IF_ERROR(g->Reset());
    for (auto& g : pp_comms_) RETURN_IF_ERROR(g->Reset());
    for (size_t q = 0; q < ranks_.size(); ++q) {
      if (!status[q].ok() && status[q].code() != absl::StatusCode::kAborted) {
        return absl::Status(status[q].code(), absl::StrCat("rank ", q, ": ", status[q].message()));
      }
    }
    return status[r];
  }

  // Aggregate: work sums over ranks; phase times are the slowest rank's.
  ForwardStats total;
  ParallelStepStats ps;
  ps.expert_tokens.assign(c.num_local_experts, 0);
  std::vector<double> ep_rows(ep, 0.0);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const ForwardStats& f = rank_stats[r];
    total.tokens = std::max(total.tokens, f.tokens);
    total.experts_hit += f.experts_hit;
    total.expert_assignments += f.expert_assignments;
    total.attention_seconds = std::max(total.attention_seconds, f.attention_seconds);
    total.moe_seconds = std::max(total.moe_seconds, f.moe_seconds);
    total.head_seconds = std::max(total.head_seconds, f.head_seconds);
    for (size_t x = 0; x < f.expert_rows.size(); ++x) {
      ps.expert_tokens[x] += f.expert_rows[x];
      ep_rows[ranks_[r].layout.ep_rank] += static_cast<double>(f.expert_rows[x]);
    }
    const CommStats epc = ranks_[r].ep->stats(), ppc = ranks_[r].pp->stats();
    ps.a2a_bytes += epc.bytes_sent - ep_before[r].bytes_sent;
    ps.pp_bytes += ppc.bytes_sent - pp_before[r].bytes_sent;
    ps.comm_seconds = std::max(ps.comm_seconds, (epc.seconds - ep_before[r].seconds) + (ppc.seconds - pp_before[r].seconds));
  }
  ps.comm_bytes = ps.a2a_bytes + ps.pp_bytes;
  total.comm_seconds = ps.comm_seconds;
  total.comm_bytes = ps.comm_bytes;
  auto imbalance = [](const std::vector<double>& v) {
    double sum = 0, mx = 0;
    for (double x : v) {
      sum += x;
      mx = std::max(mx, x);
    }
    return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 0.0;
  };
  if (ep > 1) {
    ps.expert_imbalance = imbalance(std::vector<double>(ps.expert_tokens.begin(), ps.expert_tokens.end()));
    ps.rank_imbalance = imbalance(ep_rows);
    std::vector<double> ep_tokens(ep, 0.0);  // attention is data-parallel: each rank its own sequences
    for (int64_t e = 0; e < ep; ++e) {
      for (const SubStep& sub : subs[e]) ep_tokens[e] += static_cast<double>(sub.in.num_tokens());
    }
    ps.attention_imbalance = imbalance(ep_tokens);
  }
  if (stats != nullptr) *stats = total;
  if (pstats != nullptr) *pstats = std::move(ps);
  return absl::OkStatus();
}

}  // namespace moeserve
