// One choice of an OpenAI completion (a request asks for `n`): its request's stream
// (request_stream.h: text, tokens, how it ended) and what only the OpenAI API adds to it: echo,
// prompt logprobs, best_of's ranking, vLLM's stop_reason, the usage of all choices as one.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/request.h"
#include "server/openai_protocol.h"
#include "server/request_stream.h"

namespace moeserve::server {

struct CompletionChoice {
  CompletionChoice(const ParsedCompletion& p, int index)
      : prompt_index(index / p.best_of),
        stream(p.tokenizer->tokenizer.get(), p.prompts[static_cast<size_t>(prompt_index)], p.text, p.request) {}
  // An event's tokens (with their logprobs) into `taken`, through the stream (stop strings,
  // held text); the prompt's logprobs with the first.
  void Take(const RequestEvent& ev, const ParsedCompletion& p);
  // The whole answer's text, tokens and logprobs: with echo, the prompt's first (its first
  // token's logprob a NaN, written null), then `taken`.
  CompletionText Answer(const ParsedCompletion& p) const;
  // best_of's ranking: the mean logprob of the tokens it answers (-inf with none).
  double MeanLogprob() const;
  // vLLM's prompt_logprobs of this choice's prompt (null unless asked for).
  nlohmann::json PromptLogprobs(const ParsedCompletion& p) const;
  // vLLM's stop_reason: the stop string that cut the text, or the stop token id the request
  // named that ended it; null for an EOS and for the length limit.
  nlohmann::json StopReason(const ParsedCompletion& p) const;

  int prompt_index = 0;  // which prompt of the batch it answers
  RequestStream stream;
  CompletionText taken;  // whole: everything; streamed: what waits for the next chunk
  std::vector<PromptLogprob> prompt_logprobs;  // from the engine, with the first token
  uint64_t engine_id = 0;  // 0 until submitted
  bool first = true, echoed = false;
};

// The final event of all choices as one: completion tokens, receipts and counts summed; each
// prompt's usage counted once (from its first choice); the timing of the first.
RequestEvent MergedFinal(const std::vector<CompletionChoice>& choices);

}  // namespace moeserve::server
