// Request validation.
#include "engine/request_validation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace moeserve {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

}  // namespace

absl::Status RequestLimits::Validate() const {
  if (max_tokens < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens-limit must be >= 1, got ", max_tokens));
  if (default_max_tokens < 1 || default_max_tokens > max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the default max_tokens must be in [1, ",
                                                   max_tokens, "], got ", default_max_tokens));
  }
  if (!(max_retain_seconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-retain-seconds must be >= 0, got ", max_retain_seconds));
  }
  if (max_model_len < 0 || max_model_len == 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-model-len must be >= 2 (or 0: the model's), got ", max_model_len));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const GenerateRequest& r, const ModelConfig& c,
                             const RequestLimits& limits, absl::string_view prompt_field) {
  if (r.prompt.empty()) return Invalid(prompt_field, "the prompt is empty");
  const int64_t context = limits.Context(c);
  const int64_t max_prompt = context - 1;
  if (static_cast<int64_t>(r.prompt.size()) > max_prompt) {
    return Invalid(prompt_field, absl::StrCat("the prompt has ", r.prompt.size(),
                                              " tokens; at most ", max_prompt, " fit the context"));
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size) {
      return Invalid(prompt_field,
                     absl::StrCat("token id ", r.prompt[i], " at index ", i,
                                  " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens) {
    return Invalid("max_tokens",
                   absl::StrCat("must be in [1, ", limits.max_tokens, "], got ", r.max_tokens));
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > context) {
    return Invalid("max_tokens", absl::StrCat("the prompt's ", r.prompt.size(), " tokens + max_tokens ", r.max_tokens,
                                              " exceed the model length of ", context,
                                              " (--max-model-len, or the model's max_position_embeddings)"));
  }
  if (absl::Status s = r.sampling.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", s.message()));
  }
  for (const auto& [token, bias] : r.sampling.logit_bias) {
    if (token < 0 || token >= c.vocab_size) {
      return Invalid("sampling.logit_bias",
                     absl::StrCat("token id ", token, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (r.bad_words.size() > kMaxBadWords) {
    return Invalid("bad_words", absl::StrCat("at most ", kMaxBadWords, " token sequences, got ", r.bad_words.size()));
  }
  for (const std::vector<int32_t>& word : r.bad_words) {
    if (word.empty()) return Invalid("bad_words", "a word of no tokens");
    for (int32_t id : word) {
      if (id < 0 || id >= c.vocab_size) {
        return Invalid("bad_words", absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  }
  if (r.min_tokens < 0 || r.min_tokens > r.max_tokens) {
    return Invalid("min_tokens", absl::StrCat("must be in [0, max_tokens = ", r.max_tokens, "], got ", r.min_tokens));
  }
  for (int32_t id : r.stop_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return Invalid(
          "stop_token_ids",
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > limits.max_top_logprobs) {
    return Invalid("prompt_logprobs", absl::StrCat("must be in [0, ", limits.max_top_logprobs, "] (or unset), got ",
                                                   r.prompt_logprobs));
  }
  if (r.top_logprobs < 0 || r.top_logprobs > limits.max_top_logprobs) {
    return Invalid("logprobs", absl::StrCat("must be in [0, ", limits.max_top_logprobs, "], got ",
                                            r.top_logprobs));
  }
  if (!(r.retain_seconds >= 0 && r.retain_seconds <= limits.max_retain_seconds)) {
    return Invalid("retain_seconds", absl::StrCat("must be in [0, ", limits.max_retain_seconds,
                                                  "], got ", r.retain_seconds));
  }
  if (r.cache_salt.size() > limits.max_cache_salt_bytes) {
    return Invalid("cache_salt", absl::StrCat("must be at most ", limits.max_cache_salt_bytes,
                                              " bytes, got ", r.cache_salt.size()));
  }
  if (r.cache_tenant.size() > limits.max_cache_salt_bytes) {
    return Invalid("tenant", absl::StrCat("the name must be at most ", limits.max_cache_salt_bytes,
                                          " bytes, got ", r.cache_tenant.size()));
  }
  return absl::OkStatus();
}

}  // namespace moeserve
