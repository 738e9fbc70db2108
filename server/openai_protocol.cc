// OpenAI request parsing: the body to a GenerateRequest (responses: openai_responses.cc).
#include "server/openai_protocol.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "models/tokenizer.h"
#include "server/json_body.h"
#include "server/openai_fields.h"
#include "server/openai_sampling.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
}

template <typename T>
absl::Status Read(const Json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return Bad(key, "must be true or false");
  } else if constexpr (std::is_integral_v<T>) {
    // Range-checked before narrowing: 2^32 + 1 must not become 1.
    ASSIGN_OR_RETURN(const int64_t v, IntInRange(*it, key, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    *out = static_cast<T>(v);
    return absl::OkStatus();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return Bad(key, "must be a number");
  } else {
    if (!it->is_string()) return Bad(key, "must be a string");
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

// The field table refuses what is not implemented (openai_fields.h); response_format is
// implemented for its one value, text.
absl::Status CheckFields(const Json& j, bool chat) {
  RETURN_IF_ERROR(CheckRequestFields(j, chat));
  // (value() would throw on a "type" that is not a string: checked by hand.)
  auto it = j.find("response_format");
  if (it != j.end() && !it->is_null() &&
      !(it->is_object() && (!it->contains("type") || (*it)["type"] == "text"))) {
    return Bad("response_format", "only text is supported");
  }
  return absl::OkStatus();
}

// Token ids, each checked before narrowing.
absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& array, const char* field) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const Json& v : array) {
    ASSIGN_OR_RETURN(const int64_t id, IntInRange(v, field, 0, std::numeric_limits<int32_t>::max()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// One prompt: a string, an array of token ids, or either alone in an array (never deeper).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const Json& prompt, const Tokenizer& tok, bool special) {
  if (prompt.is_string()) {
    auto ids = tok.Encode(prompt.get<std::string>(), special);
    if (!ids.ok()) return Bad("prompt", std::string(ids.status().message()));
    return ids;
  }
  if (prompt.is_array() && std::all_of(prompt.begin(), prompt.end(), [](const Json& v) { return v.is_number(); })) {
    return TokenIds(prompt, "prompt");
  }
  return Bad("prompt", "must be a string, an array of token ids, or a list of either (a batch)");
}

// A completions prompt: one (a string or token ids), or a batch (a list of strings or of token
// id arrays), as vLLM takes them.
absl::Status BatchPrompts(const Json& prompt, const Tokenizer& tok, bool special, ParsedCompletion* p) {
  auto add = [&](const Json& one) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptTokens(one, tok, special));
    p->prompt_texts.push_back(one.is_string() ? one.get<std::string>() : tok.Decode(ids, /*skip_special=*/true));
    p->prompts.push_back(std::move(ids));
    return absl::OkStatus();
  };
  const bool batch = prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array());
  if (!batch) return add(prompt);
  if (static_cast<int64_t>(prompt.size()) > kMaxBatchPrompts) {
    return Bad("prompt", absl::StrCat("a batch of ", prompt.size(), " prompts; at most ", kMaxBatchPrompts));
  }
  for (const Json& one : prompt) {
    if (!one.is_string() && !one.is_array()) return Bad("prompt", "a batch holds strings or arrays of token ids");
    RETURN_IF_ERROR(add(one));
  }
  return absl::OkStatus();
}

// The messages as {role, content} objects with string content, or why not.
absl::StatusOr<Json> NormalizeMessages(const Json& in) {
  if (!in.is_array() || in.empty()) return Bad("messages", "must be a non-empty array");
  Json messages = Json::array();
  for (const Json& m : in) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Bad("messages", "each message needs a role (system, user or assistant)");
    }
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      return Bad("messages", absl::StrCat("role \"", role, "\" is not supported"));
    }
    std::string content;
    const Json& c = m.value("content", Json(""));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // text parts only
      for (const Json& part : c) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Bad("messages", "only text content parts are supported");
        }
        content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      return Bad("messages", "content must be a string or an array of text parts");
    }
    messages.push_back({{"role", role}, {"content", content}});
  }
  return messages;
}

}  // namespace

