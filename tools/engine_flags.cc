// Engine and backend flags shared by the commands that run the engine.
#include "absl/strings/str_cat.h"
#include "tools/commands.h"

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernel_select.h"
#include "parallel/expert_load.h"
#include "roofline/hardware.h"
#include "tools/mpi_job.h"

namespace moeserve::tools {

namespace {

// Scheduling and the device KV cache.
void AddSchedulerFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--max-num-seqs", f->config.scheduler.max_num_seqs, "Most sequences in one engine step")->capture_default_str();
  cmd->add_option("--max-tokens-per-step", f->config.scheduler.max_tokens_per_step,
                  "Token budget of one step (prefill chunks plus decodes)")
      ->capture_default_str();
  cmd->add_flag("--no-chunked-prefill", f->no_chunked_prefill,
                "Prefill each prompt in one step instead of chunks under the budget");
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "Do not share KV blocks between equal prefixes");
  cmd->add_flag("--no-wait-for-shared-prefix", f->no_wait_for_shared_prefix,
                "Admit a prompt that is mostly one still being prefilled (n choices, a burst with one long "
                "system prompt) at once, computing the shared blocks twice, instead of letting it wait for "
                "them to reach the prefix cache (for comparison)");
  cmd->add_option("--max-waiting", f->config.scheduler.max_waiting, "Waiting-queue bound for admissions: a new request is refused (RESOURCE_EXHAUSTED) while this many "
                  "requests wait that were never scheduled; sequences preempted under KV pressure go back to the queue even beyond it (by at most "
                  "--max-num-seqs)")
      ->capture_default_str();
  cmd->add_option("--fast-lane-max-batch", f->config.scheduler.fast_lane_max_batch,
                  "Batch size cap while a fast-lane request is in the batch")
      ->capture_default_str();
  cmd->add_option("--block-size", f->config.block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--kv-blocks", f->config.num_kv_blocks, "KV blocks on the device (0: from --kv-cache-mb)")->capture_default_str();
  cmd->add_option("--kv-cache-mb", f->kv_cache_mb, "KV cache size in MiB when --kv-blocks is 0")->capture_default_str();
  cmd->add_option("--kv-dtype", f->kv_dtype,
                  "KV cache dtype: auto, f32 or bf16. auto (vLLM's default) is the dtype the weights compute in: "
                  "bf16 for bf16 and FP8 weights, f32 for f32 ones. bf16 halves the cache against f32; with the "
                  "avx512-bf16 and amx CPU kernels, attention then runs on vdpbf16ps, queries and probabilities "
                  "rounded to bf16. f32 keeps attention on the exact fp32 kernel")
      ->capture_default_str();
}

// The device the model runs on, its kernels, and the roofline profile that predicts its steps.
void AddDeviceFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--threads", f->threads, "CPU threads (0: one per CPU this process may run on: its affinity mask, e.g. under taskset)")->capture_default_str();
  cmd->add_option("--backend", f->backend,
                  "Where the model runs: cpu, or cuda (an NVIDIA GPU; needs a build with nvcc; checked on an H100; "
                  "the DeepSeek and GLM families and FP8 weights are CPU-only)")
      ->capture_default_str();
  cmd->add_option("--device", f->device,
                  "GPU ordinal for --backend cuda (with --ep/--pp: the first of ep x pp consecutive GPUs)")
      ->capture_default_str();
  cmd->add_option("--device-mb", f->device_mb,
                  "Capacity of each (virtual) CPU device in MiB: weights, KV cache and workspaces must fit; with "
                  "--ep/--pp, of each rank's device (0: 3/4 of physical memory)")
      ->capture_default_str();
  cmd->add_flag("--reference", f->reference, "Use the CPU reference path (slow, the test oracle)");
  cmd->add_flag("--no-batch-invariant", f->no_batch_invariant,
                "Use OpenBLAS for large batches: faster prefill, but outputs may depend on batch mates "
                "in the last bits");
  AddCpuKernelFlags(cmd, &f->cpu_kernel);
  cmd->add_option("--hardware", f->hardware,
                  "Roofline profile for per-step predictions: h100-sxm, h200, b200, gb200-nvl72, or a JSON "
                  "profile from `moeserve calibrate` (the one that describes this machine)");
  cmd->add_option("--calibration", f->calibration,
                  "JSON from `moeserve bench --sweep-batch ... --out` whose fitted efficiencies turn the "
                  "roofline bound into a calibrated prediction (needs --hardware)");
  cmd->add_option("--price-per-hour", f->config.price_per_hour,
                  "$ per hour of this machine for request receipts (default: the profile's price)");
}

