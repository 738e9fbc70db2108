// Calibration's way to run a measurement: one thread per core, each pinned to its own CPU of the
// process's affinity set (so the scheduler cannot stack two on one core or move them mid-run),
// started together, timed each; and the statistics of repeated samples (median and spread), so
// that a profile states how far it can be trusted.
#pragma once

#include <functional>
#include <vector>

namespace moeserve::calibrate {

// Runs fn(t) for t in [0, threads) on `threads` pinned threads released at once; returns each
// thread's seconds.
std::vector<double> RunPinned(int threads, const std::function<void(int)>& fn);

struct Samples {
  std::vector<double> values;
  double Median() const;
  double Min() const;
  double Max() const;
  // (max - min) / median: 0.1 means the samples lie within 10% of each other.
  double Spread() const;
};

}  // namespace moeserve::calibrate
