// The layout explorer's search (`moeserve explore`): every way to place a model on N devices
// as expert-parallel ranks x pipeline stages x scale-up domain size, whether
// it fits (weights, and KV at the context for the sequences in flight, per device), and what
// the roofline predicts for it: tokens/s, time per output token and $ per million tokens.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "roofline/cost_model.h"
#include "roofline/routing_skew.h"

namespace moeserve::roofline {

struct LayoutPoint {
  int64_t sequences = 0;    // decoding sequences in flight, over all micro-batches
  int64_t micro_batch = 0;  // sequences per micro-batch (sequences / pp)
  double kv_bytes_per_device = 0;
  bool fits = false;        // weights and this KV fit in each device's memory
  StepCost cost;            // one micro-batch's decode step through every stage
  double tokens_per_second = 0;
  double token_seconds = 0;  // time per output token of one sequence (a step through all stages)
  double usd_per_million_tokens = 0;
  // The above take a pipeline that never drains (a micro-batch enters as one leaves). moeserve's
  // engine drains it every step: pp micro-batches through pp stages in (2 pp - 1) stage-times
  // (PipelinedStepSeconds). Its step time and tokens/s; equal to the above at pp 1.
  double engine_step_seconds = 0;
  double engine_tokens_per_second = 0;
};

struct LayoutCandidate {
  ParallelLayout layout;
  double weight_bytes_per_device = 0;  // the stage's share of the replicated weights + its expert share
  bool weights_fit = false;
  // Largest micro-batch whose KV fits beside the weights at the context (0: none).
  int64_t max_micro_batch = 0;
  std::vector<LayoutPoint> points;
};

struct LayoutSearch {
  ModelCosts model;
  HardwareProfile hw;
  int64_t devices = 1;  // at most this many devices are used
  int64_t experts = 1;  // EP ranks must divide them
  int64_t layers = 1;   // stages cannot outnumber them
  int64_t context = 1024;
  std::vector<int64_t> sequences;  // decoding sequences in flight to predict at
  double price_per_hour = 0;       // $ per device-hour
  // Scale-up domain sizes to price each layout at (empty: the hardware's scale_up_domain): what
  // an engineer weighs a fast domain of 8 against one of 72 with.
  std::vector<int64_t> domain_sizes;
  // By (ep, EP ranks per domain: the layout's domain size where it is below ep, else 0): a
  // recorded routing under the placement the layout would use (`explore --expert-load`). Where
  // given, it sets each point's experts hit and EP rank imbalances (ExpectRouting) and where the
  // routed rows travel; otherwise routing is taken as uniform.
  struct Placed {
    RecordedRouting routing;
    // ParallelLayout::routed_inside / routed_outside under the placement (< 0: one copy each).
    double routed_inside = -1, routed_outside = -1;
  };
  // A layout whose (ep, EP domain) is missing while others are given is not listed.
  std::map<std::pair<int64_t, int64_t>, Placed> routing;
  // Extra expert copies each EP rank holds per MoE layer (--expert-replicas = this x ep): their
  // weights count against each device's memory at ep > 1 (where they go is `routing`'s).
  int64_t expert_copies_per_rank = 0;
};

// The EP ranks per domain a layout of `ep` ranks over domains of `domain_size` is routed by (the
// key beside ep in LayoutSearch::routing): the domain size where it cuts the EP group into whole
// domains, else 0 (one domain).
int64_t RoutingDomain(int64_t ep, int64_t domain_size);

// Every (ep, pp, domain) with ep dividing the experts, pp <= layers, ep x pp <= devices, and each
// domain size of the search: the ranks fill domains of that size in order when they outnumber
// it (domain_size 0 when they fit one; a layout appears once per distinct domain_size, and not
// where its EP groups would neither fill whole domains nor share one). Sequences not divisible by
// pp are skipped for that layout. In ep, then pp, then domain order.
std::vector<LayoutCandidate> ExploreLayouts(const LayoutSearch& s);

}  // namespace moeserve::roofline
