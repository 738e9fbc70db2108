// What the tests of the engine over process ranks share (mpi_engine_test.cc, with main, and
// mpi_engine_tiers_test.cc, one binary under mpirun): the job, the model, the ranks' parts.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "core/status.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "parallel/mpi_world.h"

namespace moeserve::mpi_engine {

// Set by main: the job and the layout under test.
struct Job {
  MpiWorld* world = nullptr;
  int64_t ep = 1, pp = 1;
  bool deepseek = false;  // --deepseek: the same shape as DeepSeek-V3 (MLA, a dense first layer)
};
inline Job& TheJob() {
  static Job job;
  return job;
}

inline ModelConfig TestModel() {  // 3 layers (uneven stages), 8 experts, a shared expert
  ModelConfig c = *PresetConfig("tiny");
  c.num_hidden_layers = 3;
  c.num_local_experts = 8;
  c.shared_expert_intermediate_size = 32;
  return TheJob().deepseek ? WithFamily(c, ModelFamily::kDeepseekV3) : c;
}

// What an engine of a random model (`seed`, stored as `dtype`) runs on: its weights on a CPU
// backend and, for a layout of several ranks, the executor: thread ranks, or with `processes`
// this process's rank of the job, which reads only its shard. With `deferred`, every backend
// emulates an asynchronous copy engine (CpuBackendOptions::defer_copies).
struct RankParts {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<ParallelExecutor> ranks;
};
// `fail_first_read`: with --eplb-interval, rank 1's first read of experts finds other weights (a
// changed checkpoint: the digest check fails it, and every rank must drop that layer).
inline absl::StatusOr<RankParts> MakeRankParts(const EngineConfig& ec, const ModelConfig& config,
                                               uint32_t seed, DType dtype, bool deferred,
                                               ProcessRanks* processes,
                                               bool fail_first_read = false) {
  RankParts p;
  CpuBackendOptions o;
  o.defer_copies = deferred;
  p.backend = std::make_unique<CpuBackend>(o);
  const WeightShard only = processes != nullptr
                               ? RankWeightShard(ec.parallel, config, processes->rank())
                               : WeightShard();
  ASSIGN_OR_RETURN(p.weights,
                   ModelWeights::Load(config, *GenerateRandomWeights(config, seed, DType::kF32),
                                      p.backend.get(), dtype, only));
  if (processes != nullptr) RETURN_IF_ERROR(ShareWeightDigests(processes, p.weights.get()));
  if (!ec.parallel.enabled()) return p;
  ASSIGN_OR_RETURN(const KvLayout kv, Engine::CacheLayout(ec, config));
  const BackendFactory one_thread = [deferred](int, int) -> std::unique_ptr<Backend> {
    CpuBackendOptions r;
    r.num_threads = 1;
    r.defer_copies = deferred;
    return std::make_unique<CpuBackend>(r);
  };
  ExpertSource source =
      nullptr;  // --eplb-interval: a process reads the experts it gains, as from a checkpoint
  if (processes != nullptr && ec.parallel.eplb_interval > 0) {
    CpuBackend* backend = p.backend.get();
    auto fail = std::make_shared<bool>(fail_first_read && processes->rank() == 1);
    source = [config, seed, dtype, backend,
              fail](const WeightShard& shard) -> absl::StatusOr<std::unique_ptr<ModelWeights>> {
      // The first read of a failing rank sees other weights, as a host whose checkpoint changed.
      const uint32_t from = *fail ? seed + 1 : seed;
      *fail = false;
      return ModelWeights::Load(config, *GenerateRandomWeights(config, from, DType::kF32), backend,
                                dtype, shard);
    };
  }
  ASSIGN_OR_RETURN(p.ranks, ParallelExecutor::Create(ec.parallel, p.weights.get(), p.backend.get(),
                                                     kv, one_thread, processes, std::move(source)));
  return p;
}

inline EngineConfig MakeConfig(int64_t ep, int64_t pp) {
  EngineConfig ec;
  ec.num_kv_blocks = 200;
  ec.block_size = 8;
  ec.scheduler.max_tokens_per_step = 48;  // chunked prefill mixes with decodes
  ec.parallel.ep = ep;
  ec.parallel.pp = pp;
  return ec;
}

}  // namespace moeserve::mpi_engine
