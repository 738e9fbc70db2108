// The layout explorer's measurements (see explore_measure.h).
#include "tools/explore_measure.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "tools/launch.h"
#include "tools/mpirun_self.h"

namespace moeserve::tools {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// How long each sequence runs: until the last prompt is prefilled and `steps` more steps have
// run with all of them (the prefill takes about this many steps of the default token budget);
// and the KV blocks that holds.
struct RunPlan {
  int64_t max_tokens = 0, kv_blocks = 0;
};
absl::StatusOr<RunPlan> PlanRun(const MeasureOptions& o, const roofline::ParallelLayout& layout, int64_t sequences) {
  const int64_t budget = SchedulerConfig().max_tokens_per_step;
  const int64_t prefill_steps = (sequences * o.context + budget - 1) / budget + 1;
  RunPlan p;
  p.max_tokens = o.steps + prefill_steps + 1;
  ASSIGN_OR_RETURN(const ModelConfig model, LoadModelConfig(o.model));
  if (o.context + p.max_tokens > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", o.context, " and ", p.max_tokens,
                                                   " tokens to decode (", sequences, " sequences prefilled ", budget,
                                                   " tokens a step, then --measure-steps) exceed the model's context of ",
                                                   model.max_position_embeddings));
  }
  const int64_t blocks_per_seq = (o.context + p.max_tokens + 16) / 16 + 1;
  p.kv_blocks = sequences * blocks_per_seq + 2 * layout.ep * blocks_per_seq;
  return p;
}

// The threads the measuring process splits over a layout's ranks.
int64_t MachineThreads(const MeasureOptions& o) { return o.threads > 0 ? o.threads : UsableCpus(); }

// The medians of the decode steps that ran all `sequences` (no prefill), as a point.
struct DecodeSteps {
  std::vector<double> observed, predicted, comm, comm_min, comm_after_last, predicted_comm;
};
absl::StatusOr<MeasuredPoint> ToPoint(const roofline::ParallelLayout& layout, int64_t sequences, const DecodeSteps& d) {
  if (d.observed.empty()) {
    return absl::InternalError(absl::StrCat("ep", layout.ep, " pp", layout.pp, ", ", sequences,
                                            " sequences: no decode step of all of them was seen"));
  }
  MeasuredPoint p;
  p.ep = layout.ep;
  p.pp = layout.pp;
  p.domain_size = layout.domain_size;
  p.sequences = sequences;
  p.measured_step_seconds = Median(d.observed);
  p.predicted_step_seconds = Median(d.predicted);
  p.measured_tokens_per_second = static_cast<double>(sequences) / p.measured_step_seconds;
  p.predicted_tokens_per_second =
      p.predicted_step_seconds > 0 ? static_cast<double>(sequences) / p.predicted_step_seconds : 0;
  p.error = p.predicted_step_seconds > 0 ? p.measured_step_seconds / p.predicted_step_seconds - 1 : 0;
  p.measured_comm_us_per_token = 1e6 * Median(d.comm) / static_cast<double>(sequences);
  p.measured_comm_min_us_per_token = 1e6 * Median(d.comm_min) / static_cast<double>(sequences);
  p.measured_comm_after_last_us_per_token = 1e6 * Median(d.comm_after_last) / static_cast<double>(sequences);
  p.predicted_comm_us_per_token = 1e6 * Median(d.predicted_comm) / static_cast<double>(sequences);
  p.cpus = UsableCpus();
  return p;
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
  f.hardware = o.hardware_path;  // for the calibration's efficiencies; the rank's share replaces it below
  f.calibration = o.calibration;
  ASSIGN_OR_RETURN(const RunPlan plan, PlanRun(o, layout, sequences));
  const int64_t max_tokens = plan.max_tokens;
  f.config.num_kv_blocks = plan.kv_blocks;
  ASSIGN_OR_RETURN(EngineConfig config, MakeEngineConfig(f));
  config.hardware = RankShare(o.hw, ranks, /*threads=*/true, MachineThreads(o));
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
  DecodeSteps d;
  for (const StepRecord& s : engine.GetStats().recent_steps) {
    if (s.prefill_tokens != 0 || s.num_seqs != sequences) continue;
    d.observed.push_back(s.duration_seconds);
    d.predicted.push_back(s.predicted_seconds);
    d.comm.push_back(s.comm_seconds);
    d.comm_min.push_back(s.comm_min_seconds);
    d.comm_after_last.push_back(s.comm_after_last_seconds);
    d.predicted_comm.push_back(s.predicted_comm_seconds);
  }
  ASSIGN_OR_RETURN(MeasuredPoint p, ToPoint(layout, sequences, d));
  p.domain_size = 0;  // threads of one process: one domain, whatever the layout's
  return p;
}

