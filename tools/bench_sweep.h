// `moeserve bench --sweep-batch ... --context ...`: holds the model at each fixed decode batch
// size and context, measures the step time, and sets it against the roofline prediction from
// a hardware profile, then fits a calibrated model (efficiency factors and overhead).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/model_weights.h"
#include "roofline/calibration_fit.h"
#include "roofline/hardware.h"

namespace moeserve::tools {

struct SweepOptions {
  std::vector<int64_t> batches;
  std::vector<int64_t> contexts;
  int64_t block_size = 16;
  DType kv_dtype = DType::kF32;
  int min_steps = 3;          // measured steps per point (after one warm-up)
  double min_seconds = 0.25;  // ... and at least this long
  double max_kv_bytes = 8e9;  // points whose KV would exceed this are skipped
  bool progress = true;
};

struct SweepPoint {
  int64_t batch = 0, context = 0;
  int steps = 0;
  double observed_seconds = 0;  // median step
  double min_seconds = 0;
  double experts_hit = 0;       // observed distinct (layer, expert) pairs per step
  double attention_seconds = 0, moe_seconds = 0, head_seconds = 0;  // median step's phases
  roofline::StepCost peak;      // prediction at the profile's peaks
  double calibrated_seconds = 0;
};

struct SweepReport {
  std::string weight_dtype;  // "bf16" or "f32": which FLOP/s peak applies
  std::vector<SweepPoint> points;
  roofline::FitResult fit;                 // fitted on every point
  roofline::FitResult holdout;             // fitted on even points, evaluated on odd ones
  std::vector<std::string> skipped;
  struct Knee {
    int64_t context = 0;
    double measured = 0;               // MeasuredKnee of the observed curve
    double predicted_knee = 0;         // the same construction on the roofline curve (peaks)
    double calibrated_knee = 0;        // ... and on the calibrated model's curve
    double predicted_critical = 0;     // compute time = memory time at the peaks (experts expected);
                                       // 0: no batch is compute-bound, and no_critical_reason says why
    std::string no_critical_reason;
    double ratio = 0;                  // measured / predicted_knee
    // Expected distinct experts per layer read at batch 1 and at the critical batch: while they
    // still grow, the weight term is not flat and even the roofline bound has no knee there.
    double experts_hit_batch1 = 0;
    double experts_hit_at_critical = 0;
  };
  int64_t num_experts = 0;
  std::vector<Knee> knees;
  int64_t beats_bound = 0;  // points observed faster than the peak bound by more than 5%
};

absl::StatusOr<SweepReport> RunDecodeSweep(const ModelWeights& weights, Backend* backend,
                                           const roofline::HardwareProfile& hw, const SweepOptions& options);

nlohmann::json SweepToJson(const SweepReport& r, const roofline::HardwareProfile& hw);
void PrintSweep(const SweepReport& r, const roofline::HardwareProfile& hw);

}  // namespace moeserve::tools
