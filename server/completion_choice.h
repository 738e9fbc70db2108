// One choice of an OpenAI completion (a request asks for `n`): its text in whole characters,
// held back where a stop string could begin and cut at one, the tokens and logprobs taken from
// the engine's events, and how it ended (finish_reason, vLLM's stop_reason, the usage).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/request.h"
#include "models/stream_detokenizer.h"
#include "server/openai_protocol.h"

namespace moeserve::server {

// Text from tokens, in whole characters, held back where it could begin a stop string; cut at
// the first stop string.
class TextStream {
 public:
  // `prompt`: the choice's own prompt (the decoder's context).
  TextStream(const ParsedCompletion& p, const std::vector<int32_t>& prompt);
  std::string Push(int32_t token);
  std::string Finish();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string, once stopped

 private:
  std::string Drain(bool final);

  std::vector<std::string> stop_;
  std::string matched_;
  bool include_stop_ = false;
  int64_t min_tokens_ = 0, pushed_ = 0;
  size_t protected_ = 0;  // the first bytes of pending_, from the first min_tokens tokens
  size_t hold_ = 0;
  StreamDetokenizer decoder_;
  std::string pending_;
  bool stopped_ = false;
};

struct CompletionChoice {
  CompletionChoice(const ParsedCompletion& p, int index)
      : prompt_index(index / p.best_of), text(p, p.prompts[static_cast<size_t>(prompt_index)]) {}
  // An event's tokens (with their logprobs) into `taken`; none after a stop string. As vLLM, a
  // stop token's (EOS or stop_token_ids) text is left out unless include_stop_str_in_output.
  void Take(const RequestEvent& ev, const ParsedCompletion& p);
  // The whole answer's text, tokens and logprobs: with echo, the prompt's first (its first
  // token's logprob a NaN, written null), then `taken`.
  CompletionText Answer(const ParsedCompletion& p) const;
  // best_of's ranking: the mean logprob of the tokens it answers (-inf with none).
  double MeanLogprob() const;
  // vLLM's prompt_logprobs of this choice's prompt (null unless asked for).
  nlohmann::json PromptLogprobs(const ParsedCompletion& p) const;
  // The finish reason of a choice that ended normally; nullopt and `error` otherwise.
  std::optional<std::string> Finish(absl::Status* error) const;
  // vLLM's stop_reason: the stop string that cut the text, or the stop token id the request
  // named that ended it; null for an EOS and for the length limit.
  nlohmann::json StopReason(const ParsedCompletion& p) const;

  int prompt_index = 0;  // which prompt of the batch it answers
  TextStream text;
  CompletionText taken;  // whole: everything; streamed: what waits for the next chunk
  std::vector<PromptLogprob> prompt_logprobs;  // from the engine, with the first token
  int64_t answered_tokens = 0;  // tokens through the one that ended it (a stop string's last)
  std::optional<int32_t> last_token;
  std::optional<RequestEvent> final_event;
  uint64_t engine_id = 0;  // 0 until submitted
  bool first = true, stop_cancelled = false, echoed = false;
};

// The final event of all choices as one: completion tokens, receipts and counts summed; each
// prompt's usage counted once (from its first choice); the timing of the first.
RequestEvent MergedFinal(const std::vector<CompletionChoice>& choices);

}  // namespace moeserve::server
