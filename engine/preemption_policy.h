// Swap or recompute, for a sequence preempted under KV pressure: swapping copies its computed
// blocks to DDR and back over the host link; recomputing prefills its computed tokens again.
// The scheduler owns one and asks it at each preemption that swap space would allow. In auto
// mode it weighs the two copies' seconds against the recompute's: priced by the roofline of the
// hardware profile where the engine has one, else by the prefill rate measured as the engine
// runs (ObservePrefill).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "kvcache/kv_tiers.h"
#include "roofline/cost_model.h"

namespace moeserve {

class PreemptionPolicy {
 public:
  // The roofline that prices a recompute: the model's costs, the profile and its efficiencies.
  struct Roofline {
    const roofline::ModelCosts* costs = nullptr;
    const roofline::HardwareProfile* hardware = nullptr;
    roofline::Efficiency efficiency;
  };

  // `block_bytes`: one KV block on the device; `link_bytes_per_second`: the host link, each way
  // (0: unknown, and auto mode recomputes).
  PreemptionPolicy(PreemptionMode mode, double block_bytes, double link_bytes_per_second,
                   std::optional<Roofline> roofline = std::nullopt);

  // Whether to swap `blocks` blocks out (and later back in) rather than recompute `tokens`
  // tokens; each answer is counted.
  bool ShouldSwap(int64_t blocks, int64_t tokens);
  // The seconds a recompute of `tokens` tokens is priced at.
  double RecomputeSeconds(int64_t tokens) const;
  // A step that prefilled: `tokens` tokens of it in `seconds` (a moving average of the rate).
  void ObservePrefill(int64_t tokens, double seconds);

  PreemptionMode mode() const { return mode_; }
  // Read by GetStats on other threads while the engine thread decides.
  int64_t swap_decisions() const { return swaps_.load(std::memory_order_relaxed); }
  int64_t recompute_decisions() const { return recomputes_.load(std::memory_order_relaxed); }

 private:
  PreemptionMode mode_;
  double block_bytes_, link_bytes_per_second_;
  std::optional<Roofline> roofline_;
  double seconds_per_prefill_token_ = 0;
  std::atomic<int64_t> swaps_{0}, recomputes_{0};
};

}  // namespace moeserve
