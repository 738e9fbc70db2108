// The request-field table and its check (see openai_fields.h). Defaults follow vLLM 0.32's
// pydantic models; null is accepted everywhere, as absent.
#include "server/openai_fields.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moeserve::server {
namespace {

using Json = nlohmann::json;
constexpr bool kChat = true, kCompletion = true, kNo = false;

RequestField Used(std::string_view name, bool chat = kChat, bool completion = kCompletion) {
  return {name, FieldUse::kUsed, chat, completion};
}
RequestField NoEffect(std::string_view name, bool chat = kChat, bool completion = kCompletion) {
  return {name, FieldUse::kNoEffect, chat, completion};
}
RequestField Only(std::string_view name, std::vector<std::string_view> defaults,
                  std::string_view why, bool chat = kChat, bool completion = kCompletion) {
  return {name, FieldUse::kDefaultOnly, chat, completion, std::move(defaults), why};
}

std::vector<RequestField> MakeTable() {
  return {
      // Implemented.
      Used("model"), Used("messages", kChat, kNo), Used("prompt", kNo, kCompletion),
      Used("max_tokens"), Used("max_completion_tokens", kChat, kNo), Used("stream"),
      Used("stream_options"), Used("temperature"), Used("top_p"), Used("top_k"), Used("seed"),
      Used("stop"), Used("stop_token_ids"), Used("include_stop_str_in_output"), Used("ignore_eos"),
      Used("logprobs"), Used("top_logprobs", kChat, kNo), Used("add_generation_prompt", kChat, kNo),
      Used("continue_final_message", kChat, kNo), Used("chat_template_kwargs", kChat, kNo),
      Used("add_special_tokens"), Used("response_format"), Used("priority"), Used("cache_salt"),
      Used("n"), Used("min_p"), Used("presence_penalty"), Used("frequency_penalty"),
      Used("repetition_penalty"), Used("logit_bias"), Used("min_tokens"), Used("prompt_logprobs"),
      Used("echo", kNo, kCompletion), Used("return_token_ids"), Used("return_tokens_as_token_ids"),
      Used("bad_words"), Used("best_of"),
      Used("retain_seconds"),  // moeserve's own: how long the prompt's KV stays cached
      // Without effect on the tokens or the text.
      NoEffect("user"), NoEffect("request_id"), NoEffect("session_id"), NoEffect("metadata"),
      NoEffect("store"), NoEffect("service_tier"), NoEffect("prompt_cache_key"),
      NoEffect("safety_identifier"), NoEffect("parallel_tool_calls", kChat, kNo),
      NoEffect("include_reasoning", kChat, kNo),  // no reasoning parser: the text comes whole
      NoEffect("stream_interval"),                // how often chunks go out, not what they say
      NoEffect("truncation_side"),                // only with truncate_prompt_tokens (refused)
      NoEffect("mm_payload"), NoEffect("routed_experts_prompt_start"),
      NoEffect("return_mm_kwargs"),  // text-only models have none to return
      // Refused at any other value than their default.
      Only("allowed_token_ids", {}, "not supported"),
      Only("use_beam_search", {"false"}, "beam search is not supported"),
      Only("length_penalty", {"1"}, "beam search is not supported (only 1)"),
      Only("echo", {"false"}, "not supported on chat (it is on /v1/completions)", kChat, kNo),
      Only("suffix", {"\"\""}, "not supported", kNo, kCompletion),
      Only("logprob_token_ids", {}, "not supported"),
      Only("skip_special_tokens", {"true"}, "special tokens are always skipped in the text"),
      Only("spaces_between_special_tokens", {"true"}, "not supported (only true)"),
      Only("truncate_prompt_tokens", {}, "prompts are never truncated: a prompt too long is refused"),
      Only("tools", {"[]"}, "not supported"), Only("functions", {"[]"}, "not supported", kChat, kNo),
      Only("tool_choice", {"\"none\"", "\"auto\""}, "tools are not supported", kChat, kNo),
      Only("function_call", {"\"none\"", "\"auto\""}, "tools are not supported", kChat, kNo),
      Only("reasoning_effort", {}, "not supported", kChat, kNo),
      Only("thinking_token_budget", {"-1"}, "not supported (-1: unset)"),
      Only("verbosity", {}, "not supported", kChat, kNo),
      Only("structured_outputs", {}, "structured output is not supported"),
      Only("watermarking", {}, "not supported"),
      Only("documents", {}, "not supported", kChat, kNo),
      Only("chat_template", {}, "a request's own chat template is not accepted", kChat, kNo),
      Only("media_io_kwargs", {}, "text-only models", kChat, kNo),
      Only("mm_processor_kwargs", {}, "text-only models", kChat, kNo),
      Only("audio", {}, "text-only models", kChat, kNo),
      Only("modalities", {"[\"text\"]"}, "text-only models", kChat, kNo),
      Only("prediction", {}, "not supported", kChat, kNo),
      Only("web_search_options", {}, "not supported", kChat, kNo),
      Only("prompt_embeds", {}, "not supported", kNo, kCompletion),
      Only("return_token_offsets", {"false"}, "not supported"),
      Only("return_prompt_text", {"false"}, "not supported", kChat, kNo),
      Only("kv_transfer_params", {}, "disaggregated serving is not supported"),
      Only("ec_transfer_params", {}, "disaggregated serving is not supported"),
      Only("vllm_xargs", {}, "not supported"),
      Only("repetition_detection", {}, "not supported"),
  };
}

}  // namespace

const std::vector<RequestField>& RequestFields() {
  static const std::vector<RequestField> table = MakeTable();  // constant, built once
  return table;
}

absl::Status CheckRequestFields(const Json& body, bool chat) {
  const std::vector<RequestField>& table = RequestFields();
  for (const auto& item : body.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    auto it = std::find_if(table.begin(), table.end(), [&](const RequestField& f) {
      return f.name == key && (chat ? f.chat : f.completion);
    });
    if (it == table.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": unknown parameter for ", chat ? "/v1/chat/completions" : "/v1/completions",
          " (not a field of OpenAI's or vLLM's request; docs/vllm-flags.md lists what moeserve "
          "implements)"));
    }
    if (it->use != FieldUse::kDefaultOnly || value.is_null()) continue;
    const bool is_default = std::any_of(it->defaults.begin(), it->defaults.end(), [&](std::string_view d) {
      return Json::parse(d) == value;
    });
    if (!is_default) {
      std::vector<std::string> allowed(it->defaults.begin(), it->defaults.end());
      allowed.push_back("null");
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": ", std::string(it->why), " (accepted: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace moeserve::server
