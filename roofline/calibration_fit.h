// Fitting a calibrated cost model to observed step times: the efficiency factors (achieved
// fractions of the peaks for weight GEMMs, attention and memory), how far compute and memory
// overlap, and a fixed per-step overhead, so that
//   t = overhead + max(C, M) + (1 - overlap) * min(C, M),  C = gemm / e_c + attention / e_a,
//   M = bytes / e_m
// best matches the observations in relative terms; and the knee of a measured curve.
#pragma once

#include <string>
#include <vector>

#include "roofline/cost_model.h"

namespace moeserve::roofline {

struct Observation {
  StepCost cost;           // predicted at the peaks (efficiency 1, no overhead)
  double observed_seconds = 0;
};

struct FitResult {
  Efficiency efficiency;
  double median_abs_rel_error = 0;  // |predicted / observed - 1|, median over the points
  double max_abs_rel_error = 0;
  // Coefficients the fit pushed to a limit of their range (an efficiency at 1 or at 1e-3, the
  // overhead at the fastest step): the model cannot explain the points then, and says so
  // rather than report them as measured.
  std::vector<std::string> at_limit;
  // Efficiencies whose term is under 5% of every predicted step: the points do not pin them
  // down (reported, not degenerate).
  std::vector<std::string> unidentified;
  // Indices of the points predicted more than 3x the median error off (and over 10%).
  std::vector<size_t> unexplained;
  bool Degenerate() const { return !at_limit.empty(); }
};

// Efficiencies are fitted within [kMinEfficiency, 1]: a step cannot beat the peak, and below a
// thousandth the term is not what limits it.
inline constexpr double kMinEfficiency = 1e-3;

// Predicted seconds of `cost` under `eff` (communication and transfers added as in PredictStep).
double PredictWithEfficiency(const StepCost& cost, const Efficiency& eff);

// Least squares on log(predicted / observed) (Nelder-Mead from a few starts).
FitResult FitEfficiency(const std::vector<Observation>& obs);
// Errors of a given efficiency on `obs`.
FitResult Evaluate(const std::vector<Observation>& obs, const Efficiency& eff);

// The knee of a step-time curve over batch sizes: the corner a / b of the two-segment roofline
// t = max(a, b * batch) fitted to it by least squares in log space.
double MeasuredKnee(const std::vector<double>& batches, const std::vector<double>& seconds);

}  // namespace moeserve::roofline
