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
  std::vector<float> logits;     // last stage, logits_to_host: its sub-steps' logit rows in order
  std::vector<int32_t> sampled;  // last stage, with sampling: their tokens
};

// A step for a worker: its sub-steps (one per micro-batch).
std::string EncodeRankStep(const std::vector<SubStep>& subs);
// The message that ends a worker's loop.
std::string EncodeShutdown();
// False for the shutdown message. A malformed message is INVALID_ARGUMENT naming the field.
absl::StatusOr<bool> DecodeRankStep(const std::string& bytes, std::vector<SubStep>* subs);

// A worker's answer: how its part went and, when it went well, what it produced.
std::string EncodeRankResult(const absl::Status& status, const RankStepResult& result);
// Returns the rank's own status (or INVALID_ARGUMENT for a malformed message).
absl::Status DecodeRankResult(const std::string& bytes, RankStepResult* result);

}  // namespace moeserve
