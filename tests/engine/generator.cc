// Static-batch generation.
#include "tests/engine/generator.h"

#include <algorithm>
#include <array>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"

namespace moeserve {
namespace {

struct SeqState {
  std::vector<int32_t> tokens;  // prompt then generated
  std::vector<int32_t> blocks;
  int64_t computed = 0;         // tokens whose KV is in the cache
  bool done = false;
};

}  // namespace

Generator::Generator(MoeModel* model, KvStorage* kv, BlockPool* pool, GeneratorOptions options)
    : model_(model), kv_(kv), pool_(pool), options_(options) {}

absl::StatusOr<std::vector<GenerationResult>> Generator::Run(
    const std::vector<GenerationRequest>& requests,
    const std::function<void(size_t, int32_t)>& on_token, GenerationTiming* timing) {
  const ModelConfig& c = model_->config();
  const KvLayout& layout = kv_->layout();
  const int64_t bs = layout.block_size;
  const size_t n = requests.size();
  std::vector<SeqState> seqs(n);
  std::vector<GenerationResult> results(n);
  std::vector<Sampler> samplers;
  absl::Cleanup release = [&] {
    for (auto& s : seqs) pool_->Release(s.blocks);
  };
  for (size_t i = 0; i < n; ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) return absl::InvalidArgumentError(absl::StrCat("request ", i, ": empty prompt"));
    if (r.max_tokens < 1) return absl::InvalidArgumentError(absl::StrCat("request ", i, ": max_tokens must be >= 1"));
    RETURN_IF_ERROR(r.sampling.Validate());
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
    if (static_cast<int64_t>(r.prompt.size()) >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": prompt of ", r.prompt.size(),
                                                     " tokens does not fit the context of ",
                                                     c.max_position_embeddings));
    }
    const int64_t capped = std::min<int64_t>(total, c.max_position_embeddings);
    ASSIGN_OR_RETURN(seqs[i].blocks, pool_->Allocate((capped + bs - 1) / bs));
    seqs[i].tokens = r.prompt;
    samplers.emplace_back(r.sampling, 0x5eed0000u + i);
  }
  GenerationTiming t;
  std::vector<float> logits;
  const int64_t vocab = c.vocab_size;
  // Builds and runs one step over the given (sequence, first token, token count) spans.
  auto step = [&](const std::vector<std::array<int64_t, 3>>& spans) -> absl::Status {
    ForwardInput in;
    in.num_seqs = static_cast<int64_t>(spans.size());
    for (const auto& sp : spans) in.max_blocks_per_seq = std::max<int64_t>(in.max_blocks_per_seq, seqs[sp[0]].blocks.size());
    in.block_tables.assign(in.num_seqs * in.max_blocks_per_seq, 0);
    std::vector<size_t> wants_logits;
    for (size_t j = 0; j < spans.size(); ++j) {
      auto& s = seqs[spans[j][0]];
      std::copy(s.blocks.begin(), s.blocks.end(), in.block_tables.begin() + j * in.max_blocks_per_seq);
      for (int64_t p = spans[j][1]; p < spans[j][1] + spans[j][2]; ++p) {
        in.token_ids.push_back(s.tokens[p]);
        in.positions.push_back(static_cast<int32_t>(p));
        in.token_seq.push_back(static_cast<int32_t>(j));
        in.slots.push_back(static_cast<int64_t>(s.blocks[p / bs]) * bs + p % bs);
      }
      s.computed = spans[j][1] + spans[j][2];
      if (s.computed == static_cast<int64_t>(s.tokens.size())) {
        in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
        wants_logits.push_back(spans[j][0]);
      }
    }
    RETURN_IF_ERROR(model_->Forward(in, layout, kv_->data(), &logits));
    for (size_t j = 0; j < wants_logits.size(); ++j) {
      const size_t i = wants_logits[j];
      const float* row = logits.data() + j * vocab;
      const int32_t tok = samplers[i].Sample(row, vocab);
      auto& s = seqs[i];
      auto& res = results[i];
      res.tokens.push_back(tok);
      if (options_.keep_logits) res.logits.emplace_back(row, row + vocab);
      s.tokens.push_back(tok);
      if (on_token) on_token(i, tok);
      const auto& stop = requests[i].stop_ids;
      if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
        s.done = true;
        res.finish_reason = "stop";
      } else if (static_cast<int64_t>(res.tokens.size()) >= requests[i].max_tokens) {
        s.done = true;
        res.finish_reason = "length";
      } else if (static_cast<int64_t>(s.tokens.size()) >= c.max_position_embeddings) {
        s.done = true;
        res.finish_reason = "context";
      }
    }
    return absl::OkStatus();
  };

  // Prefill, packing prompt chunks under the token budget.
  Stopwatch sw;
  {
    std::vector<std::array<int64_t, 3>> spans;
    int64_t budget = options_.prefill_chunk;
    for (size_t i = 0; i < n; ++i) {
      int64_t pos = 0;
      const int64_t len = static_cast<int64_t>(seqs[i].tokens.size());
      while (pos < len) {
        const int64_t take = std::min(len - pos, budget);
        spans.push_back({static_cast<int64_t>(i), pos, take});
        pos += take;
        budget -= take;
        if (budget == 0) {
          RETURN_IF_ERROR(step(spans));
          spans.clear();
          budget = options_.prefill_chunk;
        }
      }
    }
    if (!spans.empty()) RETURN_IF_ERROR(step(spans));
    for (const auto& r : requests) t.prefill_tokens += static_cast<int64_t>(r.prompt.size());
  }
  t.prefill_seconds = sw.Seconds();

  // Decode every unfinished sequence together.
  sw.Reset();
  while (true) {
    std::vector<std::array<int64_t, 3>> spans;
    for (size_t i = 0; i < n; ++i) {
      if (!seqs[i].done) spans.push_back({static_cast<int64_t>(i), seqs[i].computed, 1});
    }
    if (spans.empty()) break;
    RETURN_IF_ERROR(step(spans));
    t.decode_tokens += static_cast<int64_t>(spans.size());
    ++t.decode_steps;
  }
  t.decode_seconds = sw.Seconds();
  if (timing != nullptr) *timing = t;
  return results;
}

}  // namespace moeserve
