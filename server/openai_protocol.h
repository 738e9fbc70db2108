// The OpenAI API's request and response bodies (POST /v1/completions, /v1/chat/completions),
// mapped onto the engine: a body becomes a GenerateRequest checked by the engine's one
// validator (errors name the OpenAI parameter and the limit), and events become completion
// objects or server-sent-event chunks. Every request field is checked against the table in
// openai_fields.h: what this engine does not implement (penalties, tools, ...) is refused.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/request.h"
#include "engine/request_validation.h"
#include "models/generation_defaults.h"
#include "models/model_config.h"
#include "text/model_tokenizer.h"
#include "server/request_stream.h"

namespace moeserve::server {

// An OpenAI error: the HTTP status and the error object's fields.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending parameter, when one is
  nlohmann::json ToJson() const;
};
// The JSON text of an answer. Invalid UTF-8 (raw bytes a parse error quotes, a model's partial
// character) becomes U+FFFD instead of an exception that would end the server.
inline std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// 400 for INVALID_ARGUMENT (the message's leading "field:" becomes `param`, in OpenAI's
// spelling), 401, 404, 429 for RESOURCE_EXHAUSTED, 503 for UNAVAILABLE, 499 (nginx's "client
// closed request") for CANCELLED, 504 for DEADLINE_EXCEEDED, else 500.
ApiError ToApiError(const absl::Status& status);

// The most choices (`n`) one request may ask for, and the most prompts of one completions
// batch (`prompt` as a list of prompts).
inline constexpr int64_t kMaxChoices = 32;
inline constexpr int64_t kMaxBatchPrompts = 256;

struct ParsedCompletion {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  std::string model;              // as the client named it (checked by the caller)
  GenerateRequest request;        // validated; its prompt is prompts[0]
  // Every prompt (completions may bring a batch; chat has one), each validated. Candidate k
  // answers prompt k / best_of with seed + k % best_of; answered choices are numbered as vLLM
  // numbers a batch's (prompt i's j-th as i * n + j).
  std::vector<std::vector<int32_t>> prompts;
  TextOptions text;               // stop strings, cut from the text (the engine stops on ids)
  std::vector<int32_t> user_stop_ids;  // stop_token_ids as asked (the request's add the EOS ids)
  std::string system_fingerprint;      // the engine's fingerprint, set by the caller
  bool want_logprobs = false;     // the chosen token's logprob, and
  int logprobs = 0;               // the top-n per token (0: none)
  int n = 1;                      // choices: n requests of the same prompt, sharing its KV
  // Candidates per prompt (engine requests): best_of (completions), at least n; the n with the
  // highest mean logprob per token are answered, as OpenAI defines best_of.
  int best_of = 1;
  // echo (completions): each choice's text (and logprobs) begin with its prompt's; with
  // max_tokens 0, they are only the prompt's (one token is generated, and left out).
  bool echo = false, echo_only = false;
  std::vector<std::string> prompt_texts;  // per prompt: as sent, or its ids decoded
  // vLLM's return_token_ids (each choice's token ids, and the prompt's) and
  // return_tokens_as_token_ids (logprob tokens as "token_id:N").
  bool return_token_ids = false, tokens_as_ids = false;
  std::shared_ptr<const ModelTokenizer> tokenizer;  // for the text of logprob tokens
};

// How chat messages become a prompt, as vLLM's request fields say: the generation prompt (the
// assistant's turn opened), or the last (assistant) message continued instead, the template's
// extra variables (Qwen3's enable_thinking), and whether the tokenizer adds its special tokens.
struct ChatOptions {
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  nlohmann::json template_kwargs = nlohmann::json::object();
  std::optional<bool> add_special_tokens;  // unset: none with a template, BOS without
};
// The options from a request body (chat completions or /tokenize), each checked.
absl::StatusOr<ChatOptions> ReadChatOptions(const nlohmann::json& body);

// The embedded models' chat format (they bring no chat template of their own): ChatML turns,
// then the assistant's turn opened (or the last message left open to be continued).
std::string RenderChat(const nlohmann::json& messages, const ChatOptions& options = {});

// Chat messages ({role, content} objects) as prompt ids: through the model's chat template, or,
// when it has none, RenderChat with the tokenizer's BOS.
absl::StatusOr<std::vector<int32_t>> ChatPrompt(const nlohmann::json& messages,
                                                const ModelTokenizer& tokenizer,
                                                const ChatOptions& options = {});

// Parses a completions (`chat` false) or chat completions body; the prompt goes through the
// model's tokenizer (with its special tokens) unless given as token ids, and chat messages
// through its chat template (moeserve's ChatML rendering when it has none).
// `defaults` (the checkpoint's generation_config.json) fill temperature, top_p, top_k and
// max_tokens where the request leaves them out, as vLLM does.
absl::StatusOr<ParsedCompletion> ParseCompletion(const std::string& body, bool chat,
                                                 const ModelConfig& config,
                                                 const RequestLimits& limits,
                                                 std::shared_ptr<const ModelTokenizer> tokenizer,
                                                 const GenerationDefaults& defaults = {});

// The response objects. `id` is "cmpl-..." or "chatcmpl-...".
// One choice of an answer; `stop_reason`, as vLLM's: the stop string or stop token id that ended
// it (null for EOS, length).
// `prompt_logprobs` (null: none) goes in a completions choice; chat's is the answer's.
nlohmann::json ChoiceObject(const ParsedCompletion& p, int index, const CompletionText& out,
                            const std::string& finish_reason, const nlohmann::json& stop_reason,
                            const nlohmann::json& prompt_logprobs = nullptr);
// vLLM's prompt_logprobs: null for the first token, then {"id": {logprob, rank, decoded_token}}
// for the prompt token and the top n at each position.
nlohmann::json PromptLogprobsJson(const std::vector<int32_t>& prompt, const std::vector<PromptLogprob>& scored,
                                  const Tokenizer& tok, bool as_ids);
// The answer with `choices` (ChoiceObject's), its usage from `final_event`.
nlohmann::json CompletionObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                                const nlohmann::json& choices, const RequestEvent& final_event);
// The answer of one choice.
nlohmann::json CompletionObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                                const CompletionText& out, const std::string& finish_reason,
                                const RequestEvent& final_event,
                                const nlohmann::json& stop_reason = nullptr);
// One streamed chunk: new text (and its tokens' logprobs), or, with finish_reason set, the last.
nlohmann::json ChunkObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                           const CompletionText& delta,
                           const std::optional<std::string>& finish_reason, bool first,
                           const nlohmann::json& stop_reason = nullptr, int index = 0);
// The usage object (with the cached prompt tokens and moeserve's receipt and timing).
nlohmann::json UsageObject(const RequestEvent& final_event);

}  // namespace moeserve::server
