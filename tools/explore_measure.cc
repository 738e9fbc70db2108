// The layout explorer's measurements (see explore_measure.h).
#include "tools/explore_measure.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/progress.h"
#include "core/status.h"
#include "tools/launch.h"

namespace moeserve::tools {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One layout at one sequences count: a fresh engine, the prompts prefilled, the decode steps of
// all the sequences timed and predicted.
absl::StatusOr<MeasuredPoint> MeasurePoint(const MeasureOptions& o, const roofline::ParallelLayout& layout,
                                           int64_t sequences) {
  const int64_t ranks = layout.devices();
  EngineFlags f;
  f.threads = o.threads;
  f.kv_dtype = o.kv_dtype;
  f.config.parallel.ep = layout.ep;
  f.config.parallel.pp = layout.pp;
  f.config.block_size = 16;
  f.config.scheduler.max_num_seqs = std::max<int64_t>(sequences, 1);
  f.config.step_history = 1 << 14;
  // Every sequence keeps decoding until the last prompt is prefilled and `steps` more steps
  // have run with all of them: the prefill takes about this many steps of the token budget.
  const int64_t budget = f.config.scheduler.max_tokens_per_step;
  const int64_t prefill_steps = (sequences * o.context + budget - 1) / budget + 1;
  const int64_t max_tokens = o.steps + prefill_steps + 1;
  ASSIGN_OR_RETURN(const ModelConfig model, LoadModelConfig(o.model));
  if (o.context + max_tokens > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", o.context, " and ", max_tokens,
                                                   " tokens to decode (", sequences, " sequences prefilled ", budget,
                                                   " tokens a step, then --measure-steps) exceed the model's context of ",
                                                   model.max_position_embeddings));
  }
  const int64_t blocks_per_seq = (o.context + max_tokens + 16) / 16 + 1;
  f.config.num_kv_blocks = sequences * blocks_per_seq + 2 * layout.ep * blocks_per_seq;
  ASSIGN_OR_RETURN(EngineConfig config, MakeEngineConfig(f));
  config.hardware = RankShare(o.hw, ranks);
  ASSIGN_OR_RETURN(std::unique_ptr<Launched> run, LaunchEngine(f, o.model, config, nullptr, "explore: "));
  Engine& engine = *run->engine;
  const ModelConfig& c = engine.model_config();
  std::mt19937 gen(static_cast<uint32_t>(sequences * 131 + ranks));
  const int32_t vocab = static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 256));
  for (int64_t i = 0; i < sequences; ++i) {
    GenerateRequest r;
    for (int64_t t = 0; t < o.context; ++t) r.prompt.push_back(static_cast<int32_t>(gen() % vocab));
    r.max_tokens = static_cast<int32_t>(max_tokens);
    RETURN_IF_ERROR(engine.Submit(std::move(r), [](const RequestEvent&) {}).status());
  }
  RETURN_IF_ERROR(engine.RunUntilIdle());
  std::vector<double> observed, predicted, comm, predicted_comm;
  for (const StepRecord& s : engine.GetStats().recent_steps) {
    if (s.prefill_tokens != 0 || s.num_seqs != sequences) continue;
    observed.push_back(s.duration_seconds);
    predicted.push_back(s.predicted_seconds);
    comm.push_back(s.comm_seconds);
    predicted_comm.push_back(s.predicted_comm_seconds);
  }
  if (observed.empty()) {
    return absl::InternalError(absl::StrCat("ep", layout.ep, " pp", layout.pp, ", ", sequences,
                                            " sequences: no decode step of all of them was seen"));
  }
  MeasuredPoint p;
  p.ep = layout.ep;
  p.pp = layout.pp;
  p.sequences = sequences;
  p.measured_step_seconds = Median(observed);
  p.predicted_step_seconds = Median(predicted);
  p.measured_tokens_per_second = static_cast<double>(sequences) / p.measured_step_seconds;
  p.predicted_tokens_per_second =
      p.predicted_step_seconds > 0 ? static_cast<double>(sequences) / p.predicted_step_seconds : 0;
  p.error = p.predicted_step_seconds > 0 ? p.measured_step_seconds / p.predicted_step_seconds - 1 : 0;
  p.measured_comm_us_per_token = 1e6 * Median(comm) / static_cast<double>(sequences);
  p.predicted_comm_us_per_token = 1e6 * Median(predicted_comm) / static_cast<double>(sequences);
  return p;
}

}  // namespace

roofline::HardwareProfile RankShare(const roofline::HardwareProfile& hw, int64_t ranks) {
  roofline::HardwareProfile r = hw;
  const double share = 1.0 / static_cast<double>(std::max<int64_t>(ranks, 1));
  r.peak_flops_bf16 *= share;
  r.peak_flops_f32 *= share;
  r.peak_flops_attention *= share;
  r.mem_bandwidth *= share;
  r.llc_bandwidth *= share;
  r.llc_bytes *= share;
  // Thread ranks exchange through memory: without a measured scale-up link, its share of the
  // memory bandwidth stands for one.
  if (r.interconnect_bandwidth <= 0) r.interconnect_bandwidth = r.mem_bandwidth;
  r.name = ranks > 1 ? absl::StrCat(hw.name, " / ", ranks, " ranks") : hw.name;
  return r;
}

absl::StatusOr<std::vector<MeasuredPoint>> MeasureLayouts(const MeasureOptions& o,
                                                          const std::vector<roofline::LayoutCandidate>& candidates) {
  if (o.context < 1 || o.steps < 2) return absl::InvalidArgumentError("--measure needs --context >= 1 and --measure-steps >= 2");
  std::vector<std::pair<roofline::ParallelLayout, int64_t>> todo;
  for (const auto& c : candidates) {
    if (c.layout.devices() > o.max_ranks) continue;
    for (const auto& p : c.points) {
      if (p.fits && p.sequences <= o.max_sequences) todo.emplace_back(c.layout, p.sequences);
    }
  }
  std::vector<MeasuredPoint> out;
  Progress progress("explore --measure", static_cast<int64_t>(todo.size()), o.progress);
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto& [layout, n] = todo[i];
    progress.Update(static_cast<int64_t>(i), absl::StrCat("ep", layout.ep, " pp", layout.pp, " x ", n, " sequences"));
    absl::StatusOr<MeasuredPoint> p = MeasurePoint(o, layout, n);
    if (!p.ok() && p.status().code() == absl::StatusCode::kInvalidArgument) return p.status();
    if (!p.ok()) {  // this point only: say so and go on with the others
      std::fprintf(stderr, "explore: ep%lld pp%lld, %lld sequences not measured: %s\n", static_cast<long long>(layout.ep),
                   static_cast<long long>(layout.pp), static_cast<long long>(n), std::string(p.status().message()).c_str());
      continue;
    }
    out.push_back(*p);
  }
  progress.Finish(static_cast<int64_t>(todo.size()), "done");
  return out;
}

}  // namespace moeserve::tools
