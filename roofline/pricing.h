// The price sheet: a provider's unit prices derived from step times, by the same formulas
// whether the step times are predicted (the roofline) or measured (the local engine). The four
// derivations (docs/economics.md): output vs input tokens, cached input per memory tier, price
// against context length (the cliff), and fast mode (price vs speed down to the latency floor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moeserve::roofline {

// A step's time and which roofline term bounds it.
struct StepTime {
  double seconds = 0;
  bool compute_bound = false;
};

// Where step times come from. Both are asked only at the batches, contexts and chunk sizes the
// PriceInputs list, so a measured table needs no interpolation.
class StepTimes {
 public:
  virtual ~StepTimes() = default;
  // One decode step of `batch` sequences, each attending `context` tokens.
  virtual StepTime Decode(int64_t batch, int64_t context) const = 0;
  // Prefill with `step_tokens` prompt tokens per step: PromptsPerStep prompts of `prompt` tokens
  // each, computed together in ceil(their tokens / step_tokens) steps (one prompt in chunks when
  // it is longer than a step). The time until all of them have their first token.
  virtual StepTime Prefill(int64_t prompt, int64_t step_tokens) const = 0;
};

// Prompts a prefill step of `step_tokens` tokens carries at once (at least one).
inline int64_t PromptsPerStep(int64_t prompt, int64_t step_tokens) {
  return step_tokens > prompt ? step_tokens / prompt : 1;
}

// What the machine costs and holds. Prices are per device; the machine is `devices` of them.
struct MachinePrices {
  int64_t devices = 1;
  double usd_per_device_hour = 0;
  double device_memory_bytes = 0;      // per device (HBM, or DRAM on a CPU)
  double usd_per_gb_hour_device = -1;  // < 0: the device's price over its memory (rented with it); else > 0
  double usd_per_gb_hour_ddr = 0;
  double usd_per_gb_hour_flash = 0;
  double host_link_bytes_per_s = 0;    // per device: KV back from host DDR
  double flash_read_bytes_per_s = 0;   // per device: KV back from flash
  double UsdPerSecond() const { return usd_per_device_hour * static_cast<double>(devices) / 3600.0; }
  double MemoryBytes() const { return device_memory_bytes * static_cast<double>(devices); }
  double DeviceTierUsdPerGbHour() const {
    return usd_per_gb_hour_device >= 0 ? usd_per_gb_hour_device : usd_per_device_hour / (device_memory_bytes / 1e9);
  }
};

// The model's sizes that prices depend on.
struct ModelBytes {
  double weight_bytes = 0;        // every weight, stored once over the machine
  double kv_bytes_per_token = 0;  // all layers
  int64_t max_context = 0;
};

// Targets and traffic.
struct TrafficMix {
  int64_t prompt_tokens = 1024;
  int64_t output_tokens = 256;
  double cache_hit_rate = 0;       // fraction of prompt tokens served from a cache
  double tpot_seconds = 0.05;      // time per output token target (a decode step)
  double ttft_seconds = 2.0;       // time to first token target (the whole prompt's prefill)
  // Retention each tier sells: minutes on the device and in DDR, an hour on flash.
  double retention_device_s = 300, retention_ddr_s = 300, retention_flash_s = 3600;
  int64_t DecodeContext() const { return prompt_tokens + output_tokens / 2; }  // mean context while decoding
};

// The grid the sheet is computed on (every list ascending, each entry >= 1).
struct PriceGrid {
  std::vector<int64_t> batches;   // decode batch candidates
  std::vector<int64_t> contexts;  // context curve; must include the mix's DecodeContext()
  std::vector<int64_t> chunks;    // prefill tokens-per-step candidates
};

struct PriceInputs {
  MachinePrices machine;
  ModelBytes model;
  TrafficMix mix;
  PriceGrid grid;
  // The weights a batch-1 step must read, over the bandwidth (the roofline's; no KV, no
  // arithmetic): no batch decodes faster.
  double latency_floor_seconds = 0;
  absl::Status Validate() const;
  // Memory the weights leave for KV, over the whole machine.
  double FreeBytes() const { return machine.MemoryBytes() - model.weight_bytes; }
};

struct UnitPrice {
  double usd_per_million = 0;
  int64_t batch = 0;      // decode: the operating batch; prefill: tokens per step
  int64_t prompts = 1;    // prefill: prompts computed together
  double seconds = 0;     // decode: the step; prefill: until those prompts' first tokens
  bool compute_bound = false;
  // false: no candidate met the TPOT/TTFT target; then the smallest batch (decode) or the
  // cheapest step size (prefill) is priced.
  bool target_met = true;
  bool kv_fits = true;     // false: not even batch 1 fits at the context
  // Decode: what stopped the batch growing: "tpot" (the next candidate misses the target),
  // "memory" (the next one's KV does not fit) or "grid" (no larger candidate was given).
  std::string limited_by;
};

struct TierPrice {
  std::string tier;  // "device", "ddr", "flash"
  double usd_per_gb_hour = 0;
  double retention_seconds = 0;
  double restore_seconds_per_token = 0;  // moving one token's KV back to the device (0 on the device)
  double hold_usd_per_million = 0, restore_usd_per_million = 0, usd_per_million = 0;
  double discount = 0;                     // the input price over this price (how much cheaper a hit is)
  double break_even_retention_seconds = 0;  // holding longer than this costs more than recomputing
};

struct ContextPoint {
  int64_t context = 0;
  int64_t batch = 0;              // the largest candidate meeting TPOT that fits
  bool memory_limited = false;    // KV at the operating batch no longer fits: memory cuts the batch
  double step_seconds = 0;
  double usd_per_million_output = 0;
  double kv_over_weight_bytes = 0;  // KV read per step over weight bytes, at this batch
  bool fits = true;
};

struct FastPoint {
  int64_t batch = 0;
  double step_seconds = 0;
  double price_multiple = 0;  // price per output token over the operating batch's
  double speed_multiple = 0;  // tokens/s per sequence over the operating batch's
  bool at_floor = false;      // within 5% of the fastest step any batch reaches
};

struct PriceSheet {
  UnitPrice input, output;
  double output_over_input = 0;
  std::vector<TierPrice> tiers;
  double usd_per_request = 0;  // the mix: uncached and cached prompt, and output
  std::vector<ContextPoint> context_curve;
  double kv_equals_weights_context = 0;   // at the operating batch
  double batch_shrinks_context = 0;       // the operating batch's KV fills the memory weights leave
  int64_t doubling_context = 0;           // first curve context priced >= 2x the shortest (0: none)
  double long_over_short = 0;             // price at the longest curve context over the shortest
  std::vector<FastPoint> fast_curve;      // operating batch down to 1
  double max_speed_multiple = 0;          // what batch 1 buys: no price buys more
  double latency_floor_seconds = 0;
};

// The sheet, from `times` at the grid's points. Prices are $ per million tokens.
PriceSheet ComputePriceSheet(const PriceInputs& in, const StepTimes& times);

// The largest grid batch whose KV at `context` fits the memory the weights leave (0: none).
int64_t LargestFittingBatch(const PriceInputs& in, int64_t context);

// One paragraph in plain English: what each price is and which bound sets it.
std::string ReadPriceSheet(const PriceSheet& s, const PriceInputs& in);

}  // namespace moeserve::roofline
