// `moeserve bench`: offline throughput of the engine (no server) on a synthetic workload.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/summary.h"
#include "roofline/hardware.h"
#include "tools/bench_sweep.h"
#include "tools/bench_parallel.h"
#include "tools/bench_report.h"
#include "tools/bench_tiers.h"
#include "tools/calibrate/measure.h"
#include "engine/workload.h"
#include "tools/commands.h"
#include "tools/launch.h"
#include "tools/mpi_job.h"

namespace moeserve::tools {
namespace {

struct BenchOptions {
  ModelSpec model = DefaultModelSpec();
  std::string dtype;
  std::string load_format = "auto";
  EngineFlags engine;
  int64_t num_requests = 64;
  std::string prompt_len = "128";
  std::string output_len = "64";
  int64_t shared_prefix = 0;
  double rate = 0.0;
  uint64_t seed = 0;
  std::string out;
  // Decode sweep against the roofline.
  std::string sweep_batch;
  std::string context = "128,1024,4096";
  double sweep_max_kv_gb = 8;
  int sweep_steps = 3;
  // Long-prompt TTFT per KV tier.
  bool tier_scenario = false;
  int64_t tier_prompt = 4096;
};

int RunSweep(BenchOptions o) {
  auto batches = ParseIntList("--sweep-batch", o.sweep_batch);
  if (!batches.ok()) return Fail(batches.status());
  auto contexts = ParseIntList("--context", o.context);
  if (!contexts.ok()) return Fail(contexts.status());
  if (o.sweep_steps < 1) return Fail(absl::InvalidArgumentError("--sweep-steps must be >= 1"));
  if (!(o.sweep_max_kv_gb > 0)) return Fail(absl::InvalidArgumentError("--sweep-max-kv-gb must be > 0"));
  auto kv_dtype = DTypeFromShortName(o.engine.kv_dtype);
  if (!kv_dtype.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", kv_dtype.status().message())));
  auto backend_or = MakeBackend(o.engine);
  if (!backend_or.ok()) return Fail(backend_or.status());
  Backend& backend = **backend_or;
  roofline::HardwareProfile hw;
  if (o.engine.hardware.empty()) {
    std::fprintf(stderr, "bench: no --hardware given; calibrating this machine first (no disk)\n");
    calibrate::CalibrateSettings cs;
    cs.threads = o.engine.threads;
    cs.disk = false;
    auto c = calibrate::Calibrate(&backend, cs);
    if (!c.ok()) return Fail(c.status());
    hw = c->profile;
  } else {
    auto h = roofline::LoadHardware(o.engine.hardware);
    if (!h.ok()) return Fail(h.status());
    hw = *h;
  }
  std::fprintf(stderr, "loading %s on %s ...\n", DescribeModelSpec(o.model).c_str(), backend.Name().c_str());
  auto weights = LoadModel(o.model, &backend);
  if (!weights.ok()) return Fail(weights.status());
  SweepOptions so;
  so.batches = *batches;
  so.contexts = *contexts;
  so.block_size = o.engine.config.block_size;
  so.kv_dtype = *kv_dtype;
  so.min_steps = o.sweep_steps;
  so.max_kv_bytes = o.sweep_max_kv_gb * 1e9;
  auto report = RunDecodeSweep(**weights, &backend, hw, so);
  if (!report.ok()) return Fail(report.status());
  std::printf("decode sweep: %s on %s, roofline of %s\n", DescribeModelSpec(o.model).c_str(), backend.Name().c_str(),
              hw.name.c_str());
  PrintSweep(*report, hw);
  if (!o.out.empty()) {
    nlohmann::json j = SweepToJson(*report, hw);
    j["model"] = DescribeModelSpec(o.model);
    j["backend"] = backend.Name();
    j["total_params"] = (*weights)->config().TotalParams();
    j["active_params"] = (*weights)->config().ActiveParams();
    if (absl::Status s = WriteFileAtomically(o.out, j.dump(2) + "\n"); !s.ok()) return Fail(s);
    std::printf("  wrote %s\n", o.out.c_str());
  }
  return 0;
}

int RunTiers(BenchOptions o) {
  auto ecfg = MakeEngineConfig(o.engine);
  if (!ecfg.ok()) return Fail(ecfg.status());
  std::optional<roofline::HardwareProfile> hw;
  if (!o.engine.hardware.empty()) hw = *ecfg->hardware;
  auto loaded = LoadRank(o.engine, o.model, *ecfg, nullptr, "");
  if (!loaded.ok()) return Fail(loaded.status());
  Backend& backend = *loaded->backend;
  const std::unique_ptr<ModelWeights>& weights = loaded->weights;
  TierScenarioOptions to;
  to.prompt_tokens = o.tier_prompt;
  to.flash_dir = o.engine.flash_kv_dir;
  auto j = RunTierScenario(*ecfg, weights.get(), &backend, to, hw);
  if (!j.ok()) return Fail(j.status());
  (*j)["model"] = DescribeModelSpec(o.model);
  (*j)["backend"] = backend.Name();
  if (!o.out.empty()) {
    if (absl::Status s = WriteFileAtomically(o.out, j->dump(2) + "\n"); !s.ok()) return Fail(s);
    std::printf("  wrote %s\n", o.out.c_str());
  }
  return 0;
}

int RunBenchRank0(BenchOptions o, MpiJob* job);


int RunBench(BenchOptions o) {
  if (absl::Status s = FinishModelSpec(o.dtype, o.load_format, &o.model); !s.ok()) return Fail(s);
  if (absl::Status s = ResolveKvDtype(o.model, &o.engine.kv_dtype); !s.ok()) return Fail(s);
  // Under mpirun: rank 0 runs the benchmark, the other ranks run their shards (tools/mpi_job.h).
  auto job = MpiJob::Join(o.engine, o.model);
  if (!job.ok()) return Fail(job.status());
  if (!o.engine.expert_load_out.empty() && (o.tier_scenario || !o.sweep_batch.empty())) {
    return Fail(absl::InvalidArgumentError("--expert-load-out records a workload's routing: not with --tier-scenario or --sweep-batch"));
  }
  if (*job != nullptr && (o.tier_scenario || !o.sweep_batch.empty())) {
    return Fail(absl::InvalidArgumentError("--tier-scenario and --sweep-batch do not run under mpirun"));
  }
  if (*job != nullptr && (*job)->rank() != 0) return (*job)->RunWorker(o.engine, o.model);
  const int code = RunBenchRank0(std::move(o), job->get());
  if (code != 0 && *job != nullptr) (*job)->Abort(code);  // workers may wait for rank 0
  return code;
}

// The workload the flags describe, checked.
absl::StatusOr<WorkloadSpec> ParseWorkload(const BenchOptions& o) {
  WorkloadSpec w;
  w.num_requests = o.num_requests;
  if (o.num_requests < 1) return absl::InvalidArgumentError("--num-requests must be >= 1");
  ASSIGN_OR_RETURN(w.prompt_len, LengthDist::Parse("--prompt-len", o.prompt_len));
  ASSIGN_OR_RETURN(w.output_len, LengthDist::Parse("--output-len", o.output_len));
  if (o.rate < 0) return absl::InvalidArgumentError("--rate must be >= 0");
  if (o.shared_prefix < 0) return absl::InvalidArgumentError("--shared-prefix must be >= 0");
  w.shared_prefix_len = o.shared_prefix;
  w.rate = o.rate;
  w.seed = o.seed;
  w.vocab = 256;
  return w;
}

// Submits the requests at their arrival times and waits, with a progress line, until every one
// has ended. The run's time is taken when the last request ends (in its callback), not at the
// next redraw of the progress line.
BenchRun RunWorkload(Engine* engine, const std::vector<WorkloadItem>& items) {
  BenchRun run;
  run.requests.resize(items.size());
  std::mutex mu;
  std::condition_variable all_done;
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(items.size());
  Stopwatch wall;
  // The requests that arrive at once are queued before the engine starts (up to its waiting
  // queue's bound, which it must drain past), so its first steps see all of them: a
  // few-microsecond step would otherwise finish the first request before the submitting
  // thread reaches the last.
  bool started = false;
  const auto queue_bound = static_cast<size_t>(std::max<int64_t>(1, engine->config().scheduler.max_waiting));
  for (size_t i = 0; i < items.size(); ++i) {
    const double wait = items[i].arrival_seconds - wall.Seconds();
    if ((wait > 0 || i >= queue_bound) && !started) {
      engine->Start();
      started = true;
    }
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    GenerateRequest r;
    r.prompt = items[i].prompt;
    r.max_tokens = items[i].max_tokens;
    auto id = engine->Submit(r, [&, i](const RequestEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      run.requests[i] = {ev, true};
      if (++done == total) {
        run.elapsed = wall.Seconds();
        all_done.notify_all();
      }
    });
    if (!id.ok()) {
      std::fprintf(stderr, "request %zu refused: %s\n", i, std::string(id.status().message()).c_str());
      std::lock_guard<std::mutex> lock(mu);
      if (run.refused++ == 0) run.first_refusal = id.status();
      if (++done == total) run.elapsed = wall.Seconds();
    }
  }
  if (!started) engine->Start();
  Progress progress("bench", total, true);
  {
    std::unique_lock<std::mutex> lock(mu);
    while (done < total) {
      progress.Update(done, "requests");
      all_done.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  progress.Finish(total, "requests");
  engine->Stop();
  return run;
}

int RunBenchRank0(BenchOptions o, MpiJob* job) {
  if (o.tier_scenario) return RunTiers(std::move(o));
  if (!o.sweep_batch.empty()) return RunSweep(std::move(o));
  auto ecfg = MakeEngineConfig(o.engine);
  if (!ecfg.ok()) return Fail(ecfg.status());
  ecfg->step_history = 1 << 22;
  auto w = ParseWorkload(o);
  if (!w.ok()) return Fail(w.status());
  ecfg->limits.max_tokens = std::max<int64_t>(ecfg->limits.max_tokens, w->output_len.Max());
  auto launched = LaunchEngine(o.engine, o.model, *std::move(ecfg), job, "");
  if (!launched.ok()) return Fail(launched.status());
  Engine* engine = (*launched)->engine.get();
  const BenchRun run = RunWorkload(engine, MakeWorkload(*w));
  if (absl::Status failed = engine->failure(); !failed.ok()) return Fail(failed);
  // A benchmark of nothing is an error for the scripts that run it, not a report (or --out file)
  // of zeros; it keeps the refusal's own code (a bad prompt, a full queue).
  if (run.refused > 0 && run.refused == static_cast<int64_t>(run.requests.size())) {
    return Fail(absl::Status(run.first_refusal.code(), absl::StrCat("every request was refused (", run.refused,
                                                                    "), the first: ", run.first_refusal.message())));
  }
  if (absl::Status s = WriteExpertLoadOut(o.engine, *engine, o.model); !s.ok()) return Fail(s);
  const nlohmann::json workload = {{"num_requests", o.num_requests}, {"prompt_len", w->prompt_len.ToString()},
                                   {"output_len", w->output_len.ToString()}, {"shared_prefix", o.shared_prefix},
                                   {"rate", o.rate}, {"seed", o.seed}};
  const nlohmann::json j = BenchReportJson(run, engine->GetStats(), *engine, (*launched)->config,
                                           *(*launched)->rank.weights, DescribeModelSpec(o.model),
                                           (*launched)->rank.backend->Name(), workload);
  PrintBenchReport(j);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << j.dump(2) << "\n";
    if (!f) return Fail(absl::InternalError(absl::StrCat("--out: cannot write ", o.out)));
    std::printf("  wrote %s\n", o.out.c_str());
  }
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Offline engine benchmark: N synthetic requests through continuous batching, no server");
  AddModelFlags(cmd, &o->model, &o->dtype, &o->load_format);
  AddEngineFlags(cmd, &o->engine);
  cmd->add_option("--num-requests", o->num_requests, "Requests to run")->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt length: N, MIN:MAX (uniform) or normal:MEAN:STD")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Output length (max_tokens): N, MIN:MAX or normal:MEAN:STD")
      ->capture_default_str();
  cmd->add_option("--shared-prefix", o->shared_prefix, "Tokens of a prefix shared by every prompt (prefix caching)")
      ->capture_default_str();
  cmd->add_option("--rate", o->rate, "Arrival rate in requests/s (Poisson); 0 submits all at once")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Workload seed")->capture_default_str();
  cmd->add_option("--out", o->out, "Write the report as JSON to this file");
  cmd->add_option("--sweep-batch", o->sweep_batch,
                  "Decode sweep instead of a workload: comma-separated batch sizes, each held fixed while the "
                  "step time is measured against the roofline (e.g. 1,2,4,8,16,32,64,128,256)");
  cmd->add_option("--context", o->context, "Sweep: comma-separated context lengths")->capture_default_str();
  cmd->add_option("--sweep-max-kv-gb", o->sweep_max_kv_gb, "Sweep: skip points whose KV exceeds this many GB")
      ->capture_default_str();
  cmd->add_flag("--tier-scenario", o->tier_scenario,
                "Instead of a workload: TTFT of one long prompt computed, hit on the device, brought back from "
                "DDR and from flash, with measured copy bandwidths (uses --flash-kv-dir if given)");
  cmd->add_option("--tier-prompt", o->tier_prompt, "Tier scenario: prompt length in tokens")->capture_default_str();
  cmd->add_option("--sweep-steps", o->sweep_steps, "Sweep: measured decode steps per point (after a warm-up)")
      ->capture_default_str();
  cmd->callback([o, exit_code] { *exit_code = RunBench(*o); });
}

}  // namespace moeserve::tools
