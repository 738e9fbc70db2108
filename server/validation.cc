// Wire-to-engine request mapping.
#include "server/validation.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace moeserve::server {

absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& req,
                                                const ModelConfig& c, const RequestLimits& limits,
                                                const ModelTokenizer& tokenizer, TextOptions* text) {
  GenerateRequest out;
  absl::string_view prompt_field = "prompt";
  switch (req.prompt_case()) {
    case v1::GenerateRequest::kText:
      prompt_field = "text";
      if (!req.text().empty()) {
        ASSIGN_OR_RETURN(out.prompt, tokenizer.tokenizer->Encode(req.text(), true));
      }
      break;
    case v1::GenerateRequest::kTokenIds:
      prompt_field = "token_ids";
      out.prompt.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
      break;
    default:
      return absl::InvalidArgumentError("prompt: set either text or token_ids");
  }
  // proto3 reads an unset max_tokens as 0; a negative one is passed on to be refused.
  out.max_tokens =
      req.max_tokens() == 0 ? static_cast<int32_t>(limits.default_max_tokens) : req.max_tokens();
  const auto& s = req.sampling();
  out.sampling.temperature = s.temperature();
  out.sampling.top_k = s.top_k();
  out.sampling.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  out.sampling.min_p = s.min_p();
  if (s.has_seed()) out.sampling.seed = s.seed();
  out.sampling.presence_penalty = s.presence_penalty();
  out.sampling.frequency_penalty = s.frequency_penalty();
  out.sampling.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  out.sampling.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(out.sampling.logit_bias.begin(), out.sampling.logit_bias.end());
  out.min_tokens = req.min_tokens();
  out.rank = req.priority_rank();
  for (const v1::TokenIds& word : req.bad_words()) out.bad_words.emplace_back(word.ids().begin(), word.ids().end());
  out.stop_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  // The enum's names are PRIORITY_<NAME>: one table of names (engine/priority.h) for both APIs.
  const std::string& enum_name = v1::Priority_Name(req.priority());
  if (enum_name.rfind("PRIORITY_", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("priority: unknown value ", static_cast<int>(req.priority())));
  }
  ASSIGN_OR_RETURN(out.priority, PriorityFromName(absl::AsciiStrToLower(enum_name.substr(9))));
  out.top_logprobs = req.logprobs();
  out.logprobs = req.logprobs() > 0;  // with the top n, the chosen token's own
  out.retain_seconds = req.retain_seconds();
  out.cache_salt = req.cache_salt();
  if (absl::Status v = ValidateRequest(out, c, limits, prompt_field); !v.ok()) return v;
  text->stop.assign(req.stop().begin(), req.stop().end());
  text->include_stop_str = req.include_stop_str_in_output();
  RETURN_IF_ERROR(ValidateTextOptions(*text));
  if (!text->stop.empty() && !tokenizer.has_text()) {
    return absl::InvalidArgumentError("stop: stop strings need the tokenizer (the server runs with --skip-tokenizer-init)");
  }
  // EOS stops generation unless the client asks to go past it (added after validation: it is
  // the tokenizer's, not the client's).
  if (!req.ignore_eos()) {
    out.stop_ids.insert(out.stop_ids.end(), tokenizer.eos_ids.begin(), tokenizer.eos_ids.end());
  }
  return out;
}

}  // namespace moeserve::server
