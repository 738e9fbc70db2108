// Summary statistics.
#include "core/summary.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace moeserve {

namespace {
double SortedPercentile(const std::vector<double>& v, double p) {
  if (v.empty()) return 0.0;
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}
}  // namespace

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return SortedPercentile(values, p);
}

Summary Summarize(const std::vector<double>& values) {
  Summary s;
  if (values.empty()) return s;
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  s.count = static_cast<int64_t>(v.size());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.median = SortedPercentile(v, 50);
  s.p90 = SortedPercentile(v, 90);
  s.p99 = SortedPercentile(v, 99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace moeserve
