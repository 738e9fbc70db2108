// The record of one engine step: its batch shape, the phase times observed, the bytes and
// FLOPs the cost model counts and, with a hardware profile, the roofline's prediction.
#pragma once

#include <optional>

#include "engine/batch_builder.h"
#include "runner/executor.h"
#include "engine/step_record.h"
#include "roofline/cost_model.h"
#include "roofline/hardware.h"

namespace moeserve {

struct StepTiming {
  double start_seconds = 0;     // since the engine started
  double schedule_seconds = 0;  // scheduling, tier copies and building the batch
  double forward_seconds = 0;   // from the step's start to the end of the forward pass
  double duration_seconds = 0;  // the whole step, outputs streamed
  double transfer_seconds = 0;  // tier copies inside scheduling
  double transfer_bytes = 0;
};

struct StepPricing {
  const roofline::ModelCosts* costs = nullptr;
  const roofline::HardwareProfile* hardware = nullptr;  // null: no prediction
  roofline::ParallelLayout layout;
  roofline::Efficiency efficiency;
};

StepRecord AccountStep(const SchedulerOutput& out, const StepBatch& batch, const RunnerOutput& run,
                       const StepTiming& timing, const StepPricing& pricing);

}  // namespace moeserve
