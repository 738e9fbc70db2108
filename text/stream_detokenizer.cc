// StreamDetokenizer.
#include "text/stream_detokenizer.h"

#include <algorithm>

namespace moeserve {
namespace {

constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";

bool EndsInReplacement(const std::string& s) {
  return s.size() >= kReplacement.size() &&
         absl::string_view(s).substr(s.size() - kReplacement.size()) == kReplacement;
}

}  // namespace

StreamDetokenizer::StreamDetokenizer(const Tokenizer* tokenizer, absl::Span<const int32_t> prompt)
    : tokenizer_(tokenizer) {
  const size_t keep = std::min(prompt.size(), kContext);
  ids_.assign(prompt.end() - keep, prompt.end());
  prefix_ = 0;
  read_ = ids_.size();
}

std::string StreamDetokenizer::Push(int32_t id) {
  ids_.push_back(id);
  const absl::Span<const int32_t> all(ids_);
  const std::string before = tokenizer_->Decode(all.subspan(prefix_, read_ - prefix_), true);
  const std::string now = tokenizer_->Decode(all.subspan(prefix_), true);
  // Hold back until the window's text has grown and its newest bytes form a character.
  if (now.size() <= before.size() || EndsInReplacement(now)) return "";
  // Lossy decoding can render invalid bytes differently once more follow, so the window's old
  // text is not always a prefix of its new one: repair the cut so a message is valid UTF-8.
  std::string out = Utf8Lossy(absl::string_view(now).substr(before.size()));
  // Slide the window: the emitted ids become context; keep at most kContext of them.
  read_ = ids_.size();
  prefix_ = read_ - std::min(read_, kContext);
  if (prefix_ > 4 * kContext) {  // drop ids no window will look at again
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return out;
}

std::string StreamDetokenizer::Flush() {
  const absl::Span<const int32_t> all(ids_);
  const std::string before = tokenizer_->Decode(all.subspan(prefix_, read_ - prefix_), true);
  const std::string now = tokenizer_->Decode(all.subspan(prefix_), true);
  read_ = ids_.size();
  prefix_ = read_ - std::min(read_, kContext);
  if (now.size() <= before.size()) return "";
  return Utf8Lossy(absl::string_view(now).substr(before.size()));
}

}  // namespace moeserve
