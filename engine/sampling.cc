// Sampling.
#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace moeserve {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature) || temperature > 100.0f) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be in [0, 100], got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

int32_t ArgMax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : params_(params), rng_(params.seed.value_or(fallback_seed)) {}

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  if (params_.greedy()) return ArgMax(logits, vocab);
  // Candidates sorted by logit, descending; ties broken by the lower id for determinism.
  candidates_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) candidates_[i] = {logits[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);
  // Probabilities at temperature over the kept candidates.
  const double inv_t = 1.0 / params_.temperature;
  const double mx = candidates_[0].first;
  std::vector<double> p(keep);
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp((candidates_[i].first - mx) * inv_t);
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep) {
      mass += p[n] / sum;
      ++n;
      if (mass >= params_.top_p) break;
    }
    keep = n;
    sum = 0.0;
    for (int64_t i = 0; i < keep; ++i) sum += p[i];
  }
  const double u = rng_.UniformDouble() * sum;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int n) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
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
