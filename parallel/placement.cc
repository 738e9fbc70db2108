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

// The scale-up domains copies are spread over: rank r is in domain r / size. One domain (size 0,
// or at least ep) leaves copies free to share one.
struct Domains {
  int64_t size = 0, count = 1;
  Domains(int64_t domain_size, int64_t ep)
      : size(domain_size > 0 && domain_size < ep ? domain_size : ep), count(ep / size) {}
  // Whether a copy of the expert held by `h` may go to rank r: r does not hold it, and with
  // several domains no rank of r's domain does (at most one copy per domain, so a domain's
  // senders all use their own copy and each copy still takes an even share: NearHolders).
  bool Allows(const std::vector<int32_t>& h, int64_t r) const {
    for (int32_t q : h) {
      if (q == r || (count > 1 && q / size == r / size)) return false;
    }
    return true;
  }
  // Rank of the i-th entry of a round-robin deal that puts consecutive entries in different domains.
  int32_t Deal(size_t i) const {
    const int64_t slot = static_cast<int64_t>(i) % (size * count);
    return static_cast<int32_t>(slot % count * size + slot / count);
  }
};

// Each rank's summed load under `owner`.
std::vector<int64_t> RankSums(const std::vector<int32_t>& owner, const ExpertLoad& load, int64_t layer, int64_t ep) {
  std::vector<int64_t> sum(static_cast<size_t>(ep), 0);
  for (size_t e = 0; e < owner.size(); ++e) sum[static_cast<size_t>(owner[e])] += load.at(layer, static_cast<int64_t>(e));
  return sum;
}

// One layer's experts by the longest-processing-time rule (see ExpertHolders).
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

// Copies per expert: each of `replicas` extra copies to the expert with the most load per copy
// (at most `most` copies of one expert).
std::vector<int64_t> CopyCounts(const ExpertLoad& load, int64_t layer, int64_t most, int64_t replicas) {
  std::vector<int64_t> copies(static_cast<size_t>(load.experts), 1);
  for (int64_t c = 0; c < replicas; ++c) {
    int64_t best = -1;
    for (int64_t e = 0; e < load.experts; ++e) {
      if (copies[static_cast<size_t>(e)] == most) continue;
      // load_e / copies_e > load_b / copies_b, compared without division.
      if (best < 0 || load.at(layer, e) * copies[static_cast<size_t>(best)] >
                          load.at(layer, best) * copies[static_cast<size_t>(e)]) {
        best = e;
      }
    }
    ++copies[static_cast<size_t>(best)];
  }
  return copies;
}

// One layer's copies on the ranks (see ExpertHolders: balanced with replicas).
std::vector<std::vector<int32_t>> PlaceCopies(const ExpertLoad& load, int64_t layer, int64_t ep, int64_t replicas,
                                              const Domains& domains) {
  const std::vector<int64_t> copies = CopyCounts(load, layer, domains.count > 1 ? domains.count : ep, replicas);
  struct Copy {
    int32_t expert;
    double load;
  };
  std::vector<Copy> order;
  for (int64_t e = 0; e < load.experts; ++e) {
    for (int64_t j = 0; j < copies[static_cast<size_t>(e)]; ++j) {
      order.push_back({static_cast<int32_t>(e), static_cast<double>(load.at(layer, e)) / copies[static_cast<size_t>(e)]});
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const Copy& a, const Copy& b) { return a.load > b.load; });
  const int64_t room = (load.experts + replicas) / ep;
  std::vector<std::vector<int32_t>> holders(static_cast<size_t>(load.experts));
  std::vector<int64_t> held(static_cast<size_t>(ep), 0);
  std::vector<double> sum(static_cast<size_t>(ep), 0);
  for (const Copy& c : order) {
    std::vector<int32_t>& h = holders[static_cast<size_t>(c.expert)];
    int64_t best = -1;
    for (int64_t r = 0; r < ep; ++r) {
      if (held[static_cast<size_t>(r)] == room || !domains.Allows(h, r)) continue;
      if (best < 0 || sum[static_cast<size_t>(r)] < sum[static_cast<size_t>(best)]) best = r;
    }
    if (best < 0) {  // the rule is stuck: a round-robin deal over the same order never is (an
      // expert's copies are adjacent in it and at most one per domain, so they land in distinct ones)
      holders.assign(static_cast<size_t>(load.experts), {});
      for (size_t i = 0; i < order.size(); ++i) holders[static_cast<size_t>(order[i].expert)].push_back(domains.Deal(i));
      break;
    }
    h.push_back(static_cast<int32_t>(best));
    ++held[static_cast<size_t>(best)];
    sum[static_cast<size_t>(best)] += c.load;
  }
  for (auto& h : holders) std::sort(h.begin(), h.end());
  return holders;
}

// Each rank's load, an expert's split evenly among its holders.
std::vector<double> CopySums(const std::vector<std::vector<int32_t>>& holders, const ExpertLoad& load, int64_t layer,
                             int64_t ep) {
  std::vector<double> sum(static_cast<size_t>(ep), 0.0);
  for (size_t e = 0; e < holders.size(); ++e) {
    for (int32_t r : holders[e]) {
      sum[static_cast<size_t>(r)] += static_cast<double>(load.at(layer, static_cast<int64_t>(e))) / holders[e].size();
    }
  }
  return sum;
}

double Busiest(const std::vector<std::vector<int32_t>>& holders, const ExpertLoad& load, int64_t layer, int64_t ep) {
  const std::vector<double> sum = CopySums(holders, load, layer, ep);
  return *std::max_element(sum.begin(), sum.end());
}

