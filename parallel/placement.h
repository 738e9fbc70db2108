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

// holders[layer][e]: the EP ranks that hold routed expert e in `layer`, ascending: one rank, or
// several where the placement replicates the expert (its rows are then split among the copies:
// parallel/expert_dispatch.h). For every layer of the model.
//   contiguous: expert e on rank floor(e N / E) in every layer (rank r holds a contiguous range);
//   round-robin: expert e on rank e mod N in every layer;
//   balanced (`load` given, of these layers and experts), without replicas: every rank holds as
//     many experts as under contiguous; per layer, the experts, heaviest first (ties to the lower
//     index), each to the rank with the least load so far that has room (ties to the lower
//     rank): the longest-processing-time rule (within 4/3 of the best possible busiest rank in
//     the tests' brute-force comparisons; with the room per rank fixed that bound is not a
//     theorem); then swaps of an expert of the busiest rank with a lighter one elsewhere while
//     that lowers the busiest rank's load (at most E rounds); contiguous where that is at least
//     as even (so never worse than it). What DeepSeek's EPLB does per layer.
//   balanced with `replicas` > 0 extra copies per layer (EPLB's redundant experts; E + replicas
//     a multiple of N, each expert on at most N ranks, an expert's load split evenly among its
//     copies; every rank holds (E + replicas) / N). Two rules, the one leaving the busiest rank
//     lighter kept (ties: the second):
//     1. EPLB's: each copy to the expert with the most load per copy (ties to the lower index);
//        then the copies, heaviest first, each to the least-loaded rank with room that does not
//        hold that expert yet (where the rule finds no such rank for some copy, every copy goes
//        round-robin in that order instead);
//     2. from the balanced placement without copies, each copy in turn of the expert, onto the
//        least-loaded rank with room that lacks it, that leaves the busiest rank lightest.
//     With `domain_size` D (0 < D < N: ranks [d D, (d + 1) D) form scale-up domain d), a copy
//     goes only to a domain that holds no copy of the expert yet (at most N / D copies of one
//     expert; the fallback deals consecutive copies to different domains). ExpertDispatch sends
//     a token's rows to the copy in its own domain where there is one (NearHolders), so a hot
//     expert copied into every domain is reached without leaving the domain, and each copy
//     still takes an even share of the expert's rows when the tokens are spread evenly.
using ExpertHolderTable = std::vector<std::vector<std::vector<int32_t>>>;
// domain_size must be 0, at least ep, or divide ep.
ExpertHolderTable ExpertHolders(int64_t layers, int64_t experts, int64_t ep, ExpertPlacement placement,
                                const ExpertLoad* load = nullptr, int64_t replicas = 0, int64_t domain_size = 0);
// The most replicas ExpertHolders takes: E (N - 1), or E (N / D - 1) with several domains.
int64_t MaxReplicas(int64_t experts, int64_t ep, int64_t domain_size);
// The holders that rank `sender`'s rows of an expert go to (ExpertDispatch splits them among
// these): those in the sender's domain (of `domain_size` ranks; 0: one domain) if any, else all.
std::vector<int32_t> NearHolders(const std::vector<int32_t>& holders, int64_t sender, int64_t domain_size);
// The experts rank `rank` holds in each layer of [layer_begin, layer_end), ascending.
std::vector<std::vector<int32_t>> ExpertsOfRank(const ExpertHolderTable& holders, int64_t rank, int64_t layer_begin,
                                                int64_t layer_end);
// The busiest rank's load over the mean, per layer, for `holders` under `load` (an expert's load
// split evenly among its copies): 1 is even. The layers without tokens give 1.
std::vector<double> RankImbalance(const ExpertHolderTable& holders, const ExpertLoad& load, int64_t ep);

// Contiguous layer ranges [begin, end) of `pp` stages (the first stages take one more when uneven).
std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t layers, int64_t pp);

// The scale-up domain the ranks' hosts make (hosts[r]: rank r's host name; ranks fill hosts in
// rank order, as mpirun fills a hostfile's slots): the ranks per host when every host holds
// one contiguous run of ranks of the same length, 0 when every rank is on one host, -1 when the
// runs are uneven or a host's ranks are not contiguous (no domain size describes them).
int64_t DomainSizeOfHosts(const std::vector<std::string>& hosts);

}  // namespace moeserve