// The KV tiers below the device (host DDR, flash) and preemption.
void AddKvTierFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--host-kv-mb", f->host_kv_mb,
                  "Host DDR tier for evicted prefix-cache blocks and swapped-out sequences, MiB (0: none); pinned "
                  "memory with --backend cuda; works with --ep/--pp, as threads or as mpirun processes (the tiers are rank "
                  "0's; a block is assembled from every rank that holds a piece of it)")
      ->capture_default_str();
  cmd->add_option("--flash-kv-dir", f->flash_kv_dir,
                  "Directory of the flash tier below DDR (verified records; survives restarts). Created 0700 "
                  "with records 0600; refused when another user owns it, when group or others have any access "
                  "(stored KV reveals prompts), or while another server holds its lock");
  cmd->add_flag("--flash-kv-purge-foreign", f->flash_kv_purge_foreign,
                "Delete records of other models, KV formats or block shapes found in --flash-kv-dir at start "
                "(by default they are skipped, counted and left in place)");
  cmd->add_option("--flash-kv-mb", f->flash_kv_mb, "Byte budget of the flash tier, MiB")->capture_default_str();
  cmd->add_flag("--sync-flash", f->sync_flash,
                "Write evicted blocks to flash on the engine thread instead of the transfer thread (no "
                "prefetch either; for comparison)");
  cmd->add_option("--preemption", f->preemption,
                  "What happens to a sequence preempted under KV pressure: auto (swap its KV to the DDR "
                  "tier when the copies cost less than recomputing, by the roofline of --hardware or "
                  "measured rates), swap, or recompute. Swap needs --host-kv-mb")
      ->capture_default_str();
  cmd->add_option("--max-retain-seconds", f->config.limits.max_retain_seconds,
                  "Largest retain_seconds (prompt-cache retention) a request may ask")
      ->capture_default_str();
}

