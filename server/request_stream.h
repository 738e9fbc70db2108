// What a front end shows of one engine request, the same on gRPC and HTTP: its text in whole
// characters, held back where a stop string could begin and cut at one; the tokens and logprobs
// it answers (none after a stop string); and how it ended, through one table from the engine's
// FinishReason to a status. The front ends keep only the wire mapping (protobuf or JSON).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/request.h"
#include "text/stream_detokenizer.h"

namespace moeserve::server {

// Stop strings, as vLLM's request fields: cut from the text (the engine stops on token ids).
struct TextOptions {
  std::vector<std::string> stop;
  bool include_stop_str = false;  // include_stop_str_in_output: the text keeps the stop string
};
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;
// Each stop string non-empty and at most kMaxStopStringBytes, at most kMaxStopStrings of them;
// the error names the field "stop".
absl::Status ValidateTextOptions(const TextOptions& options);

// Cuts `text` at the earliest stop string that ends after its first `min_end` bytes (after it,
// with `include_stop`); true when one was found, and then `matched` (when given) names it.
bool CutAtStop(std::string* text, const std::vector<std::string>& stop, bool include_stop = false,
               std::string* matched = nullptr, size_t min_end = 0);

// The one table from how a request ended to its status: OK for the length limit and a stop
// (token or string), CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE where a rank was lost, INTERNAL
// for any other failure. gRPC sends it as is; HTTP maps it with ToApiError.
absl::Status OutcomeStatus(const RequestEvent& final_event);

// Text from tokens, in whole characters, held back where it could begin a stop string; cut at
// the first stop string.
class TextStream {
 public:
  // `prompt`: the request's own (the decoder's context); the text of its first `min_tokens`
  // tokens ends no stop string, as vLLM's.
  TextStream(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt, const TextOptions& options,
             int64_t min_tokens);
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

// A piece of an answer: text, and the tokens it answers with their logprobs (when asked).
struct CompletionText {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> chosen;                        // per token: its own logprob, when asked
  std::vector<std::vector<TokenLogprob>> logprobs;  // per token: the top n, when asked
};

// One engine request as a client sees it.
class RequestStream {
 public:
  // `stop_ids`: the ids the engine stops on (the client's and EOS); their text is left out
  // unless include_stop_str, as vLLM's.
  RequestStream(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt, const TextOptions& options,
                const GenerateRequest& request);

  // Appends an event's tokens, logprobs and text to `out`; none after a stop string. The final
  // event is kept.
  void Take(const RequestEvent& ev, CompletionText* out);
  // As Take, counting the tokens without answering them (echo with max_tokens 0: the one token
  // generated is counted, not shown).
  void Count(const RequestEvent& ev);
  // True once, the first time a stop string has cut the text before the request ended: the
  // caller cancels the rest in the engine.
  bool StopNow();
  // The text still held back, once the request has ended.
  std::string FinishText() { return text_.Finish(); }
  // After the final event: "stop" or "length", or the status the request failed with.
  absl::StatusOr<std::string> Outcome() const;
  // The final event, its completion_tokens the tokens answered (through a stop string's last;
  // the engine may have run a token or two past it before its cancel arrived).
  RequestEvent Final() const;

  bool ended() const { return final_.has_value(); }
  const std::optional<RequestEvent>& final_event() const { return final_; }
  bool stopped() const { return text_.stopped(); }
  const std::string& matched() const { return text_.matched(); }
  std::optional<int32_t> last_token() const { return last_token_; }
  int64_t answered_tokens() const { return answered_; }

 private:
  TextStream text_;
  bool include_stop_ = false;
  std::vector<int32_t> stop_ids_;
  int64_t answered_ = 0;
  std::optional<int32_t> last_token_;
  std::optional<RequestEvent> final_;
  bool stop_sent_ = false;
};

}  // namespace moeserve::server
