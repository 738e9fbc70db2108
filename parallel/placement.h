// Where the pieces of a parallel layout go: which EP rank holds each expert, which layers each
// pipeline stage holds.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace moeserve {

enum class ExpertPlacement { kContiguous, kRoundRobin };

// Splits the experts of a layer over `ep` ranks; owner[e] is the rank holding expert e:
// contiguous ranges (rank r holds [rE/N, (r+1)E/N)) or round-robin (expert e on rank e mod N).
std::vector<int32_t> ExpertOwners(int64_t experts, int64_t ep, ExpertPlacement placement);
// Contiguous layer ranges [begin, end) of `pp` stages (the first stages take one more when uneven).
std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp);

}  // namespace moeserve
