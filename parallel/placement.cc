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

}  // namespace moeserve
