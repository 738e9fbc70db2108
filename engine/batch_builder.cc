// Batch building.
#include "engine/batch_builder.h"

#include <algorithm>

#include "core/status.h"

namespace moeserve {

absl::StatusOr<StepBatch> BuildBatch(const SchedulerOutput& out, const StepCut& cut, const LiveLookup& live,
                                     Clock::time_point now) {
  StepBatch b;
  std::vector<int64_t> ranks;
  for (const ScheduledChunk& ch : out.chunks) ranks.push_back(ch.seq->segment);
  StepWriter w(cut, ranks);
  const SampleSpec scored;  // prompt logprob rows are scored, never sampled from
  int64_t row = 0;          // the step's logit rows, in the order ProcessOutputs reads them
  for (const ScheduledChunk& ch : out.chunks) {
    const Sequence& s = *ch.seq;
    LiveRequest& r = live(s.id);
    w.BeginSequence(s.blocks);
    const int64_t prompt_rows = ch.prompt_logit_rows();
    for (int64_t p = ch.start; p < ch.start + ch.num_tokens; ++p) {
      w.AddToken(s.tokens[p], static_cast<int32_t>(p));
      b.context_tokens += p + 1;
      if (p - ch.start < prompt_rows) {
        w.AddLogitRow(row++, &scored);
        w.RequestLogitsToHost();
      }
    }
    if (ch.wants_logits) {
      // Sampled on the device; the logits come to the host only for requests that want logprobs.
      const SampleSpec spec = r.sampler->Next();
      const int32_t local = w.AddLogitRow(row++, &spec);
      r.editor->Append(local, s.num_tokens() - s.prompt_len, w.edits());
      if (r.request.wants_logprobs()) w.RequestLogitsToHost();
    }
    if (!r.first_scheduled) r.first_scheduled = now;
  }
  ASSIGN_OR_RETURN(b.step, w.Finish());
  return b;
}

}  // namespace moeserve
