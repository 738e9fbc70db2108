// Roofline analysis.
#include "roofline/analysis.h"

#include <cmath>

namespace moeserve::roofline {

RooflineReport AnalyzeRoofline(const RooflineInputs& in) {
  const ModelCosts& m = in.model;
  const HardwareProfile& hw = in.hw;
  const double devices = static_cast<double>(in.layout.devices());
  RooflineReport r;
  r.flops_per_byte = hw.FlopsPerByte();
  const double bytes_factor = m.weight_bytes_per_param / 2.0;
  r.critical_batch = r.flops_per_byte * bytes_factor * m.total_params / m.active_params;
  r.critical_batch_routed_experts =
      r.flops_per_byte * bytes_factor * static_cast<double>(m.experts) / static_cast<double>(m.top_k);

  // Bisection on the batch where decode compute time equals weight time (context 1).
  auto gap = [&](double batch) {
    StepShape s;
    s.seqs = {SeqShape{1, 1, true}};
    const StepCost one = PredictStep(m, s, hw, in.layout);
    // Scale a single-sequence shape to `batch` tokens without building a huge vector.
    const double flops = batch * (one.flops);
    const double experts = m.layers * ExpectedExpertsHit(m.experts, m.top_k, batch);
    const double weight_bytes = (m.dense_params + experts * m.expert_params + batch * m.hidden) * m.weight_bytes_per_param;
    return flops / (hw.PeakFlops(m.weight_dtype) * devices) - weight_bytes / (hw.mem_bandwidth * devices);
  };
  double lo = 1e-3, hi = 1e9;
  if (gap(lo) < 0 && gap(hi) > 0) {
    for (int i = 0; i < 200; ++i) {
      const double mid = std::sqrt(lo * hi);
      (gap(mid) < 0 ? lo : hi) = mid;
    }
    r.critical_batch_moe_aware = std::sqrt(lo * hi);
  }

  const double weight_bytes = m.TotalWeightBytes();
  r.latency_floor_seconds = weight_bytes / (hw.mem_bandwidth * devices);
  r.latency_floor_batch1_seconds = PredictStep(m, StepShape::Decode(1, in.context), hw, in.layout).bound_seconds;
  r.drain_seconds = hw.mem_capacity / hw.mem_bandwidth;
  r.kv_bytes_per_token = m.kv_bytes_per_token;
  const double free_bytes = hw.mem_capacity * devices - weight_bytes;
  r.max_batch_kv_fits =
      free_bytes > 0 ? static_cast<int64_t>(std::floor(free_bytes / (m.kv_bytes_per_token * in.context))) : 0;
  r.kv_equals_weights_context_batch1 = weight_bytes / m.kv_bytes_per_token;
  if (r.critical_batch > 0) r.kv_equals_weights_context_at_critical = weight_bytes / (r.critical_batch * m.kv_bytes_per_token);

  for (int64_t b : in.batches) {
    RooflineRow row;
    row.batch = b;
    row.cost = PredictStep(m, StepShape::Decode(b, in.context), hw, in.layout);
    row.tokens_per_second = static_cast<double>(b) / row.cost.bound_seconds;
    row.usd_per_million_tokens = in.price_per_hour * devices / 3600.0 / row.tokens_per_second * 1e6;
    row.kv_fits = b <= r.max_batch_kv_fits;
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace moeserve::roofline