absl::StatusOr<ChatOptions> ReadChatOptions(const Json& j) {
  ChatOptions o;
  RETURN_IF_ERROR(Read(j, "add_generation_prompt", &o.add_generation_prompt));
  RETURN_IF_ERROR(Read(j, "continue_final_message", &o.continue_final_message));
  if (o.continue_final_message && o.add_generation_prompt) {
    return Bad("continue_final_message",
               "cannot be true while add_generation_prompt is true (set it to false)");
  }
  if (auto it = j.find("add_special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return Bad("add_special_tokens", "must be true or false");
    o.add_special_tokens = it->get<bool>();
  }
  if (auto it = j.find("chat_template_kwargs"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("chat_template_kwargs", "must be an object");
    for (const char* own : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (it->contains(own)) {
        return Bad("chat_template_kwargs", absl::StrCat("\"", own, "\" is set by the request itself"));
      }
    }
    o.template_kwargs = *it;
  }
  return o;
}

std::string RenderChat(const Json& messages, const ChatOptions& options) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    absl::StrAppend(&out, "<|im_start|>", m["role"].get<std::string>(), "\n",
                    m["content"].get<std::string>());
    if (options.continue_final_message && i + 1 == messages.size()) return out;  // left open
    out += "<|im_end|>\n";
  }
  return options.add_generation_prompt ? out + "<|im_start|>assistant\n" : out;
}

namespace {

// The model's template rendered as transformers' apply_chat_template does; continuing the final
// message cuts the text right after that message's content, as transformers does.
absl::StatusOr<std::string> RenderTemplate(const Json& messages, const ModelTokenizer& tok,
                                           const ChatOptions& options) {
  nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::parse(messages.dump())},
                                    {"add_generation_prompt", options.add_generation_prompt},
                                    {"bos_token", tok.bos_token},
                                    {"eos_token", tok.eos_token}};
  for (const auto& [key, value] : options.template_kwargs.items()) {
    context[key] = nlohmann::ordered_json::parse(value.dump());
  }
  absl::StatusOr<std::string> text = tok.chat->Render(context);
  if (!text.ok()) return Bad("messages", std::string(text.status().message()));
  if (options.continue_final_message) {
    // As transformers: find the content stripped (templates often trim it), then keep its
    // trailing whitespace where the template kept it.
    const std::string last = messages.back()["content"].get<std::string>();
    const absl::string_view stripped = absl::StripAsciiWhitespace(last);
    const absl::string_view lstripped = absl::StripLeadingAsciiWhitespace(last);
    const size_t at = stripped.empty() ? std::string::npos : text->rfind(std::string(stripped));
    if (at == std::string::npos) {
      return Bad("continue_final_message",
                 "the final message's content does not appear in the rendered chat");
    }
    const bool kept = absl::string_view(*text).substr(at, lstripped.size()) == lstripped;
    text->resize(at + (kept ? lstripped.size() : stripped.size()));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ChatPrompt(const Json& raw, const ModelTokenizer& tok,
                                                const ChatOptions& options) {
  ASSIGN_OR_RETURN(const Json messages, NormalizeMessages(raw));
  std::string text;
  bool special = false;
  if (tok.chat == nullptr) {
    if (!options.template_kwargs.empty()) {  // they would be ignored: nothing reads them
      return Bad("chat_template_kwargs",
                 "this model has no chat template (moeserve's ChatML rendering takes no variables)");
    }
    text = RenderChat(messages, options);
    special = options.add_special_tokens.value_or(true);  // the BOS
  } else {
    // As transformers' apply_chat_template(tokenize=True): the template writes the special
    // tokens itself, so the tokenizer adds none unless asked.
    ASSIGN_OR_RETURN(text, RenderTemplate(messages, tok, options));
    special = options.add_special_tokens.value_or(false);
  }
  auto ids = tok.tokenizer->Encode(text, special);
  if (!ids.ok()) return Bad("messages", std::string(ids.status().message()));
  return ids;
}

namespace {

// The prompt: chat messages through the template, or the completion's prompt.
absl::Status ReadPrompt(const Json& j, bool chat, ParsedCompletion* p) {
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end()) return Bad("messages", "must be a non-empty array");
    ASSIGN_OR_RETURN(const ChatOptions options, ReadChatOptions(j));
    ASSIGN_OR_RETURN(p->request.prompt, ChatPrompt(*it, *p->tokenizer, options));
    p->prompts = {p->request.prompt};
    return absl::OkStatus();
  }
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return Bad("prompt", "is required");
  bool special = true;
  RETURN_IF_ERROR(Read(j, "add_special_tokens", &special));
  RETURN_IF_ERROR(BatchPrompts(*it, *p->tokenizer->tokenizer, special, p));
  p->request.prompt = p->prompts[0];
  return absl::OkStatus();
}

