// The devices the flags ask for: this process's backend, the ranks' backends, and freeing the
// staging copy of the weights once the ranks hold their shards.
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernel_select.h"
#include "tools/commands.h"
#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace moeserve::tools {

namespace {

// This process's resident memory in MiB from /proc/self/statm (0 where there is none).
double ResidentMiB() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0 : 0;
}

}  // namespace

void ReleaseStagingCopy(const EngineConfig& config, ModelWeights* weights, const char* log_prefix) {
  if (!config.parallel.enabled()) return;
  const double staged_mb = static_cast<double>(weights->total_bytes()) / 1048576.0;
  const double rss_before = ResidentMiB();
  weights->ReleaseTensors();
#ifdef __GLIBC__
  // The tensors are heap blocks below the ranks' shards: hand the freed pages back explicitly.
  malloc_trim(0);
#endif
  std::fprintf(stderr,
               "%sfreed the %.1f MiB staging copy of the weights; each rank holds its shard (resident "
               "memory %.0f -> %.0f MiB)\n",
               log_prefix, staged_mb, rss_before, ResidentMiB());
}

BackendFactory RankBackends(const EngineFlags& f, bool processes, int process_gpu) {
  const size_t device_bytes = static_cast<size_t>(f.device_mb * 1048576.0);
  if (f.backend == "cuda") {
    const int first = f.device;
    return [=](int rank, int) { return MakeCudaRankBackend(rank, processes ? process_gpu : first + rank, device_bytes); };
  }
  // Checked by the caller already; a failure here still ends the rank's start with the reason,
  // as a null backend does.
  const absl::StatusOr<CpuBackendOptions> base = MakeBackendOptions(f);
  return [base, device_bytes, processes](int rank, int ranks) -> std::unique_ptr<Backend> {
    if (!base.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(base.status().message()).c_str());
      return nullptr;
    }
    CpuBackendOptions o = *base;
    o.capacity_bytes = device_bytes;
    if (!processes) {  // thread ranks share the process's threads
      const int threads = o.num_threads > 0 ? o.num_threads : UsableCpus();
      o.num_threads = std::max(1, threads / ranks);
    }
    return std::make_unique<CpuBackend>(o);
  };
}

std::unique_ptr<Backend> MakeCudaRankBackend(int rank, int gpu, size_t capacity_bytes) {
#if MOESERVE_HAVE_CUDA
  CudaBackendOptions o;
  o.device = gpu;
  o.capacity_bytes = capacity_bytes;
  auto b = CudaBackend::Create(o);
  if (b.ok()) return std::move(*b);
  std::fprintf(stderr, "rank %d: %s\n", rank, std::string(b.status().message()).c_str());
#else
  std::fprintf(stderr, "rank %d: GPU %d asked for, but this build has no CUDA backend\n", rank, gpu);
  (void)capacity_bytes;
#endif
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const EngineFlags& f) {
  // With several ranks this backend only stages the full weights in host memory; the ranks get
  // devices of their own (RankBackends).
  if (f.backend == "cpu" || (f.ranks() > 1 && f.backend == "cuda")) {
    ASSIGN_OR_RETURN(const CpuBackendOptions options, MakeBackendOptions(f));
    auto cpu = std::make_unique<CpuBackend>(options);
    if (cpu->path() == CpuPath::kFast) {
      std::fprintf(stderr, "moeserve: CPU kernels: %s; attention: %s\n", DescribeVariants(cpu->isa()).c_str(),
                   f.kv_dtype != "bf16"     ? "exact fp32"
                   : cpu->isa() == CpuIsa::kAmxModel
                       ? "AMX tiles on their software model (bf16 cache; queries and probabilities rounded to bf16)"
                   : cpu->AmxAttention()    ? "AMX tiles (bf16 cache; queries and probabilities rounded to bf16)"
                   : cpu->Bf16Attention()   ? "vdpbf16ps (bf16 cache; queries and probabilities rounded to bf16)"
                                            : "exact fp32");
    }
    return std::unique_ptr<Backend>(std::move(cpu));
  }
#if MOESERVE_HAVE_CUDA
  if (f.backend == "cuda") {
    CudaBackendOptions o;
    o.device = f.device;
    o.capacity_bytes = static_cast<size_t>(f.device_mb * 1048576.0);
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(o));
    return std::unique_ptr<Backend>(std::move(b));
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend must be cpu or cuda, got '", f.backend, "'"));
#else
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be cpu (this build has no CUDA: nvcc was not found), got '", f.backend, "'"));
#endif
}

absl::StatusOr<CpuBackendOptions> MakeBackendOptions(const EngineFlags& f) {
  CpuBackendOptions o;
  o.path = f.reference ? CpuPath::kReference : CpuPath::kFast;
  o.num_threads = f.threads;
  o.batch_invariant = !f.no_batch_invariant;
  RETURN_IF_ERROR(ApplyCpuKernelFlags(f.cpu_kernel, &o));
  // With several ranks this backend only stages the full weights in host memory; the ranks'
  // own devices get the capacity.
  if (f.ranks() == 1) o.capacity_bytes = static_cast<size_t>(f.device_mb * 1048576.0);
  return o;
}

}  // namespace moeserve::tools
