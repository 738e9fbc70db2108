// Price sheet formulas (docs/economics.md derives each).
#include "roofline/pricing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moeserve::roofline {
namespace {

absl::Status CheckList(const std::vector<int64_t>& v, const char* name) {
  if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty"));
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 1 || (i > 0 && v[i] <= v[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be ascending integers >= 1, got ", v[i]));
    }
  }
  return absl::OkStatus();
}

// $ per million tokens when `seconds` of the whole machine produce `tokens` tokens.
double PerMillion(const MachinePrices& m, double seconds, double tokens) {
  return m.UsdPerSecond() * seconds / tokens * 1e6;
}

// The largest batch of `batches` that fits at `context` and whose decode step meets the TPOT
// target; the fastest fitting one (batch 1, at least) when none meets it.
UnitPrice OperatingDecode(const PriceInputs& in, const StepTimes& times, int64_t context) {
  UnitPrice u;
  const int64_t fit = LargestFittingBatch(in, context);
  u.kv_fits = fit > 0;
  // Where nothing fits, the smallest candidate is priced (and marked as not fitting).
  const int64_t cap = fit > 0 ? fit : in.grid.batches.front();
  bool any = false;
  for (int64_t b : in.grid.batches) {
    if (b > cap) break;
    const StepTime t = times.Decode(b, context);
    if (t.seconds <= in.mix.tpot_seconds || !any) {
      u.batch = b;
      u.seconds = t.seconds;
      u.compute_bound = t.compute_bound;
      u.target_met = t.seconds <= in.mix.tpot_seconds;
      any = true;
    }
  }
  u.usd_per_million = PerMillion(in.machine, u.seconds, static_cast<double>(u.batch));
  const auto next = std::upper_bound(in.grid.batches.begin(), in.grid.batches.end(), u.batch);
  u.limited_by = next == in.grid.batches.end() ? "grid" : (*next > cap ? "memory" : "tpot");
  return u;
}

// The prefill step size with the cheapest tokens among those meeting the TTFT target (the
// cheapest of all when none does), among those whose prompts' KV fits.
UnitPrice InputPrice(const PriceInputs& in, const StepTimes& times) {
  UnitPrice u;
  double best = 0;  // seconds per token of the chosen size
  bool met_any = false;
  for (int64_t c : in.grid.chunks) {
    const int64_t prompts = PromptsPerStep(in.mix.prompt_tokens, c);
    // The prompts of one step hold their KV together (beyond one prompt, which must fit anyway).
    const double kv = static_cast<double>(prompts * in.mix.prompt_tokens) * in.model.kv_bytes_per_token;
    if (prompts > 1 && kv > in.FreeBytes()) continue;
    const StepTime t = times.Prefill(in.mix.prompt_tokens, c);
    const double per_token = t.seconds / static_cast<double>(prompts * in.mix.prompt_tokens);
    const bool met = t.seconds <= in.mix.ttft_seconds;
    if (u.batch == 0 || (met && !met_any) || (met == met_any && per_token < best)) {
      u.batch = c;
      u.prompts = prompts;
      u.seconds = t.seconds;
      u.compute_bound = t.compute_bound;
      best = per_token;
      met_any = met_any || met;
    }
  }
  u.target_met = met_any;
  u.usd_per_million = PerMillion(in.machine, best, 1.0);
  return u;
}

// Holding a token's KV at a tier for its retention, plus moving it back once, against
// recomputing it at the input price.
TierPrice Tier(const PriceInputs& in, const std::string& name, double usd_per_gb_hour, double retention_s,
               double restore_bytes_per_s, double input_usd_per_million) {
  TierPrice t;
  t.tier = name;
  t.usd_per_gb_hour = usd_per_gb_hour;
  t.retention_seconds = retention_s;
  const double kvb = in.model.kv_bytes_per_token;
  const double hold_per_second = kvb / 1e9 * usd_per_gb_hour / 3600.0 * 1e6;  // $/M tokens per second held
  // Every device brings its share back over its own link, so the machine restores in parallel.
  t.restore_seconds_per_token =
      restore_bytes_per_s > 0 ? kvb / (restore_bytes_per_s * static_cast<double>(in.machine.devices)) : 0;
  t.hold_usd_per_million = hold_per_second * retention_s;
  t.restore_usd_per_million = PerMillion(in.machine, t.restore_seconds_per_token, 1.0);
  t.usd_per_million = t.hold_usd_per_million + t.restore_usd_per_million;
  t.discount = t.usd_per_million > 0 ? input_usd_per_million / t.usd_per_million : 0;
  t.break_even_retention_seconds =
      hold_per_second > 0 ? std::max(0.0, (input_usd_per_million - t.restore_usd_per_million) / hold_per_second) : 0;
  return t;
}

}  // namespace

