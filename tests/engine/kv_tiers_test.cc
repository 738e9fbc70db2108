// KV tiers in the engine: a shared prefix whose device blocks were evicted comes back from host
// DDR or from flash (also after a restart on the same flash directory), and the greedy output
// is token for token what the request gives alone with its prefix computed. Pool accounting
// stays exact. (kv_tiers_copy_test.cc: the tiers' copies byte for byte, below the engine.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "tests/engine/kv_tiers_fixture.h"

namespace moeserve::kv_tiers_test {
namespace {


TEST_P(KvTiersTest, WithoutTiersTheEvictedPrefixIsRecomputed) {
  auto e = MakeEngine(model_, {}, 12);
  const Result r = PlayScenario(e.get(), scenario_);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 0) << "the fillers evicted the prefix";
  EXPECT_TRUE(e->CheckAccounting());
}

TEST_P(KvTiersTest, PrefixComesBackFromDdr) {
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
  // The step that brought the prefix back records the copies: bytes and the time they took.
  const double block_bytes = static_cast<double>(s.tiers.block_bytes);
  bool recorded = false;
  for (const StepRecord& r : s.recent_steps) {
    if (r.transfer_bytes >= 3 * block_bytes) recorded = recorded || r.transfer_seconds > 0;
  }
  EXPECT_TRUE(recorded) << "no step recorded the promotion's " << 3 * block_bytes << " bytes with their time";
  // ... and the request the prefix came back for is charged for the copies on its receipt.
  const RequestReceipt& rc = r.final_event.receipt;
  EXPECT_GT(rc.transfer_device_seconds, 0);
  EXPECT_NEAR(rc.prefill_device_seconds + rc.decode_device_seconds + rc.transfer_device_seconds, rc.device_seconds,
              1e-12 + 1e-9 * rc.device_seconds);
  EXPECT_TRUE(e->CheckAccounting());
}

TEST_P(KvTiersTest, PrefixComesBackFromFlashAndSurvivesARestart) {
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

TEST_P(KvTiersTest, ASmallDdrCascadesIntoFlash) {
  const std::string dir = FreshDir();
  KvTierConfig t;
  t.host_bytes = 2 * KvLayoutFor(model_.config, 1, 16, DType::kF32).BlockBytes();  // two blocks
  t.flash_dir = dir;
  auto e = MakeEngine(model_, t, 12);
  const Result r = PlayScenario(e.get(), scenario_);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48);
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_ddr + r.final_event.usage.cached_prompt_tokens_flash, 48);
  e->WaitForTransfers();
  EXPECT_GT(e->GetStats().tiers.host.demoted_to_flash, 0);
  EXPECT_TRUE(e->CheckAccounting());
  fs::remove_all(dir);
}

// Retention on the device: the retained prompt blocks survive fillers that evict everything
// else, and turn into ordinary LRU blocks at their deadline.
TEST_P(KvTiersTest, RetainedPrefixOutlivesDevicePressureUntilItExpires) {
  double now = 1000.0;
  auto e = MakeEngine(model_, {}, 12, [&] { return now; });
  RunAlone(e.get(), scenario_.first, 4, /*retain_seconds=*/300);
  EXPECT_EQ(e->GetStats().kv_blocks_retained, 3);
  for (const auto& f : scenario_.fillers) RunAlone(e.get(), f, 8);
  Result r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48) << "the retained prefix was evicted";
  now += 301;  // past the deadline
  for (const auto& f : scenario_.fillers) RunAlone(e.get(), f, 8);
  EXPECT_EQ(e->GetStats().kv_blocks_retained, 0);
  r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 0) << "an expired prefix is an ordinary LRU candidate";
  EXPECT_TRUE(e->CheckAccounting());
}

// Retention below the device: a request that needs the whole device pool pushes the retained
// blocks down to a four-block DDR tier, where the fillers' blocks rotate through the one slot
// left rather than pushing them out. Without retention they are lost.
TEST_P(KvTiersTest, RetainedBlocksKeepTheirPlaceInASmallDdr) {
  std::mt19937 gen(static_cast<uint32_t>(seed_) + 1);  // not the scenario's stream
  const std::vector<int32_t> big = RandomTokens(gen, 180);  // with 8 new tokens: all 12 blocks
  for (const double retain : {0.0, 600.0}) {
    KvTierConfig t;
    t.host_bytes = 4 * KvLayoutFor(model_.config, 1, 16, DType::kF32).BlockBytes();
    auto e = MakeEngine(model_, t, 12);
    RunAlone(e.get(), scenario_.first, 4, retain);
    RunAlone(e.get(), big, 8);
    for (const auto& f : scenario_.fillers) RunAlone(e.get(), f, 8);
    if (retain > 0) {
      EXPECT_EQ(e->GetStats().tiers.host.retained, 3);
    }
    const Result r = RunAlone(e.get(), scenario_.second, 10);
    EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
    EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_ddr, retain > 0 ? 48 : 0) << "retain " << retain;
    EXPECT_TRUE(e->CheckAccounting());
  }
}

