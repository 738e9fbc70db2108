// A recorded routing's expected cost shape (see routing_skew.h).
#include "roofline/routing_skew.h"

#include <algorithm>
#include <cmath>

namespace moeserve::roofline {
namespace {

// Per-token pick probability of each expert of a layer.
std::vector<double> PickProbabilities(const std::vector<double>& share, int64_t top_k) {
  std::vector<double> q(share.size());
  for (size_t e = 0; e < share.size(); ++e) q[e] = std::min(1.0, static_cast<double>(top_k) * share[e]);
  return q;
}

// P(count <= x) for x = 0 .. n of a sum of independent Bernoulli(p_i) (a Poisson binomial).
std::vector<double> PoissonBinomialCdf(const std::vector<double>& p) {
  std::vector<double> pmf(p.size() + 1, 0.0);
  pmf[0] = 1;
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t x = i + 1; x > 0; --x) pmf[x] = pmf[x] * (1 - p[i]) + pmf[x - 1] * p[i];
    pmf[0] *= 1 - p[i];
  }
  for (size_t x = 1; x < pmf.size(); ++x) pmf[x] += pmf[x - 1];
  return pmf;
}

// E[max over ranks] of the experts each rank's share of the hits holds.
double ExpectedBusiestHits(const std::vector<std::vector<double>>& hit_by_rank) {
  std::vector<std::vector<double>> cdf;
  size_t most = 0;
  for (const auto& h : hit_by_rank) {
    cdf.push_back(PoissonBinomialCdf(h));
    most = std::max(most, h.size());
  }
  double expected = 0;
  for (size_t x = 0; x < most; ++x) {
    double all_at_most = 1;
    for (const auto& f : cdf) all_at_most *= x < f.size() ? f[x] : 1.0;
    expected += 1 - all_at_most;
  }
  return expected;
}

double NormalCdf(double x, double mean, double sd) {
  if (sd <= 0) return x >= mean ? 1.0 : 0.0;
  return 0.5 * std::erfc(-(x - mean) / (sd * std::sqrt(2.0)));
}

// E[max over ranks] of independent normal row counts (mean[r], sd[r]), taken as >= 0.
double ExpectedBusiestRows(const std::vector<double>& mean, const std::vector<double>& sd) {
  double lo = 0, hi = 0;
  for (size_t r = 0; r < mean.size(); ++r) {
    lo = std::max(lo, mean[r] - 8 * sd[r]);
    hi = std::max(hi, mean[r] + 8 * sd[r]);
  }
  // Below lo the busiest rank's own count is almost surely above x; above hi every count is
  // below it. Between, P(max > x) by the trapezoid rule.
  constexpr int kSteps = 256;  // the integrand is smooth over 16 deviations
  const double dx = (hi - lo) / kSteps;
  if (dx <= 0) return lo;
  double area = 0;
  for (int i = 0; i <= kSteps; ++i) {
    const double x = lo + dx * i;
    double all_below = 1;
    for (size_t r = 0; r < mean.size(); ++r) all_below *= NormalCdf(x, mean[r], sd[r]);
    area += (i == 0 || i == kSteps ? 0.5 : 1.0) * (1 - all_below);
  }
  return lo + area * dx;
}

}  // namespace

RecordedRouting RecordedRouting::FromCounts(const std::vector<int64_t>& counts, int64_t experts, int64_t top_k,
                                            int64_t ep, const std::vector<std::vector<std::vector<int32_t>>>& holders) {
  RecordedRouting r;
  r.top_k = top_k;
  r.ep = ep;
  const size_t layers = experts > 0 ? counts.size() / static_cast<size_t>(experts) : 0;
  for (size_t l = 0; l < layers && l < holders.size(); ++l) {
    const int64_t* row = counts.data() + l * static_cast<size_t>(experts);
    double total = 0;
    for (int64_t e = 0; e < experts; ++e) total += static_cast<double>(row[e]);
    if (total <= 0) continue;
    std::vector<double> share;
    std::vector<int32_t> owner;
    for (int64_t e = 0; e < experts; ++e) {
      const std::vector<int32_t>& h = holders[l][static_cast<size_t>(e)];
      for (int32_t rank : h) {
        share.push_back(static_cast<double>(row[e]) / total / static_cast<double>(h.size()));
        owner.push_back(rank);
      }
    }
    r.share.push_back(std::move(share));
    r.owner.push_back(std::move(owner));
  }
  return r;
}

RecordedRouting RecordedRouting::Uniform(int64_t experts, int64_t top_k, int64_t ep) {
  RecordedRouting r;
  r.top_k = top_k;
  r.ep = ep;
  r.share.assign(1, std::vector<double>(static_cast<size_t>(experts), 1.0 / static_cast<double>(experts)));
  r.owner.assign(1, std::vector<int32_t>(static_cast<size_t>(experts)));
  for (int64_t e = 0; e < experts; ++e) r.owner[0][static_cast<size_t>(e)] = static_cast<int32_t>(e * ep / experts);
  return r;
}

RoutingExpectation ExpectRouting(const RecordedRouting& routing, double tokens) {
  RoutingExpectation out;
  if (routing.share.empty() || tokens <= 0) return out;
  const size_t ep = static_cast<size_t>(std::max<int64_t>(1, routing.ep));
  double hits = 0, busiest_hits = 0, busiest_rows = 0, rows = 0;
  for (size_t l = 0; l < routing.share.size(); ++l) {
    const std::vector<double> q = PickProbabilities(routing.share[l], routing.top_k);
    std::vector<std::vector<double>> hit_by_rank(ep);
    std::vector<double> mean(ep, 0.0), var(ep, 0.0);
    for (size_t e = 0; e < q.size(); ++e) {
      const size_t r = std::min(ep - 1, static_cast<size_t>(std::max(0, routing.owner[l][e])));
      const double hit = 1 - std::pow(1 - q[e], tokens);
      hits += hit;
      hit_by_rank[r].push_back(hit);
      mean[r] += tokens * q[e];
      var[r] += tokens * q[e] * (1 - q[e]);
    }
    if (ep == 1) continue;
    busiest_hits += ExpectedBusiestHits(hit_by_rank);
    std::vector<double> sd(ep);
    for (size_t r = 0; r < ep; ++r) sd[r] = std::sqrt(var[r]), rows += mean[r];
    busiest_rows += ExpectedBusiestRows(mean, sd);
  }
  out.experts_hit_per_layer = hits / static_cast<double>(routing.share.size());
  if (ep > 1 && hits > 0) out.weight_imbalance = std::max(1.0, busiest_hits / (hits / static_cast<double>(ep)));
  if (ep > 1 && rows > 0) out.rows_imbalance = std::max(1.0, busiest_rows / (rows / static_cast<double>(ep)));
  return out;
}

}  // namespace moeserve::roofline
