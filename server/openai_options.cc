// The option fields of an OpenAI request (see openai_options.h).
#include "server/openai_options.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/json_body.h"

namespace moeserve::server {

using Json = nlohmann::json;

absl::Status ReadStops(const Json& j, ParsedCompletion* p) {
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p->text.stop.push_back(it->get<std::string>());
    } else if (it->is_array() &&
               std::all_of(it->begin(), it->end(), [](const Json& v) { return v.is_string(); })) {
      for (const Json& v : *it) p->text.stop.push_back(v.get<std::string>());
    } else {
      return FieldError("stop", "must be a string or an array of strings");
    }
  }
  RETURN_IF_ERROR(ReadField(j, "include_stop_str_in_output", &p->text.include_stop_str));
  RETURN_IF_ERROR(ValidateTextOptions(p->text));
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError("stop_token_ids", "must be an array of token ids");
    ASSIGN_OR_RETURN(p->user_stop_ids, TokenIds(*it, "stop_token_ids"));
    p->request.stop_ids.insert(p->request.stop_ids.end(), p->user_stop_ids.begin(), p->user_stop_ids.end());
  }
  return absl::OkStatus();
}

absl::Status ReadLogprobs(const Json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p) {
  if (chat) {
    RETURN_IF_ERROR(ReadField(j, "logprobs", &p->want_logprobs));
    int64_t top = 0;
    if (auto it = j.find("top_logprobs"); it != j.end() && !it->is_null()) {
      ASSIGN_OR_RETURN(top, IntInRange(*it, "top_logprobs", 0, limits.max_top_logprobs));
    }
    if (top > 0 && !p->want_logprobs) return FieldError("top_logprobs", "needs logprobs: true");
    p->logprobs = static_cast<int>(top);
  } else if (auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(ReadField(j, "logprobs", &p->logprobs));
    p->want_logprobs = true;
  }
  p->request.logprobs = p->want_logprobs;
  p->request.top_logprobs = p->logprobs;
  return absl::OkStatus();
}

absl::Status ReadEcho(const Json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p) {
  if (!chat) RETURN_IF_ERROR(ReadField(j, "echo", &p->echo));
  if (p->echo && p->stream && p->want_logprobs) {
    return FieldError("echo", "with logprobs is not available when stream is true");
  }
  GenerateRequest& r = p->request;
  if (auto it = j.find("prompt_logprobs"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(const int64_t n, IntInRange(*it, "prompt_logprobs", -1, limits.max_top_logprobs));
    if (n == -1) {
      return FieldError("prompt_logprobs", absl::StrCat("-1 (the whole vocabulary) is not supported; at most ",
                                                 limits.max_top_logprobs));
    }
    r.prompt_logprobs = static_cast<int32_t>(n);
  } else if (p->echo && p->want_logprobs) {
    r.prompt_logprobs = p->logprobs;
  }
  if (r.prompt_logprobs >= 0 && p->stream) return FieldError("prompt_logprobs", "not available when stream is true (as vLLM)");
  if (p->echo && r.max_tokens == 0) {
    p->echo_only = true;
    r.max_tokens = 1;
  }
  return absl::OkStatus();
}

absl::Status ReadTokenIdFields(const Json& j, ParsedCompletion* p) {
  RETURN_IF_ERROR(ReadField(j, "return_token_ids", &p->return_token_ids));
  RETURN_IF_ERROR(ReadField(j, "return_tokens_as_token_ids", &p->tokens_as_ids));
  if (p->tokenizer->has_text()) return absl::OkStatus();
  if (!p->text.stop.empty()) return FieldError("stop", "stop strings need the tokenizer (the server runs with --skip-tokenizer-init)");
  if ((p->want_logprobs || p->request.prompt_logprobs >= 0) && !p->tokens_as_ids) {
    return FieldError("logprobs", "token text needs the tokenizer (--skip-tokenizer-init): add return_tokens_as_token_ids");
  }
  return absl::OkStatus();
}

absl::Status ReadBadWords(const Json& j, ParsedCompletion* p) {
  auto it = j.find("bad_words");
  if (it == j.end() || it->is_null() || (it->is_array() && it->empty())) return absl::OkStatus();
  if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const Json& w) { return w.is_string(); })) {
    return FieldError("bad_words", "must be an array of strings");
  }
  if (!p->tokenizer->has_text()) return FieldError("bad_words", "needs the tokenizer (the server runs with --skip-tokenizer-init)");
  std::vector<std::string> words;
  for (const Json& w : *it) {
    if (std::find(words.begin(), words.end(), w.get<std::string>()) == words.end()) words.push_back(w);
  }
  std::vector<std::vector<int32_t>>& out = p->request.bad_words;
  for (const std::string& word : words) {
    if (word.empty()) return FieldError("bad_words", "cannot contain an empty string");
    for (const bool space : {false, true}) {
      auto ids = p->tokenizer->tokenizer->Encode(absl::StrCat(space ? " " : "", absl::StripLeadingAsciiWhitespace(word)), false);
      if (!ids.ok()) return FieldError("bad_words", std::string(ids.status().message()));
      if (ids->empty()) {
        if (!space) return FieldError("bad_words", "entries must tokenize to at least one token");
        continue;
      }
      if (!space || ((*ids)[0] != out.back()[0] && ids->size() == out.back().size())) out.push_back(*std::move(ids));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadBestOf(const Json& j, bool chat, ParsedCompletion* p) {
  p->best_of = p->n;
  auto it = j.find("best_of");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t best_of, IntInRange(*it, "best_of", 1, kMaxChoices));
  if (chat) {  // not a chat parameter: accepted only where it changes nothing
    if (best_of == 1 || best_of == p->n) return absl::OkStatus();
    return FieldError("best_of", "is a /v1/completions parameter (on chat only 1 or n)");
  }
  if (best_of < p->n) return FieldError("best_of", absl::StrCat("must be at least n (", p->n, "), got ", best_of));
  if (best_of == p->n) return absl::OkStatus();  // nothing to rank
  if (p->stream && best_of > p->n) return FieldError("best_of", "cannot be used with stream (as OpenAI)");
  p->best_of = static_cast<int>(best_of);
  if (p->best_of > p->n) p->request.logprobs = true;
  return absl::OkStatus();
}

absl::Status ReadPriority(const Json& j, Priority* out, int32_t* rank) {
  std::string priority = "normal";
  if (auto it = j.find("priority"); it != j.end() && it->is_number()) {
    ASSIGN_OR_RETURN(const int64_t v, IntInRange(*it, "priority", std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
    *rank = static_cast<int32_t>(v);
  } else {
    RETURN_IF_ERROR(ReadField(j, "priority", &priority));
  }
  ASSIGN_OR_RETURN(*out, PriorityFromName(priority));
  return absl::OkStatus();
}

}  // namespace moeserve::server