absl::Status PriceInputs::Validate() const {
  if (machine.devices < 1) return absl::InvalidArgumentError("devices must be >= 1");
  if (!(machine.usd_per_device_hour > 0)) return absl::InvalidArgumentError("the price per device-hour must be > 0");
  if (!(machine.device_memory_bytes > 0)) return absl::InvalidArgumentError("the device memory must be > 0 bytes");
  if (!(machine.usd_per_gb_hour_ddr > 0) || !(machine.usd_per_gb_hour_flash > 0) ||
      machine.usd_per_gb_hour_device == 0) {
    return absl::InvalidArgumentError("a tier's $/GB-hour must be > 0 (holding bytes is never free)");
  }
  if (!(machine.host_link_bytes_per_s > 0) || !(machine.flash_read_bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        "the hardware profile needs host_link_bandwidth and disk_read_bandwidth > 0 to price KV brought back "
        "from DDR and flash (calibrate measures them unless --no-disk)");
  }
  if (!(model.kv_bytes_per_token > 0) || !(model.weight_bytes > 0)) {
    return absl::InvalidArgumentError("the model's weight and KV bytes must be > 0");
  }
  if (FreeBytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the weights (%.3g GB) do not fit %d device(s) of %.3g GB: spread them over more (--ep) or price a "
        "larger device (--hardware)",
        model.weight_bytes / 1e9, machine.devices, machine.device_memory_bytes / 1e9));
  }
  if (mix.prompt_tokens < 1 || mix.output_tokens < 1) {
    return absl::InvalidArgumentError("prompt and output tokens must be >= 1");
  }
  if (mix.cache_hit_rate < 0 || mix.cache_hit_rate > 1) {
    return absl::InvalidArgumentError(absl::StrCat("cache hit rate must be in [0, 1], got ", mix.cache_hit_rate));
  }
  if (!(mix.tpot_seconds > 0) || !(mix.ttft_seconds > 0)) return absl::InvalidArgumentError("targets must be > 0");
  if (model.max_context > 0 && mix.DecodeContext() > model.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + output / 2 = ", mix.DecodeContext(),
                                                   " tokens exceeds the model's context of ", model.max_context));
  }
  for (auto [v, name] : {std::pair{&grid.batches, "batches"}, {&grid.contexts, "contexts"}, {&grid.chunks, "chunks"}}) {
    if (absl::Status s = CheckList(*v, name); !s.ok()) return s;
  }
  if (std::find(grid.contexts.begin(), grid.contexts.end(), mix.DecodeContext()) == grid.contexts.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("contexts: must include the mix's decode context ", mix.DecodeContext()));
  }
  return absl::OkStatus();
}

int64_t LargestFittingBatch(const PriceInputs& in, int64_t context) {
  const double free_bytes = in.FreeBytes();
  int64_t best = 0;
  for (int64_t b : in.grid.batches) {
    if (static_cast<double>(b) * static_cast<double>(context) * in.model.kv_bytes_per_token <= free_bytes) best = b;
  }
  return best;
}

