// Expert placement and stage layout.
#include "parallel/placement.h"

#include <algorithm>

#include "core/status.h"

namespace moeserve {

namespace {

// How many experts rank r holds under contiguous placement (expert e on rank e * ep / experts):
// the e in [ceil(r E / ep), ceil((r + 1) E / ep)).
int64_t Room(int64_t experts, int64_t ep, int64_t r) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  return ceil_div((r + 1) * experts, ep) - ceil_div(r * experts, ep);
}

// Each rank's summed load under `owner`.
std::vector<int64_t> RankSums(const std::vector<int32_t>& owner, const ExpertLoad& load, int64_t layer, int64_t ep) {
  std::vector<int64_t> sum(static_cast<size_t>(ep), 0);
  for (size_t e = 0; e < owner.size(); ++e) sum[static_cast<size_t>(owner[e])] += load.at(layer, static_cast<int64_t>(e));
  return sum;
}

// One layer's experts by the longest-processing-time rule (see ExpertOwners).
std::vector<int32_t> LongestFirst(const ExpertLoad& load, int64_t layer, int64_t ep) {
  const int64_t experts = load.experts;
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return load.at(layer, a) > load.at(layer, b); });
  std::vector<int64_t> held(static_cast<size_t>(ep), 0), sum(static_cast<size_t>(ep), 0);
  std::vector<int32_t> owner(static_cast<size_t>(experts));
  for (int32_t e : order) {
    int64_t best = -1;
    for (int64_t r = 0; r < ep; ++r) {
      if (held[static_cast<size_t>(r)] == Room(experts, ep, r)) continue;
      if (best < 0 || sum[static_cast<size_t>(r)] < sum[static_cast<size_t>(best)]) best = r;
    }
    owner[static_cast<size_t>(e)] = static_cast<int32_t>(best);
    ++held[static_cast<size_t>(best)];
    sum[static_cast<size_t>(best)] += load.at(layer, e);
  }
  return owner;
}

// Swaps an expert of the busiest rank with a lighter one of another rank while that lowers the
// busiest rank's load (the best such swap each time; counts per rank unchanged).
void ImproveBySwaps(const ExpertLoad& load, int64_t layer, int64_t ep, std::vector<int32_t>* owner) {
  const int64_t experts = load.experts;
  for (int64_t round = 0; round < experts; ++round) {  // each round lowers the busiest load; rarely more than a few
    const std::vector<int64_t> sum = RankSums(*owner, load, layer, ep);
    const int64_t busy = std::max_element(sum.begin(), sum.end()) - sum.begin();
    int64_t best_x = -1, best_y = -1, best_peak = sum[static_cast<size_t>(busy)];
    for (int64_t x = 0; x < experts; ++x) {
      if ((*owner)[static_cast<size_t>(x)] != busy) continue;
      for (int64_t y = 0; y < experts; ++y) {
        const int32_t r = (*owner)[static_cast<size_t>(y)];
        const int64_t moved = load.at(layer, x) - load.at(layer, y);
        if (r == busy || moved <= 0) continue;
        const int64_t peak = std::max(sum[static_cast<size_t>(busy)] - moved, sum[static_cast<size_t>(r)] + moved);
        if (peak < best_peak) best_x = x, best_y = y, best_peak = peak;
      }
    }
    if (best_x < 0) return;
    std::swap((*owner)[static_cast<size_t>(best_x)], (*owner)[static_cast<size_t>(best_y)]);
  }
}

// One layer's balanced placement: the rule, then the swaps; contiguous where that is as even.
std::vector<int32_t> Balance(const ExpertLoad& load, int64_t layer, int64_t ep, std::vector<int32_t> contiguous) {
  std::vector<int32_t> owner = LongestFirst(load, layer, ep);
  ImproveBySwaps(load, layer, ep, &owner);
  const std::vector<int64_t> a = RankSums(owner, load, layer, ep), b = RankSums(contiguous, load, layer, ep);
  return *std::max_element(a.begin(), a.end()) < *std::max_element(b.begin(), b.end()) ? owner : contiguous;
}

}  // namespace

ExpertOwnerTable ExpertOwners(int64_t layers, int64_t experts, int64_t ep, ExpertPlacement placement,
                              const ExpertLoad* load) {
  MS_CHECK(ep >= 1 && experts >= ep);
  MS_CHECK(placement != ExpertPlacement::kBalanced ||
           (load != nullptr && load->layers == layers && load->experts == experts));
  ExpertOwnerTable table;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<int32_t> owner(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      owner[static_cast<size_t>(e)] =
          static_cast<int32_t>(placement == ExpertPlacement::kRoundRobin ? e % ep : e * ep / experts);
    }
    table.push_back(placement == ExpertPlacement::kBalanced ? Balance(*load, l, ep, std::move(owner)) : std::move(owner));
  }
  return table;
}

std::vector<std::vector<int32_t>> ExpertsOfRank(const ExpertOwnerTable& owner, int64_t rank, int64_t layer_begin,
                                                int64_t layer_end) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    std::vector<int32_t> mine;
    const std::vector<int32_t>& o = owner[static_cast<size_t>(l)];
    for (size_t e = 0; e < o.size(); ++e) {
      if (o[e] == rank) mine.push_back(static_cast<int32_t>(e));
    }
    out.push_back(std::move(mine));
  }
  return out;
}

std::vector<double> RankImbalance(const ExpertOwnerTable& owner, const ExpertLoad& load, int64_t ep) {
  std::vector<double> out;
  for (int64_t l = 0; l < load.layers; ++l) {
    std::vector<double> sum(static_cast<size_t>(ep), 0);
    double total = 0;
    for (int64_t e = 0; e < load.experts; ++e) {
      sum[static_cast<size_t>(owner[static_cast<size_t>(l)][static_cast<size_t>(e)])] += static_cast<double>(load.at(l, e));
      total += static_cast<double>(load.at(l, e));
    }
    out.push_back(total > 0 ? *std::max_element(sum.begin(), sum.end()) / (total / static_cast<double>(ep)) : 1.0);
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t s = 0; s < pp; ++s) {
    const int64_t n = layers / pp + (s < layers % pp ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

int64_t DomainSizeOfHosts(const std::vector<std::string>& hosts) {
  std::vector<std::string> seen;  // each host once, in the order its run starts
  std::vector<int64_t> runs;      // the length of each host's run
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (r > 0 && hosts[r] == hosts[r - 1]) {
      ++runs.back();
      continue;
    }
    for (const std::string& h : seen) {
      if (h == hosts[r]) return -1;  // the host came back after another: not contiguous
    }
    seen.push_back(hosts[r]);
    runs.push_back(1);
  }
  if (runs.size() <= 1) return 0;
  for (int64_t n : runs) {
    if (n != runs.front()) return -1;
  }
  return runs.front();
}

}  // namespace moeserve
