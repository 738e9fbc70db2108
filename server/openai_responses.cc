// OpenAI response objects: errors, completions, stream chunks, usage and logprobs.
#include "server/openai_protocol.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "text/tokenizer.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;

// The engine validator's field names in OpenAI's spelling.
std::string OpenAiParam(absl::string_view field) {
  if (absl::StartsWith(field, "sampling.")) return std::string(field.substr(9));
  if (field == "text" || field == "token_ids") return "prompt";
  return std::string(field);
}
// A token as text and bytes, for logprobs. A token alone may be part of a character: its text
// then shows U+FFFD, and "bytes" its exact bytes (Tokenizer::TokenBytes).
// With `as_ids` (return_tokens_as_token_ids), vLLM's "token_id:N" instead of the text.
std::string TokenText(int32_t id, const Tokenizer& tokenizer, bool as_ids) {
  return as_ids ? absl::StrCat("token_id:", id) : tokenizer.Decode(std::vector<int32_t>{id}, false);
}
Json TokenJson(int32_t id, float logprob, bool chat, const Tokenizer& tokenizer, bool as_ids) {
  const std::string text = TokenText(id, tokenizer, as_ids);
  Json bytes = Json::array();
  for (unsigned char b : as_ids ? text : tokenizer.TokenBytes(id)) bytes.push_back(b);
  Json j = {{"token", text}, {"logprob", logprob}};
  if (chat) j["bytes"] = bytes;
  return j;
}

Json FingerprintJson(const ParsedCompletion& p) {
  return p.system_fingerprint.empty() ? Json(nullptr) : Json(p.system_fingerprint);
}

// Logprobs of generated tokens: the chosen token's own, and the top n.
Json LogprobsJson(const CompletionText& out, bool chat, const Tokenizer& tok, bool as_ids) {
  if (out.logprobs.empty() && out.chosen.empty()) return nullptr;
  auto chosen_logprob = [&](size_t i) -> Json { return i < out.chosen.size() ? Json(out.chosen[i]) : Json(nullptr); };
  if (chat) {
    Json content = Json::array();
    for (size_t i = 0; i < out.token_ids.size(); ++i) {
      Json top = Json::array();
      Json chosen = TokenJson(out.token_ids[i], 0.0f, true, tok, as_ids);
      chosen["logprob"] = chosen_logprob(i);
      if (i < out.logprobs.size()) {
        for (const TokenLogprob& lp : out.logprobs[i]) top.push_back(TokenJson(lp.token, lp.logprob, true, tok, as_ids));
      }
      chosen["top_logprobs"] = top;
      content.push_back(chosen);
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array();
  for (size_t i = 0; i < out.token_ids.size(); ++i) {
    tokens.push_back(TokenJson(out.token_ids[i], 0, false, tok, as_ids)["token"]);
    if (i < out.chosen.size() && std::isnan(out.chosen[i])) {  // an echoed prompt's first token
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    Json alternatives = Json::object();
    if (i < out.logprobs.size()) {
      for (const TokenLogprob& lp : out.logprobs[i]) {
        alternatives[TokenJson(lp.token, 0, false, tok, as_ids)["token"].get<std::string>()] = lp.logprob;
      }
    }
    // As vLLM's completions: the chosen token is among its alternatives (n + 1 where it is
    // outside the top n; with logprobs 0, alone).
    if (i < out.chosen.size()) alternatives[tokens.back().get<std::string>()] = out.chosen[i];
    token_logprobs.push_back(chosen_logprob(i));
    top.push_back(alternatives);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}};
}
}  // namespace

Json ApiError::ToJson() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", http_status}}}};
}

