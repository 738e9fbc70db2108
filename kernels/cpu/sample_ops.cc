// CPU sampling ops.
#include "kernels/cpu/sample_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace moeserve::cpu_sample {
namespace {

int32_t ArgMaxRow(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

// The element of `keys` (restricted to key >= floor) where the cumulative weight, taken in
// descending key order, first reaches `target` (inclusive: cum >= target) or exceeds it
// (strict: cum > target). Returns its key and the weight of all keys above it in *above.
// Falls back to the last candidate when rounding leaves the target unreached.
template <typename Weight>
uint64_t Descend(const std::vector<uint64_t>& keys, const std::vector<Weight>& w, uint64_t floor, double target,
                 bool inclusive, double* above_out) {
  uint64_t prefix = 0, mask = 0;
  double above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    std::array<double, 256> hist{};
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] >= floor && (keys[i] & mask) == prefix) hist[(keys[i] >> shift) & 0xFF] += static_cast<double>(w[i]);
    }
    const int chosen = ChooseKeyByte(hist.data(), target, inclusive, &above);
    prefix |= static_cast<uint64_t>(chosen) << shift;
    mask |= uint64_t{0xFF} << shift;
  }
  if (above_out != nullptr) *above_out = above;
  return prefix;
}

int64_t MinPCount(const float* logits, int64_t vocab, double floor) {
  int64_t n = 0;
  for (int64_t i = 0; i < vocab; ++i) n += static_cast<double>(logits[i]) >= floor;
  return n;
}

}  // namespace

int32_t SortSampleRow(const float* logits, int64_t vocab, const SampleSpec& spec) {
  if (spec.temperature == 0.0f) return ArgMaxRow(logits, vocab);
  std::vector<std::pair<float, int32_t>> c(vocab);
  for (int64_t i = 0; i < vocab; ++i) c[i] = {logits[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t keep = vocab;
  if (spec.top_k > 0 && spec.top_k < vocab) keep = spec.top_k;
  // min_p first: it keeps a prefix of the order (the logits at or above its floor).
  const double min_p_floor = MinPLogitFloor(logits[ArgMaxRow(logits, vocab)], spec.temperature, spec.min_p);
  keep = std::min(keep, MinPCount(logits, vocab, min_p_floor));
  std::partial_sort(c.begin(), c.begin() + keep, c.end(), by_logit);
  c.resize(keep);
  const double inv_t = 1.0 / spec.temperature, mx = c[0].first;
  std::vector<double> p(keep);
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp((c[i].first - mx) * inv_t);
  if (spec.top_p < 1.0f) {
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep) {
      mass += p[n];
      ++n;
      if (mass >= spec.top_p * sum) break;
    }
    keep = n;
    sum = 0.0;
    for (int64_t i = 0; i < keep; ++i) sum += p[i];
  }
  const double u = spec.u * sum;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return c[i].second;
  }
  return c[keep - 1].second;
}

int32_t RadixSampleRow(const float* logits, int64_t vocab, const SampleSpec& spec) {
  if (spec.temperature == 0.0f) return ArgMaxRow(logits, vocab);
  std::vector<uint64_t> keys(vocab);
  for (int64_t i = 0; i < vocab; ++i) keys[i] = OrderKey(logits[i], static_cast<int32_t>(i));
  // top_k, and min_p as the count of logits at or above its floor: the k-th key by count (each
  // candidate weighs 1).
  const float mx = logits[ArgMaxRow(logits, vocab)];
  int64_t k = spec.top_k > 0 && spec.top_k < vocab ? spec.top_k : vocab;
  k = std::min(k, MinPCount(logits, vocab, MinPLogitFloor(mx, spec.temperature, spec.min_p)));
  uint64_t floor = 0;
  if (k < vocab) {
    const std::vector<int32_t> ones(vocab, 1);
    floor = Descend(keys, ones, 0, static_cast<double>(k), /*inclusive=*/true, nullptr);
  }
  // Probabilities at temperature over the candidates (0 elsewhere).
  const double inv_t = 1.0 / spec.temperature;
  std::vector<double> p(vocab, 0.0);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (keys[i] >= floor) sum += p[i] = std::exp((static_cast<double>(logits[i]) - mx) * inv_t);
  }
  // Nucleus: the candidate where the cumulative mass first reaches top_p of the sum.
  if (spec.top_p < 1.0f) {
    floor = Descend(keys, p, floor, spec.top_p * sum, /*inclusive=*/true, nullptr);
    sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (keys[i] >= floor) sum += p[i];
    }
  }
  const uint64_t key = Descend(keys, p, floor, spec.u * sum, /*inclusive=*/false, nullptr);
  return static_cast<int32_t>(~static_cast<uint32_t>(key & 0xFFFFFFFFu));
}

}  // namespace moeserve::cpu_sample
