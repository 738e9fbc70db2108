// One choice of an OpenAI completion (see completion_choice.h).
#include "server/completion_choice.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moeserve::server {

void CompletionChoice::Take(const RequestEvent& ev, const ParsedCompletion& p) {
  if (!ev.prompt_logprobs.empty()) prompt_logprobs = ev.prompt_logprobs;
  if (p.echo_only) return stream.Count(ev);  // max_tokens 0 with echo: counted, not answered
  stream.Take(ev, &taken);
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

nlohmann::json CompletionChoice::StopReason(const ParsedCompletion& p) const {
  if (stream.stopped()) return stream.matched();
  const std::vector<int32_t>& eos = p.tokenizer->eos_ids;
  const std::optional<int32_t> last = stream.last_token();
  if (stream.ended() && stream.final_event()->reason == FinishReason::kStop && last &&
      std::find(eos.begin(), eos.end(), *last) == eos.end() &&  // EOS: null, as vLLM
      std::find(p.user_stop_ids.begin(), p.user_stop_ids.end(), *last) != p.user_stop_ids.end()) {
    return *last;
  }
  return nullptr;
}

RequestEvent MergedFinal(const std::vector<CompletionChoice>& choices) {
  RequestEvent out = choices.front().stream.Final();  // completion_tokens: the tokens answered, as vLLM
  for (size_t i = 1; i < choices.size(); ++i) {
    const RequestEvent ev = choices[i].stream.Final();
    out.usage.completion_tokens += ev.usage.completion_tokens;
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