PriceSheet ComputePriceSheet(const PriceInputs& in, const StepTimes& times) {
  PriceSheet s;
  const int64_t ctx = in.mix.DecodeContext();
  s.output = OperatingDecode(in, times, ctx);
  s.input = InputPrice(in, times);
  s.output_over_input = s.output.usd_per_million / s.input.usd_per_million;

  const MachinePrices& m = in.machine;
  s.tiers.push_back(Tier(in, "device", m.DeviceTierUsdPerGbHour(), in.mix.retention_device_s, 0, s.input.usd_per_million));
  s.tiers.push_back(Tier(in, "ddr", m.usd_per_gb_hour_ddr, in.mix.retention_ddr_s, m.host_link_bytes_per_s,
                         s.input.usd_per_million));
  s.tiers.push_back(Tier(in, "flash", m.usd_per_gb_hour_flash, in.mix.retention_flash_s, m.flash_read_bytes_per_s,
                         s.input.usd_per_million));
  // A hit is served from the cheapest tier that still holds it at its retention.
  double cached = s.input.usd_per_million;
  for (const TierPrice& t : s.tiers) cached = std::min(cached, t.usd_per_million);
  const double p = static_cast<double>(in.mix.prompt_tokens), h = in.mix.cache_hit_rate;
  s.usd_per_request = (p * (1 - h) * s.input.usd_per_million + p * h * cached +
                       static_cast<double>(in.mix.output_tokens) * s.output.usd_per_million) / 1e6;

  // Price against context: the operating batch where it fits, fewer sequences where not.
  const double b_op = static_cast<double>(s.output.batch);
  s.kv_equals_weights_context = in.model.weight_bytes / (b_op * in.model.kv_bytes_per_token);
  s.batch_shrinks_context = in.FreeBytes() / (b_op * in.model.kv_bytes_per_token);
  for (int64_t c : in.grid.contexts) {
    const UnitPrice u = OperatingDecode(in, times, c);
    ContextPoint pt;
    pt.context = c;
    pt.batch = u.batch;
    pt.fits = u.kv_fits;
    pt.step_seconds = u.seconds;
    pt.usd_per_million_output = u.usd_per_million;
    pt.memory_limited = LargestFittingBatch(in, c) < s.output.batch;
    pt.kv_over_weight_bytes = static_cast<double>(u.batch) * static_cast<double>(c) * in.model.kv_bytes_per_token /
                              in.model.weight_bytes;
    s.context_curve.push_back(pt);
  }
  const double shortest = s.context_curve.front().usd_per_million_output;
  for (const ContextPoint& pt : s.context_curve) {
    if (pt.usd_per_million_output >= 2 * shortest) {
      s.doubling_context = pt.context;
      break;
    }
  }
  s.long_over_short = s.context_curve.back().usd_per_million_output / shortest;

  // Fast mode: smaller batches at the mix's context, against the operating batch.
  s.latency_floor_seconds = in.latency_floor_seconds;
  double fastest = s.output.seconds;
  for (int64_t b : in.grid.batches) {
    if (b > s.output.batch) break;
    FastPoint f;
    f.batch = b;
    f.step_seconds = times.Decode(b, ctx).seconds;
    f.price_multiple = PerMillion(m, f.step_seconds, static_cast<double>(b)) / s.output.usd_per_million;
    f.speed_multiple = s.output.seconds / f.step_seconds;
    fastest = std::min(fastest, f.step_seconds);
    s.fast_curve.push_back(f);
  }
  std::reverse(s.fast_curve.begin(), s.fast_curve.end());  // operating batch first
  for (FastPoint& f : s.fast_curve) {
    f.at_floor = f.step_seconds <= 1.05 * fastest;
    s.max_speed_multiple = std::max(s.max_speed_multiple, f.speed_multiple);
  }
  return s;
}

std::string ReadPriceSheet(const PriceSheet& s, const PriceInputs& in) {
  const TierPrice* best = &s.tiers.front();
  for (const TierPrice& t : s.tiers) {
    if (t.usd_per_million < best->usd_per_million) best = &t;
  }
  std::string text = absl::StrFormat(
      "Output tokens cost %.2fx input tokens: a decode step at the operating batch of %d (the largest that fits and "
      "meets the %.0f ms TPOT target%s; %s) is %s-bound and yields %d tokens, while a prefill step of %d tokens (%d prompts of "
      "%d) is %s-bound%s. ",
      s.output_over_input, s.output.batch, in.mix.tpot_seconds * 1e3,
      s.output.target_met ? "" : ", which no batch meets",
      s.output.limited_by == "tpot"     ? "a larger batch would miss it"
      : s.output.limited_by == "memory" ? "a larger batch's KV would not fit"
                                        : "the largest batch given: pass larger --batches",
      s.output.compute_bound ? "compute" : "memory",
      s.output.batch, s.input.batch, s.input.prompts, in.mix.prompt_tokens,
      s.input.compute_bound ? "compute" : "memory", s.input.target_met ? "" : " and misses the TTFT target");
  absl::StrAppendFormat(&text,
                        "A cache hit served from %s (held %.0f s) costs %.3g $/M against %.3g $/M to recompute (a "
                        "%.2fx discount); holding KV stops paying after %.0f s on the device, %.0f s in DDR and %.0f s "
                        "on flash. ",
                        best->tier, best->retention_seconds, best->usd_per_million, s.input.usd_per_million,
                        best->discount,
                        s.tiers[0].break_even_retention_seconds, s.tiers[1].break_even_retention_seconds,
                        s.tiers[2].break_even_retention_seconds);
  absl::StrAppendFormat(&text,
                        "At that batch KV reads equal weight reads at %.0f tokens of context and fill the memory "
                        "at %.0f; the price per output token is %.2fx as high at %d tokens as at %d",
                        s.kv_equals_weights_context, s.batch_shrinks_context, s.long_over_short,
                        s.context_curve.back().context, s.context_curve.front().context);
  if (s.doubling_context > 0) absl::StrAppendFormat(&text, " and first doubles at %d", s.doubling_context);
  absl::StrAppendFormat(&text,
                        ". Fast mode: a smaller batch buys at most %.2fx the speed per sequence (batch %d), at "
                        "%.1fx the price; below that the step cannot fall under the time to read the weights "
                        "a batch-1 step must read (%.3g ms).",
                        s.max_speed_multiple, s.fast_curve.empty() ? 0 : s.fast_curve.back().batch,
                        s.fast_curve.empty() ? 0.0 : s.fast_curve.back().price_multiple,
                        s.latency_floor_seconds * 1e3);
  return text;
}

}  // namespace moeserve::roofline
