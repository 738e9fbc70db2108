// The logits processors of one request, as vLLM applies them before sampling: logit_bias,
// min_tokens (its stop tokens banned until that many tokens are out), bad words (a word's last
// token banned where the output ends with the rest of it), and the repetition,
// frequency and presence penalties. The editor counts the request's output tokens as they come
// and writes, for each step that samples for it, the edits of its logit row
// (Backend::EditLogits applies them on the device, before SampleRows).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/request.h"
#include "kernels/backend.h"

namespace moeserve {

class LogitEditor {
 public:
  explicit LogitEditor(const GenerateRequest& r);

  // Whether the request asks for any edit at all (most do not: nothing is counted then).
  bool active() const { return active_; }
  // One output token, as it is appended to the sequence.
  void Observe(int32_t token);
  // The edits of logit row `row` for the next token, given how many tokens are already out.
  void Append(int32_t row, int64_t generated, std::vector<LogitEdit>* out) const;

 private:
  // Tokens that cannot be next: stop tokens before min_tokens, bad words' last tokens.
  std::vector<int32_t> Bans(int64_t generated) const;

  struct Entry {
    float bias = 0.0f;
    bool seen = false;  // in the prompt or the output: the repetition penalty applies
    int32_t count = 0;  // times in the output
  };

  SamplingParams params_;
  std::vector<int32_t> stop_ids_;  // sorted, unique
  std::vector<std::vector<int32_t>> bad_words_;
  std::vector<int32_t> output_;  // the output so far, kept for bad words
  int32_t min_tokens_ = 0;
  bool active_ = false;
  std::map<int32_t, Entry> entries_;  // ordered, so the edits come out the same every time
};

}  // namespace moeserve
