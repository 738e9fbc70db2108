// The parallel layouts under pressure: KV tiers (preemption to DDR, flash, prefixes brought back
// into the right EP rank's stages) give one rank's tokens; a rank failing mid-step aborts the
// step without hanging its peers; a sequence whose blocks span two EP segments is refused.
// (Instantiated for every model in parallel_test.cc.)
#include "tests/engine/parallel_fixture.h"

namespace moeserve::parallel_test {
namespace {

// KV tiers under every layout: a tight pool (preemptions swap to DDR), a small DDR over flash,
// and the first prompts asked again after the pool has moved on, so their prefixes come back
// from DDR or flash into the pieces of the right EP rank's stages. Each rank's backend emulates
// an asynchronous copy engine (CpuBackendOptions::defer_copies), so a missing wait or ordering
// on any device shows. The output equals one rank without tiers, token for token.
TEST_P(ParallelTest, KvTiersWorkUnderEveryLayout) {
  std::mt19937 gen(seed_ + 2);
  std::vector<GenerateRequest> reqs(16);
  for (auto& r : reqs) {
    const int len = 20 + static_cast<int>(gen() % 21);
    for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 8;
  }
  for (int i = 0; i < 4; ++i) reqs.push_back(reqs[i]);  // asked again at the end
  const uint64_t block_bytes = KvLayoutFor(config_, 1, 8, DType::kF32).BlockBytes();
  auto run = [&](const Layout& l, bool tiers, EngineStats* stats, int64_t* lower_tier_tokens) {
    const std::string dir =
        (std::filesystem::temp_directory_path() /
         ("moeserve_ptiers_" + std::to_string(getpid()) + "_" + std::to_string(seed_)))
            .string();
    std::filesystem::remove_all(dir);
    EngineConfig ec;
    ec.block_size = 8;
    ec.num_kv_blocks = tiers ? 24 : 400;
    ec.scheduler.max_num_seqs = 8;
    ec.parallel = ToConfig(l);
    const BackendFactory deferred = [](int, int) -> std::unique_ptr<Backend> {
      CpuBackendOptions o;
      o.num_threads = 1;
      o.defer_copies = true;
      return std::make_unique<CpuBackend>(o);
    };
    if (tiers) {
      ec.kv_tiers.host_bytes = 10 * block_bytes;
      ec.kv_tiers.flash_dir = dir;
      ec.kv_tiers.preemption = PreemptionMode::kSwap;
    }
    auto e = MakeEngine(ec, weights_.get(), &backend_, deferred);
    EXPECT_TRUE(e.ok()) << Name(l) << ": " << e.status();
    if (!e.ok()) return std::vector<std::vector<int32_t>>();
    std::map<uint64_t, std::vector<int32_t>> out;
    std::vector<uint64_t> ids;
    auto submit = [&](size_t from, size_t to) {
      for (size_t i = from; i < to; ++i) {
        auto id = (*e)->Submit(reqs[i], [&](const RequestEvent& ev) {
          auto& v = out[ev.request_id];
          v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
          if (ev.finished) {
            *lower_tier_tokens +=
                ev.usage.cached_prompt_tokens_ddr + ev.usage.cached_prompt_tokens_flash;
          }
        });
        EXPECT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
      }
      EXPECT_TRUE((*e)->RunUntilIdle().ok());
      (*e)->WaitForTransfers();
    };
    submit(0, 16);   // all at once: the tight pool preempts
    submit(16, 20);  // the first four again, one pool's worth of other KV later
    EXPECT_TRUE((*e)->CheckAccounting()) << Name(l);
    *stats = (*e)->GetStats();
    EXPECT_EQ(stats->kv_blocks_used, 0) << Name(l);
    EXPECT_EQ(stats->tiers.host.swap_blocks, 0) << Name(l) << ": swap space leaked";
    std::vector<std::vector<int32_t>> result;
    for (uint64_t id : ids) result.push_back(out[id]);
    e->reset();
    std::filesystem::remove_all(dir);
    return result;
  };
  EngineStats stats;
  int64_t lower = 0;
  const auto want = run({1, 1}, false, &stats, &lower);
  int64_t swaps = 0;
  for (const Layout& l : std::vector<Layout>{{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    int64_t lower_tier_tokens = 0;
    const auto got = run(l, true, &stats, &lower_tier_tokens);
    ASSERT_EQ(got.size(), want.size()) << Name(l);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << Name(l) << " request " << i << " (seed " << seed_ << ")";
    }
    EXPECT_GT(stats.tiers.demoted, 0) << Name(l);
    EXPECT_GT(lower_tier_tokens, 0) << Name(l) << ": no prompt came back from DDR or flash";
    // A sequence preempted after its promotion may promote again on readmission.
    EXPECT_GE(stats.tiers.promoted_ddr + stats.tiers.promoted_flash, lower_tier_tokens / 8)
        << Name(l);
    swaps += stats.tiers.swapped_in;
  }
  EXPECT_GT(swaps, 0) << "the pool was meant to be tight enough to swap";
}

// A rank that fails mid-step (its device cannot grow a workspace) must not hang its peers:
// the step returns the error, and the next step runs normally with the same output as one rank.
TEST_P(ParallelTest, ARankFailingMidStepAbortsTheStepWithoutHanging) {
  const KvLayout layout = KvLayoutFor(config_, 64, 8, DType::kF32);
  // Capacity: what each rank needs at rest plus a little, too little for a 480-token step.
  size_t at_rest = 0;
  {
    auto probe =
        ParallelExecutor::Create(ToConfig({2, 2}), weights_.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(probe.ok());
    for (auto [used, cap] : (*probe)->device_bytes()) at_rest = std::max(at_rest, used);
  }
  const size_t capacity = at_rest + (256 << 10);
  auto x = ParallelExecutor::Create(ToConfig({2, 2}), weights_.get(), &backend_, layout,
                                    [capacity](int, int) -> std::unique_ptr<Backend> {
                                      CpuBackendOptions o;
                                      o.num_threads = 1;
                                      o.capacity_bytes = capacity;
                                      return std::make_unique<CpuBackend>(o);
                                    });
  ASSERT_TRUE(x.ok()) << x.status();
  std::vector<float> logits;
  const ForwardInput big = MakeStep(config_, 64, 8, 2, {120, 120, 120, 120}, seed_);
  const absl::Status failed = (*x)->Forward(big, &logits, nullptr, nullptr);
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_NE(std::string(failed.message()).find("rank "), std::string::npos) << failed;
  // The next step is unaffected: no stale hand-off, no barrier out of step.
  const ForwardInput small = MakeStep(config_, 64, 8, 2, {5, 5}, seed_ + 1);
  const absl::Status next = (*x)->Forward(small, &logits, nullptr, nullptr);
  ASSERT_TRUE(next.ok()) << next;
  auto kv = KvStorage::Create(&backend_, layout);
  MoeModel one(weights_.get(), &backend_);
  std::vector<float> want;
  ASSERT_TRUE(one.Forward(small, layout, kv->data(), &want).ok());
  EXPECT_EQ(logits, want);
}

// A sequence runs on the EP rank whose pool segment holds its blocks; one whose blocks span two
// segments is refused by name before any rank starts, and the next step runs as one rank does.
TEST_P(ParallelTest, ASequenceWhoseBlocksSpanTwoSegmentsIsRefused) {
  const KvLayout layout = KvLayoutFor(config_, 64, 8, DType::kF32);
  auto x = ParallelExecutor::Create(ToConfig({2, 1}), weights_.get(), &backend_, layout, CpuRanks());
  ASSERT_TRUE(x.ok()) << x.status();
  const ForwardInput good = MakeStep(config_, 64, 8, 2, {20, 5}, seed_);
  ForwardInput bad = good;
  bad.block_tables[1] = 32;  // sequence 0's second block, taken from EP rank 1's segment [32, 64)
  std::vector<float> logits;
  const absl::Status refused = (*x)->Forward(bad, &logits, nullptr, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(std::string(refused.message()).find("sequence 0 runs on EP rank 0"), std::string::npos) << refused;
  EXPECT_NE(std::string(refused.message()).find("is 32, outside"), std::string::npos) << refused;
  ASSERT_TRUE((*x)->Forward(good, &logits, nullptr, nullptr).ok());
  auto kv = KvStorage::Create(&backend_, layout);
  MoeModel one(weights_.get(), &backend_);
  std::vector<float> want;
  ASSERT_TRUE(one.Forward(good, layout, kv->data(), &want).ok());
  EXPECT_EQ(logits, want);
}

}  // namespace
}  // namespace moeserve::parallel_test
