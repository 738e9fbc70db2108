// One choice of an OpenAI completion (see completion_choice.h).
#include "server/completion_choice.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moeserve::server {

TextStream::TextStream(const ParsedCompletion& p, const std::vector<int32_t>& prompt)
    : stop_(p.stop),
      include_stop_(p.include_stop_str),
      min_tokens_(p.request.min_tokens),
      decoder_(p.tokenizer->tokenizer.get(), prompt) {
  for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

std::string TextStream::Push(int32_t token) {
  pending_ += decoder_.Push(token);
  // As vLLM: the text of the first min_tokens tokens ends no stop string.
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
  while (cut > 0 && cut < pending_.size() && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  protected_ -= std::min(protected_, cut);
  return out;
}

void CompletionChoice::Take(const RequestEvent& ev, const ParsedCompletion& p) {
  if (!ev.tokens.empty()) last_token = ev.tokens.back();
  if (!ev.prompt_logprobs.empty()) prompt_logprobs = ev.prompt_logprobs;
  if (p.echo_only) {  // max_tokens 0 with echo: the one token generated is counted, not answered
    answered_tokens += static_cast<int64_t>(ev.tokens.size());
    return;
  }
  const std::vector<int32_t>& stops = p.request.stop_ids;
  for (size_t i = 0; i < ev.tokens.size(); ++i) {
    if (text.stopped()) return;
    ++answered_tokens;
    taken.token_ids.push_back(ev.tokens[i]);
    if (i < ev.logprobs.size()) taken.logprobs.push_back(ev.logprobs[i]);
    if (i < ev.token_logprobs.size()) taken.chosen.push_back(ev.token_logprobs[i]);
    const bool stop_token = std::find(stops.begin(), stops.end(), ev.tokens[i]) != stops.end();
    if (!stop_token || p.include_stop_str) taken.text += text.Push(ev.tokens[i]);
  }
}

CompletionText CompletionChoice::Answer(const ParsedCompletion& p) const {
  if (!p.echo) return taken;
  const std::vector<int32_t>& prompt = p.prompts[static_cast<size_t>(prompt_index)];
  CompletionText out;
  // (vLLM leaves the prompt's text out when the ids come back: return_token_ids.)
  out.text = (p.return_token_ids ? "" : p.prompt_texts[static_cast<size_t>(prompt_index)]) + taken.text;
  out.token_ids = prompt;
  out.token_ids.insert(out.token_ids.end(), taken.token_ids.begin(), taken.token_ids.end());
  if (p.want_logprobs) {
    out.chosen.push_back(std::nanf(""));
    out.logprobs.emplace_back();
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      out.chosen.push_back(i < prompt_logprobs.size() ? prompt_logprobs[i].logprob : std::nanf(""));
      out.logprobs.push_back(i < prompt_logprobs.size() ? prompt_logprobs[i].top : std::vector<TokenLogprob>());
    }
    out.chosen.insert(out.chosen.end(), taken.chosen.begin(), taken.chosen.end());
    out.logprobs.insert(out.logprobs.end(), taken.logprobs.begin(), taken.logprobs.end());
  }
  return out;
}

double CompletionChoice::MeanLogprob() const {
  if (taken.chosen.empty()) return -std::numeric_limits<double>::infinity();
  double sum = 0;
  for (float lp : taken.chosen) sum += lp;
  return sum / static_cast<double>(taken.chosen.size());
}

nlohmann::json CompletionChoice::PromptLogprobs(const ParsedCompletion& p) const {
  if (p.request.prompt_logprobs < 0) return nullptr;
  return PromptLogprobsJson(p.prompts[static_cast<size_t>(prompt_index)], prompt_logprobs, *p.tokenizer->tokenizer,
                            p.tokens_as_ids);
}

std::optional<std::string> CompletionChoice::Finish(absl::Status* error) const {
  if (text.stopped()) return "stop";
  const RequestEvent& ev = *final_event;
  switch (ev.reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      *error = absl::UnavailableError(ev.message);
      break;
    case FinishReason::kDeadline:
      *error = absl::DeadlineExceededError(ev.message);
      break;
    case FinishReason::kError:
      *error = absl::Status(ev.error_code == absl::StatusCode::kUnavailable ? absl::StatusCode::kUnavailable
                                                                            : absl::StatusCode::kInternal,
                            ev.message);
      break;
  }
  return std::nullopt;
}

nlohmann::json CompletionChoice::StopReason(const ParsedCompletion& p) const {
  if (text.stopped()) return text.matched();
  const std::vector<int32_t>& eos = p.tokenizer->eos_ids;
  if (final_event && final_event->reason == FinishReason::kStop && last_token &&
      std::find(eos.begin(), eos.end(), *last_token) == eos.end() &&  // EOS: null, as vLLM
      std::find(p.user_stop_ids.begin(), p.user_stop_ids.end(), *last_token) != p.user_stop_ids.end()) {
    return *last_token;
  }
  return nullptr;
}

RequestEvent MergedFinal(const std::vector<CompletionChoice>& choices) {
  RequestEvent out = *choices.front().final_event;
  // As vLLM counts them: the tokens each choice answers (the engine may have run a token or two
  // past a stop string before its cancel arrived; the receipt still has their cost).
  out.usage.completion_tokens = 0;
  for (const CompletionChoice& c : choices) out.usage.completion_tokens += c.answered_tokens;
  for (size_t i = 1; i < choices.size(); ++i) {
    const RequestEvent& ev = *choices[i].final_event;
    if (choices[i].prompt_index != choices[i - 1].prompt_index) {  // another prompt of the batch
      out.usage.prompt_tokens += ev.usage.prompt_tokens;
      out.usage.cached_prompt_tokens += ev.usage.cached_prompt_tokens;
      out.usage.cached_prompt_tokens_ddr += ev.usage.cached_prompt_tokens_ddr;
      out.usage.cached_prompt_tokens_flash += ev.usage.cached_prompt_tokens_flash;
      out.receipt.cached_tokens += ev.receipt.cached_tokens;
    }
    out.preemptions += ev.preemptions;
    out.swaps += ev.swaps;
    RequestReceipt& r = out.receipt;
    r.steps += ev.receipt.steps;
    r.device_seconds += ev.receipt.device_seconds;
    r.prefill_device_seconds += ev.receipt.prefill_device_seconds;
    r.decode_device_seconds += ev.receipt.decode_device_seconds;
    r.transfer_device_seconds += ev.receipt.transfer_device_seconds;
    r.kv_gb_seconds += ev.receipt.kv_gb_seconds;
    r.cost_usd += ev.receipt.cost_usd;
  }
  return out;
}

}  // namespace moeserve::server
