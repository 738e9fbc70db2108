// Logit edits.
#include "engine/logit_edits.h"

#include <algorithm>
#include <limits>

namespace moeserve {

LogitEditor::LogitEditor(const GenerateRequest& r)
    : params_(r.sampling), stop_ids_(r.stop_ids), min_tokens_(r.min_tokens) {
  std::sort(stop_ids_.begin(), stop_ids_.end());  // sorted and unique: EOS may be named twice
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  active_ = params_.has_penalties() || !params_.logit_bias.empty() || (min_tokens_ > 0 && !stop_ids_.empty());
  for (const auto& [token, bias] : params_.logit_bias) entries_[token].bias = bias;
  // vLLM's repetition penalty also covers the prompt's tokens; presence and frequency only the
  // output's.
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t t : r.prompt) entries_[t].seen = true;
  }
}

void LogitEditor::Observe(int32_t token) {
  if (!params_.has_penalties()) return;
  Entry& e = entries_[token];
  e.seen = true;
  ++e.count;
}

void LogitEditor::Append(int32_t row, int64_t generated, std::vector<LogitEdit>* out) const {
  if (!active_) return;
  const bool ban_stops = generated < min_tokens_;
  for (const auto& [token, e] : entries_) {
    LogitEdit edit;
    edit.row = row;
    edit.token = token;
    edit.bias = e.bias;
    if (e.seen) edit.repetition = params_.repetition_penalty;
    if (e.count > 0) edit.subtract = params_.frequency_penalty * static_cast<float>(e.count) + params_.presence_penalty;
    if (ban_stops && std::binary_search(stop_ids_.begin(), stop_ids_.end(), token)) {
      edit.bias = -std::numeric_limits<float>::infinity();
    }
    if (edit.bias != 0.0f || edit.repetition != 1.0f || edit.subtract != 0.0f) out->push_back(edit);
  }
  if (!ban_stops) return;
  for (int32_t s : stop_ids_) {  // stop tokens without an entry of their own
    if (entries_.count(s) == 0) out->push_back(LogitEdit{row, s, -std::numeric_limits<float>::infinity(), 1.0f, 0.0f});
  }
}

}  // namespace moeserve
