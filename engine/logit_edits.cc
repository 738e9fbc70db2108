// Logit edits.
#include "engine/logit_edits.h"

#include <algorithm>
#include <limits>

namespace moeserve {

LogitEditor::LogitEditor(const GenerateRequest& r)
    : params_(r.sampling), stop_ids_(r.stop_ids), bad_words_(r.bad_words), min_tokens_(r.min_tokens) {
  std::sort(stop_ids_.begin(), stop_ids_.end());  // sorted and unique: EOS may be named twice
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  active_ = params_.has_penalties() || !params_.logit_bias.empty() || (min_tokens_ > 0 && !stop_ids_.empty()) ||
            !bad_words_.empty();
  for (const auto& [token, bias] : params_.logit_bias) entries_[token].bias = bias;
  // vLLM's repetition penalty also covers the prompt's tokens; presence and frequency only the
  // output's.
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t t : r.prompt) entries_[t].seen = true;
  }
}

void LogitEditor::Observe(int32_t token) {
  if (!bad_words_.empty()) output_.push_back(token);
  if (!params_.has_penalties()) return;
  Entry& e = entries_[token];
  e.seen = true;
  ++e.count;
}

std::vector<int32_t> LogitEditor::Bans(int64_t generated) const {
  std::vector<int32_t> bans;
  if (generated < min_tokens_) bans = stop_ids_;
  // vLLM's bad words: a word's last token, when the output ends with the tokens before it.
  for (const std::vector<int32_t>& word : bad_words_) {
    const size_t prefix = word.size() - 1;
    if (prefix > output_.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output_.end() - static_cast<std::ptrdiff_t>(prefix))) {
      bans.push_back(word.back());
    }
  }
  std::sort(bans.begin(), bans.end());
  bans.erase(std::unique(bans.begin(), bans.end()), bans.end());
  return bans;
}

void LogitEditor::Append(int32_t row, int64_t generated, std::vector<LogitEdit>* out) const {
  if (!active_) return;
  const std::vector<int32_t> bans = Bans(generated);
  for (const auto& [token, e] : entries_) {
    LogitEdit edit;
    edit.row = row;
    edit.token = token;
    edit.bias = e.bias;
    if (e.seen) edit.repetition = params_.repetition_penalty;
    if (e.count > 0) edit.subtract = params_.frequency_penalty * static_cast<float>(e.count) + params_.presence_penalty;
    if (std::binary_search(bans.begin(), bans.end(), token)) edit.bias = -std::numeric_limits<float>::infinity();
    if (edit.bias != 0.0f || edit.repetition != 1.0f || edit.subtract != 0.0f) out->push_back(edit);
  }
  for (int32_t b : bans) {  // banned tokens without an entry of their own
    if (entries_.count(b) == 0) out->push_back(LogitEdit{row, b, -std::numeric_limits<float>::infinity(), 1.0f, 0.0f});
  }
}

}  // namespace moeserve
