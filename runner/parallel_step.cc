// One parallel step: plan the ranks' sub-steps, run them (every worker rank through the same
// loop, fed by its step channel: threads of this process, or the processes of an MPI job),
// gather the outputs and the statistics.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "runner/parallel_executor.h"
#include "runner/remote_kv.h"

namespace moeserve {
namespace {

double Imbalance(const std::vector<double>& v) {
  double sum = 0, mx = 0;
  for (double x : v) {
    sum += x;
    mx = std::max(mx, x);
  }
  return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 0.0;
}

void Accumulate(const ForwardStats& fs, ForwardStats* acc) {
  acc->tokens += fs.tokens;
  acc->experts_hit += fs.experts_hit;
  acc->expert_assignments += fs.expert_assignments;
  acc->attention_seconds += fs.attention_seconds;
  acc->moe_seconds += fs.moe_seconds;
  acc->head_seconds += fs.head_seconds;
  acc->comm_seconds += fs.comm_seconds;
  acc->comm_bytes += fs.comm_bytes;
  acc->comm_bytes_outside += fs.comm_bytes_outside;
  acc->collective_spans.insert(acc->collective_spans.end(), fs.collective_spans.begin(), fs.collective_spans.end());
  if (!fs.expert_rows.empty()) {
    acc->expert_rows.resize(fs.expert_rows.size(), 0);
    for (size_t x = 0; x < fs.expert_rows.size(); ++x) acc->expert_rows[x] += fs.expert_rows[x];
  }
  if (!fs.layer_expert_rows.empty()) {
    acc->layer_expert_rows.resize(fs.layer_expert_rows.size(), 0);
    for (size_t x = 0; x < fs.layer_expert_rows.size(); ++x) acc->layer_expert_rows[x] += fs.layer_expert_rows[x];
  }
}

// Each MoE layer waits for its busiest EP rank: the busiest rank's rows (or experts hit) summed
// over the layers, over the mean rank's (1: even in every layer; 0 without rows). The ranks'
// rows summed over layers first would hide a layer's imbalance behind another's. With several
// micro-batches a rank's counts are the step's: an expert it computed in two of them is one hit.
struct RankImbalances {
  double rows = 0, hits = 0;
};
RankImbalances LayerRankImbalance(const std::vector<RankLayout>& layout, int64_t ep, int64_t experts,
                                  const std::vector<RankStepResult>& results) {
  std::map<int64_t, std::vector<std::pair<double, double>>> per_layer;  // layer -> (rows, hits) per EP rank
  for (size_t r = 0; r < results.size(); ++r) {
    const std::vector<int64_t>& f = results[r].stats.layer_expert_rows;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == 0) continue;
      auto& ranks = per_layer[static_cast<int64_t>(i) / experts];
      ranks.resize(static_cast<size_t>(ep), {0.0, 0.0});
      auto& [rows, hits] = ranks[static_cast<size_t>(layout[r].ep_rank)];
      rows += static_cast<double>(f[i]);
      hits += 1;
    }
  }
  double busiest_rows = 0, busiest_hits = 0, rows = 0, hits = 0;
  for (const auto& [layer, ranks] : per_layer) {
    double most_rows = 0, most_hits = 0;
    for (const auto& [r, h] : ranks) {
      rows += r, hits += h;
      most_rows = std::max(most_rows, r), most_hits = std::max(most_hits, h);
    }
    busiest_rows += most_rows, busiest_hits += most_hits;
  }
  const double n = static_cast<double>(ep);
  return {rows > 0 ? busiest_rows / (rows / n) : 0.0, hits > 0 ? busiest_hits / (hits / n) : 0.0};
}

}  // namespace

