// One engine request as a client sees it (see request_stream.h).
#include "server/request_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace moeserve::server {

absl::Status ValidateTextOptions(const TextOptions& options) {
  if (options.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most ", kMaxStopStrings, " stop strings, got ", options.stop.size()));
  }
  for (const std::string& s : options.stop) {
    if (s.empty()) return absl::InvalidArgumentError("stop: stop strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop: a stop string may have at most ", kMaxStopStringBytes,
                                                     " bytes, got ", s.size()));
    }
  }
  return absl::OkStatus();
}

bool CutAtStop(std::string* text, const std::vector<std::string>& stop, bool include_stop,
               std::string* matched, size_t min_end) {
  size_t cut = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stop) {
    const size_t at = text->find(s, min_end >= s.size() ? min_end - s.size() + 1 : 0);
    if (at < cut || (at == cut && at != std::string::npos && s.size() > which->size())) {
      cut = at;
      which = &s;
    }
  }
  if (which == nullptr) return false;
  text->resize(cut + (include_stop ? which->size() : 0));
  if (matched != nullptr) *matched = *which;
  return true;
}

absl::Status OutcomeStatus(const RequestEvent& ev) {
  switch (ev.reason) {
    case FinishReason::kLength:
    case FinishReason::kStop:
      return absl::OkStatus();
    case FinishReason::kCancelled:
      return absl::CancelledError(ev.message);
    case FinishReason::kDeadline:
      return absl::DeadlineExceededError(ev.message);
    case FinishReason::kError:
      return ev.error_code == absl::StatusCode::kUnavailable ? absl::UnavailableError(ev.message)
                                                             : absl::InternalError(ev.message);
  }
  return absl::InternalError(ev.message);
}

TextStream::TextStream(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                       const TextOptions& options, int64_t min_tokens)
    : stop_(options.stop), include_stop_(options.include_stop_str), min_tokens_(min_tokens),
      decoder_(tokenizer, prompt) {
  for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

std::string TextStream::Push(int32_t token) {
  pending_ += decoder_.Push(token);
  if (++pushed_ <= min_tokens_) protected_ = pending_.size();
  return Drain(false);
}

std::string TextStream::Finish() {
  pending_ += decoder_.Flush();
  return Drain(true);
}

std::string TextStream::Drain(bool final) {
  if (stopped_) return "";
  std::string out;
  if (CutAtStop(&pending_, stop_, include_stop_, &matched_, protected_)) {
    stopped_ = true;
    out.swap(pending_);
    return out;
  }
  size_t cut = pending_.size() - (final ? 0 : std::min(hold_, pending_.size()));
  // Never split a UTF-8 character: back up over continuation bytes.
  while (cut > 0 && cut < pending_.size() && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  protected_ -= std::min(protected_, cut);
  return out;
}

RequestStream::RequestStream(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                             const TextOptions& options, const GenerateRequest& request)
    : text_(tokenizer, prompt, options, request.min_tokens),
      include_stop_(options.include_stop_str),
      stop_ids_(request.stop_ids) {}

void RequestStream::Count(const RequestEvent& ev) {
  if (!ev.tokens.empty()) last_token_ = ev.tokens.back();
  answered_ += static_cast<int64_t>(ev.tokens.size());
  if (ev.finished) final_ = ev;
}

void RequestStream::Take(const RequestEvent& ev, CompletionText* out) {
  if (!ev.tokens.empty()) last_token_ = ev.tokens.back();
  if (ev.finished) final_ = ev;
  for (size_t i = 0; i < ev.tokens.size(); ++i) {
    if (text_.stopped()) return;
    ++answered_;
    out->token_ids.push_back(ev.tokens[i]);
    if (i < ev.logprobs.size()) out->logprobs.push_back(ev.logprobs[i]);
    if (i < ev.token_logprobs.size()) out->chosen.push_back(ev.token_logprobs[i]);
    const bool stop_token = std::find(stop_ids_.begin(), stop_ids_.end(), ev.tokens[i]) != stop_ids_.end();
    if (!stop_token || include_stop_) out->text += text_.Push(ev.tokens[i]);
  }
}

bool RequestStream::StopNow() {
  if (!text_.stopped() || final_ || stop_sent_) return false;
  stop_sent_ = true;
  return true;
}

absl::StatusOr<std::string> RequestStream::Outcome() const {
  if (text_.stopped()) return std::string("stop");  // whatever the engine did after the cancel
  const absl::Status s = OutcomeStatus(*final_);
  if (!s.ok()) return s;
  return std::string(final_->reason == FinishReason::kLength ? "length" : "stop");
}

RequestEvent RequestStream::Final() const {
  RequestEvent out = *final_;
  out.usage.completion_tokens = answered_;
  return out;
}

}  // namespace moeserve::server
