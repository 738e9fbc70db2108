// Roofline step times for the price sheet.
#include "roofline/predicted_times.h"

#include <algorithm>

namespace moeserve::roofline {

StepTime PredictedStepTimes::Decode(int64_t batch, int64_t context) const {
  const StepCost c = PredictStep(model_, StepShape::Decode(batch, context), hw_, layout_, eff_);
  return {c.seconds, c.compute_bound};
}

StepTime PredictedStepTimes::Prefill(int64_t prompt, int64_t step_tokens) const {
  const int64_t prompts = PromptsPerStep(prompt, step_tokens);
  StepTime t;
  double compute = 0, memory = 0;
  if (prompts > 1) {  // whole prompts side by side in one step
    StepShape shape;
    shape.seqs.assign(static_cast<size_t>(prompts), SeqShape{prompt, prompt, true});
    const StepCost c = PredictStep(model_, shape, hw_, layout_, eff_);
    return {c.seconds, c.compute_seconds >= c.memory_seconds};
  }
  // One prompt in chunks, each attending what came before it; only the last samples a token.
  for (int64_t done = 0; done < prompt; done += step_tokens) {
    const int64_t n = std::min(step_tokens, prompt - done);
    StepShape shape;
    shape.seqs.push_back(SeqShape{n, done + n, done + n == prompt});
    const StepCost c = PredictStep(model_, shape, hw_, layout_, eff_);
    t.seconds += c.seconds;
    compute += c.compute_seconds;
    memory += c.memory_seconds;
  }
  t.compute_bound = compute >= memory;
  return t;
}

double BatchOneWeightSeconds(const ModelCosts& model, const HardwareProfile& hw, const ParallelLayout& layout) {
  const double experts = static_cast<double>(model.layers) * ExpectedExpertsHit(model.experts, model.top_k, 1);
  return WeightSeconds(model, hw, layout, 1, experts, /*any_logits=*/true);
}

}  // namespace moeserve::roofline
