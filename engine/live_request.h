// A request the engine has accepted, as the loop thread holds it from intake to its final
// event: what was asked, where its tokens go, its sequence, its random stream and the times and
// shares of work its receipt reports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "core/clock.h"
#include "engine/logit_edits.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "engine/sequence.h"

namespace moeserve {

struct LiveRequest {
  GenerateRequest request;
  EventCallback callback;
  Sequence seq;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<LogitEditor> editor;  // penalties, logit_bias, min_tokens
  Clock::time_point submitted;
  std::optional<Clock::time_point> first_scheduled, first_token;
  int64_t steps = 0, batch_sum = 0;  // steps joined, and the sequences of those steps in all
  double device_seconds = 0.0;       // its share of those steps' time, which splits into:
  double prefill_device_seconds = 0.0, decode_device_seconds = 0.0, transfer_device_seconds = 0.0;
  double kv_gb_seconds = 0.0;        // its KV on the device over the steps it joined
  // Prompt logprobs computed so far (a recomputed prompt after preemption adds none twice);
  // they go out with the first token.
  std::vector<PromptLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
};

// The live request of a sequence id (the engine's map; every scheduled sequence has one).
using LiveLookup = std::function<LiveRequest&(uint64_t id)>;

}  // namespace moeserve
