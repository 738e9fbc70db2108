// `moeserve price-sheet --measure`: the step times of the price sheet measured on the local
// engine (a decode sweep over the grid's batches and contexts, prefill of the mix's prompt at
// each step size, one prompt's TTFT through each KV tier), so the measured sheet comes from the
// same formulas as the predicted one.
#pragma once

#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/model_weights.h"
#include "roofline/predicted_times.h"
#include "roofline/pricing.h"

namespace moeserve::tools {

// Measured step times at the grid's points; which roofline term bounds each is the roofline's
// verdict on the same shape (a stopwatch cannot say).
class MeasuredStepTimes : public roofline::StepTimes {
 public:
  explicit MeasuredStepTimes(const roofline::PredictedStepTimes* bounds) : bounds_(bounds) {}
  roofline::StepTime Decode(int64_t batch, int64_t context) const override;
  roofline::StepTime Prefill(int64_t prompt, int64_t step_tokens) const override;

  std::map<std::pair<int64_t, int64_t>, double> decode;   // (batch, context) -> median step seconds
  std::map<std::pair<int64_t, int64_t>, double> prefill;  // (prompt, step tokens) -> median seconds

 private:
  const roofline::PredictedStepTimes* bounds_;
};

struct PriceMeasureOptions {
  int64_t block_size = 16;
  DType kv_dtype = DType::kF32;
  int repeats = 3;              // timed runs per point (median), after a warm-up
  int64_t tier_prompt_tokens = 0;  // 0: no tier scenario
  bool progress = true;
};

struct PriceMeasurement {
  MeasuredStepTimes times;
  double host_link_bytes_per_s = 0;   // KV back from DDR, as the tier scenario measured it
  double flash_read_bytes_per_s = 0;  // ... from flash
  nlohmann::json tier_scenario;       // TTFT cold / device / DDR / flash hit (null when not run)
};

// Measures every point `in.grid` asks for: decode at each (batch, context) whose KV fits the
// memory `in.machine` gives, prefill of `in.mix.prompt_tokens` at each step size.
absl::StatusOr<PriceMeasurement> MeasurePriceTimes(const ModelWeights& weights, Backend* backend,
                                                   const roofline::HardwareProfile& hw,
                                                   const roofline::PriceInputs& in,
                                                   const roofline::PredictedStepTimes* bounds,
                                                   const PriceMeasureOptions& options);

// The fast lane under load: `bulk` requests decoding together (every prompt computed), first
// alone (their decode steps timed and priced at the machine's rate) and then with one fast-lane
// request arriving among them (which caps the batch at SchedulerConfig::fast_lane_max_batch
// while it runs; its TPOT from its final event, its decode price from its own receipt); the
// fast request's speed and price as multiples of the bulk's.
absl::StatusOr<nlohmann::json> MeasureFastLane(const ModelWeights& weights, Backend* backend, int64_t bulk,
                                               int64_t prompt_tokens, int64_t output_tokens, double usd_per_hour,
                                               const PriceMeasureOptions& options);

}  // namespace moeserve::tools
