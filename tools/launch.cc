// The one bring-up (see launch.h).
#include "tools/launch.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/file_util.h"
#include "core/status.h"
#include "parallel/expert_load.h"

namespace moeserve::tools {

absl::StatusOr<LoadedRank> LoadRank(const EngineFlags& flags, const ModelSpec& spec, const EngineConfig& config,
                                    MpiJob* job, const std::string& log_prefix) {
  LoadedRank out;
  ASSIGN_OR_RETURN(out.backend, MakeBackend(flags));
  Stopwatch sw;
  std::fprintf(stderr, "%sloading %s on %s ...\n", log_prefix.c_str(), DescribeModelSpec(spec).c_str(),
               out.backend->Name().c_str());
  WeightShard shard;  // without a job: everything
  if (job != nullptr) {
    ASSIGN_OR_RETURN(const ModelConfig model, LoadModelConfig(spec));
    // Again with the domain the hosts gave (Configure): it bounds --expert-replicas.
    if (absl::Status s = config.parallel.Validate(model); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("with the scale-up domain the ranks' hosts give (--domain-size ",
                                                     config.parallel.domain_size, "): ", s.message()));
    }
    shard = RankWeightShard(config.parallel, model, job->rank());
  }
  ASSIGN_OR_RETURN(out.weights, LoadModel(spec, out.backend.get(), shard));
  if (job != nullptr) RETURN_IF_ERROR(job->ShareDigests(out.weights.get()));
  const ModelConfig& c = out.weights->config();
  std::fprintf(stderr, "%sloaded in %.2f s: %.1fM parameters (%.1fM active), %s weights, %.0f MiB\n",
               log_prefix.c_str(), sw.Seconds(), c.TotalParams() / 1e6, c.ActiveParams() / 1e6,
               std::string(DTypeShortName(out.weights->dtype())).c_str(), out.weights->total_bytes() / 1048576.0);
  return out;
}

absl::StatusOr<std::unique_ptr<ParallelExecutor>> MakeRanks(const EngineFlags& flags, const EngineConfig& config,
                                                             const ModelWeights* weights, Backend* backend,
                                                             MpiJob* job, const ModelSpec& spec) {
  if (!config.parallel.enabled()) return nullptr;
  ASSIGN_OR_RETURN(const KvLayout kv, Engine::CacheLayout(config, weights->config()));
  if (job != nullptr) {
    ExpertSource source = nullptr;
    if (config.parallel.eplb_interval > 0) {
      source = [spec, backend](const WeightShard& shard) { return LoadModel(spec, backend, shard); };
    }
    return ParallelExecutor::Create(config.parallel, weights, backend, kv, job->RankBackend(flags), job->processes(),
                                    std::move(source));
  }
  return ParallelExecutor::Create(config.parallel, weights, backend, kv,
                                  RankBackends(flags, /*processes=*/false, flags.device));
}

absl::StatusOr<std::unique_ptr<Launched>> LaunchEngine(const EngineFlags& flags, const ModelSpec& spec,
                                                       EngineConfig config, MpiJob* job,
                                                       const std::string& log_prefix, const FitToModel& fit) {
  auto out = std::make_unique<Launched>();
  if (job != nullptr) job->Configure(flags, &config);
  ASSIGN_OR_RETURN(out->rank, LoadRank(flags, spec, config, job, log_prefix));
  if (fit) RETURN_IF_ERROR(fit(out->rank.weights->config(), &config));
  out->config = config;
  ASSIGN_OR_RETURN(std::unique_ptr<ParallelExecutor> ranks,
                   MakeRanks(flags, out->config, out->rank.weights.get(), out->rank.backend.get(), job, spec));
  ASSIGN_OR_RETURN(out->engine, Engine::Create(out->config, out->rank.weights.get(), out->rank.backend.get(),
                                               std::move(ranks)));
  if (job != nullptr) {
    Engine* e = out->engine.get();
    job->StartMonitor([e](const std::string& message) { e->Fail(absl::UnavailableError(message)); });
    out->monitor_stop.job = job;
  }
  ReleaseStagingCopy(out->config, out->rank.weights.get(), log_prefix.c_str());
  return out;
}

absl::Status WriteExpertLoadOut(const EngineFlags& flags, const Engine& engine, const ModelSpec& spec) {
  if (flags.expert_load_out.empty()) return absl::OkStatus();
  const std::string& path = flags.expert_load_out;
  const ExpertLoad load = engine.RecordedExpertLoad();
  RETURN_IF_ERROR(WriteFileAtomically(path, ExpertLoadJson(load, DescribeModelSpec(spec))));
  std::printf("  wrote %s: tokens routed to each of %lld layers x %lld experts\n", path.c_str(),
              static_cast<long long>(load.layers), static_cast<long long>(load.experts));
  std::vector<bool> routed(static_cast<size_t>(load.layers), false);  // the layers that saw tokens
  for (int64_t l = 0; l < load.layers; ++l) {
    for (int64_t e = 0; e < load.experts; ++e) routed[static_cast<size_t>(l)] = routed[static_cast<size_t>(l)] || load.at(l, e) > 0;
  }
  const int64_t layers = std::count(routed.begin(), routed.end(), true);
  if (layers == 0) return absl::OkStatus();
  // The mean over routed layers of RankImbalance under `placement` at `ep` ranks.
  auto mean = [&](ExpertPlacement placement, int64_t ep, int64_t replicas) {
    const std::vector<double> imb =
        RankImbalance(ExpertHolders(load.layers, load.experts, ep, placement, &load, replicas), load, ep);
    double sum = 0;
    for (int64_t l = 0; l < load.layers; ++l) sum += routed[static_cast<size_t>(l)] ? imb[static_cast<size_t>(l)] : 0.0;
    return sum / static_cast<double>(layers);
  };
  for (int64_t ep : {2, 4, 8}) {
    if (ep > load.experts) break;
    // The fewest copies, at least ep, that --expert-replicas takes: experts plus copies a multiple of ep.
    const int64_t copies = ep + (ep - load.experts % ep) % ep;
    std::printf("    ep %lld: busiest rank over the mean, mean over layers: contiguous %.3f, balanced %.3f, balanced "
                "with --expert-replicas %lld %.3f\n",
                static_cast<long long>(ep), mean(ExpertPlacement::kContiguous, ep, 0),
                mean(ExpertPlacement::kBalanced, ep, 0), static_cast<long long>(copies),
                mean(ExpertPlacement::kBalanced, ep, copies));
  }
  return absl::OkStatus();
}

}  // namespace moeserve::tools