#if MOESERVE_HAVE_MPI
// The same point as an MPI job of one process per rank on this machine: `moeserve bench` under
// mpirun with the same workload, predicting with the rank's share of the machine, its steps
// read back from its --trace-jsonl.
absl::StatusOr<MeasuredPoint> MeasurePointInProcesses(const MeasureOptions& o, const roofline::ParallelLayout& layout,
                                                      int64_t sequences) {
  ASSIGN_OR_RETURN(const RunPlan plan, PlanRun(o, layout, sequences));
  char dir_template[] = "/tmp/moeserve-explore-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("explore: cannot make a temporary directory");
  const std::string dir = dir_template, hw = dir + "/hw.json", steps = dir + "/steps.jsonl";
  const int64_t machine_threads = MachineThreads(o);
  RETURN_IF_ERROR(WriteFileAtomically(hw, RankShare(o.hw, layout.devices(), /*threads=*/false, machine_threads).ToJson()));
  const std::string model = o.model.model_dir.empty() ? absl::StrCat(" --preset ", o.model.preset)
                                                      : absl::StrCat(" --model '", o.model.model_dir, "'");
  // Each process its share of this machine's cores, as the prediction gives it its share: a
  // process rank otherwise takes all of --threads, and the ranks' thread pools would contend.
  const int64_t threads = std::max<int64_t>(1, machine_threads / layout.devices());
  const std::string args = absl::StrCat(
      "bench", model, " --ep ", layout.ep, " --pp ", layout.pp, " --num-requests ", sequences, " --prompt-len ",
      o.context, " --output-len ", plan.max_tokens, " --max-num-seqs ", sequences, " --kv-blocks ", plan.kv_blocks,
      " --kv-dtype ", o.kv_dtype, " --threads ", threads, " --hardware '", hw, "' --trace-jsonl '", steps, "'",
      o.calibration.empty() ? "" : absl::StrCat(" --calibration '", o.calibration, "'"),
      // Across hosts (a hostfile), the layout's EP domains are the profile's scale-up size (one
      // domain of all the ranks where it has none), given explicitly: the job would otherwise
      // take its domains from the ranks' hosts. On one host, all over shared memory.
      !o.mpirun_args.empty()
          ? absl::StrCat(" --domain-size ", layout.domain_size > 0 ? layout.domain_size : layout.devices())
          : "");
  const absl::StatusOr<MpirunOutput> run = RunSelfUnderMpirun(static_cast<int>(layout.devices()), o.mpirun_args, args);
  const absl::StatusOr<std::string> text = ReadFileToString(steps);
  std::filesystem::remove_all(dir);
  RETURN_IF_ERROR(run.status());
  if (run->status != 0 || !text.ok()) {
    return absl::UnavailableError(
        absl::StrCat("explore: bench under mpirun (", args, ") failed (status ", run->status, "): ", run->output));
  }
  DecodeSteps d;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    const nlohmann::json s = nlohmann::json::parse(line, nullptr, false);
    if (s.is_discarded() || s.value("prefill_tokens", -1) != 0 || s.value("num_seqs", -1) != sequences) continue;
    d.observed.push_back(s["duration_s"].get<double>());
    d.predicted.push_back(s["predicted_s"]["total"].get<double>());
    d.comm.push_back(s["observed_s"]["comm"].get<double>());
    d.comm_min.push_back(s["observed_s"]["comm_min"].get<double>());
    d.comm_after_last.push_back(s["observed_s"]["comm_after_last"].get<double>());
    d.predicted_comm.push_back(s["predicted_s"]["comm"].get<double>());
  }
  ASSIGN_OR_RETURN(MeasuredPoint p, ToPoint(layout, sequences, d));
  p.processes = true;
  if (o.mpirun_args.empty()) p.domain_size = 0;  // one host: its ranks' domain
  // Rank 0's warning that ranks time-share cores (e.g. a namespace per host without --bind-to
  // none), said here too: the bench output is not shown.
  for (absl::string_view line : absl::StrSplit(run->output, '\n')) {
    if (!absl::StrContains(line, "time-share those cores")) continue;
    p.core_sharing = std::string(line);
    std::fprintf(stderr, "explore: ep %lld pp %lld: %s\n", static_cast<long long>(layout.ep),
                 static_cast<long long>(layout.pp), p.core_sharing.c_str());
    break;
  }
  return p;
}
#endif

}  // namespace

