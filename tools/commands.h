// Subcommands of the `moeserve` binary. Each Add*Command registers its flags on `app` and
// returns the options struct that the callback fills; Run* executes it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "kernels/cpu/cpu_backend.h"

namespace moeserve::tools {

// Prints "error: MESSAGE" to stderr and returns the exit code: 2 for bad input (a flag or a
// file the user named), 1 otherwise.
inline int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// A comma-separated list flag of integers >= 1, sorted; errors name `flag` and the bad part.
absl::StatusOr<std::vector<int64_t>> ParseIntList(const std::string& flag, const std::string& text);

// Adds --model / --preset / --model-seed / --load-format / --dtype to a subcommand.
void AddModelFlags(CLI::App* cmd, ModelSpec* spec, std::string* dtype_flag, std::string* load_format);
// Applies the parsed --dtype and --load-format spellings to `spec`.
absl::Status FinishModelSpec(const std::string& dtype_flag, const std::string& load_format, ModelSpec* spec);
// --kv-dtype once the model is known (`model` finished by FinishModelSpec): "auto" becomes the
// dtype the weights compute in, as vLLM's --kv-cache-dtype auto does (bf16 for bf16 and FP8
// weights, f32 for f32 and f16 ones); f32 and bf16 stay; anything else is refused by name.
// Every rank of a job resolves it the same way, from the same spec.
absl::Status ResolveKvDtype(const ModelSpec& model, std::string* kv_dtype);

// The CPU kernel variant flags: --cpu-isa auto|avx2|avx512|avx512-bf16|amx and --cpu-kernel
// fastest|exact, checked at parse time (a variant this CPU lacks or whose self-check failed is
// refused naming the flag), applied to `o` by ApplyCpuKernelFlags.
struct CpuKernelFlags {
  std::string isa = "auto";
  std::string kernel = "fastest";
};
void AddCpuKernelFlags(CLI::App* cmd, CpuKernelFlags* flags);
absl::Status ApplyCpuKernelFlags(const CpuKernelFlags& flags, CpuBackendOptions* o);

// With a parallel layout, once the engine exists every rank holds its shard: frees the full
// copy of the weights the ranks were cut from (it would stay in memory for the whole run) and
// says so on stderr after `log_prefix`. Does nothing on one rank. (Re-placements copy experts
// from the ranks that hold them, or under mpirun read them from the checkpoint.)
void ReleaseStagingCopy(const EngineConfig& config, ModelWeights* weights, const char* log_prefix);

// Engine flags shared by `bench` and `serve`. A flag that needs no conversion binds straight to
// its field of `config`, whose default is the only one; the others (units, names, files) are
// kept here, with defaults taken from the config structs, and applied by MakeEngineConfig.
struct EngineFlags {
  EngineConfig config;
  bool no_chunked_prefill = !SchedulerConfig().chunked_prefill;
  bool no_prefix_caching = !SchedulerConfig().prefix_caching;
  bool no_wait_for_shared_prefix = !SchedulerConfig().wait_for_shared_prefix;
  double kv_cache_mb = static_cast<double>(EngineConfig().kv_cache_bytes) / 1048576.0;
  std::string kv_dtype = "auto";  // resolved by ResolveKvDtype before MakeEngineConfig
  int threads = 0;
  std::string backend = "cpu";
  int device = 0;
  double device_mb = 0;
  std::string expert_placement = "contiguous";
  std::string expert_load;      // --expert-load FILE
  std::string expert_load_out;  // --expert-load-out FILE: the routing recorded, written at the end
  bool fp32_dispatch = false;
  bool reference = false;
  bool no_batch_invariant = false;
  CpuKernelFlags cpu_kernel;
  std::string hardware;     // roofline profile: preset or calibrate JSON
  std::string calibration;  // a `bench --sweep-batch --out` JSON whose fitted efficiencies to use
  double host_kv_mb = 0;
  std::string flash_kv_dir;
  double flash_kv_mb = static_cast<double>(KvTierConfig().flash_bytes) / 1048576.0;
  std::string preemption = "auto";
  bool sync_flash = false;
  bool flash_kv_purge_foreign = false;
  // The layout the flags ask for (ep, pp).
  int64_t ranks() const { return config.parallel.ep * config.parallel.pp; }
};
void AddEngineFlags(CLI::App* cmd, EngineFlags* flags);
absl::StatusOr<EngineConfig> MakeEngineConfig(const EngineFlags& flags);
// --expert-placement's value: contiguous, round-robin or balanced (the error names the flag).
absl::StatusOr<ExpertPlacement> ParseExpertPlacement(const std::string& name);
// --expert-placement and --expert-load into `parallel` (the load file read and checked).
absl::Status ApplyPlacementFlags(const EngineFlags& flags, ParallelConfig* parallel);
absl::StatusOr<CpuBackendOptions> MakeBackendOptions(const EngineFlags& flags);
// A parallel rank's GPU backend on `gpu` (null, with the reason on stderr, when it cannot be made).
std::unique_ptr<Backend> MakeCudaRankBackend(int rank, int gpu, size_t capacity_bytes);
// The one factory of each rank's own device, with --device-mb of capacity. Thread ranks (one
// process): rank r gets GPU --device + r, or its share of --threads. Process ranks (mpirun):
// the GPU `process_gpu`, or all of --threads.
BackendFactory RankBackends(const EngineFlags& flags, bool processes, int process_gpu);
// The backend --backend names: the CPU (with MakeBackendOptions) or a GPU (--device).
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const EngineFlags& flags);

// The model an analysis command (roofline, explore) prices: one of a checkpoint directory, a
// preset's name or a config.json (default: the small preset); and its weight dtype for the
// roofline (bf16, f32 or fp8; default the checkpoint's).
absl::StatusOr<ModelConfig> AnalysisConfig(const std::string& model_dir, const std::string& preset,
                                           const std::string& config);
absl::StatusOr<std::string> AnalysisDtype(const ModelConfig& config, const std::string& dtype_flag);

// The callback of the chosen command stores its exit status in *exit_code.
void AddMakeModelCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);
void AddLoadgenCommand(CLI::App& app, int* exit_code);
void AddRooflineCommand(CLI::App& app, int* exit_code);
void AddPriceSheetCommand(CLI::App& app, int* exit_code);
void AddCalibrateCommand(CLI::App& app, int* exit_code);
void AddExploreCommand(CLI::App& app, int* exit_code);

}  // namespace moeserve::tools