// max_tokens, as vLLM defaults it: the completions API's 16; on chat, what the context leaves
// (under --max-model-len), or generation_config.json's max_new_tokens when smaller.
absl::Status ReadMaxTokens(const Json& j, bool chat, const ModelConfig& config, const RequestLimits& limits,
                           const GenerationDefaults& defaults, GenerateRequest* r) {
  const int64_t context = limits.Context(config);
  const int64_t room = std::max<int64_t>(1, context - static_cast<int64_t>(r->prompt.size()));
  int64_t max_tokens = limits.default_max_tokens;
  if (chat) max_tokens = std::min<int64_t>({limits.max_tokens, room, defaults.max_tokens.value_or(room)});
  for (const char* key : {"max_tokens", chat ? "max_completion_tokens" : "max_tokens"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      ASSIGN_OR_RETURN(max_tokens, IntInRange(*it, "max_tokens", 0, limits.max_tokens));
    }
  }
  r->max_tokens = static_cast<int32_t>(max_tokens);
  return absl::OkStatus();
}

// Stop strings (cut from the text) and stop token ids (the engine stops on them).
absl::Status ReadStops(const Json& j, ParsedCompletion* p) {
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p->stop.push_back(it->get<std::string>());
    } else if (it->is_array() &&
               std::all_of(it->begin(), it->end(), [](const Json& v) { return v.is_string(); })) {
      for (const Json& v : *it) p->stop.push_back(v.get<std::string>());
    } else {
      return Bad("stop", "must be a string or an array of strings");
    }
    for (const std::string& s : p->stop) {
      if (s.empty()) return Bad("stop", "stop strings must not be empty");
    }
  }
  RETURN_IF_ERROR(Read(j, "include_stop_str_in_output", &p->include_stop_str));
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Bad("stop_token_ids", "must be an array of token ids");
    ASSIGN_OR_RETURN(p->user_stop_ids, TokenIds(*it, "stop_token_ids"));
    p->request.stop_ids.insert(p->request.stop_ids.end(), p->user_stop_ids.begin(), p->user_stop_ids.end());
  }
  return absl::OkStatus();
}

// The chosen token's logprob whenever logprobs are asked for; top-n alternatives on top (chat:
// top_logprobs, which needs logprobs true, as vLLM; completions: logprobs n, 0 the chosen only).
absl::Status ReadLogprobs(const Json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p) {
  if (chat) {
    RETURN_IF_ERROR(Read(j, "logprobs", &p->want_logprobs));
    int64_t top = 0;
    if (auto it = j.find("top_logprobs"); it != j.end() && !it->is_null()) {
      ASSIGN_OR_RETURN(top, IntInRange(*it, "top_logprobs", 0, limits.max_top_logprobs));
    }
    if (top > 0 && !p->want_logprobs) return Bad("top_logprobs", "needs logprobs: true");
    p->logprobs = static_cast<int>(top);
  } else if (auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(Read(j, "logprobs", &p->logprobs));
    p->want_logprobs = true;
  }
  p->request.logprobs = p->want_logprobs;
  p->request.top_logprobs = p->logprobs;
  return absl::OkStatus();
}