// Fault injection on the engine path: after a run leaves the prefix and the fillers on flash,
// one record gets a flipped payload byte, one is truncated, a record of another model and a
// half-written temp file appear. The restarted engine drops and counts the bad ones at open
// and on read, serves only verified blocks, and its output equals the oracle.
TEST_P(KvTiersTest, DamagedFlashRecordsAreDroppedCountedAndNeverServed) {
  const std::string dir = FreshDir();
  KvTierConfig t;
  t.flash_dir = dir;
  t.flash_bytes = 64ull << 20;
  {
    auto e = MakeEngine(model_, t, 12);
    PlayScenario(e.get(), scenario_);
  }
  const uint64_t fp = ModelFingerprint(*model_.weights, model_.backend, DType::kF32, 16);
  std::vector<BlockHash> prefix;
  ExtendBlockHashes(scenario_.prefix, 16, fp, BlockHash{}, &prefix);
  ASSERT_EQ(prefix.size(), 3u);
  std::vector<std::string> prefix_paths, other_paths;
  {
    auto store = FlashStore::Open({dir, 64ull << 20, fp});
    ASSERT_TRUE(store.ok());
    for (const auto& h : prefix) {
      ASSERT_TRUE((*store)->Contains(h));
      prefix_paths.push_back((*store)->PathOf(h));
    }
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string p = entry.path().string();
    if (std::find(prefix_paths.begin(), prefix_paths.end(), p) == prefix_paths.end()) other_paths.push_back(p);
  }
  ASSERT_GE(other_paths.size(), 1u);
  {  // the prefix's second block: a flipped payload byte (only the payload checksum can tell)
    std::fstream f(prefix_paths[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(FlashRecordHeader::kBytes + 7));
    const char c = static_cast<char>(f.peek());
    f.put(static_cast<char>(c ^ 0x10));
  }
  fs::resize_file(other_paths[0], fs::file_size(other_paths[0]) / 2);  // truncated
  {  // a valid record of another model, copied in
    const std::string other_dir = FreshDir();
    auto foreign = FlashStore::Open({other_dir, 1 << 20, fp + 1});
    ASSERT_TRUE(foreign.ok());
    const std::vector<uint8_t> payload(4096, 7);
    const BlockHash h{12345, 678};
    ASSERT_TRUE((*foreign)->Put(h, 0, 2, DType::kF32, 16, payload.data(), payload.size()).ok());
    fs::copy_file((*foreign)->PathOf(h), dir + "/" + fs::path((*foreign)->PathOf(h)).filename().string());
    fs::remove_all(other_dir);
  }
  std::ofstream(dir + "/" + fs::path(prefix_paths[2]).filename().string() + ".tmp.999.999") << "half a record";

  auto e = MakeEngine(model_, t, 12);
  FlashStoreStats fs0 = e->GetStats().tiers.flash;
  EXPECT_EQ(fs0.dropped_truncated, 1);
  EXPECT_EQ(fs0.skipped_foreign, 1) << "another model's record is skipped and left in place";
  EXPECT_EQ(fs0.dropped_foreign, 0);
  EXPECT_EQ(fs0.dropped_incomplete, 1);
  EXPECT_EQ(fs0.dropped_corrupt, 0) << "the flipped payload byte is only caught on read";
  Result r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens_flash, 16) << "only the block before the damaged one";
  EXPECT_EQ(e->GetStats().tiers.flash.dropped_corrupt, 1);
  EXPECT_EQ(e->GetStats().tiers.promote_failures, 1) << "the damaged block's promotion failed and was rolled back";
  // The engine keeps working, and the recomputed blocks are cached again.
  r = RunAlone(e.get(), scenario_.second, 10);
  EXPECT_EQ(r.tokens, oracle_) << "seed " << seed_;
  EXPECT_EQ(r.final_event.usage.cached_prompt_tokens, 48);
  EXPECT_TRUE(e->CheckAccounting());
  fs::remove_all(dir);
}
// Random traffic through every tier at once (a 16-block device pool, a 6-block DDR tier, a
// flash tier of about 12 records, swap-or-recompute by measured costs, retention on some
// prompts), with cancellations from another thread: every request ends exactly once, the ones
// that finish equal the oracle and the cancelled ones are prefixes of it, and afterwards no
// device block, swap slot or queued write is left and flash stays within its budget.
TEST_P(KvTiersTest, RandomWorkloadWithCancellationsKeepsEveryTierConsistent) {
  std::mt19937 gen(static_cast<uint32_t>(seed_));
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 3; ++i) prefixes.push_back(RandomTokens(gen, 32));
  struct Req {
    GenerateRequest g;
    std::vector<int32_t> oracle;
  };
  std::vector<Req> reqs(40);
  auto plain = MakeEngine(model_, {}, 128);
  // The first kLong requests are never cancelled and each grows to 4 blocks (40 prompt tokens,
  // 20 outputs): together 32 blocks against a 16-block pool, so preemption happens by
  // construction, whatever the cancellations and the CPU's speed.
  constexpr size_t kLong = 8;
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerateRequest& g = reqs[i].g;
    if (i < kLong) {
      g.prompt = RandomTokens(gen, 40);
      g.max_tokens = 20;
      reqs[i].oracle = RunAlone(plain.get(), g.prompt, g.max_tokens).tokens;
      continue;
    }
    if (i % 4 != 3) g.prompt = prefixes[i % 3];
    for (int32_t tok : RandomTokens(gen, 1 + static_cast<int>(gen() % 30))) g.prompt.push_back(tok);
    g.max_tokens = 1 + static_cast<int32_t>(gen() % 20);
    if (i % 5 == 0) g.retain_seconds = 60;
    reqs[i].oracle = RunAlone(plain.get(), g.prompt, g.max_tokens).tokens;
  }
  const std::string dir = FreshDir();
  const uint64_t block_bytes = KvLayoutFor(model_.config, 1, 16, DType::kF32).BlockBytes();
  KvTierConfig t;
  t.host_bytes = 6 * block_bytes;
  t.flash_dir = dir;
  t.flash_bytes = 12 * (block_bytes + FlashRecordHeader::kBytes);
  // Under the copy-engine emulation every preemption swaps, to exercise the swap copies.
  if (GetParam()) t.preemption = PreemptionMode::kSwap;
  EngineConfig ec;
  ec.num_kv_blocks = 16;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_tokens_per_step = 64;
  ec.kv_tiers = t;
  auto created = Engine::Create(ec, model_.weights.get(), &model_.backend);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine* e = created->get();

  std::mutex mu;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, RequestEvent> finals;
  std::map<uint64_t, int> final_count;
  // The first 16 requests are queued before the loop starts, so the 16-block pool is short at
  // once whatever the CPU's speed (preemption does not hang on racing the submissions).
  std::vector<uint64_t> ids;
  for (const Req& r : reqs) {
    if (ids.size() == 16) e->Start();
    auto id = e->Submit(r.g, [&](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      auto& v = tokens[ev.request_id];
      v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        finals[ev.request_id] = ev;
        ++final_count[ev.request_id];
      }
    });
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    if (ids.size() > kLong && gen() % 4 == 0) {  // cancel an earlier request, which may be waiting, running or swapped out
      std::this_thread::sleep_for(std::chrono::microseconds(gen() % 3000));
      e->Cancel(ids[kLong + gen() % (ids.size() - kLong)]);
    }
  }
  for (int waited = 0; waited < 6000; ++waited) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (finals.size() == ids.size()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  e->Stop();
  e->WaitForTransfers();
  int cancelled = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(final_count[ids[i]], 1) << "request " << i << " must end exactly once (seed " << seed_ << ")";
    const RequestEvent& ev = finals[ids[i]];
    const auto& got = tokens[ids[i]];
    if (ev.reason == FinishReason::kCancelled) {
      ++cancelled;
      ASSERT_LE(got.size(), reqs[i].oracle.size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), reqs[i].oracle.begin())) << "request " << i << " seed " << seed_;
    } else {
      EXPECT_EQ(ev.reason, FinishReason::kLength);
      EXPECT_EQ(got, reqs[i].oracle) << "request " << i << " seed " << seed_;
    }
  }
  const EngineStats s = e->GetStats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.tiers.host.swap_blocks, 0) << "swap space leaked";
  EXPECT_EQ(s.tiers.host.pending_writes, 0);
  EXPECT_LE(s.tiers.flash.bytes, t.flash_bytes);
  EXPECT_GT(s.preemptions, 0) << "the pool was meant to be small enough to preempt";
  EXPECT_TRUE(e->CheckAccounting());
  std::printf("random tiers workload (seed %llu): %d cancelled, %lld preemptions, %lld swaps, %lld demoted, "
              "%lld promoted from DDR, %lld from flash, %lld flash writes\n",
              static_cast<unsigned long long>(seed_), cancelled, static_cast<long long>(s.preemptions),
              static_cast<long long>(s.swaps), static_cast<long long>(s.tiers.demoted),
              static_cast<long long>(s.tiers.promoted_ddr), static_cast<long long>(s.tiers.promoted_flash),
              static_cast<long long>(s.tiers.flash.writes));
  created->reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Copies, KvTiersTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DeferredCopyEngine" : "Synchronous"; });

}  // namespace
}  // namespace moeserve::kv_tiers_test
