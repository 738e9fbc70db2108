// Roofline analysis.
#include "roofline/analysis.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace moeserve::roofline {

RooflineReport AnalyzeRoofline(const RooflineInputs& in) {
  const ModelCosts& m = in.model;
  const HardwareProfile& hw = in.hw;
  const double ep = static_cast<double>(in.layout.ep);
  const double devices = static_cast<double>(in.layout.devices());
  const double peak = hw.PeakFlops(m.weight_dtype);
  RooflineReport r;
  r.flops_per_byte = hw.FlopsPerByte();
  // Compute time = weight time with every weight read, at the peak of the weights' dtype.
  const double ratio = peak / hw.mem_bandwidth;
  const double bytes_factor = m.weight_bytes_per_param / 2.0;
  r.critical_batch = ratio * bytes_factor * m.total_params / m.active_params;
  r.critical_batch_routed_experts = ratio * bytes_factor * static_cast<double>(m.experts) / static_cast<double>(m.top_k);

  // Bisection on the batch (decode tokens, context 1) where compute time meets weight time,
  // with the experts expected to be hit and the layout's per-device shares (as PredictStep).
  auto gap = [&](double batch) {
    const double flops = batch * (m.flops_per_token + 2.0 * m.lm_head_params);
    const double experts = m.moe_layers * ExpectedExpertsHit(m.experts, m.top_k, batch);
    return flops / (peak * ep) - WeightSeconds(m, hw, in.layout, batch, experts, /*any_logits=*/true);
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
  const double replicated_bytes = m.replicated_params * m.weight_bytes_per_param;
  r.latency_floor_seconds = weight_bytes / (hw.mem_bandwidth * devices);
  r.latency_floor_layout_seconds =
      replicated_bytes / hw.mem_bandwidth + (weight_bytes - replicated_bytes) / (hw.mem_bandwidth * ep);
  r.latency_floor_batch1_seconds = PredictStep(m, StepShape::Decode(1, in.context), hw, in.layout).bound_seconds;
  r.drain_seconds = hw.mem_capacity / hw.mem_bandwidth;
  r.kv_bytes_per_token = m.kv_bytes_per_token;
  // Each EP rank holds the non-expert weights (a 1/pp share per stage); experts are stored once.
  const double free_bytes = hw.mem_capacity * devices - replicated_bytes * ep - (weight_bytes - replicated_bytes);
  r.max_batch_kv_fits =
      free_bytes > 0 ? static_cast<int64_t>(std::floor(free_bytes / (m.kv_bytes_per_token * in.context))) : 0;
  r.kv_equals_weights_context_batch1 = weight_bytes / m.kv_bytes_per_token;
  if (r.critical_batch > 0) r.kv_equals_weights_context_at_critical = weight_bytes / (r.critical_batch * m.kv_bytes_per_token);

  const double pp = static_cast<double>(in.layout.pp);
  for (int64_t b : in.batches) {
    RooflineRow row;
    row.batch = b;
    row.cost = PredictStep(m, StepShape::Decode(b, in.context), hw, in.layout);
    // With pp stages, pp micro-batches of this size are in flight at once.
    row.tokens_per_second = pp * static_cast<double>(b) / row.cost.bound_seconds;
    row.usd_per_million_tokens = in.price_per_hour * devices / 3600.0 / row.tokens_per_second * 1e6;
    row.kv_fits = static_cast<double>(b) * pp <= static_cast<double>(r.max_batch_kv_fits);
    r.rows.push_back(row);
  }
  return r;
}

int64_t SmallestComputeBoundBatch(const ModelCosts& m, const HardwareProfile& hw, int64_t context) {
  auto compute_bound = [&](int64_t n) {
    const StepCost c = PredictStep(m, StepShape::Decode(n, context), hw);
    return c.compute_seconds >= c.memory_seconds;
  };
  // Compute grows linearly in the batch and memory concavely (experts saturate, KV is linear),
  // so the batches split into a memory-bound prefix and a compute-bound rest: bisect.
  int64_t lo = 0, hi = int64_t{1} << 20;  // lo memory-bound (or 0), hi compute-bound
  if (!compute_bound(hi)) return 0;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (compute_bound(mid) ? hi : lo) = mid;
  }
  return hi;
}

double MarginalDecodeIntensity(const ModelCosts& m, const HardwareProfile& hw, int64_t context) {
  // Far past expert saturation, the difference of two large batches holds only per-sequence terms.
  constexpr int64_t kBig = int64_t{1} << 20;
  const StepCost a = PredictStep(m, StepShape::Decode(kBig, context), hw);
  const StepCost b = PredictStep(m, StepShape::Decode(2 * kBig, context), hw);
  const double bytes = (b.weight_bytes + b.kv_read_bytes + b.kv_write_bytes) -
                       (a.weight_bytes + a.kv_read_bytes + a.kv_write_bytes);
  return bytes > 0 ? (b.flops - a.flops) / bytes : 0;
}

std::string NoCriticalBatchReason(const ModelCosts& m, const HardwareProfile& hw, int64_t context) {
  return absl::StrFormat(
      "no decode batch is compute-bound at context %d: each added sequence brings %.1f FLOP per byte of "
      "its KV, below this machine's %.1f FLOP/byte (%s), so the KV read grows with the batch as fast as "
      "the FLOPs",
      context, MarginalDecodeIntensity(m, hw, context), hw.PeakFlops(m.weight_dtype) / hw.mem_bandwidth,
      hw.name);
}

}  // namespace moeserve::roofline
