// One parallel step: plan the ranks' sub-steps, run them (every worker rank through the same
// loop, fed by its step channel: threads of this process, or the processes of an MPI job),
// gather the outputs and the statistics.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "runner/parallel_executor.h"
#include "runner/remote_kv.h"

namespace moeserve {
namespace {

int64_t MicroBatches(const ParallelConfig& c) {
  return c.pp == 1 ? 1 : (c.micro_batches > 0 ? c.micro_batches : c.pp);
}

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
  if (!fs.expert_rows.empty()) {
    acc->expert_rows.resize(fs.expert_rows.size(), 0);
    for (size_t x = 0; x < fs.expert_rows.size(); ++x) acc->expert_rows[x] += fs.expert_rows[x];
  }
}

// The edits of logit row `from` (edits are row-ordered), renumbered as row `to` of `out`.
void MoveRowEdits(const std::vector<LogitEdit>& edits, int64_t from, int64_t to, std::vector<LogitEdit>* out) {
  auto lo = std::lower_bound(edits.begin(), edits.end(), from,
                             [](const LogitEdit& e, int64_t row) { return e.row < row; });
  for (; lo != edits.end() && lo->row == from; ++lo) {
    out->push_back(*lo);
    out->back().row = static_cast<int32_t>(to);
  }
}

}  // namespace

absl::StatusOr<std::vector<std::vector<SubStep>>> ParallelExecutor::PlanStep(const ForwardInput& in) {
  const int64_t ep = config_.ep, micro = MicroBatches(config_);
  if (in.num_seqs < 0 || static_cast<int64_t>(in.block_tables.size()) != in.num_seqs * in.max_blocks_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat("parallel forward: block_tables has ", in.block_tables.size(),
                                                   " entries, not num_seqs x max_blocks_per_seq = ", in.num_seqs,
                                                   " x ", in.max_blocks_per_seq));
  }
  // Tokens of each sequence (the engine lays them out sequence by sequence).
  std::vector<std::vector<int64_t>> seq_tokens(in.num_seqs);
  for (int64_t i = 0; i < in.num_tokens(); ++i) seq_tokens[in.token_seq[i]].push_back(i);
  std::vector<int64_t> logit_of_token(in.num_tokens(), -1);
  for (size_t r = 0; r < in.logit_rows.size(); ++r)
    logit_of_token[in.logit_rows[r]] = static_cast<int64_t>(r);
  // Sequences of each EP rank, cut into micro-batches of consecutive sequences.
  std::vector<std::vector<int64_t>> rank_seqs(ep);
  for (int64_t j = 0; j < in.num_seqs; ++j) {
    const int32_t first = in.max_blocks_per_seq > 0 ? in.block_tables[j * in.max_blocks_per_seq] : 0;
    rank_seqs[SegmentOf(first)].push_back(j);
  }
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
        const int64_t used =
            seq_tokens[j].empty() ? 0 : in.positions[seq_tokens[j].back()] / bs + 1;
        for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) {
          const int32_t id = in.block_tables[j * in.max_blocks_per_seq + b];
          if (b < used && (id < base || id >= segment_begin_[e + 1])) {
            return absl::InvalidArgumentError(absl::StrCat(
                "parallel forward: sequence ", j, " runs on EP rank ", e, " (its first block) but its block ", b,
                " is ", id, ", outside that rank's pool segment [", base, ", ", segment_begin_[e + 1], ")"));
          }
          sub.in.block_tables.push_back(b < used ? static_cast<int32_t>(id - base) : 0);
        }
        for (int64_t i : seq_tokens[j]) {
          if (logit_of_token[i] >= 0) {
            sub.in.logit_rows.push_back(static_cast<int32_t>(sub.in.token_ids.size()));
            sub.logit_dest.push_back(logit_of_token[i]);
            if (!in.sample.empty()) sub.in.sample.push_back(in.sample[logit_of_token[i]]);
            MoveRowEdits(in.logit_edits, logit_of_token[i], static_cast<int64_t>(sub.in.logit_rows.size()) - 1,
                         &sub.in.logit_edits);
          }
          sub.in.token_ids.push_back(in.token_ids[i]);
          sub.in.positions.push_back(in.positions[i]);
          sub.in.token_seq.push_back(static_cast<int32_t>(q - from));
          sub.in.slots.push_back(in.slots[i] - base * bs);
        }
      }
      // Checked before any rank starts, so that no rank fails halfway through a collective.
      // Process ranks are checked here by rank 0's model against the segment's layout (the
      // checks that depend on the stage are the same for every stage).
      if (sub.in.num_tokens() == 0) continue;
      for (size_t i = 0; i < ranks_.size(); ++i) {
        const RankLayout& l = ranks_[i].layout;
        if (processes_ == nullptr && l.ep_rank != e) continue;
        RETURN_IF_ERROR(
            ranks_[i].model->Validate(sub.in, SegmentLayout(e, l.layer_end - l.layer_begin)));
      }
    }
  }
  return subs;
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
  return absl::OkStatus();
}

