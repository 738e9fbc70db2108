// Fitting a calibrated cost model to observed step times: the efficiency factors (achieved
// fractions of the peaks for weight GEMMs, attention and memory), how far compute and memory
// overlap, and a fixed per-step overhead, so that
//   t = overhead + max(C, M) + (1 - overlap) * min(C, M),  C = gemm / e_c + attention / e_a,
//   M = bytes / e_m
// best matches the observations in relative terms; and the knee of a measured curve.
#pragma once

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
};

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
