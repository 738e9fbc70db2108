// Every field of the OpenAI request bodies that vLLM 0.32 (ChatCompletionRequest,
// CompletionRequest) or OpenAI itself defines, and what moeserve does with each: used, without
// effect on the answer, or refused at any value other than its default. A field in no schema is
// refused by name (a misspelt "max_token" must not silently give a 16-token answer), so no
// field that changes an answer is ever ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace moeserve::server {

enum class FieldUse {
  kUsed,         // implemented (openai_protocol.cc reads it)
  kNoEffect,     // accepted; it cannot change the tokens or the text (user, request_id, ...)
  kDefaultOnly,  // refused unless absent, null or one of `defaults`
};

struct RequestField {
  std::string_view name;
  FieldUse use;
  bool chat;        // a field of /v1/chat/completions
  bool completion;  // a field of /v1/completions
  // kDefaultOnly: the values accepted, as JSON text ("false", "1", "[]", "\"none\"").
  std::vector<std::string_view> defaults = {};
  std::string_view why = "";  // kDefaultOnly: said in the 400
};

// The table, in the schemas' order (the test and docs/vllm-flags.md read it).
const std::vector<RequestField>& RequestFields();

// INVALID_ARGUMENT naming the first field of `body` that this endpoint does not know or does not
// implement at the value given; OK otherwise.
absl::Status CheckRequestFields(const nlohmann::json& body, bool chat);

}  // namespace moeserve::server
