// Summary statistics of a sample: mean and percentiles (linear interpolation between order
// statistics, as numpy.percentile does, so numbers match vLLM's serving benchmark).
#pragma once

#include <cstdint>
#include <vector>

namespace moeserve {

// p in [0, 100]; 0 for an empty sample.
double Percentile(std::vector<double> values, double p);

struct Summary {
  int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
Summary Summarize(const std::vector<double>& values);

}  // namespace moeserve
