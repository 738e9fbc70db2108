// Expert placement and stage layout.
#include "parallel/placement.h"

namespace moeserve {

std::vector<int32_t> ExpertOwners(int64_t experts, int64_t ep, ExpertPlacement placement) {
  std::vector<int32_t> owner(experts);
  for (int64_t e = 0; e < experts; ++e) {
    owner[e] =
        static_cast<int32_t>(placement == ExpertPlacement::kRoundRobin ? e % ep : e * ep / experts);
  }
  return owner;
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
