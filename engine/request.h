// What a client asks of the engine and what it hears back.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

#include "core/clock.h"
#include "engine/sampling.h"
#include "engine/priority.h"

namespace moeserve {

// Most bad-word token sequences a request may carry (vLLM's VLLM_MAX_NUM_BAD_WORDS).
inline constexpr size_t kMaxBadWords = 128;
// Longest cache_salt (and tenant name) a request may carry.
inline constexpr size_t kMaxCacheSaltBytes = 256;

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  // Until this many tokens are generated, the stop tokens (stop_ids) cannot be sampled and the
  // front ends match no stop string (vLLM's min_tokens).
  int32_t min_tokens = 0;
  // vLLM's bad words, as token sequences: a sequence's last token is never sampled right after
  // the output ends with the tokens before it (a one-token word: never).
  std::vector<std::vector<int32_t>> bad_words;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
  Priority priority = Priority::kNormal;
  // vLLM's integer priority: within the lane, a lower value is scheduled earlier and preempted
  // later (ties by arrival).
  int32_t rank = 0;
  std::optional<Clock::time_point> deadline;
  // Log-probabilities, under the model's unmodified distribution: the chosen token's with
  // `logprobs`, and the `top_logprobs` most likely tokens' (which implies `logprobs`).
  bool logprobs = false;
  int32_t top_logprobs = 0;  // 0: none
  bool wants_logprobs() const { return logprobs || top_logprobs > 0; }
  // The prompt's own log-probabilities (vLLM's prompt_logprobs): -1 none; else each prompt token
  // after the first, with the `prompt_logprobs` most likely tokens at its position. The prompt
  // is then computed whole (no prefix-cache hit), as its logits are needed.
  int32_t prompt_logprobs = -1;
  // Keep the prompt's KV cached for this long after it is computed (0: ordinary LRU), as the
  // prompt caches of hosted APIs offer: retained blocks outlive eviction pressure in every tier
  // within its budget.
  double retain_seconds = 0;
  // The prefix cache's namespace: a request shares cached blocks (and learns of them through
  // usage.cached_prompt_tokens) only with requests of the same tenant and salt.
  std::string cache_tenant;  // who sent it (the API key's tenant); empty: the default tenant
  std::string cache_salt;    // the request's own salt (as vLLM's cache_salt); empty: none
};

enum class FinishReason { kLength, kStop, kCancelled, kDeadline, kError };
const char* FinishReasonName(FinishReason r);

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;        // from the prefix cache, any tier
  int64_t cached_prompt_tokens_ddr = 0;    // ... of which brought back from host DDR
  int64_t cached_prompt_tokens_flash = 0;  // ... and from flash
  int64_t completion_tokens = 0;
};

struct RequestTiming {
  double queue_seconds = 0.0;  // submission to first scheduled step
  double ttft_seconds = 0.0;   // submission to first token
  double tpot_seconds = 0.0;   // mean time per output token after the first
  double e2e_seconds = 0.0;
};

// What a request consumed: its share of every step it joined (each step's time split over the
// step's tokens), and what that share costs at the configured price.
struct RequestReceipt {
  double queue_seconds = 0.0;    // submission to first scheduled step
  double prefill_seconds = 0.0;  // first scheduled step to first token
  double decode_seconds = 0.0;   // first token to the end
  int64_t steps = 0;             // steps it took part in
  double mean_batch_size = 0.0;  // sequences per step, over those steps
  int64_t cached_tokens = 0;     // prompt tokens served from the prefix cache
  double device_seconds = 0.0;   // attributed share of step time
  double cost_usd = 0.0;         // device_seconds at the price per hour
  // device_seconds in parts: its prompt tokens' share of the compute, its decode tokens' share,
  // and the tier copies (DDR, flash) made for it. The parts add up to device_seconds.
  double prefill_device_seconds = 0.0, decode_device_seconds = 0.0, transfer_device_seconds = 0.0;
  // The KV it held on the device, GB x seconds over the steps it joined: memory rented with the
  // device, so already inside cost_usd (the price sheet's device tier prices it the same way).
  double kv_gb_seconds = 0.0;
};

// Streamed to the request's callback: one event per produced token, and a final one.
// One prompt token's log-probability, and the most likely tokens at its position.
struct PromptLogprob {
  float logprob = 0.0f;
  int32_t rank = 0;  // 1 + the tokens more likely than it
  std::vector<TokenLogprob> top;
};

struct RequestEvent {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;                    // new tokens (empty on a bare final event)
  // With the first token, when asked: prompt tokens 1..n-1 (the first has none).
  std::vector<PromptLogprob> prompt_logprobs;
  std::vector<float> token_logprobs;                // per new token: its own, when asked
  std::vector<std::vector<TokenLogprob>> logprobs;  // per new token: the top n (maybe none), when asked
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  std::string message;  // why, for cancelled / deadline / error
  // For kError: INTERNAL for a failed step, UNAVAILABLE when the engine lost a rank and stops.
  absl::StatusCode error_code = absl::StatusCode::kInternal;
  RequestUsage usage;
  RequestTiming timing;
  RequestReceipt receipt;
  int64_t preemptions = 0;
  int64_t swaps = 0;  // preemptions that swapped the KV out to DDR instead of recomputing
};

// Called on the engine thread; must not block or call back into the engine.
using EventCallback = std::function<void(const RequestEvent&)>;

}  // namespace moeserve
