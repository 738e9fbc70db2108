// Where the pieces of a parallel layout go: which EP rank holds each expert of each layer,
// which layers each pipeline stage holds.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moeserve {

enum class ExpertPlacement { kContiguous, kRoundRobin, kBalanced };

// Tokens routed to each (layer, expert) over a recorded run (parallel/expert_load.h): what a
// balanced placement evens out.
struct ExpertLoad {
  int64_t layers = 0, experts = 0;
  std::vector<int64_t> tokens;  // [layers x experts]
  int64_t at(int64_t layer, int64_t expert) const { return tokens[static_cast<size_t>(layer * experts + expert)]; }
};

// owner[layer][e]: the EP rank that holds routed expert e in `layer`, for every layer of the
// model (ceil or floor of E / ep experts per rank).
//   contiguous: expert e on rank floor(e N / E) in every layer (rank r holds a contiguous range);
//   round-robin: expert e on rank e mod N in every layer;
//   balanced (`load` given, of these layers and experts): every rank holds as many experts as
//     under contiguous; per layer, the experts, heaviest first (ties to the lower index), each
//     to the rank with the least load so far that has room (ties to the lower rank): the
//     longest-processing-time rule (within 4/3 of the best possible busiest rank in the tests'
//     brute-force comparisons; with the room per rank fixed that bound is not a theorem);
//     then swaps of an expert of the busiest rank with a lighter one elsewhere while that
//     lowers the busiest rank's load (at most E rounds); contiguous where that is at least as
//     even (so never worse than it). What DeepSeek's EPLB does per layer, without replicating
//     experts.
using ExpertOwnerTable = std::vector<std::vector<int32_t>>;
ExpertOwnerTable ExpertOwners(int64_t layers, int64_t experts, int64_t ep, ExpertPlacement placement,
                              const ExpertLoad* load = nullptr);
// The experts rank `rank` holds in each layer of [layer_begin, layer_end), ascending.
std::vector<std::vector<int32_t>> ExpertsOfRank(const ExpertOwnerTable& owner, int64_t rank, int64_t layer_begin,
                                                int64_t layer_end);
// The busiest rank's load over the mean, per layer, for `owner` under `load`: 1 is even. The
// layers without tokens give 1.
std::vector<double> RankImbalance(const ExpertOwnerTable& owner, const ExpertLoad& load, int64_t ep);

// Contiguous layer ranges [begin, end) of `pp` stages (the first stages take one more when uneven).
std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp);

// The scale-up domain the ranks' hosts make (hosts[r]: rank r's host name; ranks fill hosts in
// rank order, as mpirun fills a hostfile's slots): the ranks per host when every host holds
// one contiguous run of ranks of the same length, 0 when every rank is on one host, -1 when the
// runs are uneven or a host's ranks are not contiguous (no domain size describes them).
int64_t DomainSizeOfHosts(const std::vector<std::string>& hosts);

}  // namespace moeserve
