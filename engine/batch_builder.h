// Turns a scheduled step into the forward pass's input, in the parts the executor runs (one
// per EP rank and micro-batch; one on one device): a block-table row per sequence, the step's
// token ids, positions and KV slots, and a sampling spec (the request's next uniform draw) per
// sequence that samples. Logits come to the host only if a request wants logprobs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/clock.h"
#include "engine/live_request.h"
#include "engine/scheduler.h"
#include "models/moe_model.h"
#include "runner/step_parts.h"

namespace moeserve {

struct StepBatch {
  StepParts step;              // written in the executor's cut: each sequence in its rank's part
  int64_t context_tokens = 0;  // sum over tokens of the context each attends to
};

// Writes each scheduled sequence straight into its EP rank's sub-step (`cut`, the executor's).
// Also marks each request's first scheduled step (`now`) and draws its sampling uniforms.
absl::StatusOr<StepBatch> BuildBatch(const SchedulerOutput& out, const StepCut& cut, const LiveLookup& live,
                                     Clock::time_point now);

}  // namespace moeserve
