// Sampling parameters and the per-request sampler: greedy, temperature, top-k, top-p, a seed.
// Each request owns its random stream, so a seeded request yields the same tokens whatever
// else shares its batch.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/rng.h"

namespace moeserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // (0, 1]
  std::optional<uint64_t> seed;

  // Errors name the field and the limit.
  absl::Status Validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

class Sampler {
 public:
  // `fallback_seed` is used when params.seed is unset.
  Sampler(const SamplingParams& params, uint64_t fallback_seed);

  // Picks the next token from logits [vocab].
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit (the lowest index among ties).
int32_t ArgMax(const float* logits, int64_t vocab);

// The `n` most likely tokens with their log-probabilities under the unmodified distribution.
std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int n);

}  // namespace moeserve
