// Helpers shared by the KV tier tests (kv_tiers_test.cc, kv_tiers_isolation_test.cc): a tiny
// model, running requests one at a time, and a scenario whose shared prefix the fillers push
// out of a 12-block device pool, with its oracle (the request alone on a plain engine).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kvcache/kv_tiers.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "tests/test_util.h"

namespace moeserve::kv_tiers_test {

namespace fs = std::filesystem;

// With `defer_copies`, the backend emulates a GPU's asynchronous copy engine (see
// CpuBackendOptions): a missing wait or ordering of the tiers' copies shows as wrong output.
inline CpuBackendOptions BackendOptions(bool defer_copies) {
  CpuBackendOptions o;
  o.defer_copies = defer_copies;
  return o;
}
struct Model {
  CpuBackend backend;
  ModelConfig config = *PresetConfig("tiny");
  std::unique_ptr<ModelWeights> weights;
  explicit Model(bool defer_copies = false) : backend(BackendOptions(defer_copies)) {
    weights = *ModelWeights::Load(config, *GenerateRandomWeights(config, 7, DType::kF32), &backend,
                                  DType::kF32);
  }
};

// Runs requests one after another; returns each final event and the generated tokens.
struct Result {
  std::vector<int32_t> tokens;
  RequestEvent final_event;
};
inline Result RunAlone(Engine* engine, const std::vector<int32_t>& prompt, int32_t max_tokens,
                       double retain_seconds = 0, const std::string& tenant = "",
                       const std::string& salt = "") {
  Result r;
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = max_tokens;
  g.retain_seconds = retain_seconds;
  g.cache_tenant = tenant;
  g.cache_salt = salt;
  auto id = engine->Submit(g, [&](const RequestEvent& ev) {
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) r.final_event = ev;
  });
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(engine->RunUntilIdle().ok());
  return r;
}

inline std::vector<int32_t> RandomTokens(std::mt19937& gen, int n) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(gen() % 256);
  return v;
}

inline std::unique_ptr<Engine> MakeEngine(Model& m, KvTierConfig tiers, int64_t blocks,
                                          WallClock clock = WallSeconds) {
  EngineConfig ec;
  ec.num_kv_blocks = blocks;
  ec.kv_tiers = tiers;
  ec.clock = std::move(clock);
  auto e = Engine::Create(ec, m.weights.get(), &m.backend);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

struct Scenario {
  std::vector<int32_t> prefix, first, second;
  std::vector<std::vector<int32_t>> fillers;
};
inline Scenario MakeScenario(uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  Scenario s;
  s.prefix = RandomTokens(gen, 48);  // three full blocks of 16
  s.first = s.prefix;
  for (int32_t t : RandomTokens(gen, 5)) s.first.push_back(t);
  s.second = s.prefix;
  for (int32_t t : RandomTokens(gen, 7)) s.second.push_back(t);
  for (int i = 0; i < 6; ++i) s.fillers.push_back(RandomTokens(gen, 64));
  return s;
}

// Fills the cache with the prefix, pushes it out of the 12-block device pool with unrelated
// requests, then asks for the prefix again.
inline Result PlayScenario(Engine* e, const Scenario& s) {
  RunAlone(e, s.first, 4);
  for (const auto& f : s.fillers) RunAlone(e, f, 8);
  e->WaitForTransfers();  // blocks queued for flash are on flash before the lookup
  return RunAlone(e, s.second, 10);
}

inline std::string FreshDir() { return testing::FreshTempPath("tiers"); }

class KvTiersTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    // KV_TIERS_SEED replays a failing run's seed (printed in every failure message).
    const char* fixed = std::getenv("KV_TIERS_SEED");
    seed_ = fixed != nullptr ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
    scenario_ = MakeScenario(seed_);
    // The oracle: the second request alone on an engine without tiers, its prefix computed.
    auto plain = MakeEngine(model_, {}, 64);
    oracle_ = RunAlone(plain.get(), scenario_.second, 10).tokens;
    ASSERT_EQ(oracle_.size(), 10u);
  }
  Model model_{GetParam()};
  uint64_t seed_ = 0;
  Scenario scenario_;
  std::vector<int32_t> oracle_;
};

}  // namespace moeserve::kv_tiers_test
