// The option fields of an OpenAI request that ParseCompletion (openai_protocol.h) reads after
// the prompt, max_tokens and sampling: stops, logprobs, echo and prompt_logprobs, token ids in
// and out, bad words, best_of and priority. Each names its field in its error.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "engine/request_validation.h"
#include "server/openai_protocol.h"

namespace moeserve::server {

// Stop strings (cut from the text) and stop token ids (the engine stops on them).
absl::Status ReadStops(const nlohmann::json& j, ParsedCompletion* p);
// The chosen token's logprob whenever logprobs are asked for; top-n alternatives on top (chat:
// top_logprobs, which needs logprobs true, as vLLM; completions: logprobs n, 0 the chosen only).
absl::Status ReadLogprobs(const nlohmann::json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p);
// prompt_logprobs, and echo (completions) with what it implies, as vLLM: echo with logprobs scores
// the prompt the same way; echo with max_tokens 0 answers with the prompt alone.
absl::Status ReadEcho(const nlohmann::json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p);
// return_token_ids and return_tokens_as_token_ids; without a tokenizer (--skip-tokenizer-init)
// there is no text: stop strings are refused, and logprobs need their tokens as ids.
absl::Status ReadTokenIdFields(const nlohmann::json& j, ParsedCompletion* p);
// bad_words as vLLM tokenizes them: each word (deduplicated, leading spaces stripped) alone, and
// with a leading space where that makes a different first token of the same length.
absl::Status ReadBadWords(const nlohmann::json& j, ParsedCompletion* p);
// best_of (completions): best_of candidates per prompt, the n best answered; their ranking needs
// each token's logprob, so the engine is asked for it whatever the client asked.
absl::Status ReadBestOf(const nlohmann::json& j, bool chat, ParsedCompletion* p);
// A lane name, or vLLM's integer priority: the normal lane, ordered within it by the integer
// (lower is earlier, as vLLM's priority scheduling).
absl::Status ReadPriority(const nlohmann::json& j, Priority* out, int32_t* rank);

}  // namespace moeserve::server
