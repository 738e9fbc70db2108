// Batch building.
#include "engine/batch_builder.h"

#include <algorithm>

namespace moeserve {

StepBatch BuildBatch(const SchedulerOutput& out, int64_t block_size, const LiveLookup& live,
                     Clock::time_point now) {
  StepBatch b;
  ForwardInput& in = b.input;
  in.logits_to_host = false;  // set below by a request that wants logprobs
  in.num_seqs = static_cast<int64_t>(out.chunks.size());
  for (const auto& ch : out.chunks) {
    in.max_blocks_per_seq = std::max<int64_t>(in.max_blocks_per_seq, ch.seq->blocks.size());
  }
  in.block_tables.assign(in.num_seqs * in.max_blocks_per_seq, 0);
  for (size_t j = 0; j < out.chunks.size(); ++j) {
    const ScheduledChunk& ch = out.chunks[j];
    const Sequence& s = *ch.seq;
    std::copy(s.blocks.begin(), s.blocks.end(),
              in.block_tables.begin() + j * in.max_blocks_per_seq);
    const int64_t first_token = static_cast<int64_t>(in.token_ids.size());
    for (int64_t p = ch.start; p < ch.start + ch.num_tokens; ++p) {
      in.token_ids.push_back(s.tokens[p]);
      in.positions.push_back(static_cast<int32_t>(p));
      in.token_seq.push_back(static_cast<int32_t>(j));
      in.slots.push_back(static_cast<int64_t>(s.blocks[p / block_size]) * block_size +
                         p % block_size);
      b.context_tokens += p + 1;
    }
    LiveRequest& r = live(s.id);
    for (int64_t i = 0; i < ch.prompt_logit_rows(); ++i) {  // scored, never sampled from
      in.logit_rows.push_back(static_cast<int32_t>(first_token + i));
      in.sample.push_back(SampleSpec());
      in.logits_to_host = true;
    }
    if (ch.wants_logits) {
      // Sampled on the device; the logits come to the host only for requests that want logprobs.
      in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
      in.sample.push_back(r.sampler->Next());
      r.editor->Append(static_cast<int32_t>(in.logit_rows.size() - 1), s.num_tokens() - s.prompt_len,
                       &in.logit_edits);
      if (r.request.wants_logprobs()) in.logits_to_host = true;
    }
    if (!r.first_scheduled) r.first_scheduled = now;
  }
  return b;
}

}  // namespace moeserve