// prompt_logprobs, and echo (completions) with what it implies, as vLLM: echo with logprobs scores
// the prompt the same way; echo with max_tokens 0 answers with the prompt alone.
absl::Status ReadEcho(const Json& j, bool chat, const RequestLimits& limits, ParsedCompletion* p) {
  if (!chat) RETURN_IF_ERROR(Read(j, "echo", &p->echo));
  if (p->echo && p->stream && p->want_logprobs) {
    return Bad("echo", "with logprobs is not available when stream is true");
  }
  GenerateRequest& r = p->request;
  if (auto it = j.find("prompt_logprobs"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(const int64_t n, IntInRange(*it, "prompt_logprobs", -1, limits.max_top_logprobs));
    if (n == -1) {
      return Bad("prompt_logprobs", absl::StrCat("-1 (the whole vocabulary) is not supported; at most ",
                                                 limits.max_top_logprobs));
    }
    r.prompt_logprobs = static_cast<int32_t>(n);
  } else if (p->echo && p->want_logprobs) {
    r.prompt_logprobs = p->logprobs;
  }
  if (r.prompt_logprobs >= 0 && p->stream) return Bad("prompt_logprobs", "not available when stream is true (as vLLM)");
  if (p->echo && r.max_tokens == 0) {
    p->echo_only = true;
    r.max_tokens = 1;
  }
  return absl::OkStatus();
}

// return_token_ids and return_tokens_as_token_ids; without a tokenizer (--skip-tokenizer-init)
// there is no text: stop strings are refused, and logprobs need their tokens as ids.
absl::Status ReadTokenIdFields(const Json& j, ParsedCompletion* p) {
  RETURN_IF_ERROR(Read(j, "return_token_ids", &p->return_token_ids));
  RETURN_IF_ERROR(Read(j, "return_tokens_as_token_ids", &p->tokens_as_ids));
  if (p->tokenizer->has_text()) return absl::OkStatus();
  if (!p->stop.empty()) return Bad("stop", "stop strings need the tokenizer (the server runs with --skip-tokenizer-init)");
  if ((p->want_logprobs || p->request.prompt_logprobs >= 0) && !p->tokens_as_ids) {
    return Bad("logprobs", "token text needs the tokenizer (--skip-tokenizer-init): add return_tokens_as_token_ids");
  }
  return absl::OkStatus();
}

// bad_words as vLLM tokenizes them: each word (deduplicated, leading spaces stripped) alone, and
// with a leading space where that makes a different first token of the same length.
absl::Status ReadBadWords(const Json& j, ParsedCompletion* p) {
  auto it = j.find("bad_words");
  if (it == j.end() || it->is_null() || (it->is_array() && it->empty())) return absl::OkStatus();
  if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const Json& w) { return w.is_string(); })) {
    return Bad("bad_words", "must be an array of strings");
  }
  if (!p->tokenizer->has_text()) return Bad("bad_words", "needs the tokenizer (the server runs with --skip-tokenizer-init)");
  std::vector<std::string> words;
  for (const Json& w : *it) {
    if (std::find(words.begin(), words.end(), w.get<std::string>()) == words.end()) words.push_back(w);
  }
  std::vector<std::vector<int32_t>>& out = p->request.bad_words;
  for (const std::string& word : words) {
    if (word.empty()) return Bad("bad_words", "cannot contain an empty string");
    for (const bool space : {false, true}) {
      auto ids = p->tokenizer->tokenizer->Encode(absl::StrCat(space ? " " : "", absl::StripLeadingAsciiWhitespace(word)), false);
      if (!ids.ok()) return Bad("bad_words", std::string(ids.status().message()));
      if (ids->empty()) {
        if (!space) return Bad("bad_words", "entries must tokenize to at least one token");
        continue;
      }
      if (!space || ((*ids)[0] != out.back()[0] && ids->size() == out.back().size())) out.push_back(*std::move(ids));
    }
  }
  return absl::OkStatus();
}

// best_of (completions): best_of candidates per prompt, the n best answered; their ranking needs
// each token's logprob, so the engine is asked for it whatever the client asked.
absl::Status ReadBestOf(const Json& j, bool chat, ParsedCompletion* p) {
  p->best_of = p->n;
  auto it = j.find("best_of");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t best_of, IntInRange(*it, "best_of", 1, kMaxChoices));
  if (chat) {  // not a chat parameter: accepted only where it changes nothing
    if (best_of == 1 || best_of == p->n) return absl::OkStatus();
    return Bad("best_of", "is a /v1/completions parameter (on chat only 1 or n)");
  }
  if (best_of < p->n) return Bad("best_of", absl::StrCat("must be at least n (", p->n, "), got ", best_of));
  if (best_of == p->n) return absl::OkStatus();  // nothing to rank
  if (p->stream && best_of > p->n) return Bad("best_of", "cannot be used with stream (as OpenAI)");
  p->best_of = static_cast<int>(best_of);
  if (p->best_of > p->n) p->request.logprobs = true;
  return absl::OkStatus();
}

