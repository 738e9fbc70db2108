// Where an expert-parallel layer's routed rows travel under a placement: kept on the sender's
// rank, sent to another rank of its scale-up domain, or sent across domains. What the roofline
// prices the all-to-all by (roofline::ParallelLayout::routed_inside / routed_outside) and what a
// replicated expert's copy in every domain saves.
#pragma once

#include <cstdint>

#include "parallel/placement.h"

namespace moeserve {

// Fractions of the routed (token, expert) rows; own + inside + outside = 1.
struct RoutedTraffic {
  double own = 0, inside = 0, outside = 0;
};

// The expectation over `holders` (every layer; the layers without tokens in `load` skipped) with
// the tokens spread evenly over the `ep` ranks and each expert taking its share of the layer's
// rows (from `load`; null: every expert alike). Each sender's rows of an expert go to its
// NearHolders under `domain_size` (0: one domain), split evenly, as ExpertDispatch splits them.
// One rank per expert and one domain give own 1 / ep, inside (ep - 1) / ep: the uniform case.
RoutedTraffic ExpectedTraffic(const ExpertHolderTable& holders, const ExpertLoad* load, int64_t ep,
                              int64_t domain_size);

}  // namespace moeserve
