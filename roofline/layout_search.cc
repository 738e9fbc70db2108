// The layout explorer's search (see layout_search.h).
#include "roofline/layout_search.h"

#include <algorithm>
#include <cmath>

namespace moeserve::roofline {
namespace {

// Per device: each EP rank holds the replicated weights of its stage's layers, 1/ep of its
// stage's experts, and its extra expert copies (at ep > 1).
double WeightBytesPerDevice(const ModelCosts& m, const ParallelLayout& l, int64_t copies_per_rank) {
  const double replicated = m.replicated_params * m.weight_bytes_per_param;
  const double experts = m.TotalWeightBytes() - replicated;
  const double copies = l.ep > 1 ? static_cast<double>(copies_per_rank) * m.moe_layers * m.expert_params *
                                       m.weight_bytes_per_param
                                 : 0.0;
  return (replicated + experts / static_cast<double>(l.ep) + copies) / static_cast<double>(l.pp);
}

// KV per device for `sequences` in flight: an EP rank keeps its 1/ep of the sequences, a stage
// its 1/pp of the layers, and pp micro-batches are in flight; so pp saves weight memory, not KV.
// (A sequence lives on one EP rank: the busiest rank holds ceil(sequences / ep) of them.)
double KvBytesPerDevice(const ModelCosts& m, const ParallelLayout& l, int64_t sequences, int64_t context) {
  const int64_t per_rank = (sequences + l.ep - 1) / l.ep;
  return static_cast<double>(per_rank) * static_cast<double>(context) * m.kv_bytes_per_token / static_cast<double>(l.pp);
}

// The candidate (ep, pp, domain_size) with its weights, KV room and a point per sequences count.
LayoutCandidate Evaluate(const LayoutSearch& s, const ParallelLayout& layout) {
  LayoutCandidate c;
  c.layout = layout;
  const int64_t ep = layout.ep, pp = layout.pp;
  c.weight_bytes_per_device = WeightBytesPerDevice(s.model, c.layout, s.expert_copies_per_rank);
  c.weights_fit = c.weight_bytes_per_device <= s.hw.mem_capacity;
  // Sequences a rank can hold (each ctx x KV-per-token / pp bytes here), and so the largest
  // micro-batch whose pp copies in flight spread over the ep ranks fit.
  const double per_seq = static_cast<double>(s.context) * s.model.kv_bytes_per_token / static_cast<double>(pp);
  const int64_t per_rank =
      c.weights_fit && per_seq > 0
          ? static_cast<int64_t>(std::floor((s.hw.mem_capacity - c.weight_bytes_per_device) / per_seq))
          : 0;
  c.max_micro_batch = per_rank * ep / pp;
  for (int64_t n : s.sequences) {
    if (n % pp != 0) continue;
    LayoutPoint p;
    p.sequences = n;
    p.micro_batch = n / pp;
    p.kv_bytes_per_device = KvBytesPerDevice(s.model, c.layout, n, s.context);
    p.fits = c.weights_fit && p.micro_batch <= c.max_micro_batch;
    StepShape shape = StepShape::Decode(p.micro_batch, s.context), engine = StepShape::Decode(n, s.context);
    if (auto r = s.routing.find({ep, RoutingDomain(ep, layout.domain_size)}); r != s.routing.end()) {
      c.layout.routed_inside = r->second.routed_inside;
      c.layout.routed_outside = r->second.routed_outside;
      // Every micro-batch of the engine's step holds micro_batch tokens too.
      const RoutingExpectation x = ExpectRouting(r->second.routing, static_cast<double>(p.micro_batch));
      for (StepShape* sh : {&shape, &engine}) {
        sh->experts_hit = x.experts_hit_per_layer * static_cast<double>(s.model.moe_layers);
        sh->micro_batch_experts_hit_per_layer = x.experts_hit_per_layer;
        sh->expert_rank_imbalance = x.weight_imbalance;
        sh->expert_rows_imbalance = x.rows_imbalance;
      }
    }
    p.cost = PredictStep(s.model, shape, s.hw, c.layout);
    p.token_seconds = p.cost.bound_seconds;
    p.tokens_per_second = static_cast<double>(n) / p.cost.bound_seconds;
    p.usd_per_million_tokens =
        s.price_per_hour * static_cast<double>(c.layout.devices()) / 3600.0 / p.tokens_per_second * 1e6;
    p.engine_step_seconds = PipelinedStepSeconds(s.model, engine, s.hw, c.layout).bound_seconds;
    p.engine_tokens_per_second = static_cast<double>(n) / p.engine_step_seconds;
    c.points.push_back(p);
  }
  return c;
}

}  // namespace

int64_t RoutingDomain(int64_t ep, int64_t domain_size) {
  return domain_size > 0 && domain_size < ep && ep % domain_size == 0 ? domain_size : 0;
}

std::vector<LayoutCandidate> ExploreLayouts(const LayoutSearch& s) {
  const std::vector<int64_t> domains =
      s.domain_sizes.empty() ? std::vector<int64_t>{s.hw.scale_up_domain} : s.domain_sizes;
  std::vector<LayoutCandidate> out;
  for (int64_t ep = 1; ep <= s.devices; ++ep) {
    if (s.experts % ep != 0) continue;
    for (int64_t pp = 1; ep * pp <= s.devices && pp <= s.layers; ++pp) {
      std::vector<int64_t> done;  // the domain sizes this (ep, pp) was priced at
      for (int64_t domain : domains) {
        // Beyond one scale-up domain the ranks fill whole domains in order; a layout whose EP
        // groups neither fill whole domains nor share one is skipped (its all-to-all has no
        // single price).
        const ParallelLayout layout{ep, pp, domain > 0 && ep * pp > domain ? domain : 0};
        if (!CheckDomainSize(layout, "scale_up_domain").ok()) continue;
        // A recorded routing without a placement for this (ep, EP domain): one serve refuses
        // (more expert copies than domains allow).
        if (!s.routing.empty() && s.routing.count({ep, RoutingDomain(ep, layout.domain_size)}) == 0) continue;
        if (std::find(done.begin(), done.end(), layout.domain_size) != done.end()) continue;
        done.push_back(layout.domain_size);
        out.push_back(Evaluate(s, layout));
      }
    }
  }
  return out;
}

}  // namespace moeserve::roofline