// A lane name, or vLLM's integer priority: the normal lane, ordered within it by the integer
// (lower is earlier, as vLLM's priority scheduling).
absl::Status ReadPriority(const Json& j, Priority* out, int32_t* rank) {
  std::string priority = "normal";
  if (auto it = j.find("priority"); it != j.end() && it->is_number()) {
    ASSIGN_OR_RETURN(const int64_t v, IntInRange(*it, "priority", std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
    *rank = static_cast<int32_t>(v);
  } else {
    RETURN_IF_ERROR(Read(j, "priority", &priority));
  }
  if (priority == "fast") {
    *out = Priority::kFast;
  } else if (priority == "high") {
    *out = Priority::kHigh;
  } else if (priority == "low") {
    *out = Priority::kLow;
  } else if (priority == "normal") {
    *out = Priority::kNormal;
  } else {
    return Bad("priority", absl::StrCat("must be fast, high, normal or low, got \"", priority, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedCompletion> ParseCompletion(const std::string& body, bool chat,
                                                 const ModelConfig& config,
                                                 const RequestLimits& limits,
                                                 std::shared_ptr<const ModelTokenizer> tokenizer,
                                                 const GenerationDefaults& defaults) {
  ASSIGN_OR_RETURN(const Json j, ParseJsonBody(body));
  RETURN_IF_ERROR(CheckFields(j, chat));
  ParsedCompletion p;
  p.chat = chat;
  p.tokenizer = std::move(tokenizer);
  GenerateRequest& r = p.request;
  RETURN_IF_ERROR(Read(j, "model", &p.model));
  if (auto it = j.find("n"); it != j.end() && !it->is_null()) {
    // Each choice is a request of its own in the engine.
    ASSIGN_OR_RETURN(const int64_t n, IntInRange(*it, "n", 1, kMaxChoices));
    p.n = static_cast<int>(n);
  }
  RETURN_IF_ERROR(Read(j, "stream", &p.stream));
  if (auto it = j.find("stream_options"); it != j.end() && it->is_object()) {
    RETURN_IF_ERROR(Read(*it, "include_usage", &p.include_usage));
  }
  RETURN_IF_ERROR(ReadPrompt(j, chat, &p));
  RETURN_IF_ERROR(ReadMaxTokens(j, chat, config, limits, defaults, &r));
  RETURN_IF_ERROR(ReadSampling(j, defaults, &r));
  RETURN_IF_ERROR(ReadStops(j, &p));
  RETURN_IF_ERROR(ReadLogprobs(j, chat, limits, &p));
  RETURN_IF_ERROR(ReadEcho(j, chat, limits, &p));
  RETURN_IF_ERROR(ReadTokenIdFields(j, &p));
  RETURN_IF_ERROR(ReadBadWords(j, &p));
  RETURN_IF_ERROR(ReadBestOf(j, chat, &p));
  RETURN_IF_ERROR(ReadPriority(j, &r.priority, &r.rank));
  RETURN_IF_ERROR(Read(j, "retain_seconds", &r.retain_seconds));
  RETURN_IF_ERROR(Read(j, "cache_salt", &r.cache_salt));
  bool ignore_eos = false;
  RETURN_IF_ERROR(Read(j, "ignore_eos", &ignore_eos));
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    GenerateRequest each = r;
    each.prompt = p.prompts[i];
    const std::string field = chat ? "messages" : p.prompts.size() == 1 ? "prompt" : absl::StrCat("prompt[", i, "]");
    RETURN_IF_ERROR(ValidateRequest(each, config, limits, field));
  }
  if (!ignore_eos) {
    r.stop_ids.insert(r.stop_ids.end(), p.tokenizer->eos_ids.begin(), p.tokenizer->eos_ids.end());
  }
  return p;
}

bool CutAtStop(std::string* text, const std::vector<std::string>& stop, bool include_stop,
               std::string* matched, size_t min_end) {
  size_t cut = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stop) {
    const size_t at = text->find(s, min_end >= s.size() ? min_end - s.size() + 1 : 0);
    if (at < cut || (at == cut && at != std::string::npos && s.size() > which->size())) {
      cut = at;
      which = &s;
    }
  }
  if (which == nullptr) return false;
  text->resize(cut + (include_stop ? which->size() : 0));
  if (matched != nullptr) *matched = *which;
  return true;
}

}  // namespace moeserve::server
