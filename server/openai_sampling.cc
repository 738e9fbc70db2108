// OpenAI sampling fields (see openai_sampling.h).
#include "server/openai_sampling.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/json_body.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// A number field into `out`, or `fallback` (the checkpoint's default) when absent.
absl::Status ReadFloat(const Json& j, const char* key, std::optional<double> fallback, float* out) {
  if (fallback) *out = static_cast<float>(*fallback);
  return ReadField(j, key, out);
}

// {"token id": bias, ...}, as OpenAI's logit_bias: the keys are token ids written as strings.
absl::Status ReadLogitBias(const Json& j, SamplingParams* s) {
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return absl::InvalidArgumentError("logit_bias: must be an object of token id -> bias");
  for (const auto& [key, value] : it->items()) {
    int32_t token = 0;
    if (!absl::SimpleAtoi(key, &token) || token < 0) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: key \"", key, "\" is not a token id"));
    }
    if (!value.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: the bias of token ", key, " must be a number"));
    }
    s->logit_bias.emplace_back(token, value.get<float>());
  }
  // Sorted; "5" and "05" name one token twice, which SamplingParams::Validate refuses.
  std::sort(s->logit_bias.begin(), s->logit_bias.end());
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadSampling(const Json& j, const GenerationDefaults& defaults, GenerateRequest* r) {
  SamplingParams* s = &r->sampling;
  s->temperature = 1.0f;  // OpenAI's default, under the checkpoint's
  RETURN_IF_ERROR(ReadFloat(j, "temperature", defaults.temperature, &s->temperature));
  RETURN_IF_ERROR(ReadFloat(j, "top_p", defaults.top_p, &s->top_p));
  RETURN_IF_ERROR(ReadFloat(j, "min_p", defaults.min_p, &s->min_p));
  RETURN_IF_ERROR(ReadFloat(j, "repetition_penalty", defaults.repetition_penalty, &s->repetition_penalty));
  RETURN_IF_ERROR(ReadFloat(j, "presence_penalty", std::nullopt, &s->presence_penalty));
  RETURN_IF_ERROR(ReadFloat(j, "frequency_penalty", std::nullopt, &s->frequency_penalty));
  s->top_k = static_cast<int32_t>(defaults.top_k.value_or(0));
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(const int64_t top_k, IntInRange(*it, "top_k", -1, std::numeric_limits<int32_t>::max()));
    s->top_k = static_cast<int32_t>(top_k == -1 ? 0 : top_k);  // vLLM spells "off" -1
  }
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(s->seed, UnsignedInt(*it, "seed"));
  }
  RETURN_IF_ERROR(ReadLogitBias(j, s));
  if (auto it = j.find("min_tokens"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(const int64_t min_tokens, IntInRange(*it, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
    r->min_tokens = static_cast<int32_t>(min_tokens);
  }
  return absl::OkStatus();
}

}  // namespace moeserve::server
