// Swap or recompute (see preemption_policy.h).
#include "engine/preemption_policy.h"

namespace moeserve {

PreemptionPolicy::PreemptionPolicy(PreemptionMode mode, double block_bytes, double link_bytes_per_second,
                                   std::optional<Roofline> roofline)
    : mode_(mode), block_bytes_(block_bytes), link_bytes_per_second_(link_bytes_per_second),
      roofline_(roofline) {}

double PreemptionPolicy::RecomputeSeconds(int64_t tokens) const {
  if (roofline_) {
    roofline::StepShape shape;
    shape.seqs.push_back({tokens, tokens, false});
    return roofline::PredictStep(*roofline_->costs, shape, *roofline_->hardware, {}, roofline_->efficiency).seconds;
  }
  return static_cast<double>(tokens) * seconds_per_prefill_token_;
}

bool PreemptionPolicy::ShouldSwap(int64_t blocks, int64_t tokens) {
  bool swap = mode_ == PreemptionMode::kSwap;
  if (mode_ == PreemptionMode::kAuto) {
    // Out and back in over the host link, against recomputing every computed token.
    const double copies = 2.0 * static_cast<double>(blocks) * block_bytes_;
    swap = link_bytes_per_second_ > 0 && copies / link_bytes_per_second_ < RecomputeSeconds(tokens);
  }
  ++(swap ? swaps_ : recomputes_);
  return swap;
}

void PreemptionPolicy::ObservePrefill(int64_t tokens, double seconds) {
  if (tokens <= 0) return;
  const double per_token = seconds / static_cast<double>(tokens);
  seconds_per_prefill_token_ =
      seconds_per_prefill_token_ == 0 ? per_token : 0.8 * seconds_per_prefill_token_ + 0.2 * per_token;
}

}  // namespace moeserve
