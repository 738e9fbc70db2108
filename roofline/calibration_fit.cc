// Calibrated-model fitting.
#include "roofline/calibration_fit.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/summary.h"

namespace moeserve::roofline {

double PredictWithEfficiency(const StepCost& c, const Efficiency& eff) {
  const double compute = (c.compute_seconds - c.attention_seconds) / eff.compute + c.attention_seconds / eff.attention;
  const double memory = c.memory_seconds / eff.memory;
  const double extra = c.bound_seconds - std::max(c.compute_seconds, c.memory_seconds);  // comm, transfers
  return eff.overhead_seconds + std::max(compute, memory) + (1 - eff.overlap) * std::min(compute, memory) + extra;
}

FitResult Evaluate(const std::vector<Observation>& obs, const Efficiency& eff) {
  FitResult r;
  r.efficiency = eff;
  std::vector<double> errs;
  for (const Observation& o : obs) errs.push_back(std::abs(PredictWithEfficiency(o.cost, eff) / o.observed_seconds - 1));
  r.median_abs_rel_error = Percentile(errs, 50);
  r.max_abs_rel_error = errs.empty() ? 0 : *std::max_element(errs.begin(), errs.end());
  for (size_t i = 0; i < errs.size(); ++i) {
    if (errs[i] > 0.1 && errs[i] > 3 * r.median_abs_rel_error) r.unexplained.push_back(i);
  }
  return r;
}

namespace {

constexpr int kDims = 5;
using Vec = std::array<double, kDims>;

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Unconstrained coordinates -> efficiencies: logits over [kMinEfficiency, 1] for the three
// efficiencies, over [0, 1] for the overlap and for the overhead as a fraction of the fastest
// observed step.
double Efficiency01(double x) { return kMinEfficiency + (1 - kMinEfficiency) * Sigmoid(x); }
double Logit(double e) {
  const double p = (e - kMinEfficiency) / (1 - kMinEfficiency);
  return std::log(p / (1 - p));
}

Efficiency Decode(const Vec& x, double min_obs) {
  Efficiency e;
  e.compute = Efficiency01(x[0]);
  e.attention = Efficiency01(x[1]);
  e.memory = Efficiency01(x[2]);
  e.overlap = Sigmoid(x[3]);
  e.overhead_seconds = min_obs * Sigmoid(x[4]);
  return e;
}

// The largest share of a predicted step each efficiency's term takes over the points.
struct TermShares {
  double compute = 0, attention = 0, memory = 0;
};
TermShares MaxShares(const std::vector<Observation>& obs, const Efficiency& e) {
  TermShares s;
  for (const Observation& o : obs) {
    const double t = PredictWithEfficiency(o.cost, e);
    if (!(t > 0)) continue;
    s.compute = std::max(s.compute, (o.cost.compute_seconds - o.cost.attention_seconds) / e.compute / t);
    s.attention = std::max(s.attention, o.cost.attention_seconds / e.attention / t);
    s.memory = std::max(s.memory, o.cost.memory_seconds / e.memory / t);
  }
  return s;
}

// The coefficients that the points push against an end of their range, among those they pin
// down (a term of at least 5% of some step); the others are listed as unidentified. At 1 it is
// a limit only if the points want more (the loss falls past 1): a step at its bound is not.
double Loss(const std::vector<Observation>& obs, const Efficiency& eff);
void CheckLimits(const std::vector<Observation>& obs, FitResult* r) {
  const Efficiency& e = r->efficiency;
  const TermShares shares = MaxShares(obs, e);
  const double loss = Loss(obs, e);
  auto check = [&](const char* name, double Efficiency::*field, double share) {
    if (share < 0.05) {
      r->unidentified.push_back(std::string(name) + " efficiency (its term is under 5% of every step)");
      return;
    }
    const double v = e.*field;
    Efficiency more = e;
    more.*field = 1.25 * v;
    if (v > 0.99 && Loss(obs, more) < 0.98 * loss) {
      r->at_limit.push_back(std::string(name) + " efficiency at 1 (the points are faster than its peak allows)");
    }
    if (v < 1.01 * kMinEfficiency) r->at_limit.push_back(std::string(name) + " efficiency at its floor of 1e-3");
  };
  check("GEMM", &Efficiency::compute, shares.compute);
  check("attention", &Efficiency::attention, shares.attention);
  check("memory", &Efficiency::memory, shares.memory);
}

double Loss(const std::vector<Observation>& obs, const Efficiency& eff) {
  double loss = 0;
  for (const Observation& o : obs) {
    const double e = std::log(PredictWithEfficiency(o.cost, eff) / o.observed_seconds);
    loss += e * e;
  }
  return loss;
}

// Nelder-Mead on the log-squared error.
Vec Minimize(const std::vector<Observation>& obs, double min_obs, Vec start) {
  auto f = [&](const Vec& x) { return Loss(obs, Decode(x, min_obs)); };
  std::array<Vec, kDims + 1> simplex;
  std::array<double, kDims + 1> value;
  simplex[0] = start;
  for (int i = 0; i < kDims; ++i) {
    simplex[i + 1] = start;
    simplex[i + 1][i] += 0.7;
  }
  for (int i = 0; i <= kDims; ++i) value[i] = f(simplex[i]);
  for (int iter = 0; iter < 3000; ++iter) {
    std::array<int, kDims + 1> order;
    for (int i = 0; i <= kDims; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return value[a] < value[b]; });
    const int best = order[0], worst = order[kDims], second = order[kDims - 1];
    if (value[worst] - value[best] < 1e-12) break;
    Vec centroid{};
    for (int i = 0; i <= kDims; ++i) {
      if (i == worst) continue;
      for (int d = 0; d < kDims; ++d) centroid[d] += simplex[i][d] / kDims;
    }
    auto along = [&](double t) {
      Vec x;
      for (int d = 0; d < kDims; ++d) x[d] = centroid[d] + t * (simplex[worst][d] - centroid[d]);
      return x;
    };
    const Vec reflected = along(-1);
    const double fr = f(reflected);
    if (fr < value[best]) {
      const Vec expanded = along(-2);
      const double fe = f(expanded);
      if (fe < fr) {
        simplex[worst] = expanded;
        value[worst] = fe;
      } else {
        simplex[worst] = reflected;
        value[worst] = fr;
      }
    } else if (fr < value[second]) {
      simplex[worst] = reflected;
      value[worst] = fr;
    } else {
      const Vec contracted = along(0.5);
      const double fc = f(contracted);
      if (fc < value[worst]) {
        simplex[worst] = contracted;
        value[worst] = fc;
      } else {
        for (int i = 0; i <= kDims; ++i) {
          if (i == best) continue;
          for (int d = 0; d < kDims; ++d) simplex[i][d] = simplex[best][d] + 0.5 * (simplex[i][d] - simplex[best][d]);
          value[i] = f(simplex[i]);
        }
      }
    }
  }
  int best = 0;
  for (int i = 1; i <= kDims; ++i) {
    if (value[i] < value[best]) best = i;
  }
  return simplex[best];
}

}  // namespace

