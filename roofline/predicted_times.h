// Step times from the roofline cost model, for the price sheet's --predict side.
#pragma once

#include "roofline/cost_model.h"
#include "roofline/pricing.h"

namespace moeserve::roofline {

class PredictedStepTimes : public StepTimes {
 public:
  // `eff` left at its defaults prices at the peaks (the bound); a calibrated one prices what
  // the machine is expected to achieve.
  PredictedStepTimes(ModelCosts model, HardwareProfile hw, ParallelLayout layout, Efficiency eff = {})
      : model_(std::move(model)), hw_(std::move(hw)), layout_(layout), eff_(eff) {}
  StepTime Decode(int64_t batch, int64_t context) const override;
  StepTime Prefill(int64_t prompt, int64_t chunk) const override;

 private:
  ModelCosts model_;
  HardwareProfile hw_;
  ParallelLayout layout_;
  Efficiency eff_;
};

// The weights a batch-1 decode step reads (the dense ones and one token's experts), over the
// bandwidth: the latency floor no batch gets under (PriceInputs::latency_floor_seconds).
double BatchOneWeightSeconds(const ModelCosts& model, const HardwareProfile& hw, const ParallelLayout& layout);

}  // namespace moeserve::roofline
