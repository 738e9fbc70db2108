// Sampling.
#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/sample_ops.h"

namespace moeserve {

namespace {

absl::Status Bad(absl::string_view field, absl::string_view limit, double got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be ", limit, ", got ", got));
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f && temperature <= 100.0f)) return Bad("temperature", "in [0, 100]", temperature);
  if (top_k < 0) return Bad("top_k", ">= 0 (0 = off)", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return Bad("top_p", "in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return Bad("min_p", "in [0, 1]", min_p);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) return Bad("presence_penalty", "in [-2, 2]", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return Bad("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 100.0f)) {
    return Bad("repetition_penalty", "in (0, 100]", repetition_penalty);
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto& [token, bias] = logit_bias[i];
    if (i > 0 && token <= logit_bias[i - 1].first) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: token ", token, " is listed twice or out of order"));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: the bias of token ", token, " must be in [-100, 100], got ", bias));
    }
  }
  return absl::OkStatus();
}

int32_t ArgMax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : params_(params), rng_(params.seed.value_or(fallback_seed)) {}

SampleSpec Sampler::Next() {
  SampleSpec s;
  s.temperature = params_.temperature;
  s.top_k = params_.top_k;
  s.top_p = params_.top_p;
  s.min_p = params_.min_p;
  if (!params_.greedy()) s.u = rng_.UniformDouble();
  return s;
}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  return cpu_sample::SortSampleRow(logits, vocab, Next());
}

double LogNormalizer(const float* logits, int64_t vocab) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(sum);
}

std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int n, double log_z) {
  if (n <= 0) return {};
  std::vector<int32_t> ids(vocab);
  for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
  n = static_cast<int>(std::min<int64_t>(n, vocab));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<TokenLogprob> out(n);
  for (int i = 0; i < n; ++i) out[i] = {ids[i], static_cast<float>(logits[ids[i]] - log_z)};
  return out;
}

}  // namespace moeserve