FitResult FitEfficiency(const std::vector<Observation>& obs) {
  if (obs.empty()) return {};
  double min_obs = obs[0].observed_seconds;
  for (const Observation& o : obs) min_obs = std::min(min_obs, o.observed_seconds);
  // Starts over a coarse grid (compute and memory efficiency low or high; ideal overlap, none,
  // in between), each restarted once from its result: from one start the fit can settle where
  // a wrong memory efficiency and the fixed overhead make up for each other.
  Vec best_x{};
  double best_loss = 1e300;
  for (double compute : {0.3, 0.7}) {
    for (double memory : {0.3, 0.6, 0.9}) {
      for (double overlap_logit : {3.0, 0.0, -3.0}) {
        Vec x = {Logit(compute), Logit(0.5), Logit(memory), overlap_logit, -3.0};
        x = Minimize(obs, min_obs, Minimize(obs, min_obs, x));
        const double l = Loss(obs, Decode(x, min_obs));
        if (l < best_loss) {
          best_loss = l;
          best_x = x;
        }
      }
    }
  }
  FitResult r = Evaluate(obs, Decode(best_x, min_obs));
  CheckLimits(obs, &r);
  return r;
}

double MeasuredKnee(const std::vector<double>& batches, const std::vector<double>& seconds) {
  if (batches.size() < 2 || seconds.size() != batches.size()) return 0;
  // Fit t = max(a, b * B) in log space by grid search, then refine; the knee is a / b.
  const double tmin = *std::min_element(seconds.begin(), seconds.end());
  const double tmax = *std::max_element(seconds.begin(), seconds.end());
  const double bmax = *std::max_element(batches.begin(), batches.end());
  double lo_a = std::log(tmin / 2), hi_a = std::log(tmax * 2);
  double lo_b = std::log(tmin / bmax / 4), hi_b = std::log(tmax * 2);
  double best_a = 0, best_b = 0, best_loss = 1e300;
  for (int round = 0; round < 4; ++round) {
    constexpr int kSteps = 200;
    for (int i = 0; i <= kSteps; ++i) {
      const double la = lo_a + (hi_a - lo_a) * i / kSteps;
      for (int j = 0; j <= kSteps; ++j) {
        const double lb = lo_b + (hi_b - lo_b) * j / kSteps;
        double loss = 0;
        for (size_t p = 0; p < batches.size(); ++p) {
          const double e = std::max(la, lb + std::log(batches[p])) - std::log(seconds[p]);
          loss += e * e;
        }
        if (loss < best_loss) {
          best_loss = loss;
          best_a = la;
          best_b = lb;
        }
      }
    }
    const double wa = (hi_a - lo_a) / 20, wb = (hi_b - lo_b) / 20;
    lo_a = best_a - wa;
    hi_a = best_a + wa;
    lo_b = best_b - wb;
    hi_b = best_b + wb;
  }
  return std::exp(best_a - best_b);
}

}  // namespace moeserve::roofline
