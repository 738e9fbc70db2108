// The tiny preset with f32 weights generated from a seed, loaded on a CPU backend: the engine
// tests that compare against the naive forward (tests/models/naive_forward.h) build their
// engine on it and hand the same tensors to the naive model.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"

namespace moeserve::testing {

struct TinyF32Model {
  explicit TinyF32Model(uint64_t seed)
      : config(*PresetConfig("tiny")), tensors(GenerateRandomWeights(config, seed, DType::kF32)) {
    auto w = ModelWeights::Load(config, *tensors, &backend, DType::kF32);
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) weights = *std::move(w);
  }
  // An engine over the weights (f32 KV unless the config says otherwise); null on failure.
  std::unique_ptr<Engine> MakeEngine(EngineConfig cfg) {
    auto e = Engine::Create(cfg, weights.get(), &backend);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  ModelConfig config;
  std::unique_ptr<HostTensorSet> tensors;
  CpuBackend backend;
  std::unique_ptr<ModelWeights> weights;
};

// EngineConfig with f32 KV, as the naive forward computes.
inline EngineConfig F32KvConfig() {
  EngineConfig cfg;
  cfg.kv_dtype = DType::kF32;
  return cfg;
}

}  // namespace moeserve::testing
