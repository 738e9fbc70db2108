// How rank 0 of a parallel layout hands the worker ranks their part of each step, and how a
// worker takes it and answers. Every worker runs the same loop (ParallelExecutor::WorkerLoop:
// take its sub-steps, run them, reply), whether it is a thread of this process or a process of
// an MPI job; only the channel differs:
//   - ThreadChannel: a mailbox per worker thread; the sub-steps are lent, not copied or
//     encoded. A failed step can be retried: the ranks' groups are reset.
//   - ProcessChannel: step and result messages (runner/rank_step.h) over MPI. A failed step
//     cannot be retried (a peer may be gone, or stuck in a collective): the job is lost. It
//     also carries the KV tiers' copies of the pieces a worker holds (runner/remote_kv.h).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/process_ranks.h"
#include "runner/rank_step.h"

namespace moeserve {

// A worker's next task, valid until its reply: a step's sub-steps, or (process ranks with KV
// tiers) a copy of KV pieces of its arena; neither once shut down.
struct WorkerTask {
  const std::vector<SubStep>* step = nullptr;
  const KvPieceOp* kv = nullptr;
  const ReplaceOp* replace = nullptr;  // process ranks re-placing experts (runner/expert_replacement.cc)
  bool shutdown() const { return step == nullptr && kv == nullptr && replace == nullptr; }
};

class StepChannel {
 public:
  virtual ~StepChannel() = default;

  // Rank 0's side. A step: Begin, Send to every worker, rank 0's own part, Receive from every
  // worker, End. `subs` must live until that worker's Receive returns.
  virtual void BeginStep() {}
  virtual absl::Status Send(int rank, const std::vector<SubStep>& subs) = 0;
  // The worker's result and status; a transport failure (a lost rank) is UNAVAILABLE.
  virtual absl::Status Receive(int rank, RankStepResult* result) = 0;
  virtual void EndStep() {}
  // Ends every worker's loop. Idempotent.
  virtual absl::Status Shutdown() = 0;

  // A worker's side: its next task, and its answers to a step and to a KV piece copy.
  virtual absl::StatusOr<WorkerTask> Next(int rank) = 0;
  virtual absl::Status Reply(int rank, const absl::Status& status, RankStepResult result) = 0;
  virtual absl::Status ReplyKv(int rank, const absl::Status& status, const std::string& data) = 0;
  virtual absl::Status ReplyReplace(int rank, const absl::Status& status, const ReplaceReply& reply) = 0;

  // Whether a failed step ends the layout (processes) or leaves it usable once its groups are
  // reset (threads).
  virtual bool failures_are_fatal() const = 0;
  // "rank 1", or a process rank's pid and host.
  virtual std::string DescribeRank(int rank) const = 0;
};

// The workers are threads of this process: ranks 1 .. num_ranks - 1.
class ThreadChannel final : public StepChannel {
 public:
  explicit ThreadChannel(int num_ranks) : boxes_(static_cast<size_t>(num_ranks)) {}
  absl::Status Send(int rank, const std::vector<SubStep>& subs) override;
  absl::Status Receive(int rank, RankStepResult* result) override;
  absl::Status Shutdown() override;
  absl::StatusOr<WorkerTask> Next(int rank) override;
  absl::Status Reply(int rank, const absl::Status& status, RankStepResult result) override;
  // In-process ranks' KV is reached directly (ParallelExecutor::BlockParts): never asked.
  absl::Status ReplyKv(int rank, const absl::Status&, const std::string&) override;
  // In-process ranks re-place experts from rank 0's thread: never asked.
  absl::Status ReplyReplace(int rank, const absl::Status&, const ReplaceReply&) override;
  bool failures_are_fatal() const override { return false; }
  std::string DescribeRank(int rank) const override;

 private:
  struct Box {
    const std::vector<SubStep>* step = nullptr;  // lent by Send until Receive
    bool taken = false;                          // the worker has it (Next)
    bool replied = false;
    absl::Status status;
    RankStepResult result;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Box> boxes_;
  bool shutdown_ = false;
};

// The workers are the processes of an MPI job; rank 0 marks each step for the job's step
// timeout (ProcessRanks::StepBegins).
class ProcessChannel final : public StepChannel {
 public:
  explicit ProcessChannel(ProcessRanks* world) : world_(world) {}
  void BeginStep() override { world_->StepBegins(); }
  absl::Status Send(int rank, const std::vector<SubStep>& subs) override;
  absl::Status Receive(int rank, RankStepResult* result) override;
  void EndStep() override { world_->StepEnds(); }
  absl::Status Shutdown() override;
  absl::StatusOr<WorkerTask> Next(int rank) override;
  absl::Status Reply(int rank, const absl::Status& status, RankStepResult result) override;
  absl::Status ReplyKv(int rank, const absl::Status& status, const std::string& data) override;
  absl::Status ReplyReplace(int rank, const absl::Status& status, const ReplaceReply& reply) override;
  bool failures_are_fatal() const override { return true; }
  std::string DescribeRank(int rank) const override { return world_->DescribeRank(rank); }

  // Rank 0's side of a KV piece copy (runner/remote_kv.h): Send to each worker concerned, then
  // Receive from each; a read's pieces come back in `data`.
  absl::Status SendKv(int rank, const KvPieceOp& op) { return world_->SendMessage(rank, EncodeKvPieceOp(op)); }
  absl::Status ReceiveKv(int rank, std::string* data);
  // Rank 0's side of a re-placement's phase: Send to every worker, then Receive from each: the
  // worker's own status in `status`; the return is the transport's (UNAVAILABLE: a lost rank).
  absl::Status SendReplace(int rank, const ReplaceOp& op) { return world_->SendMessage(rank, EncodeReplaceOp(op)); }
  absl::Status ReceiveReplace(int rank, absl::Status* status, ReplaceReply* reply);

 private:
  ProcessRanks* world_;
  std::vector<SubStep> received_;  // a worker's current task
  KvPieceOp received_kv_;
  ReplaceOp received_replace_;
  bool shut_down_ = false;
};

}  // namespace moeserve
