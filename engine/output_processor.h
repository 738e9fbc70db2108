// What a step's outputs do to its requests: each sequence's share of the step goes on its
// receipt, sampled tokens are appended and streamed (with logprobs when asked), and requests
// that hit a stop id or their length are named to be finished; and the final event of a request
// (usage, timing, receipt) when it ends.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "engine/live_request.h"
#include "engine/scheduler.h"

namespace moeserve {

// Adds each request's share of a step to its receipt. Of `step_seconds`, the tier copies made
// for a sequence (`transfer_seconds` in all, shared by blocks moved) go to that sequence; the
// rest, and copies made for no one (demotions), are shared by the step's tokens, a prompt
// token's share to prefill and a decode token's to decode. Each scheduled sequence also holds
// its blocks (of `block_bytes`) for the step.
void BookReceipts(const SchedulerOutput& out, int64_t num_seqs, double step_seconds, double transfer_seconds,
                  double block_bytes, const LiveLookup& live);

// Appends each sampling sequence's token (sampled[r] for its logit row r), streams it, and
// returns the requests that end with it (stop id or length), in batch order.
std::vector<std::pair<LiveRequest*, FinishReason>> ProcessOutputs(
    const SchedulerOutput& out, const std::vector<int32_t>& sampled,
    const std::vector<float>& logits, int64_t vocab, Clock::time_point now, const LiveLookup& live);

// The final event of a request: usage, timing, and its receipt priced at `price_per_hour`.
RequestEvent FinalEvent(const LiveRequest& live, FinishReason reason, const std::string& message,
                        double price_per_hour, Clock::time_point now);

}  // namespace moeserve
