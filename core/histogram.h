// A cumulative histogram of latencies, Prometheus style: fixed upper bounds, a count per bucket
// (not cumulative here; exporters accumulate), the sum and the count of observations. Copyable
// so that stats snapshots carry it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace moeserve {

struct Histogram {
  std::vector<double> bounds;   // upper bounds, increasing; +Inf is implicit
  std::vector<int64_t> counts;  // [bounds.size() + 1]: observations in each bucket
  double sum = 0;
  int64_t count = 0;

  explicit Histogram(std::vector<double> upper_bounds = {})
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

  // Seconds, from 1 ms to 5 min (vLLM's latency buckets, roughly).
  static Histogram Latency() {
    return Histogram({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                      20.0, 40.0, 80.0, 160.0, 300.0});
  }

  void Observe(double v) {
    size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

}  // namespace moeserve
