// Where the pieces of a parallel layout go: which EP rank holds each expert, which layers each
// pipeline stage holds.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moeserve {

enum class ExpertPlacement { kContiguous, kRoundRobin };

// Splits the experts of a layer over `ep` ranks; owner[e] is the rank holding expert e:
// contiguous ranges (rank r holds [rE/N, (r+1)E/N)) or round-robin (expert e on rank e mod N).
std::vector<int32_t> ExpertOwners(int64_t experts, int64_t ep, ExpertPlacement placement);
// Contiguous layer ranges [begin, end) of `pp` stages (the first stages take one more when uneven).
std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp);

// The scale-up domain the ranks' hosts make (hosts[r]: rank r's host name; ranks fill hosts in
// rank order, as mpirun fills a hostfile's slots): the ranks per host when every host holds
// one contiguous run of ranks of the same length, 0 when every rank is on one host, -1 when the
// runs are uneven or a host's ranks are not contiguous (no domain size describes them).
int64_t DomainSizeOfHosts(const std::vector<std::string>& hosts);

}  // namespace moeserve
