// One rank's part of a parallel step, and the wire format that carries it between rank 0 and a
// worker process (runner/parallel_executor.h under mpirun): rank 0 cuts the step into
// sub-steps per EP rank, sends each worker its own, and gets back its statistics and, from the
// last stage, its logit rows and sampled tokens. The format is private to one build: both ends
// are the same binary started by the same mpirun.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/moe_model.h"

namespace moeserve {

// One micro-batch of one EP rank: a sub-step and where its logit rows go in the step's output.
struct SubStep {
  ForwardInput in;
  std::vector<int64_t> logit_dest;  // global logit row of each local logit row
};

// What one rank did in a step.
struct RankStepResult {
  ForwardStats stats;
  int64_t a2a_bytes = 0;         // sent by this rank inside the MoE layers
  int64_t pp_bytes = 0;          // sent by this rank to the next stage
  double comm_seconds = 0;       // inside collectives and send/recv, waiting included
  // Whose steady clock stats.collective_spans read: MachineClockId() of the rank's machine.
  uint64_t clock_id = 0;
  std::vector<float> logits;     // last stage, logits_to_host: its sub-steps' logit rows in order
  std::vector<int32_t> sampled;  // last stage, with sampling: their tokens
};

// KV tiers under mpirun (runner/remote_kv.h): rank 0 reads or writes whole pieces of blocks
// of a worker's KV arena, before and after a step's transfer list.
struct KvPieceOp {
  bool write = false;
  std::vector<int32_t> blocks;  // blocks of the worker's arena
  std::string data;             // a write's pieces, in block order
};

// Re-placing experts under mpirun (ParallelExecutor::ReplaceExperts), one layer at a time:
// rank 0 has every worker stage the layer's experts its new holders give the worker's rank
// (kStage), then put them in use (kCommit) or drop them (kDrop), so that all switch or none does.
struct ReplaceOp {
  enum class Phase : uint8_t { kStage = 0, kCommit = 1, kDrop = 2 };
  Phase phase = Phase::kStage;
  int64_t layer = 0;                      // the layer re-placed (one at a time)
  std::vector<std::vector<int32_t>> row;  // kStage: its new holders, [expert] -> EP ranks
};
// A worker's answer to a ReplaceOp: its status and, for kStage, the experts it copied and
// their bytes; for kCommit, its weights' bytes after the switch.
struct ReplaceReply {
  int64_t experts = 0;
  double bytes = 0;
};
std::string EncodeReplaceOp(const ReplaceOp& op);
std::string EncodeReplaceReply(const absl::Status& status, const ReplaceReply& reply);
// Returns INVALID_ARGUMENT for a malformed message; the worker's own status goes to `status`.
absl::Status DecodeReplaceReply(const std::string& bytes, absl::Status* status, ReplaceReply* reply);

// A step for a worker: its sub-steps (one per micro-batch).
std::string EncodeRankStep(const std::vector<SubStep>& subs);

// This machine's steady clock, named: a hash of the kernel's boot id (the same for every process
// and network namespace of one boot; 0 where it cannot be read).
uint64_t MachineClockId();

// The step's expert-parallel exchanges from the last rank's arrival to the last rank's exit,
// summed over the calls of every stage (`stage[r]`, rank r's; the ranks of a stage make the same
// calls in order, their ForwardStats::collective_spans). A stage whose ranks logged different
// numbers of calls, or whose clocks are not one machine's (RankStepResult::clock_id differs or
// is unknown), is left out: 0 across real hosts.
double AfterLastArrival(const std::vector<int64_t>& stage, const std::vector<RankStepResult>& results);
std::string EncodeKvPieceOp(const KvPieceOp& op);
// The message that ends a worker's loop.
std::string EncodeShutdown();
// What a message asks a worker to do: a step (into `subs`), a KV piece copy (into `kv`), a
// re-placement's phase (into `replace`), or to stop. A malformed message is INVALID_ARGUMENT
// naming the field.
enum class WorkerMessage { kStep, kKvPieces, kReplace, kShutdown };
absl::StatusOr<WorkerMessage> DecodeWorkerMessage(const std::string& bytes, std::vector<SubStep>* subs,
                                                  KvPieceOp* kv, ReplaceOp* replace);

// A worker's answer: how its part went and, when it went well, what it produced.
std::string EncodeRankResult(const absl::Status& status, const RankStepResult& result);
// Returns the rank's own status (or INVALID_ARGUMENT for a malformed message).
absl::Status DecodeRankResult(const std::string& bytes, RankStepResult* result);
// A worker's answer to a KV piece copy: its status and, for a read, the pieces in block order.
std::string EncodeKvPieceReply(const absl::Status& status, const std::string& data);
absl::Status DecodeKvPieceReply(const std::string& bytes, std::string* data);

}  // namespace moeserve