// Expert parallelism and pipeline stages.
void AddParallelFlags(CLI::App* cmd, EngineFlags* f) {
  cmd->add_option("--ep", f->config.parallel.ep,
                  "Expert-parallel ranks: each holds 1/N of every layer's experts and runs attention for its own "
                  "sequences; MoE layers exchange hidden states by all-to-all. Each rank is a thread with its own "
                  "share of --threads (cpu) or its own GPU, --device + rank, talking over NCCL (cuda). Under "
                  "`mpirun -np N` (N = ep x pp) each rank is a process with all of --threads, talking over MPI "
                  "(docs/parallelism.md)")
      ->capture_default_str();
  cmd->add_option("--pp", f->config.parallel.pp,
                  "Pipeline stages: contiguous layer ranges, each keeping KV for its own layers; micro-batches "
                  "flow through them. With --ep, ep x pp ranks")
      ->capture_default_str();
  cmd->add_option("--domain-size", f->config.parallel.domain_size,
                  "Ranks per scale-up domain (NVLink, or one host's shared memory under mpirun, "
                  "which fills hosts in rank order; rank = stage x ep + EP rank). With --hardware the predictions price "
                  "all-to-all traffic to other domains, and pipeline hand-offs between stages in different "
                  "domains, at the profile's scale-out bandwidth and latency; bench reports the bytes that crossed. "
                  "With --expert-replicas an expert's copies go to distinct domains and each sender uses its own "
                  "domain's copy (0: all ranks in one domain; under mpirun "
                  "over several hosts holding equal runs of ranks, the ranks per host, logged by rank 0)")
      ->capture_default_str();
  cmd->add_option("--ep-balance", f->config.scheduler.ep_balance_ratio,
                  "With --ep: a prompt goes to the rank its first KV block hashes to (shared prefixes meet in "
                  "one rank's cache) unless that rank has more than this many times the outstanding tokens of "
                  "the least loaded rank plus the prompt's own; then to the least loaded (0: always the hashed "
                  "rank). Prompts shorter than a block always go to the least loaded rank")
      ->capture_default_str();
  cmd->add_option("--expert-placement", f->expert_placement,
                  "How experts map to EP ranks: contiguous (rank r holds a contiguous range), round-robin (expert e on "
                  "rank e mod ep), or balanced (per layer, from the routing in --expert-load: the heaviest experts "
                  "spread so that each rank's share of the tokens is as even as the longest-processing-time rule makes "
                  "it; every rank holds as many experts as contiguous gives it)")
      ->capture_default_str();
  cmd->add_option("--expert-load", f->expert_load,
                  "With --expert-placement balanced: the tokens routed to each (layer, expert), as `moeserve bench "
                  "--expert-load-out FILE` writes them (a run of the same model, any layout)");
  cmd->add_option("--expert-replicas", f->config.parallel.expert_replicas,
                  "With --expert-placement balanced: this many extra copies of the hottest experts per MoE layer "
                  "(EPLB's redundant experts), chosen and spread over the ranks from the recorded load so that the "
                  "busiest rank is as light as the rules find (parallel/placement.h); each sender splits an expert's "
                  "rows among its copies (with --domain-size, among those in its own domain where it has any: at most "
                  "one copy per domain). The experts plus the copies must be a multiple of --ep; each rank then "
                  "holds (experts + copies) / ep experts' weights")
      ->capture_default_str();
  cmd->add_option("--expert-load-out", f->expert_load_out,
                  "Write the tokens routed to each (layer, expert) as JSON when the run ends (bench: after its "
                  "workload; serve: at a clean shutdown), for --expert-placement balanced --expert-load, and print "
                  "how evenly contiguous and balanced placements would spread them over 2, 4 and 8 EP ranks");
  cmd->add_flag("--fp32-dispatch", f->fp32_dispatch,
                "With --ep: send the hidden rows to the experts as fp32 even where every rank's expert GEMM rounds "
                "them to bf16 anyway (the avx512-bf16 and AMX kernels with bf16 or FP8 experts), which otherwise "
                "halves those bytes without changing a bit of the output (for comparison)");
  cmd->add_option("--micro-batches", f->config.parallel.micro_batches, "Micro-batches per step with --pp (0: as many as stages)")
      ->capture_default_str();
  cmd->add_option("--eplb-interval", f->config.parallel.eplb_interval,
                  "With --ep: every this many engine steps, re-place the experts while serving (vLLM's EPLB): per "
                  "MoE layer, the balanced placement of the last --eplb-window steps' routing, with --expert-replicas "
                  "copies, where it leaves that layer's busiest rank at least 2% lighter; one layer at a time. Ranks "
                  "that are threads copy the experts they gain from a rank of their stage that holds them; under "
                  "mpirun each process reads them from the checkpoint. Outputs do not change. 0: never")
      ->capture_default_str();
  cmd->add_option("--eplb-window", f->config.parallel.eplb_window,
                  "With --eplb-interval: the engine steps of routing a re-placement evens out")
      ->capture_default_str();
}

}  // namespace

void AddEngineFlags(CLI::App* cmd, EngineFlags* f) {
  AddSchedulerFlags(cmd, f);
  AddDeviceFlags(cmd, f);
  AddKvTierFlags(cmd, f);
  AddParallelFlags(cmd, f);
  cmd->add_option("--trace-jsonl", f->config.trace_jsonl, "Write every engine step's record here, one JSON per line");
  cmd->add_option("--trace-chrome", f->config.trace_chrome,
                  "Write a Chrome/Perfetto trace of the engine steps here (open in ui.perfetto.dev)");
}

absl::StatusOr<ExpertPlacement> ParseExpertPlacement(const std::string& name) {
  if (name == "contiguous") return ExpertPlacement::kContiguous;
  if (name == "round-robin") return ExpertPlacement::kRoundRobin;
  if (name == "balanced") return ExpertPlacement::kBalanced;
  return absl::InvalidArgumentError(
      absl::StrCat("--expert-placement must be contiguous, round-robin or balanced, got '", name, "'"));
}