roofline::HardwareProfile RankShare(const roofline::HardwareProfile& hw, int64_t ranks, bool threads,
                                    int64_t machine_threads) {
  roofline::HardwareProfile r = hw;
  const double share = 1.0 / static_cast<double>(std::max<int64_t>(ranks, 1));
  r.ranks_sharing_memory = std::max<int64_t>(ranks, 1);
  r.solo_mem_bandwidth = hw.MemBandwidthAtThreads(std::max<int64_t>(1, machine_threads / r.ranks_sharing_memory));
  r.peak_flops_bf16 *= share;
  r.peak_flops_f32 *= share;
  r.peak_flops_attention *= share;
  r.mem_bandwidth *= share;
  r.llc_bandwidth *= share;
  r.llc_bytes *= share;
  // Thread ranks exchange through memory, at what calibrate measured between threads; without
  // that, the share of the memory bandwidth stands for the link (and no latency is priced).
  if (threads && hw.thread_interconnect_bandwidth > 0) {
    r.interconnect_bandwidth = hw.thread_interconnect_bandwidth;
    r.interconnect_latency = hw.thread_interconnect_latency;
  }
  if (threads) roofline::UseThreadRankExchanges(&r);
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
#if !MOESERVE_HAVE_MPI
  if (o.processes) return absl::FailedPreconditionError("--measure-processes needs a moeserve built with MPI");
#endif
  std::vector<MeasuredPoint> out;
  Progress progress("explore --measure", static_cast<int64_t>(todo.size()), o.progress);
  for (size_t i = 0; i < todo.size(); ++i) {
    const auto& [layout, n] = todo[i];
    progress.Update(static_cast<int64_t>(i), absl::StrCat("ep", layout.ep, " pp", layout.pp, " x ", n, " sequences"));
    // Threads (and processes on this one host) run the same whatever the domain size: once per
    // (ep, pp, sequences). Across hosts each domain size is its own job (--domain-size).
    const bool first = std::none_of(todo.begin(), todo.begin() + static_cast<std::ptrdiff_t>(i), [&](const auto& t) {
      return t.first.ep == layout.ep && t.first.pp == layout.pp && t.second == n;
    });
    std::vector<absl::StatusOr<MeasuredPoint>> runs;
    if (first) runs.push_back(MeasurePoint(o, layout, n));
#if MOESERVE_HAVE_MPI
    if (o.processes && layout.devices() > 1 && (first || !o.mpirun_args.empty())) {
      runs.push_back(MeasurePointInProcesses(o, layout, n));
    }
#endif
    for (absl::StatusOr<MeasuredPoint>& p : runs) {
      if (!p.ok() && p.status().code() == absl::StatusCode::kInvalidArgument) return p.status();
      if (!p.ok()) {  // this point only: say so and go on with the others
        std::fprintf(stderr, "explore: ep%lld pp%lld, %lld sequences not measured: %s\n",
                     static_cast<long long>(layout.ep), static_cast<long long>(layout.pp), static_cast<long long>(n),
                     std::string(p.status().message()).c_str());
        continue;
      }
      out.push_back(*p);
    }
  }
  progress.Finish(static_cast<int64_t>(todo.size()), "done");
  return out;
}

}  // namespace moeserve::tools
