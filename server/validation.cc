// Request validation.
#include "server/validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "models/tokenizer.h"

namespace moeserve::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

}  // namespace

absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& req, const ModelConfig& c,
                                                const ValidationLimits& limits) {
  GenerateRequest out;
  const int64_t max_prompt = limits.max_prompt_tokens > 0 ? limits.max_prompt_tokens : c.max_position_embeddings - 1;
  switch (req.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (req.text().empty()) return Invalid("text", "the prompt is empty");
      out.prompt = ByteTokenizer().Encode(req.text());
      break;
    case v1::GenerateRequest::kTokenIds:
      if (req.token_ids().ids().empty()) return Invalid("token_ids", "the prompt is empty");
      for (int i = 0; i < req.token_ids().ids_size(); ++i) {
        const int32_t id = req.token_ids().ids(i);
        if (id < 0 || id >= c.vocab_size) {
          return Invalid("token_ids", absl::StrCat("token id ", id, " at index ", i,
                                                   " is outside the vocabulary [0, ", c.vocab_size, ")"));
        }
        out.prompt.push_back(id);
      }
      break;
    default:
      return Invalid("prompt", "set either text or token_ids");
  }
  if (static_cast<int64_t>(out.prompt.size()) > max_prompt) {
    return Invalid(req.prompt_case() == v1::GenerateRequest::kText ? "text" : "token_ids",
                   absl::StrCat("the prompt has ", out.prompt.size(), " tokens; at most ", max_prompt,
                                " fit the context"));
  }
  const int64_t max_tokens = req.max_tokens() == 0 ? limits.default_max_tokens : req.max_tokens();
  if (max_tokens < 1 || max_tokens > limits.max_tokens_limit) {
    return Invalid("max_tokens", absl::StrCat("must be in [1, ", limits.max_tokens_limit, "], got ", req.max_tokens()));
  }
  out.max_tokens = static_cast<int32_t>(max_tokens);
  const auto& s = req.sampling();
  if (!std::isfinite(s.temperature()) || s.temperature() < 0.0f || s.temperature() > 100.0f) {
    return Invalid("sampling.temperature", absl::StrCat("must be in [0, 100], got ", s.temperature()));
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat("must be >= 0 (0 = off), got ", s.top_k()));
  const float top_p = s.has_top_p() ? s.top_p() : 1.0f;
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return Invalid("sampling.top_p", absl::StrCat("must be in (0, 1], got ", top_p));
  }
  out.sampling.temperature = s.temperature();
  out.sampling.top_k = s.top_k();
  out.sampling.top_p = top_p;
  if (s.has_seed()) out.sampling.seed = s.seed();
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    const int32_t id = req.stop_token_ids(i);
    if (id < 0 || id >= c.vocab_size) {
      return Invalid("stop_token_ids", absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    out.stop_ids.push_back(id);
  }
  if (!req.ignore_eos()) out.stop_ids.push_back(ByteTokenizer::kEos);
  switch (req.priority()) {
    case v1::PRIORITY_NORMAL: out.priority = Priority::kNormal; break;
    case v1::PRIORITY_FAST: out.priority = Priority::kFast; break;
    case v1::PRIORITY_HIGH: out.priority = Priority::kHigh; break;
    case v1::PRIORITY_LOW: out.priority = Priority::kLow; break;
    default: return Invalid("priority", absl::StrCat("unknown value ", static_cast<int>(req.priority())));
  }
  if (req.logprobs() < 0 || req.logprobs() > 20) {
    return Invalid("logprobs", absl::StrCat("must be in [0, 20], got ", req.logprobs()));
  }
  out.top_logprobs = req.logprobs();
  if (!(req.retain_seconds() >= 0 && req.retain_seconds() <= limits.max_retain_seconds)) {
    return Invalid("retain_seconds", absl::StrCat("must be in [0, ", limits.max_retain_seconds, "], got ", req.retain_seconds()));
  }
  out.retain_seconds = req.retain_seconds();
  if (req.cache_salt().size() > kMaxCacheSaltBytes) {
    return Invalid("cache_salt", absl::StrCat("must be at most ", kMaxCacheSaltBytes, " bytes, got ",
                                              req.cache_salt().size()));
  }
  out.cache_salt = req.cache_salt();
  return out;
}

}  // namespace moeserve::server