ApiError ToApiError(const absl::Status& s) {
  ApiError e;
  e.message = std::string(s.message());
  // A message that starts with "field: " names the parameter.
  const size_t colon = e.message.find(": ");
  if (colon != std::string::npos && e.message.find(' ') > colon) {
    e.param = OpenAiParam(e.message.substr(0, colon));
    e.message = e.param + e.message.substr(colon);
  }
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      e.http_status = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kCancelled:  // by the server or an operator: the client is still there
      e.http_status = 499;
      e.type = "cancelled";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
  }
  return e;
}
Json UsageObject(const RequestEvent& ev) {
  const RequestUsage& u = ev.usage;
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
          {"moeserve",
           {{"cached_prompt_tokens_ddr", u.cached_prompt_tokens_ddr},
            {"cached_prompt_tokens_flash", u.cached_prompt_tokens_flash},
            {"preemptions", ev.preemptions},
            {"swaps", ev.swaps},
            {"timing",
             {{"queue_seconds", ev.timing.queue_seconds},
              {"time_to_first_token_seconds", ev.timing.ttft_seconds},
              {"time_per_output_token_seconds", ev.timing.tpot_seconds},
              {"e2e_seconds", ev.timing.e2e_seconds}}},
            {"receipt",
             {{"steps", ev.receipt.steps},
              {"mean_batch_size", ev.receipt.mean_batch_size},
              {"device_seconds", ev.receipt.device_seconds},
              {"prefill_device_seconds", ev.receipt.prefill_device_seconds},
              {"decode_device_seconds", ev.receipt.decode_device_seconds},
              {"transfer_device_seconds", ev.receipt.transfer_device_seconds},
              {"kv_gb_seconds", ev.receipt.kv_gb_seconds},
              {"cost_usd", ev.receipt.cost_usd}}}}}};
}

Json PromptLogprobsJson(const std::vector<int32_t>& prompt, const std::vector<PromptLogprob>& scored,
                        const Tokenizer& tok, bool as_ids) {
  Json out = Json::array({nullptr});
  for (size_t i = 0; i < scored.size() && i + 1 < prompt.size(); ++i) {
    Json entry = Json::object();
    for (size_t k = 0; k < scored[i].top.size(); ++k) {
      const TokenLogprob& t = scored[i].top[k];
      entry[std::to_string(t.token)] = {{"logprob", t.logprob}, {"rank", k + 1},
                                        {"decoded_token", TokenText(t.token, tok, as_ids)}};
    }
    const int32_t id = prompt[i + 1];
    entry[std::to_string(id)] = {{"logprob", scored[i].logprob}, {"rank", scored[i].rank},
                                 {"decoded_token", TokenText(id, tok, as_ids)}};
    out.push_back(entry);
  }
  return out;
}

Json ChoiceObject(const ParsedCompletion& p, int index, const CompletionText& out,
                  const std::string& finish_reason, const Json& stop_reason, const Json& prompt_logprobs) {
  Json choice = {{"index", index},
                 {"logprobs", LogprobsJson(out, p.chat, *p.tokenizer->tokenizer, p.tokens_as_ids)},
                 {"finish_reason", finish_reason},
                 {"stop_reason", stop_reason}};
  if (!p.chat && !prompt_logprobs.is_null()) choice["prompt_logprobs"] = prompt_logprobs;
  if (p.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", out.text}};
  } else {
    choice["text"] = out.text;
  }
  return choice;
}

Json CompletionObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                      const Json& choices, const RequestEvent& final_event) {
  return {{"id", id},
          {"object", p.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", p.model},
          {"system_fingerprint", FingerprintJson(p)},
          {"choices", choices},
          {"usage", UsageObject(final_event)}};
}

Json CompletionObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                      const CompletionText& out, const std::string& finish_reason,
                      const RequestEvent& final_event, const Json& stop_reason) {
  return CompletionObject(p, id, created, Json::array({ChoiceObject(p, 0, out, finish_reason, stop_reason)}),
                          final_event);
}

Json ChunkObject(const ParsedCompletion& p, const std::string& id, int64_t created,
                 const CompletionText& delta, const std::optional<std::string>& finish_reason,
                 bool first, const Json& stop_reason, int index) {
  Json choice = {{"index", index},
                 {"logprobs", LogprobsJson(delta, p.chat, *p.tokenizer->tokenizer, p.tokens_as_ids)},
                 {"finish_reason", finish_reason ? Json(*finish_reason) : Json(nullptr)}};
  if (finish_reason) choice["stop_reason"] = stop_reason;
  if (p.chat) {
    Json d = Json::object();
    if (first) d["role"] = "assistant";
    if (!delta.text.empty() || !finish_reason) d["content"] = delta.text;
    choice["delta"] = d;
  } else {
    choice["text"] = delta.text;
  }
  if (p.return_token_ids) choice["token_ids"] = delta.token_ids;
  return {{"id", id},
          {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", p.model},
          {"system_fingerprint", FingerprintJson(p)},
          {"choices", Json::array({choice})}};
}
}  // namespace moeserve::server
