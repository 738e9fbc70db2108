// Turns a scheduled step into the forward pass's input: a block-table row per sequence, the
// step's token ids, positions and KV slots, and a sampling spec (the request's next uniform
// draw) per sequence that samples. Logits come to the host only if a request wants logprobs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/clock.h"
#include "engine/live_request.h"
#include "engine/scheduler.h"
#include "models/moe_model.h"

namespace moeserve {

struct StepBatch {
  ForwardInput input;
  int64_t context_tokens = 0;       // sum over tokens of the context each attends to
};

// Also marks each request's first scheduled step (`now`) and draws its sampling uniforms.
StepBatch BuildBatch(const SchedulerOutput& out, int64_t block_size, const LiveLookup& live,
                     Clock::time_point now);

}  // namespace moeserve
