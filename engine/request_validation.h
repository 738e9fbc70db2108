// The one validator of a generation request, used by the engine's Submit, the gRPC service
// (and, when it exists, the HTTP API) and the offline tools: every field against the model and
// the limits, with a message that starts with the field's name as clients spell it and states
// the limit. A request that passes is never refused later for its fields (only for capacity:
// a full queue, a KV cache too small for it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/request.h"
#include "models/model_config.h"

namespace moeserve {

struct RequestLimits {
  int64_t max_tokens = 4096;          // largest max_tokens a request may ask (--max-tokens-limit)
  // Tokens a sequence may reach, prompt and output (--max-model-len, as vLLM's); 0: the model's
  // context. A request asking past it is refused.
  int64_t max_model_len = 0;
  int64_t default_max_tokens = 16;    // what an API that leaves max_tokens unset asks for
  double max_retain_seconds = 86400;  // largest retain_seconds (--max-retain-seconds)
  int32_t max_top_logprobs = 20;
  size_t max_cache_salt_bytes = kMaxCacheSaltBytes;

  absl::Status Validate() const;
  // The context a sequence may reach: max_model_len, or the model's max_position_embeddings.
  int64_t Context(const ModelConfig& c) const {
    return max_model_len > 0 && max_model_len < c.max_position_embeddings ? max_model_len : c.max_position_embeddings;
  }
};

// `prompt_field` names the prompt in messages ("text" or "token_ids" on the gRPC API).
absl::Status ValidateRequest(const GenerateRequest& r, const ModelConfig& config,
                             const RequestLimits& limits,
                             absl::string_view prompt_field = "prompt");

}  // namespace moeserve
