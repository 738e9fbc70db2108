// Runs a fixed set of requests to completion over the paged KV cache (static batching):
// one prefill step for all prompts (split into chunks under a token budget), then decode steps
// over every unfinished sequence together. The continuous-batching engine serves (and runs
// `moeserve generate`); this stays in tests/ as the simple, sequential oracle it is compared to.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/sampling.h"
#include "kvcache/block_pool.h"
#include "kvcache/kv_storage.h"
#include "models/moe_model.h"

namespace moeserve {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "length", "stop" or "context"
  // Logits that chose each generated token (only when keep_logits).
  std::vector<std::vector<float>> logits;
};

struct GenerationTiming {
  double prefill_seconds = 0.0;
  int64_t prefill_tokens = 0;
  double decode_seconds = 0.0;
  int64_t decode_tokens = 0;
  int64_t decode_steps = 0;
};

struct GeneratorOptions {
  int64_t prefill_chunk = 512;  // tokens per prefill step, across sequences
  bool keep_logits = false;
};

class Generator {
 public:
  Generator(MoeModel* model, KvStorage* kv, BlockPool* pool, GeneratorOptions options = {});

  // Calls on_token(request_index, token) as tokens are produced. Every block taken is
  // returned to the pool, on success and on error.
  absl::StatusOr<std::vector<GenerationResult>> Run(
      const std::vector<GenerationRequest>& requests,
      const std::function<void(size_t, int32_t)>& on_token = nullptr,
      GenerationTiming* timing = nullptr);

 private:
  MoeModel* model_;
  KvStorage* kv_;
  BlockPool* pool_;
  GeneratorOptions options_;
};

}  // namespace moeserve
