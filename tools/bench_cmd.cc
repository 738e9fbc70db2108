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
#include "core/summary.h"
#include "roofline/hardware.h"
#include "tools/bench_sweep.h"
#include "tools/bench_parallel.h"
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
  // Under mpirun: rank 0 runs the benchmark, the other ranks run their shards (tools/mpi_job.h).
  auto job = MpiJob::Join(o.engine, o.model);
  if (!job.ok()) return Fail(job.status());
  if (*job != nullptr && (o.tier_scenario || !o.sweep_batch.empty())) {
    return Fail(absl::InvalidArgumentError("--tier-scenario and --sweep-batch do not run under mpirun"));
  }
  if (*job != nullptr && (*job)->rank() != 0) return (*job)->RunWorker(o.engine, o.model);
  const int code = RunBenchRank0(std::move(o), job->get());
  if (code != 0 && *job != nullptr) (*job)->Abort(code);  // workers may wait for rank 0
  return code;
}

int RunBenchRank0(BenchOptions o, MpiJob* job) {
  if (o.tier_scenario) return RunTiers(std::move(o));
  if (!o.sweep_batch.empty()) return RunSweep(std::move(o));
  auto ecfg = MakeEngineConfig(o.engine);
  if (!ecfg.ok()) return Fail(ecfg.status());
  ecfg->step_history = 1 << 22;
  WorkloadSpec w;
  w.num_requests = o.num_requests;
  if (o.num_requests < 1) return Fail(absl::InvalidArgumentError("--num-requests must be >= 1"));
  auto pl = LengthDist::Parse("--prompt-len", o.prompt_len);
  if (!pl.ok()) return Fail(pl.status());
  auto ol = LengthDist::Parse("--output-len", o.output_len);
  if (!ol.ok()) return Fail(ol.status());
  if (o.rate < 0) return Fail(absl::InvalidArgumentError("--rate must be >= 0"));
  if (o.shared_prefix < 0) return Fail(absl::InvalidArgumentError("--shared-prefix must be >= 0"));
  w.prompt_len = *pl;
  w.output_len = *ol;
  w.shared_prefix_len = o.shared_prefix;
  w.rate = o.rate;
  w.seed = o.seed;
  ecfg->limits.max_tokens = std::max<int64_t>(ecfg->limits.max_tokens, ol->Max());

  auto launched = LaunchEngine(o.engine, o.model, *std::move(ecfg), job, "");
  if (!launched.ok()) return Fail(launched.status());
  Backend& backend = *(*launched)->rank.backend;
  const ModelWeights* weights = (*launched)->rank.weights.get();
  Engine* engine = (*launched)->engine.get();
  const EngineConfig* config = &(*launched)->config;
  const ModelConfig& c = weights->config();
  w.vocab = 256;
  auto items = MakeWorkload(w);

  struct Result {
    RequestEvent final_event;
    bool done = false;
  };
  std::mutex mu;
  std::condition_variable all_done;
  std::vector<Result> results(items.size());
  int64_t done = 0, failed_submit = 0;
  double elapsed = 0;  // the run itself: from the start to the last request's end
  Stopwatch wall;
  engine->Start();
  for (size_t i = 0; i < items.size(); ++i) {
    const double wait = items[i].arrival_seconds - wall.Seconds();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    GenerateRequest r;
    r.prompt = items[i].prompt;
    r.max_tokens = items[i].max_tokens;
    auto id = engine->Submit(r, [&, i](const RequestEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      results[i].final_event = ev;
      results[i].done = true;
      if (++done == static_cast<int64_t>(results.size())) {
        elapsed = wall.Seconds();
        all_done.notify_all();
      }
    });
    if (!id.ok()) {
      std::fprintf(stderr, "request %zu refused: %s\n", i, std::string(id.status().message()).c_str());
      std::lock_guard<std::mutex> lock(mu);
      ++failed_submit;
      if (++done == static_cast<int64_t>(results.size())) elapsed = wall.Seconds();
    }
  }
  // Progress until every request has finished.
  Progress progress("bench", static_cast<int64_t>(items.size()), true);
  {
    // The progress line is redrawn every 100 ms; the run's time is taken when the last request
    // ends (in its callback), not at the next redraw.
    std::unique_lock<std::mutex> lock(mu);
    while (done < static_cast<int64_t>(items.size())) {
      progress.Update(done, "requests");
      all_done.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  progress.Finish(static_cast<int64_t>(items.size()), "requests");
  engine->Stop();
  if (absl::Status failed = engine->failure(); !failed.ok()) return Fail(failed);
  const EngineStats stats = engine->GetStats();

  int64_t prompt_tokens = 0, cached = 0, generated = 0;
  std::vector<double> ttft, tpot, e2e;
  for (const auto& r : results) {
    if (!r.done) continue;
    prompt_tokens += r.final_event.usage.prompt_tokens;
    cached += r.final_event.usage.cached_prompt_tokens;
    generated += r.final_event.usage.completion_tokens;
    ttft.push_back(r.final_event.timing.ttft_seconds * 1e3);
    tpot.push_back(r.final_event.timing.tpot_seconds * 1e3);
    e2e.push_back(r.final_event.timing.e2e_seconds * 1e3);
  }
  std::vector<double> step_ms, batch;
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tok = 0, decode_tok = 0;
  for (const auto& s : stats.recent_steps) {
    step_ms.push_back(s.duration_seconds * 1e3);
    batch.push_back(static_cast<double>(s.num_seqs));
    // Attribute each step's time to prefill and decode in proportion to their tokens.
    const double frac = s.num_tokens ? static_cast<double>(s.prefill_tokens) / s.num_tokens : 0.0;
    prefill_s += s.duration_seconds * frac;
    decode_s += s.duration_seconds * (1 - frac);
    prefill_tok += s.prefill_tokens;
    decode_tok += s.decode_tokens;
  }
  double mean_batch = 0;
  for (double b : batch) mean_batch += b;
  mean_batch = batch.empty() ? 0 : mean_batch / batch.size();

  nlohmann::json j;
  j["model"] = DescribeModelSpec(o.model);
  j["backend"] = backend.Name();
  j["total_params"] = c.TotalParams();
  j["active_params"] = c.ActiveParams();
  j["workload"] = {{"num_requests", o.num_requests}, {"prompt_len", pl->ToString()},
                   {"output_len", ol->ToString()}, {"shared_prefix", o.shared_prefix},
                   {"rate", o.rate}, {"seed", o.seed}};
  j["engine"] = {{"max_num_seqs", config->scheduler.max_num_seqs},
                 {"max_tokens_per_step", config->scheduler.max_tokens_per_step},
                 {"chunked_prefill", config->scheduler.chunked_prefill},
                 {"prefix_caching", config->scheduler.prefix_caching},
                 {"block_size", config->block_size},
                 {"kv_blocks", engine->num_kv_blocks()}};
  j["elapsed_seconds"] = elapsed;
  j["requests_ok"] = static_cast<int64_t>(ttft.size());
  j["requests_refused"] = failed_submit;
  j["prompt_tokens"] = prompt_tokens;
  j["generated_tokens"] = generated;
  j["throughput"] = {{"requests_per_s", ttft.size() / elapsed},
                     {"total_tokens_per_s", (prompt_tokens - cached + generated) / elapsed},
                     {"output_tokens_per_s", generated / elapsed},
                     {"prefill_tokens_per_s", prefill_s > 0 ? prefill_tok / prefill_s : 0.0},
                     {"decode_tokens_per_s", decode_s > 0 ? decode_tok / decode_s : 0.0}};
  j["batch_size"] = {{"mean", mean_batch}, {"max", batch.empty() ? 0.0 : *std::max_element(batch.begin(), batch.end())}};
  j["step_ms"] = {{"count", step_ms.size()}, {"p50", Percentile(step_ms, 50)}, {"p90", Percentile(step_ms, 90)},
                  {"p99", Percentile(step_ms, 99)}, {"max", Percentile(step_ms, 100)}};
  j["ttft_ms"] = {{"p50", Percentile(ttft, 50)}, {"p90", Percentile(ttft, 90)}, {"p99", Percentile(ttft, 99)}};
  j["tpot_ms"] = {{"p50", Percentile(tpot, 50)}, {"p90", Percentile(tpot, 90)}, {"p99", Percentile(tpot, 99)}};
  j["prefix_cache"] = {{"cached_prompt_tokens", cached},
                       {"hit_rate", prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0.0}};
  j["preemptions"] = stats.preemptions;
  j["swaps"] = stats.swaps;
  {
    double seq_tokens = 0;
    for (const auto& r : results) {
      if (r.done) seq_tokens += r.final_event.usage.prompt_tokens + r.final_event.usage.completion_tokens;
    }
    seq_tokens /= std::max<double>(1.0, static_cast<double>(ttft.size()));
    j["parallel"] = ParallelReport(*engine, weights->dtype(), stats.recent_steps, seq_tokens, elapsed,
                                   config->hardware);
  }
  if (stats.has_tiers) {
    const KvTierStats& t = stats.tiers;
    j["swap"] = {{"swapped_out", t.swapped_out},
                 {"swapped_in", t.swapped_in},
                 {"swap_decisions", t.swap_decisions},
                 {"recompute_decisions", t.recompute_decisions},
                 {"out_bytes_per_s", t.swap_out_seconds > 0 ? t.swap_out_blocks * t.block_bytes / t.swap_out_seconds : 0.0},
                 {"in_bytes_per_s", t.swap_in_seconds > 0 ? t.swap_in_blocks * t.block_bytes / t.swap_in_seconds : 0.0}};
  }
  // Observed against predicted, step by step, when a hardware profile was given.
  std::vector<double> ratio, bound_ratio;
  for (const auto& s : stats.recent_steps) {
    if (s.predicted_seconds > 0) ratio.push_back(s.duration_seconds / s.predicted_seconds);
    if (s.predicted_bound_seconds > 0) bound_ratio.push_back(s.duration_seconds / s.predicted_bound_seconds);
  }
  const Summary ratio_summary = Summarize(ratio), bound_summary = Summarize(bound_ratio);
  if (!ratio.empty()) {
    const Summary& r = ratio_summary;
    const Summary& b = bound_summary;
    j["observed_over_predicted"] = {{"median", r.median}, {"p90", r.p90}, {"min", r.min}, {"max", r.max}};
    j["observed_over_bound"] = {{"median", b.median}, {"min", b.min}, {"max", b.max}};
  }

  std::printf("bench: %zu requests in %.2f s on %s\n", ttft.size(), elapsed, backend.Name().c_str());
  std::printf("  throughput: %.2f req/s, %.1f total tok/s, %.1f output tok/s\n", ttft.size() / elapsed,
              (prompt_tokens - cached + generated) / elapsed, generated / elapsed);
  std::printf("  prefill %.1f tok/s, decode %.1f tok/s (step time shared by token kind)\n",
              j["throughput"]["prefill_tokens_per_s"].get<double>(), j["throughput"]["decode_tokens_per_s"].get<double>());
  std::printf("  batch size: mean %.2f, max %.0f over %zu steps\n", mean_batch, j["batch_size"]["max"].get<double>(),
              step_ms.size());
  std::printf("  step ms: p50 %.2f, p90 %.2f, p99 %.2f, max %.2f\n", Percentile(step_ms, 50),
              Percentile(step_ms, 90), Percentile(step_ms, 99), Percentile(step_ms, 100));
  std::printf("  ttft ms: p50 %.1f, p99 %.1f | tpot ms: p50 %.2f, p99 %.2f\n", Percentile(ttft, 50),
              Percentile(ttft, 99), Percentile(tpot, 50), Percentile(tpot, 99));
  std::printf("  prefix cache: %lld of %lld prompt tokens (%.1f%%) | preemptions: %lld (%lld swapped to DDR)\n",
              static_cast<long long>(cached), static_cast<long long>(prompt_tokens),
              prompt_tokens ? 100.0 * cached / prompt_tokens : 0.0, static_cast<long long>(stats.preemptions),
              static_cast<long long>(stats.swaps));
  PrintParallelReport(j["parallel"]);
  if (!ratio.empty()) {
    const Summary& r = ratio_summary;
    const Summary& b = bound_summary;
    std::printf("  observed / predicted step time: median %.3f, p90 %.3f (min %.3f, max %.3f); "
                "observed / roofline bound: median %.2f, min %.2f\n",
                r.median, r.p90, r.min, r.max, b.median, b.min);
  }
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
