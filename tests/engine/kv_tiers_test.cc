// KV tiers in the engine: a shared prefix whose device blocks were evicted comes back from host
// DDR or from flash (also after a restart on the same flash directory), and the greedy output
// is token for token what the request gives alone with its prefix computed. Pool accounting
// stays exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

struct Model {
  CpuBackend backend;
  ModelConfig config = *PresetConfig("tiny");
  std::unique_ptr<ModelWeights> weights;
  Model() { weights = *ModelWeights::Load(config, *GenerateRandomWeights(config, 7, DType::kF32), &backend, DType::kF32); }
};

// Runs requests one after another; returns each final event and the generated tokens.
struct Result {
  std::vector<int32_t> tokens;
  RequestEvent final_event;
};
Result RunAlone(Engine* engine, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  Result r;
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = max_tokens;
  auto id = engine->Submit(g, [&](const RequestEvent& ev) {
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) r.final_event = ev;
  });
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(engine->RunUntilIdle().ok());
  return r;
}

std::vector<int32_t> RandomTokens(std::mt19937& gen, int n) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(gen() % 256);
  return v;
}

std::unique_ptr<Engine> MakeEngine(Model& m, KvTierConfig tiers, int64_t blocks) {
  EngineConfig ec;
  ec.num_kv_blocks = blocks;
  ec.kv_tiers = tiers;
  auto e = Engine::Create(ec, m.weights.get(), &m.backend);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

struct Scenario {
  std::vector<int32_t> prefix, first, second;
  std::vector<std::vector<int32_t>> fillers;
};
Scenario MakeScenario(uint64_t seed) {
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
Result PlayScenario(Engine* e, const Scenario& s) {
  RunAlone(e, s.first, 4);
  for (const auto& f : s.fillers) RunAlone(e, f, 8);
  return RunAlone(e, s.second, 10);
}

std::string FreshDir() {
  const fs::path p = fs::temp_directory_path() /
                     ("moeserve_tiers_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p.string();
}

class KvTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    scenario_ = MakeScenario(seed_);
    // The oracle: the second request alone on an engine without tiers, its prefix computed.
    auto plain = MakeEngine(model_, {}, 64);
    oracle_ = RunAlone(plain.get(), scenario_.second, 10).tokens;
    ASSERT_EQ(oracle_.size(), 10u);
  }
  Model model_;
  uint64_t seed_ = 0;
  Scenario scenario_;
  std::vector<int32_t> oracle_;
};

TEST_F(KvTiersTest, WithoutTiersTheEvictedPrefixIsRecomputed) {
  auto e = MakeEngine(model_, {}, 12);
  const Result r = PlayScenario(e.get(), scenario_);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 0) << "the fillers evicted the prefix";
  EXPECT_TRUE(e->CheckAccounting());
}

TEST_F(KvTiersTest, PrefixComesBackFromDdr) {
  KvTierConfig t;
  t.host_bytes = 64ull << 20;
  auto e = MakeEngine(model_, t, 12);
  const Result r = PlayScenario(e.get(), scenario_);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48);
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_ddr, 48);
  const EngineStats s = e->GetStats();
  EXPECT_GE(s.tiers.demoted, 3);
  EXPECT_EQ(s.tiers.promoted_ddr, 3);
  EXPECT_TRUE(e->CheckAccounting());
}

TEST_F(KvTiersTest, PrefixComesBackFromFlashAndSurvivesARestart) {
  const std::string dir = FreshDir();
  KvTierConfig t;
  t.flash_dir = dir;  // no DDR: evicted blocks go straight to flash
  t.flash_bytes = 64ull << 20;
  {
    auto e = MakeEngine(model_, t, 12);
    const Result r = PlayScenario(e.get(), scenario_);
    EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
    EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_flash, 48);
    EXPECT_TRUE(e->CheckAccounting());
  }
  // A new engine on the same directory: the prefix is served from flash at once.
  auto e = MakeEngine(model_, t, 12);
  EXPECT_GE(e->GetStats().tiers.flash.records, 3);
  const Result r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_flash, 48);
  EXPECT_TRUE(e->CheckAccounting());
  fs::remove_all(dir);
}

TEST_F(KvTiersTest, ASmallDdrCascadesIntoFlash) {
  const std::string dir = FreshDir();
  KvTierConfig t;
  t.host_bytes = 2 * KvLayoutFor(model_.config, 1, 16, DType::kF32).BlockBytes();  // two blocks
  t.flash_dir = dir;
  auto e = MakeEngine(model_, t, 12);
  const Result r = PlayScenario(e.get(), scenario_);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48);
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_ddr + r.final_event.usage.cached_prompt_tokens_flash, 48);
  EXPECT_GT(e->GetStats().tiers.host.demoted_to_flash, 0);
  EXPECT_TRUE(e->CheckAccounting());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