// From the balanced placement without copies, each copy in turn: of the expert, onto the least
// loaded rank with room that does not hold it, that leaves the busiest rank least loaded (ties:
// the expert with the most load per copy, then the lower index).
std::vector<std::vector<int32_t>> AddCopies(const ExpertLoad& load, int64_t layer, int64_t ep, int64_t replicas,
                                            const std::vector<int32_t>& owner, const Domains& domains) {
  const int64_t room = (load.experts + replicas) / ep;
  std::vector<std::vector<int32_t>> holders;
  std::vector<int64_t> held(static_cast<size_t>(ep), 0);
  for (int32_t r : owner) holders.push_back({r}), ++held[static_cast<size_t>(r)];
  for (int64_t c = 0; c < replicas; ++c) {
    const std::vector<double> sum = CopySums(holders, load, layer, ep);
    int64_t best_e = -1, best_r = -1;
    double best_peak = 0, best_per_copy = 0;
    for (int64_t e = 0; e < load.experts; ++e) {
      const std::vector<int32_t>& h = holders[static_cast<size_t>(e)];
      int64_t r = -1;
      for (int64_t q = 0; q < ep; ++q) {
        if (held[static_cast<size_t>(q)] == room || !domains.Allows(h, q)) continue;
        if (r < 0 || sum[static_cast<size_t>(q)] < sum[static_cast<size_t>(r)]) r = q;
      }
      if (r < 0) continue;
      const double l = static_cast<double>(load.at(layer, e)), n = static_cast<double>(h.size());
      std::vector<double> next = sum;
      for (int32_t q : h) next[static_cast<size_t>(q)] -= l / n - l / (n + 1);
      next[static_cast<size_t>(r)] += l / (n + 1);
      const double peak = *std::max_element(next.begin(), next.end()), per_copy = l / n;
      if (best_e < 0 || peak < best_peak || (peak == best_peak && per_copy > best_per_copy)) {
        best_e = e, best_r = r, best_peak = peak, best_per_copy = per_copy;
      }
    }
    // A rank with room: its domain lacks some expert (a domain's (E + replicas) / domains slots
    // hold every expert only if replicas > E (domains - 1), which the callers refuse).
    MS_CHECK(best_e >= 0);
    auto& h = holders[static_cast<size_t>(best_e)];
    h.insert(std::upper_bound(h.begin(), h.end(), static_cast<int32_t>(best_r)), static_cast<int32_t>(best_r));
    ++held[static_cast<size_t>(best_r)];
  }
  return holders;
}

}  // namespace

int64_t MaxReplicas(int64_t experts, int64_t ep, int64_t domain_size) {
  const Domains d(domain_size, ep);
  return experts * ((d.count > 1 ? d.count : ep) - 1);
}

ExpertHolderTable ExpertHolders(int64_t layers, int64_t experts, int64_t ep, ExpertPlacement placement,
                                const ExpertLoad* load, int64_t replicas, int64_t domain_size) {
  MS_CHECK(ep >= 1 && experts >= ep);
  MS_CHECK(placement != ExpertPlacement::kBalanced ||
           (load != nullptr && load->layers == layers && load->experts == experts));
  MS_CHECK(replicas == 0 || (placement == ExpertPlacement::kBalanced && replicas > 0 &&
                             (experts + replicas) % ep == 0 && replicas <= MaxReplicas(experts, ep, domain_size)));
  MS_CHECK(domain_size <= 0 || domain_size >= ep || ep % domain_size == 0);  // whole domains (CheckDomainSize)
  const Domains domains(domain_size, ep);
  ExpertHolderTable table;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<int32_t> owner(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      owner[static_cast<size_t>(e)] =
          static_cast<int32_t>(placement == ExpertPlacement::kRoundRobin ? e % ep : e * ep / experts);
    }
    if (placement == ExpertPlacement::kBalanced) owner = Balance(*load, l, ep, std::move(owner));
    if (replicas > 0) {  // the copies by either rule, whichever leaves the busiest rank less loaded
      std::vector<std::vector<int32_t>> a = PlaceCopies(*load, l, ep, replicas, domains),
                                        b = AddCopies(*load, l, ep, replicas, owner, domains);
      table.push_back(Busiest(a, *load, l, ep) < Busiest(b, *load, l, ep) ? std::move(a) : std::move(b));
      continue;
    }
    std::vector<std::vector<int32_t>> holders;
    for (int32_t r : owner) holders.push_back({r});
    table.push_back(std::move(holders));
  }
  return table;
}

std::vector<int32_t> NearHolders(const std::vector<int32_t>& holders, int64_t sender, int64_t domain_size) {
  if (domain_size <= 0 || holders.size() <= 1) return holders;
  std::vector<int32_t> near;
  for (int32_t h : holders) {
    if (h / domain_size == sender / domain_size) near.push_back(h);
  }
  return near.empty() ? holders : near;
}

std::vector<std::vector<int32_t>> ExpertsOfRank(const ExpertHolderTable& holders, int64_t rank, int64_t layer_begin,
                                                int64_t layer_end) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    std::vector<int32_t> mine;
    const auto& layer = holders[static_cast<size_t>(l)];
    for (size_t e = 0; e < layer.size(); ++e) {
      if (std::find(layer[e].begin(), layer[e].end(), rank) != layer[e].end()) mine.push_back(static_cast<int32_t>(e));
    }
    out.push_back(std::move(mine));
  }
  return out;
}

std::vector<double> RankImbalance(const ExpertHolderTable& holders, const ExpertLoad& load, int64_t ep) {
  std::vector<double> out;
  for (int64_t l = 0; l < load.layers; ++l) {
    double total = 0;
    for (int64_t e = 0; e < load.experts; ++e) total += static_cast<double>(load.at(l, e));
    const double busiest = Busiest(holders[static_cast<size_t>(l)], load, l, ep);
    out.push_back(total > 0 ? busiest / (total / static_cast<double>(ep)) : 1.0);
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
