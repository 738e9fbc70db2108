// Ranks as processes: `mpirun -np N moeserve serve|bench --ep E --pp P` (N = E x P). Rank 0 runs
// the command (front end, scheduler, its own shard); every other rank loads the model, keeps its
// shard and serves the steps rank 0 sends it until rank 0 ends the job (docs/parallelism.md).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/commands.h"

namespace moeserve::tools {

// Whether mpirun (or another PMIx launcher) started this process: Open MPI sets
// OMPI_COMM_WORLD_SIZE, PMIx launchers PMIX_RANK.
bool LaunchedByMpirun();

class MpiJob {
 public:
  // Null when mpirun did not start this process. Under mpirun: joins the job and checks the
  // layout on every rank before any weights load (N must be ep x pp, ep at most the experts,
  // pp at most the layers), so every rank refuses a bad one with the same message.
  static absl::StatusOr<std::unique_ptr<MpiJob>> Join(const EngineFlags& flags,
                                                      const ModelSpec& spec);
  virtual ~MpiJob() = default;

  virtual int rank() const = 0;
  // The layout's GPUs when the ranks are on them (one per process; NCCL between them).
  virtual void Configure(const EngineFlags& flags, EngineConfig* config) = 0;
  // The job's processes, the layout's ranks (ParallelExecutor::Create's `processes`).
  virtual ProcessRanks* processes() = 0;
  // This process's rank's device: a GPU (--device plus its index among its host's ranks), or
  // the CPU with all of --threads.
  virtual BackendFactory RankBackend(const EngineFlags& flags) const = 0;
  virtual void StartMonitor(std::function<void(const std::string&)> on_lost) = 0;
  // Stops watching and forgets `on_lost`: before the engine it calls goes away.
  virtual void StopMonitor() = 0;
  // Rank 0 got SIGTERM/SIGINT: the job may be being torn down, so a silent rank is lost sooner.
  virtual void ShutdownRequested() = 0;
  // Collective, after every rank loaded its shard: the weights' digest becomes the whole model's.
  virtual absl::Status ShareDigests(ModelWeights* weights) = 0;
  // A worker rank: loads its shard of the model, serves steps; returns the exit code.
  virtual int RunWorker(const EngineFlags& flags, const ModelSpec& spec) = 0;
  // Ends the whole job (MPI_Abort, so mpirun stops every rank and exits non-zero).
  [[noreturn]] virtual void Abort(int code) = 0;
};

// Stops a job's monitor when it goes out of scope (null: no job).
struct MonitorStop {
  MpiJob* job = nullptr;
  ~MonitorStop() {
    if (job != nullptr) job->StopMonitor();
  }
};

}  // namespace moeserve::tools
