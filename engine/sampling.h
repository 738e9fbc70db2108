// Sampling parameters and the per-request sampler: greedy, temperature, top-k, top-p, a seed.
// Each request owns its random stream, so a seeded request yields the same tokens whatever
// else shares its batch.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/rng.h"
#include "kernels/backend.h"

namespace moeserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1], vLLM's: tokens below min_p x the likeliest's probability dropped
  std::optional<uint64_t> seed;
  // The logits processors (engine/logit_edits.h), as vLLM and OpenAI define them. They change
  // the distribution sampled from (greedy too), not the logprobs reported.
  float presence_penalty = 0.0f;    // [-2, 2]: subtracted from each token already generated
  float frequency_penalty = 0.0f;   // [-2, 2]: subtracted once per time a token was generated
  float repetition_penalty = 1.0f;  // (0, 100]: divides (multiplies if negative) the logit of
                                    // each token of the prompt or the output; 1: off
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added logit, [-100, 100]

  // Errors name the field ("top_p: must be in (0, 1], got 2") and the limit.
  absl::Status Validate() const;
  bool greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

class Sampler {
 public:
  // `fallback_seed` is used when params.seed is unset.
  Sampler(const SamplingParams& params, uint64_t fallback_seed);

  // The next token's sampling spec, for Backend::SampleRows (which samples on the device): the
  // parameters and, unless greedy, the next uniform number of this request's stream.
  SampleSpec Next();
  // Picks the next token from logits [vocab] on the host (the same rule, the same stream).
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  Rng rng_;
};

// Index of the largest logit (the lowest index among ties).
int32_t ArgMax(const float* logits, int64_t vocab);

// log(sum(exp(logits))), in double precision: a token's log-probability is its logit minus it.
double LogNormalizer(const float* logits, int64_t vocab);

// The `n` most likely tokens with their log-probabilities under the unmodified distribution.
std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int n, double log_z);

}  // namespace moeserve