absl::Status ApplyPlacementFlags(const EngineFlags& f, ParallelConfig* p) {
  // Checked here too: with one rank the layout is never validated, and the flag would be ignored.
  RETURN_IF_ERROR(p->ValidateEplb());
  // Checked here, not only with the layout: one rank would otherwise ignore it. With
  // --eplb-interval the copies need no recorded load (ParallelConfig::Holders).
  const bool placed = f.expert_placement == "balanced" || (p->eplb_interval > 0 && f.expert_placement == "contiguous");
  if (p->expert_replicas != 0 && (p->ep < 2 || !placed || p->expert_replicas < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-replicas copies the hottest experts of a recorded load: it needs --ep 2 or more and "
        "--expert-placement balanced --expert-load FILE (or --eplb-interval N, which places them while serving), "
        "and a count >= 0; got --expert-replicas ",
        p->expert_replicas, " with --ep ", p->ep, " and --expert-placement ", f.expert_placement));
  }
  ASSIGN_OR_RETURN(p->placement, ParseExpertPlacement(f.expert_placement));
  if (f.expert_load.empty()) {
    if (p->placement == ExpertPlacement::kBalanced) {
      return absl::InvalidArgumentError("--expert-placement balanced needs --expert-load FILE (bench --expert-load-out)");
    }
    return absl::OkStatus();
  }
  if (p->placement != ExpertPlacement::kBalanced) {
    return absl::InvalidArgumentError("--expert-load is read only with --expert-placement balanced");
  }
  ASSIGN_OR_RETURN(ExpertLoad load, ReadExpertLoad(f.expert_load));
  p->expert_load = std::make_shared<const ExpertLoad>(std::move(load));
  return absl::OkStatus();
}

absl::StatusOr<EngineConfig> MakeEngineConfig(const EngineFlags& f) {
  EngineConfig c = f.config;  // the flags bound to it directly
  c.scheduler.chunked_prefill = !f.no_chunked_prefill;
  c.scheduler.prefix_caching = !f.no_prefix_caching;
  c.scheduler.wait_for_shared_prefix = !f.no_wait_for_shared_prefix;
  c.parallel.bf16_dispatch = !f.fp32_dispatch;
  if (!(f.kv_cache_mb > 0)) return absl::InvalidArgumentError(absl::StrCat("--kv-cache-mb must be > 0, got ", f.kv_cache_mb));
  c.kv_cache_bytes = static_cast<size_t>(f.kv_cache_mb * 1048576.0);
  auto dt = DTypeFromShortName(f.kv_dtype);
  if (!dt.ok() || *dt == DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-dtype must be auto, f32 or bf16, got \"", f.kv_dtype,
                                                   "\" (auto is resolved from the model first)"));
  }
  c.kv_dtype = *dt;
  if (!f.hardware.empty()) {
    ASSIGN_OR_RETURN(c.hardware, roofline::LoadHardware(f.hardware));
    // Ranks outside mpirun are threads of this process.
    if (!LaunchedByMpirun()) roofline::UseThreadRankExchanges(&*c.hardware);
  }
  if (!f.calibration.empty()) {
    if (f.hardware.empty()) return absl::InvalidArgumentError("--calibration needs --hardware");
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.calibration));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("fit_at_limit") && j["fit_at_limit"].is_array() && !j["fit_at_limit"].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--calibration: ", f.calibration, "'s fit is degenerate (",
                                                     j["fit_at_limit"].dump(), "); its efficiencies explain nothing"));
    }
    if (j.is_discarded() || !j.contains("efficiency") || !j["efficiency"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--calibration: ", f.calibration, " has no 'efficiency' object (use bench --sweep-batch --out)"));
    }
    const auto& e = j["efficiency"];
    for (auto [key, out] : {std::pair<const char*, double*>{"compute", &c.efficiency.compute},
                            {"attention", &c.efficiency.attention},
                            {"memory", &c.efficiency.memory},
                            {"overlap", &c.efficiency.overlap},
                            {"overhead_seconds", &c.efficiency.overhead_seconds}}) {
      if (!e.contains(key) || !e[key].is_number() || e[key].get<double>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("--calibration: efficiency.", key, " must be a number >= 0"));
      }
      *out = e[key].get<double>();
    }
    if (!(c.efficiency.compute > 0 && c.efficiency.attention > 0 && c.efficiency.memory > 0)) {
      return absl::InvalidArgumentError("--calibration: efficiencies must be > 0");
    }
  }
  if (f.host_kv_mb < 0) return absl::InvalidArgumentError(absl::StrCat("--host-kv-mb must be >= 0, got ", f.host_kv_mb));
  if (!(f.flash_kv_mb > 0)) return absl::InvalidArgumentError(absl::StrCat("--flash-kv-mb must be > 0, got ", f.flash_kv_mb));
  c.kv_tiers.host_bytes = static_cast<uint64_t>(f.host_kv_mb * 1048576.0);
  c.kv_tiers.flash_dir = f.flash_kv_dir;
  c.kv_tiers.flash_bytes = static_cast<uint64_t>(f.flash_kv_mb * 1048576.0);
  c.kv_tiers.async_flash = !f.sync_flash;
  c.kv_tiers.purge_foreign_flash = f.flash_kv_purge_foreign;
  ASSIGN_OR_RETURN(c.kv_tiers.preemption, ParsePreemptionMode(f.preemption));
  if (!(c.limits.max_retain_seconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-retain-seconds must be >= 0, got ", c.limits.max_retain_seconds));
  }
  if (!(f.device_mb >= 0)) return absl::InvalidArgumentError(absl::StrCat("--device-mb must be >= 0, got ", f.device_mb));
  RETURN_IF_ERROR(ApplyPlacementFlags(f, &c.parallel));
  if (c.parallel.enabled()) {
    RETURN_IF_ERROR(MakeBackendOptions(f).status());  // the ranks' CPU options, checked now
    if (f.backend == "cuda") {
      // Rank r on GPU --device + r; the ranks exchange hidden states over NCCL, device to device.
      for (int64_t r = 0; r < f.ranks(); ++r) c.parallel.nccl_devices.push_back(static_cast<int>(f.device + r));
    }
  }
  absl::Status s = c.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("engine flags: ", s.message()));
  return c;
}

