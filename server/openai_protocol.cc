// OpenAI request parsing: the body to a GenerateRequest (responses: openai_responses.cc).
#include "server/openai_protocol.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "text/tokenizer.h"
#include "server/json_body.h"
#include "server/openai_fields.h"
#include "server/openai_options.h"
#include "server/openai_sampling.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// The field table refuses what is not implemented (openai_fields.h); response_format is
// implemented for its one value, text.
absl::Status CheckFields(const Json& j, bool chat) {
  RETURN_IF_ERROR(CheckRequestFields(j, chat));
  // (value() would throw on a "type" that is not a string: checked by hand.)
  auto it = j.find("response_format");
  if (it != j.end() && !it->is_null() &&
      !(it->is_object() && (!it->contains("type") || (*it)["type"] == "text"))) {
    return FieldError("response_format", "only text is supported");
  }
  return absl::OkStatus();
}

// One prompt: a string, an array of token ids, or either alone in an array (never deeper).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const Json& prompt, const Tokenizer& tok, bool special) {
  if (prompt.is_string()) {
    auto ids = tok.Encode(prompt.get<std::string>(), special);
    if (!ids.ok()) return FieldError("prompt", std::string(ids.status().message()));
    return ids;
  }
  if (prompt.is_array() && std::all_of(prompt.begin(), prompt.end(), [](const Json& v) { return v.is_number(); })) {
    return TokenIds(prompt, "prompt");
  }
  return FieldError("prompt", "must be a string, an array of token ids, or a list of either (a batch)");
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
    return FieldError("prompt", absl::StrCat("a batch of ", prompt.size(), " prompts; at most ", kMaxBatchPrompts));
  }
  for (const Json& one : prompt) {
    if (!one.is_string() && !one.is_array()) return FieldError("prompt", "a batch holds strings or arrays of token ids");
    RETURN_IF_ERROR(add(one));
  }
  return absl::OkStatus();
}

// The messages as {role, content} objects with string content, or why not.
absl::StatusOr<Json> NormalizeMessages(const Json& in) {
  if (!in.is_array() || in.empty()) return FieldError("messages", "must be a non-empty array");
  Json messages = Json::array();
  for (const Json& m : in) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return FieldError("messages", "each message needs a role (system, user or assistant)");
    }
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      return FieldError("messages", absl::StrCat("role \"", role, "\" is not supported"));
    }
    std::string content;
    const Json& c = m.value("content", Json(""));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // text parts only
      for (const Json& part : c) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return FieldError("messages", "only text content parts are supported");
        }
        content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      return FieldError("messages", "content must be a string or an array of text parts");
    }
    messages.push_back({{"role", role}, {"content", content}});
  }
  return messages;
}

}  // namespace

absl::StatusOr<ChatOptions> ReadChatOptions(const Json& j) {
  ChatOptions o;
  RETURN_IF_ERROR(ReadField(j, "add_generation_prompt", &o.add_generation_prompt));
  RETURN_IF_ERROR(ReadField(j, "continue_final_message", &o.continue_final_message));
  if (o.continue_final_message && o.add_generation_prompt) {
    return FieldError("continue_final_message",
               "cannot be true while add_generation_prompt is true (set it to false)");
  }
  if (auto it = j.find("add_special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError("add_special_tokens", "must be true or false");
    o.add_special_tokens = it->get<bool>();
  }
  if (auto it = j.find("chat_template_kwargs"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return FieldError("chat_template_kwargs", "must be an object");
    for (const char* own : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (it->contains(own)) {
        return FieldError("chat_template_kwargs", absl::StrCat("\"", own, "\" is set by the request itself"));
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
  if (!text.ok()) return FieldError("messages", std::string(text.status().message()));
  if (options.continue_final_message) {
    // As transformers: find the content stripped (templates often trim it), then keep its
    // trailing whitespace where the template kept it.
    const std::string last = messages.back()["content"].get<std::string>();
    const absl::string_view stripped = absl::StripAsciiWhitespace(last);
    const absl::string_view lstripped = absl::StripLeadingAsciiWhitespace(last);
    const size_t at = stripped.empty() ? std::string::npos : text->rfind(std::string(stripped));
    if (at == std::string::npos) {
      return FieldError("continue_final_message",
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
      return FieldError("chat_template_kwargs",
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
  if (!ids.ok()) return FieldError("messages", std::string(ids.status().message()));
  return ids;
}

namespace {

// The prompt: chat messages through the template, or the completion's prompt.
absl::Status ReadPrompt(const Json& j, bool chat, ParsedCompletion* p) {
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end()) return FieldError("messages", "must be a non-empty array");
    ASSIGN_OR_RETURN(const ChatOptions options, ReadChatOptions(j));
    ASSIGN_OR_RETURN(p->request.prompt, ChatPrompt(*it, *p->tokenizer, options));
    p->prompts = {p->request.prompt};
    return absl::OkStatus();
  }
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return FieldError("prompt", "is required");
  bool special = true;
  RETURN_IF_ERROR(ReadField(j, "add_special_tokens", &special));
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
  RETURN_IF_ERROR(ReadField(j, "model", &p.model));
  if (auto it = j.find("n"); it != j.end() && !it->is_null()) {
    // Each choice is a request of its own in the engine.
    ASSIGN_OR_RETURN(const int64_t n, IntInRange(*it, "n", 1, kMaxChoices));
    p.n = static_cast<int>(n);
  }
  RETURN_IF_ERROR(ReadField(j, "stream", &p.stream));
  if (auto it = j.find("stream_options"); it != j.end() && it->is_object()) {
    RETURN_IF_ERROR(ReadField(*it, "include_usage", &p.include_usage));
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
  RETURN_IF_ERROR(ReadField(j, "retain_seconds", &r.retain_seconds));
  RETURN_IF_ERROR(ReadField(j, "cache_salt", &r.cache_salt));
  bool ignore_eos = false;
  RETURN_IF_ERROR(ReadField(j, "ignore_eos", &ignore_eos));
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

}  // namespace moeserve::server