absl::Status ParallelExecutor::CheckStep(const StepParts& step) const {
  const size_t micro = static_cast<size_t>(cut_.micro_batches);
  if (step.parts.size() != static_cast<size_t>(config_.ep)) {
    return absl::InvalidArgumentError(absl::StrCat("parallel step: ", step.parts.size(), " parts for ep ", config_.ep));
  }
  RETURN_IF_ERROR(CheckLogitRows(step));
  for (int64_t e = 0; e < config_.ep; ++e) {
    if (step.parts[e].size() != micro) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel step: ", step.parts[e].size(), " micro-batches for EP rank ", e, ", expected ", micro));
    }
    // Checked before any rank starts, so that no rank fails halfway through a collective.
    // Process ranks are checked here by rank 0's model against the segment's layout (the
    // checks that depend on the stage are the same for every stage).
    for (const SubStep& sub : step.parts[e]) {
      if (sub.in.num_tokens() == 0) continue;
      for (const Rank& r : ranks_) {
        const RankLayout& l = r.layout;
        if (processes_ == nullptr && l.ep_rank != e) continue;
        RETURN_IF_ERROR(r.model->Validate(sub.in, SegmentLayout(e, l.layer_end - l.layer_begin)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParallelExecutor::RunRank(size_t i, const std::vector<SubStep>& subs,
                                       RankStepResult* out) {
  const ModelConfig& c = weights_->config();
  Rank& rank = ranks_[i];
  const int64_t s = rank.layout.stage, ep = config_.ep, pp = config_.pp;
  const CommStats ep_before = rank.ep->stats(), pp_before = rank.pp->stats();
  std::vector<float> local_logits;
  std::vector<int32_t> local_sampled;
  for (const SubStep& sub : subs) {
    const int64_t t = sub.in.num_tokens();
    const int64_t hidden_bytes = t * c.hidden_size * static_cast<int64_t>(sizeof(float));
    if (s > 0) {  // the previous stage's hidden states, straight into this rank's device memory
      if (rank.hidden_in.bytes() < static_cast<size_t>(hidden_bytes)) {
        rank.hidden_in = DeviceBuffer();
        ASSIGN_OR_RETURN(rank.hidden_in, rank.backend->Allocate(static_cast<size_t>(hidden_bytes)));
      }
      RETURN_IF_ERROR(rank.pp->Recv(rank.hidden_in.data(), hidden_bytes, static_cast<int>(s - 1)));
    }
    ForwardStats fs;
    const float* hidden_out = nullptr;
    local_logits.clear();
    local_sampled.clear();
    if (t > 0 || ep > 1) {  // EP ranks without tokens still join the all-to-alls
      RETURN_IF_ERROR(rank.model->ForwardShard(sub.in, rank_kv_[i].layout(), rank_kv_[i].data(),
                                               s > 0 ? rank.hidden_in.as<float>() : nullptr,
                                               &hidden_out, &local_logits, &fs, &local_sampled));
    }
    Accumulate(fs, &out->stats);
    if (s < pp - 1) {
      RETURN_IF_ERROR(rank.pp->Send(hidden_out, hidden_bytes, static_cast<int>(s + 1)));
    } else if (!sub.logit_dest.empty()) {
      if (sub.in.logits_to_host)
        out->logits.insert(out->logits.end(), local_logits.begin(), local_logits.end());
      if (!sub.in.sample.empty())
        out->sampled.insert(out->sampled.end(), local_sampled.begin(), local_sampled.end());
    }
  }
  const CommStats epc = rank.ep->stats(), ppc = rank.pp->stats();
  out->a2a_bytes = epc.bytes_sent - ep_before.bytes_sent;
  out->pp_bytes = ppc.bytes_sent - pp_before.bytes_sent;
  out->comm_seconds = (epc.seconds - ep_before.seconds) + (ppc.seconds - pp_before.seconds);
  out->clock_id = clock_id_;
  return absl::OkStatus();
}

absl::Status ParallelExecutor::RunPart(size_t i, const std::vector<SubStep>& subs, RankStepResult* out) {
  const size_t micro = static_cast<size_t>(cut_.micro_batches);
  absl::Status s = subs.size() == micro ? RunRank(i, subs, out)
                                        : absl::InvalidArgumentError(absl::StrCat(
                                              "step of ", subs.size(), " micro-batches, expected ", micro));
  // Where a failed step can be retried, the rank aborts its groups, so that its peers return
  // instead of waiting for it; their failures abort their other groups in turn.
  if (!s.ok() && !channel_->failures_are_fatal()) {
    ranks_[i].ep->Abort();
    ranks_[i].pp->Abort();
  }
  return s;
}

absl::Status ParallelExecutor::WorkerLoop(int rank, size_t local) {
  while (true) {
    ASSIGN_OR_RETURN(const WorkerTask task, channel_->Next(rank));
    if (task.shutdown()) return absl::OkStatus();
    if (task.replace != nullptr) {  // rank 0 re-places the experts (runner/expert_replacement.cc)
      ReplaceReply reply;
      const absl::Status s = ServeReplace(*task.replace, &reply);
      RETURN_IF_ERROR(channel_->ReplyReplace(rank, s, reply));
      continue;
    }
    if (task.kv != nullptr) {  // the KV tiers copy pieces of this rank's arena
      std::string data;
      const absl::Status s = ServeKvPieces(*task.kv, ranks_[local].backend.get(), rank_kv_[local], &data);
      RETURN_IF_ERROR(channel_->ReplyKv(rank, s, data));
      if (!s.ok()) return s;
      continue;
    }
    RankStepResult result;
    const absl::Status s = RunPart(local, *task.step, &result);
    RETURN_IF_ERROR(channel_->Reply(rank, s, std::move(result)));
    if (!s.ok() && channel_->failures_are_fatal()) return s;
  }
}

absl::Status ParallelExecutor::LoseStep(const absl::Status& s) {
  channel_->EndStep();  // the step is over: the step timeout no longer applies
  staged_.clear();      // a re-placement's copies, if one was under way
  staged_layer_ = -1;
  if (!lost_) lost_why_ = std::string(s.message());  // the first cause, for every later step
  lost_ = true;
  return absl::UnavailableError(absl::StrCat("parallel step: ", s.message()));
}

absl::Status ParallelExecutor::RunRanks(const std::vector<std::vector<SubStep>>& subs,
                                        std::vector<RankStepResult>* results) {
  const bool fatal = channel_->failures_are_fatal();
  const int n = static_cast<int>(layout_.size());
  auto subs_of = [&](int r) -> const std::vector<SubStep>& {
    return subs[static_cast<size_t>(layout_[static_cast<size_t>(r)].ep_rank)];
  };
  channel_->BeginStep();
  for (int r = 1; r < n; ++r) {
    if (absl::Status s = channel_->Send(r, subs_of(r)); !s.ok()) return LoseStep(s);
  }
  std::vector<absl::Status> status(static_cast<size_t>(n));
  status[0] = RunPart(0, subs_of(0), &(*results)[0]);  // rank 0's worker, called inline
  if (!status[0].ok() && fatal) {
    return LoseStep(absl::Status(status[0].code(), absl::StrCat(channel_->DescribeRank(0), ": ", status[0].message())));
  }
  for (int r = 1; r < n; ++r) {
    status[static_cast<size_t>(r)] = channel_->Receive(r, &(*results)[static_cast<size_t>(r)]);
    if (!status[static_cast<size_t>(r)].ok() && fatal) return LoseStep(status[static_cast<size_t>(r)]);
  }
  channel_->EndStep();
  for (size_t r = 0; r < status.size(); ++r) {
    if (status[r].ok()) continue;
    // Every rank has returned: clear the groups (flags, barriers, stale hand-offs) for the next
    // step, and report the first failure that was not a consequence of another.
    for (auto& g : ep_comms_) RETURN_IF_ERROR(g->Reset());
    for (auto& g : pp_comms_) RETURN_IF_ERROR(g->Reset());
    for (size_t q = 0; q < status.size(); ++q) {
      if (!status[q].ok() && status[q].code() != absl::StatusCode::kAborted) {
        return absl::Status(status[q].code(), absl::StrCat(channel_->DescribeRank(static_cast<int>(q)), ": ",
                                                           status[q].message()));
      }
    }
    return status[r];
  }
  return absl::OkStatus();
}

namespace {

using SubSteps = std::vector<std::vector<SubStep>>;  // [ep rank][micro-batch]

// The last stage's logit rows and tokens, into the step's order.
absl::Status GatherOutputs(const std::vector<RankLayout>& layout, int64_t last_stage, const StepParts& step,
                           const std::vector<RankStepResult>& results, int64_t vocab, std::vector<float>* logits,
                           std::vector<int32_t>* sampled) {
  const SubSteps& subs = step.parts;
  const size_t rows = static_cast<size_t>(step.num_logit_rows);
  if (step.logits_to_host) {
    logits->assign(rows * static_cast<size_t>(vocab), 0.0f);
  } else {
    logits->clear();
  }
  if (sampled != nullptr) sampled->assign(step.sampling ? rows : 0, -1);
  for (size_t r = 0; r < layout.size(); ++r) {
    if (layout[r].stage != last_stage) continue;
    const RankStepResult& res = results[r];
    const std::vector<SubStep>& mine = subs[static_cast<size_t>(layout[r].ep_rank)];
    size_t q = 0;
    for (const SubStep& sub : mine) q += sub.logit_dest.size();
    if ((step.logits_to_host && res.logits.size() != q * static_cast<size_t>(vocab)) ||
        (step.sampling && res.sampled.size() != q)) {
      return absl::InternalError(absl::StrCat("rank ", r, " returned ", res.logits.size() / vocab,
                                              " logit rows and ", res.sampled.size(), " tokens for ", q, " rows"));
    }
    q = 0;
    for (const SubStep& sub : mine) {
      for (int64_t dest : sub.logit_dest) {
        if (step.logits_to_host) std::copy_n(res.logits.data() + q * vocab, vocab, logits->data() + dest * vocab);
        if (step.sampling) (*sampled)[dest] = res.sampled[q];
        ++q;
      }
    }
  }
  return absl::OkStatus();
}

// The step's statistics: work sums over ranks; phase times are the slowest rank's. Ranks fill
// scale-up domains of `domain_size` (0: one) in rank order.
void AggregateStats(const std::vector<RankLayout>& layout, int64_t ep, int64_t experts, int64_t domain_size,
                    const SubSteps& subs, const std::vector<RankStepResult>& results, ForwardStats* stats,
                    ParallelStepStats* pstats) {
  ForwardStats total;
  ParallelStepStats ps;
  ps.expert_tokens.assign(experts, 0);
  for (size_t r = 0; r < results.size(); ++r) {
    const ForwardStats& f = results[r].stats;
    total.tokens = std::max(total.tokens, f.tokens);
    total.experts_hit += f.experts_hit;
    total.expert_assignments += f.expert_assignments;
    total.attention_seconds = std::max(total.attention_seconds, f.attention_seconds);
    total.moe_seconds = std::max(total.moe_seconds, f.moe_seconds);
    total.head_seconds = std::max(total.head_seconds, f.head_seconds);
    for (size_t x = 0; x < f.expert_rows.size() && x < ps.expert_tokens.size(); ++x) ps.expert_tokens[x] += f.expert_rows[x];
    if (!f.layer_expert_rows.empty()) {
      total.layer_expert_rows.resize(f.layer_expert_rows.size(), 0);
      for (size_t x = 0; x < f.layer_expert_rows.size(); ++x) total.layer_expert_rows[x] += f.layer_expert_rows[x];
    }
    ps.a2a_bytes += results[r].a2a_bytes;
    ps.a2a_outside_bytes += f.comm_bytes_outside;
    // Rank r hands its stage's hidden states to rank r + ep, the same EP index one stage on.
    const int64_t rank = layout[r].rank;
    if (domain_size > 0 && rank / domain_size != (rank + ep) / domain_size) ps.pp_outside_bytes += results[r].pp_bytes;
    ps.pp_bytes += results[r].pp_bytes;
    ps.comm_seconds = std::max(ps.comm_seconds, results[r].comm_seconds);
    ps.comm_min_seconds = r == 0 ? results[r].comm_seconds : std::min(ps.comm_min_seconds, results[r].comm_seconds);
  }
  ps.comm_bytes = ps.a2a_bytes + ps.pp_bytes;
  std::vector<int64_t> stage_of_rank;
  for (const RankLayout& l : layout) stage_of_rank.push_back(l.stage);
  ps.comm_after_last_seconds = AfterLastArrival(stage_of_rank, results);
  total.comm_seconds = ps.comm_seconds;
  total.comm_bytes = ps.comm_bytes;
  total.comm_bytes_outside = ps.a2a_outside_bytes + ps.pp_outside_bytes;
  if (ep > 1) {
    ps.expert_imbalance = Imbalance(std::vector<double>(ps.expert_tokens.begin(), ps.expert_tokens.end()));
    const RankImbalances imb = LayerRankImbalance(layout, ep, experts, results);
    ps.rank_imbalance = imb.rows;
    ps.rank_hit_imbalance = imb.hits;
    std::vector<double> ep_tokens(ep, 0.0);  // attention is data-parallel: each rank its own sequences
    for (int64_t e = 0; e < ep; ++e) {
      for (const SubStep& sub : subs[e]) ep_tokens[e] += static_cast<double>(sub.in.num_tokens());
    }
    ps.attention_imbalance = Imbalance(ep_tokens);
  }
  if (stats != nullptr) *stats = total;
  if (pstats != nullptr) *pstats = std::move(ps);
}

}  // namespace

absl::Status ParallelExecutor::Forward(const ForwardInput& in, std::vector<float>* logits, ForwardStats* stats,
                                       ParallelStepStats* pstats, std::vector<int32_t>* sampled) {
  ASSIGN_OR_RETURN(const StepParts step, CutStep(in, cut_));
  return Run(step, logits, stats, pstats, sampled);
}

absl::Status ParallelExecutor::Run(const StepParts& step, std::vector<float>* logits, ForwardStats* stats,
                                   ParallelStepStats* pstats, std::vector<int32_t>* sampled) {
  const ModelConfig& c = weights_->config();
  if (lost_) return absl::UnavailableError(absl::StrCat("parallel step: a rank of this job was lost earlier (", lost_why_, ")"));
  if (processes_ != nullptr && processes_->rank() != 0) {
    return absl::FailedPreconditionError(
        "parallel forward: only rank 0 drives the steps of an MPI job");
  }
  RETURN_IF_ERROR(CheckStep(step));
  const SubSteps& subs = step.parts;
  if (step.sampling && sampled == nullptr) {
    return absl::InvalidArgumentError(
        "parallel forward: sampling specs but nowhere to put the tokens");
  }
  // One result per rank of the layout (process ranks: the workers' come back as messages).
  std::vector<RankStepResult> results(layout_.size());
  RETURN_IF_ERROR(RunRanks(subs, &results));
  RETURN_IF_ERROR(GatherOutputs(layout_, config_.pp - 1, step, results, c.vocab_size, logits, sampled));
  AggregateStats(layout_, config_.ep, c.num_local_experts, config_.domain_size, subs, results, stats, pstats);
  return absl::OkStatus();
}

absl::Status ParallelExecutor::ServeSteps() {
  ProcessRanks* world = processes_;
  if (world == nullptr || world->rank() == 0) {
    return absl::FailedPreconditionError("ServeSteps runs on the worker processes of an MPI job");
  }
  return WorkerLoop(world->rank(), 0);
}

absl::Status ParallelExecutor::ShutdownWorkers() {
  ProcessRanks* world = processes_;
  if (channel_ == nullptr || (world != nullptr && world->rank() != 0) || lost_) return absl::OkStatus();
  return channel_->Shutdown();
}

}  // namespace moeserve