void AddCpuKernelFlags(CLI::App* cmd, CpuKernelFlags* f) {
  // Each value is checked as it is parsed; the pair together by ApplyCpuKernelFlags.
  auto check_isa = [](const std::string& v) -> std::string {
    const absl::StatusOr<CpuIsa> isa = ParseCpuIsa(v);
    if (!isa.ok()) return std::string(isa.status().message());
    const absl::StatusOr<CpuIsa> chosen = ChooseCpuIsa(*isa, CpuKernelNumerics::kFastest);
    return chosen.ok() ? "" : std::string(chosen.status().message());
  };
  auto check_kernel = [](const std::string& v) -> std::string {
    const absl::StatusOr<CpuKernelNumerics> n = ParseCpuKernelNumerics(v);
    return n.ok() ? "" : std::string(n.status().message());
  };
  cmd->add_option("--cpu-isa", f->isa,
                  "CPU kernel variant: auto (the fastest that passes its start-up self-check), avx2 or avx512 "
                  "(exact fp32 arithmetic, the same bits), avx512-bf16 (vdpbf16ps) or amx (tiles); the last two "
                  "round activations to bf16 for bf16 weights. amx-model runs the amx variant's code with its "
                  "tile instructions computed in software, on any AVX512-BF16 CPU: to check that code where no "
                  "AMX is granted, not meant for speed (never chosen by auto). A variant this CPU lacks "
                  "is refused")
      ->capture_default_str()
      ->check(CLI::Validator(check_isa, "ISA"));
  cmd->add_option("--cpu-kernel", f->kernel,
                  "fastest: allow the variants that round activations to bf16; exact: fp32 activations only "
                  "(avx2/avx512), the arithmetic of the reference order")
      ->capture_default_str()
      ->check(CLI::Validator(check_kernel, "NUMERICS"));
}

absl::Status ApplyCpuKernelFlags(const CpuKernelFlags& f, CpuBackendOptions* o) {
  ASSIGN_OR_RETURN(o->isa, ParseCpuIsa(f.isa));
  ASSIGN_OR_RETURN(o->numerics, ParseCpuKernelNumerics(f.kernel));
  if (o->path == CpuPath::kReference) return absl::OkStatus();
  return ChooseCpuIsa(o->isa, o->numerics).status();
}

}  // namespace moeserve::tools
