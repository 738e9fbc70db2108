// Streams a generation's text as its tokens arrive, for any Tokenizer, never splitting a UTF-8
// character across two messages. As vLLM does: the text of a new token is the difference
// between decoding a short window of recent ids with and without it (the window starts a few
// tokens back, inside the prompt for the first one, so that decoders that strip a leading
// space or merge bytes see the same context both times), held back while it ends in U+FFFD
// (an incomplete byte sequence). Special tokens are skipped, as OpenAI-API servers do.
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace moeserve {

class StreamDetokenizer {
 public:
  // `tokenizer` must outlive this; `prompt` gives the context before the first new token.
  StreamDetokenizer(const Tokenizer* tokenizer, absl::Span<const int32_t> prompt);

  // Text that became final with `id` (maybe empty).
  std::string Push(int32_t id);
  // Whatever is still held back (an incomplete character renders as U+FFFD).
  std::string Flush();

 private:
  // How many tokens of context the window keeps before the unread ones.
  static constexpr size_t kContext = 5;

  const Tokenizer* tokenizer_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;  // the window's start
  size_t read_ = 0;    // ids before this are already emitted
};

}  // namespace moeserve
