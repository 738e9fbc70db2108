// KV tiers over process ranks (the engine's MPI test binary; mpi_engine_test.cc has main).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvcache/flash_store.h"
#include "tests/engine/mpi_engine_fixture.h"

namespace moeserve::mpi_engine {
namespace {

// KV tiers over process ranks: rank 0's DDR and flash hold whole blocks, the workers' pieces
// travel as messages. Every rank's backend emulates an asynchronous copy engine, a tight pool
// preempts by swapping, a small DDR spills to flash, and the first prompts come back after the
// pool moved on. Then a restart over the same flash directory, every record's payload damaged:
// nothing damaged is served. Both runs' output equals one rank without tiers, token for token.
struct TierRun {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
  int64_t lower_tier_tokens = 0;
};

EngineConfig TierConfig(int64_t ep, int64_t pp, const ModelConfig& config, const std::string& dir) {
  EngineConfig ec = MakeConfig(ep, pp);
  ec.num_kv_blocks = 8 * ep;  // tight: one long prompt per EP rank, so growing sequences are preempted (swap)
  ec.scheduler.max_num_seqs = 8;
  if (!dir.empty()) {
    ec.kv_tiers.host_bytes = 10 * KvLayoutFor(config, 1, ec.block_size, DType::kF32).BlockBytes();
    ec.kv_tiers.flash_dir = dir;
    ec.kv_tiers.preemption = PreemptionMode::kSwap;
  } else {
    ec.num_kv_blocks = 400;
  }
  return ec;
}

TierRun RunTiers(const EngineConfig& ec, const ModelConfig& config, uint32_t seed,
                 const std::vector<GenerateRequest>& reqs, size_t first, ProcessRanks* processes = nullptr) {
  TierRun out;
  auto parts = MakeRankParts(ec, config, seed, DType::kF32, /*deferred=*/true, processes);
  EXPECT_TRUE(parts.ok()) << parts.status();
  if (!parts.ok()) return out;
  auto e = Engine::Create(ec, parts->weights.get(), parts->backend.get(), std::move(parts->ranks));
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return out;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::vector<uint64_t> ids;
  auto submit = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      auto id = (*e)->Submit(reqs[i], [&](const RequestEvent& ev) {
        auto& v = tokens[ev.request_id];
        v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
        EXPECT_NE(ev.reason, FinishReason::kError) << ev.message;
        if (ev.finished) out.lower_tier_tokens += ev.usage.cached_prompt_tokens_ddr + ev.usage.cached_prompt_tokens_flash;
      });
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    EXPECT_TRUE((*e)->RunUntilIdle().ok());
    (*e)->WaitForTransfers();
  };
  submit(first, 16);    // all at once: the tight pool preempts
  submit(16, reqs.size());  // the first four again, one pool's worth of other KV later
  EXPECT_TRUE((*e)->CheckAccounting());
  out.stats = (*e)->GetStats();
  for (uint64_t id : ids) out.tokens.push_back(tokens[id]);
  return out;
}

// Flips a payload byte of every record in `dir`.
int DamageEveryRecord(const std::string& dir) {
  int damaged = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (std::filesystem::file_size(entry.path()) <= FlashRecordHeader::kBytes + 7) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(FlashRecordHeader::kBytes + 7));
    const char c = static_cast<char>(f.peek());
    f.seekp(static_cast<std::streamoff>(FlashRecordHeader::kBytes + 7));
    f.put(static_cast<char>(c ^ 0x10));
    ++damaged;
  }
  return damaged;
}

TEST(MpiEngineTest, KvTiersOverProcessRanksEqualOneRankAndNeverServeDamagedRecords) {
  Job& job = TheJob();
  MpiWorld* world = job.world;
  auto seeds = world->AllGather(static_cast<double>(std::random_device{}() % 1000000));
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  const uint32_t seed = static_cast<uint32_t>((*seeds)[0]);
  const ModelConfig config = TestModel();
  const std::string dir = (std::filesystem::temp_directory_path() / ("moeserve_mpitiers_" + std::to_string(seed))).string();
  const EngineConfig tiers = TierConfig(job.ep, job.pp, config, dir);
  if (world->rank() != 0) {  // a worker serves the two engines' steps (and their KV piece copies)
    for (int run = 0; run < 2; ++run) {
      auto parts = MakeRankParts(tiers, config, seed, DType::kF32, /*deferred=*/true, world);
      ASSERT_TRUE(parts.ok()) << parts.status();
      EXPECT_TRUE(parts->ranks->ServeSteps().ok());
    }
    return;
  }
  std::filesystem::remove_all(dir);
  std::mt19937 gen(seed + 2);
  std::vector<GenerateRequest> reqs(16);
  for (auto& r : reqs) {
    const int len = 20 + static_cast<int>(gen() % 21);
    for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 16;
  }
  for (int i = 0; i < 4; ++i) reqs.push_back(reqs[i]);  // asked again at the end
  const std::string name = absl::StrCat("ep", job.ep, " pp", job.pp, " (seed ", seed, ")");
  const TierRun want = RunTiers(TierConfig(1, 1, config, ""), config, seed, reqs, 0);
  const TierRun got = RunTiers(tiers, config, seed, reqs, 0, world);
  // No ASSERT before the restart: the workers wait for its engine.
  EXPECT_EQ(got.tokens.size(), want.tokens.size()) << name;
  for (size_t i = 0; i < want.tokens.size() && i < got.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << name << " request " << i;
  }
  EXPECT_GT(got.stats.tiers.demoted, 0) << name;
  EXPECT_GT(got.lower_tier_tokens, 0) << name << ": no prompt came back from DDR or flash";
  EXPECT_GT(got.stats.tiers.swapped_in, 0) << name << ": the pool was meant to be tight enough to swap";
  EXPECT_EQ(got.stats.kv_blocks_used, 0) << name;
  EXPECT_EQ(got.stats.tiers.host.swap_blocks, 0) << name << ": swap space leaked";
  // A restart over the damaged flash directory: the last four prompts again, recomputed.
  EXPECT_GT(DamageEveryRecord(dir), 0) << name << ": nothing reached flash";
  const TierRun again = RunTiers(tiers, config, seed, reqs, 16, world);
  ASSERT_EQ(again.tokens.size(), 4u) << name;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(again.tokens[i], want.tokens[16 + i]) << name << " after the restart, request " << i;
  EXPECT_EQ(again.stats.tiers.promoted_flash, 0) << name << ": a damaged record was served";
  EXPECT_EQ(again.lower_tier_tokens, 0) << name << ": a damaged record was served";
  EXPECT_GT(again.stats.tiers.flash.dropped_corrupt, 0) << name;
  EXPECT_EQ(again.stats.kv_blocks_used, 0) << name;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::mpi_engine
