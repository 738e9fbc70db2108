// One bring-up for every command that runs the model: `serve`, `bench` and `generate` on rank 0,
// and mpirun's worker ranks. A rank's device, its part of the model (the digests shared under a
// job), then rank 0's engine with the job's monitor, or a worker's step loop.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/commands.h"
#include "tools/mpi_job.h"

namespace moeserve::tools {

struct LoadedRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelWeights> weights;
};

// This rank's device (--backend) and its part of the model: all of it without a job, its
// layers and experts under mpirun, where the digests are then shared so that every rank's
// fingerprint is the whole model's. Says what it loads on stderr, after `log_prefix`.
absl::StatusOr<LoadedRank> LoadRank(const EngineFlags& flags, const ModelSpec& spec, const EngineConfig& config,
                                    MpiJob* job, const std::string& log_prefix);

// The layout's ranks over `weights` (staged on `backend`), when config.parallel asks for
// several: threads with their share of --threads, or under a job its processes (which, with
// --eplb-interval, read the experts a re-placement gives them from `spec`'s checkpoint); else
// null.
absl::StatusOr<std::unique_ptr<ParallelExecutor>> MakeRanks(const EngineFlags& flags, const EngineConfig& config,
                                                             const ModelWeights* weights, Backend* backend,
                                                             MpiJob* job, const ModelSpec& spec);

// Rank 0's engine and what it runs on. Members go in reverse order: the monitor stops before
// the engine goes, the engine before its weights and device.
struct Launched {
  LoadedRank rank;
  EngineConfig config;  // as the engine got it
  std::unique_ptr<Engine> engine;
  MonitorStop monitor_stop;
};

// Adjusts the config to the loaded model (limits that depend on its context); may refuse.
using FitToModel = std::function<absl::Status(const ModelConfig&, EngineConfig*)>;

// Rank 0: under a job its ranks become the job's processes; LoadRank; `fit`; the engine; the
// job's monitor (a lost rank fails the engine: its requests end UNAVAILABLE naming the rank);
// with several ranks the staging copy of the weights is released.
absl::StatusOr<std::unique_ptr<Launched>> LaunchEngine(const EngineFlags& flags, const ModelSpec& spec,
                                                       EngineConfig config, MpiJob* job,
                                                       const std::string& log_prefix, const FitToModel& fit = nullptr);

// --expert-load-out (flags.expert_load_out; nothing without it): the routing `engine` recorded,
// to that file (parallel/expert_load.h), and how evenly contiguous and balanced placements would
// spread it over 2, 4 and 8 EP ranks (per layer the busiest rank's tokens over the mean,
// averaged over the routed layers), on stdout.
absl::Status WriteExpertLoadOut(const EngineFlags& flags, const Engine& engine, const ModelSpec& spec);

}  // namespace moeserve::tools