absl::Status ParallelExecutor::RunPart(size_t i, const std::vector<SubStep>& subs, RankStepResult* out) {
  const size_t micro = static_cast<size_t>(MicroBatches(config_));
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
absl::Status GatherOutputs(const std::vector<RankLayout>& layout, int64_t last_stage, const SubSteps& subs,
                           const std::vector<RankStepResult>& results, const ForwardInput& in, int64_t vocab,
                           std::vector<float>* logits, std::vector<int32_t>* sampled) {
  if (in.logits_to_host) {
    logits->assign(in.logit_rows.size() * static_cast<size_t>(vocab), 0.0f);
  } else {
    logits->clear();
  }
  if (sampled != nullptr) sampled->assign(in.sample.size(), -1);
  for (size_t r = 0; r < layout.size(); ++r) {
    if (layout[r].stage != last_stage) continue;
    const RankStepResult& res = results[r];
    const std::vector<SubStep>& mine = subs[static_cast<size_t>(layout[r].ep_rank)];
    size_t q = 0;
    for (const SubStep& sub : mine) q += sub.logit_dest.size();
    if ((in.logits_to_host && res.logits.size() != q * static_cast<size_t>(vocab)) ||
        (!in.sample.empty() && res.sampled.size() != q)) {
      return absl::InternalError(absl::StrCat("rank ", r, " returned ", res.logits.size() / vocab,
                                              " logit rows and ", res.sampled.size(), " tokens for ", q, " rows"));
    }
    q = 0;
    for (const SubStep& sub : mine) {
      for (int64_t dest : sub.logit_dest) {
        if (in.logits_to_host) std::copy_n(res.logits.data() + q * vocab, vocab, logits->data() + dest * vocab);
        if (!in.sample.empty()) (*sampled)[dest] = res.sampled[q];
        ++q;
      }
    }
  }
  return absl::OkStatus();
}

// The step's statistics: work sums over ranks; phase times are the slowest rank's.
void AggregateStats(const std::vector<RankLayout>& layout, int64_t ep, int64_t experts, const SubSteps& subs,
                    const std::vector<RankStepResult>& results, ForwardStats* stats, ParallelStepStats* pstats) {
  ForwardStats total;
  ParallelStepStats ps;
  ps.expert_tokens.assign(experts, 0);
  std::vector<double> ep_rows(ep, 0.0);
  for (size_t r = 0; r < results.size(); ++r) {
    const ForwardStats& f = results[r].stats;
    total.tokens = std::max(total.tokens, f.tokens);
    total.experts_hit += f.experts_hit;
    total.expert_assignments += f.expert_assignments;
    total.attention_seconds = std::max(total.attention_seconds, f.attention_seconds);
    total.moe_seconds = std::max(total.moe_seconds, f.moe_seconds);
    total.head_seconds = std::max(total.head_seconds, f.head_seconds);
    for (size_t x = 0; x < f.expert_rows.size() && x < ps.expert_tokens.size(); ++x) {
      ps.expert_tokens[x] += f.expert_rows[x];
      ep_rows[layout[r].ep_rank] += static_cast<double>(f.expert_rows[x]);
    }
    ps.a2a_bytes += results[r].a2a_bytes;
    ps.pp_bytes += results[r].pp_bytes;
    ps.comm_seconds = std::max(ps.comm_seconds, results[r].comm_seconds);
    ps.comm_min_seconds = r == 0 ? results[r].comm_seconds : std::min(ps.comm_min_seconds, results[r].comm_seconds);
  }
  ps.comm_bytes = ps.a2a_bytes + ps.pp_bytes;
  total.comm_seconds = ps.comm_seconds;
  total.comm_bytes = ps.comm_bytes;
  if (ep > 1) {
    ps.expert_imbalance = Imbalance(std::vector<double>(ps.expert_tokens.begin(), ps.expert_tokens.end()));
    ps.rank_imbalance = Imbalance(ep_rows);
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
  const ModelConfig& c = weights_->config();
  if (lost_) return absl::UnavailableError(absl::StrCat("parallel step: a rank of this job was lost earlier (", lost_why_, ")"));
  if (processes_ != nullptr && processes_->rank() != 0) {
    return absl::FailedPreconditionError(
        "parallel forward: only rank 0 drives the steps of an MPI job");
  }
  ASSIGN_OR_RETURN(const SubSteps subs, PlanStep(in));
  if (!in.sample.empty() && sampled == nullptr) {
    return absl::InvalidArgumentError(
        "parallel forward: sampling specs but nowhere to put the tokens");
  }
  // One result per rank of the layout (process ranks: the workers' come back as messages).
  std::vector<RankStepResult> results(layout_.size());
  RETURN_IF_ERROR(RunRanks(subs, &results));
  RETURN_IF_ERROR(GatherOutputs(layout_, config_.pp - 1, subs, results, in, c.vocab_size, logits, sampled));
  AggregateStats(layout_, config_.ep, c.num_local_experts, subs, results, stats, pstats);
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
