// Output processing.
#include "engine/output_processor.h"

#include <algorithm>
#include <optional>

namespace moeserve {
namespace {

PromptLogprob ScorePromptToken(const float* row, int64_t vocab, int32_t token, int32_t top) {
  const double log_z = LogNormalizer(row, vocab);
  PromptLogprob p;
  p.logprob = static_cast<float>(row[token] - log_z);
  p.rank = 1 + static_cast<int32_t>(std::count_if(row, row + vocab, [&](float l) { return l > row[token]; }));
  p.top = TopLogprobs(row, vocab, top, log_z);
  return p;
}

}  // namespace

void BookReceipts(const SchedulerOutput& out, int64_t num_seqs, double step_seconds, double transfer_seconds,
                  double block_bytes, const LiveLookup& live) {
  double moved = 0, owned = 0;  // blocks copied, and of those, for a sequence
  for (size_t i = 0; i < out.transfers.size(); ++i) {
    const double n = static_cast<double>(out.transfers[i].blocks.size());
    moved += n;
    if (out.transfer_seqs[i] != nullptr) owned += n;
  }
  // Copies may overlap the step (they are asynchronous): what is charged never exceeds it.
  const double owned_seconds = moved > 0 ? std::min(transfer_seconds, step_seconds) * owned / moved : 0.0;
  for (size_t i = 0; i < out.transfers.size(); ++i) {
    if (out.transfer_seqs[i] == nullptr) continue;
    LiveRequest& r = live(out.transfer_seqs[i]->id);
    const double share = owned_seconds * static_cast<double>(out.transfers[i].blocks.size()) / owned;
    r.transfer_device_seconds += share;
    r.device_seconds += share;
  }
  const double shared = step_seconds - owned_seconds;
  for (const auto& ch : out.chunks) {
    LiveRequest& r = live(ch.seq->id);
    ++r.steps;
    r.batch_sum += num_seqs;
    const double share = shared * static_cast<double>(ch.num_tokens) / static_cast<double>(out.num_tokens);
    (ch.is_decode() ? r.decode_device_seconds : r.prefill_device_seconds) += share;
    r.device_seconds += share;
    r.kv_gb_seconds += static_cast<double>(ch.seq->blocks.size()) * block_bytes / 1e9 * step_seconds;
  }
}

std::vector<std::pair<LiveRequest*, FinishReason>> ProcessOutputs(
    const SchedulerOutput& out, const std::vector<int32_t>& sampled,
    const std::vector<float>& logits, int64_t vocab, Clock::time_point now,
    const LiveLookup& live) {
  std::vector<std::pair<LiveRequest*, FinishReason>> finishing;
  size_t row = 0;
  for (const auto& ch : out.chunks) {
    LiveRequest& r = live(ch.seq->id);
    for (int64_t i = 0; i < ch.prompt_logit_rows(); ++i) {
      const size_t lr = row++;
      // Position p scores prompt token p + 1; a recomputed prompt adds nothing twice.
      if (ch.start + i != static_cast<int64_t>(r.prompt_logprobs.size())) continue;
      r.prompt_logprobs.push_back(
          ScorePromptToken(logits.data() + lr * vocab, vocab, ch.seq->tokens[ch.start + i + 1], r.request.prompt_logprobs));
    }
    if (!ch.wants_logits) continue;
    const size_t lr = row++;
    const int32_t tok = sampled[lr];
    Sequence& seq = r.seq;
    seq.tokens.push_back(tok);
    r.editor->Observe(tok);
    if (!r.first_token) r.first_token = now;
    RequestEvent ev;
    ev.request_id = seq.id;
    ev.tokens = {tok};
    if (!r.prompt_logprobs_sent && r.request.prompt_logprobs >= 0) {
      ev.prompt_logprobs = r.prompt_logprobs;
      r.prompt_logprobs_sent = true;
      seq.prompt_logits = false;  // a recompute after preemption needs no prompt logits
    }
    if (r.request.wants_logprobs()) {
      const float* row_logits = logits.data() + lr * vocab;
      const double log_z = LogNormalizer(row_logits, vocab);
      ev.token_logprobs.push_back(static_cast<float>(row_logits[tok] - log_z));
      ev.logprobs.push_back(TopLogprobs(row_logits, vocab, r.request.top_logprobs, log_z));
    }
    const auto& stop = r.request.stop_ids;
    const int64_t generated = seq.num_tokens() - seq.prompt_len;
    std::optional<FinishReason> reason;
    if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
      reason = FinishReason::kStop;
    } else if (generated >= r.request.max_tokens || seq.num_tokens() >= seq.max_total_tokens) {
      reason = FinishReason::kLength;
    }
    if (r.callback) r.callback(ev);
    if (reason) finishing.emplace_back(&r, *reason);
  }
  return finishing;
}

RequestEvent FinalEvent(const LiveRequest& live, FinishReason reason, const std::string& message,
                        double price_per_hour, Clock::time_point now) {
  RequestEvent ev;
  ev.request_id = live.seq.id;
  ev.finished = true;
  ev.reason = reason;
  ev.message = message;
  ev.usage.prompt_tokens = live.seq.prompt_len;
  ev.usage.cached_prompt_tokens = live.seq.cached_prompt_tokens;
  ev.usage.cached_prompt_tokens_ddr = live.seq.cached_prompt_tokens_ddr;
  ev.usage.cached_prompt_tokens_flash = live.seq.cached_prompt_tokens_flash;
  ev.usage.completion_tokens = live.seq.num_tokens() - live.seq.prompt_len;
  ev.preemptions = live.seq.preemptions;
  ev.swaps = live.seq.swaps;
  auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  ev.timing.e2e_seconds = secs(now - live.submitted);
  ev.timing.queue_seconds =
      live.first_scheduled ? secs(*live.first_scheduled - live.submitted) : ev.timing.e2e_seconds;
  if (live.first_token) {
    ev.timing.ttft_seconds = secs(*live.first_token - live.submitted);
    if (ev.usage.completion_tokens > 1) {
      ev.timing.tpot_seconds =
          secs(now - *live.first_token) / static_cast<double>(ev.usage.completion_tokens - 1);
    }
  }
  RequestReceipt& rc = ev.receipt;
  rc.queue_seconds = ev.timing.queue_seconds;
  if (live.first_scheduled && live.first_token)
    rc.prefill_seconds = secs(*live.first_token - *live.first_scheduled);
  if (live.first_token) rc.decode_seconds = secs(now - *live.first_token);
  rc.steps = live.steps;
  rc.mean_batch_size =
      live.steps ? static_cast<double>(live.batch_sum) / static_cast<double>(live.steps) : 0.0;
  rc.cached_tokens = live.seq.cached_prompt_tokens;
  rc.device_seconds = live.device_seconds;
  rc.prefill_device_seconds = live.prefill_device_seconds;
  rc.decode_device_seconds = live.decode_device_seconds;
  rc.transfer_device_seconds = live.transfer_device_seconds;
  rc.kv_gb_seconds = live.kv_gb_seconds;
  rc.cost_usd = live.device_seconds * price_per_hour / 3600.0;
  return ev;
}

}  // namespace moeserve
