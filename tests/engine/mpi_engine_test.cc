// The engine over ranks that are processes (ctest starts it under `mpirun --oversubscribe -np N`
// with --ep E --pp P, N = E x P): rank 0 runs three engines on the same random model (fresh
// seed, chosen by rank 0 and shared) and the same mixed requests (shared prefixes, chunked
// prefills beside decodes, a sampled request, one asking for logprobs): one rank (the oracle),
// the layout as threads of rank 0, and the layout over the job's processes, each of which reads
// only its own shard of the weights. The processes'
// output equals one rank's token for token (and logprob for logprob), and the traffic the
// processes record equals the in-process ranks', byte for byte. The other ranks serve steps.
// With --deepseek the model is DeepSeek-V3's shape (latent attention, a dense first layer).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/weight_init.h"
#include "parallel/mpi_world.h"
#include "tests/engine/mpi_engine_fixture.h"

namespace moeserve::mpi_engine {
namespace {

struct Output {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t a2a_bytes = 0, pp_bytes = 0;
  int64_t eplb_rearrangements = 0, eplb_experts_copied = 0, eplb_failures = 0;
  std::vector<RankLayout> layout;  // rank 0's record of every rank at the end
};

std::vector<GenerateRequest> MakeRequests(uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<GenerateRequest> reqs(20);
  std::vector<int32_t> shared(20);
  for (auto& t : shared) t = static_cast<int32_t>(gen() % 256);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 0) reqs[i].prompt = shared;
    const int extra = 1 + static_cast<int>(gen() % 40);
    for (int j = 0; j < extra; ++j) reqs[i].prompt.push_back(static_cast<int32_t>(gen() % 256));
    reqs[i].max_tokens = 1 + static_cast<int32_t>(gen() % 12);
  }
  reqs[4].sampling.temperature = 0.8f;  // sampled on the last stage's device
  reqs[4].sampling.top_p = 0.9f;
  reqs[7].top_logprobs = 3;  // the logits come back to rank 0
  reqs[9].sampling.repetition_penalty = 1.5f;  // logit edits travel in the step message
  reqs[9].sampling.frequency_penalty = 0.5f;
  reqs[10].sampling.logit_bias = {{17, 6.0f}, {90, -6.0f}};
  reqs[10].stop_ids = {17};
  reqs[10].min_tokens = reqs[10].max_tokens / 2;
  return reqs;
}

// `processes`: the ranks are the job's processes (null: threads).
// `release`: free the staging copy once the engine exists, as serve does under mpirun.
Output RunEngine(const EngineConfig& ec, const ModelConfig& config, uint32_t seed,
                 const std::vector<GenerateRequest>& reqs, ProcessRanks* processes = nullptr, bool release = false) {
  Output out;
  auto parts = MakeRankParts(ec, config, seed, DType::kBF16, /*deferred=*/false, processes);
  EXPECT_TRUE(parts.ok()) << parts.status();
  if (!parts.ok()) return out;
  auto e = Engine::Create(ec, parts->weights.get(), parts->backend.get(), std::move(parts->ranks));
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return out;
  if (release) parts->weights->ReleaseTensors();
  std::mutex mu;
  std::map<uint64_t, size_t> index;
  out.tokens.resize(reqs.size());
  out.logprobs.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = (*e)->Submit(reqs[i], [&, i](const RequestEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      out.tokens[i].insert(out.tokens[i].end(), ev.tokens.begin(), ev.tokens.end());
      for (const auto& top : ev.logprobs) {
        for (const TokenLogprob& t : top) out.logprobs[i].push_back(t.logprob);
      }
      EXPECT_NE(ev.reason, FinishReason::kError) << ev.message;
    });
    EXPECT_TRUE(id.ok()) << id.status();
  }
  EXPECT_TRUE((*e)->RunUntilIdle().ok());
  EXPECT_TRUE((*e)->CheckAccounting());
  const EngineStats stats = (*e)->GetStats();
  for (const StepRecord& s : stats.recent_steps) out.a2a_bytes += s.comm_bytes_observed;
  out.eplb_rearrangements = stats.eplb_rearrangements;
  out.eplb_experts_copied = stats.eplb_experts_copied;
  out.eplb_failures = stats.eplb_failures;
  if ((*e)->parallel() != nullptr) out.layout = (*e)->parallel()->layout();
  return out;
}

TEST(MpiEngineTest, OutputAndTrafficEqualOneRankAndInProcessRanks) {
  Job& job = TheJob();
  MpiWorld* world = job.world;
  ASSERT_EQ(world->size(), job.ep * job.pp);
  // A fresh seed from rank 0, the same on every rank.
  auto seeds = world->AllGather(static_cast<double>(std::random_device{}() % 1000000));
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  const uint32_t seed = static_cast<uint32_t>((*seeds)[0]);
  const ModelConfig config = TestModel();
  const EngineConfig processes = MakeConfig(job.ep, job.pp);
  if (world->rank() != 0) {
    auto parts = MakeRankParts(processes, config, seed, DType::kBF16, /*deferred=*/false, world);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_TRUE(parts->ranks->ServeSteps().ok());
    return;
  }
  const auto reqs = MakeRequests(seed + 1);
  const Output want = RunEngine(MakeConfig(1, 1), config, seed, reqs);
  const Output threads = RunEngine(MakeConfig(job.ep, job.pp), config, seed, reqs);
  const Output got = RunEngine(processes, config, seed, reqs, world);
  const std::string name = absl::StrCat("ep", job.ep, " pp", job.pp, " (seed ", seed, ")");
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << name << " request " << i;
    if (reqs[i].stop_ids.empty()) {
      EXPECT_EQ(got.tokens[i].size(), static_cast<size_t>(reqs[i].max_tokens)) << name << " request " << i;
    }
    EXPECT_EQ(got.logprobs[i], want.logprobs[i]) << name << " request " << i;
  }
  EXPECT_FALSE(got.logprobs[7].empty());
  EXPECT_GT(got.a2a_bytes, 0) << name;
  EXPECT_EQ(got.a2a_bytes, threads.a2a_bytes)
      << name << ": bytes between ranks, processes vs threads";
}

// Re-placing the experts every two steps (--eplb-interval) over process ranks, each reading the
// experts it gains from the checkpoint (here the same random weights) with the staging copy
// freed: every layer is staged on every process, then committed, and the output equals one
// rank's token for token. Rank 1's first read finds other weights: the digest check refuses
// them, that layer is dropped on every rank, and the next re-placement goes through.
TEST(MpiEngineTest, RePlacingExpertsOverProcessRanksEqualsOneRank) {
  Job& job = TheJob();
  MpiWorld* world = job.world;
  if (job.ep < 2) GTEST_SKIP() << "re-placing experts needs --ep 2 or more";
  auto seeds = world->AllGather(static_cast<double>(std::random_device{}() % 1000000));
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  const uint32_t seed = static_cast<uint32_t>((*seeds)[0]);
  const ModelConfig config = TestModel();
  EngineConfig processes = MakeConfig(job.ep, job.pp);
  processes.parallel.eplb_interval = 2;
  processes.parallel.eplb_window = 3;
  if (world->rank() != 0) {
    auto parts = MakeRankParts(processes, config, seed, DType::kBF16, /*deferred=*/false, world,
                               /*fail_first_read=*/true);
    ASSERT_TRUE(parts.ok()) << parts.status();
    parts->weights->ReleaseTensors();
    EXPECT_TRUE(parts->ranks->ServeSteps().ok());
    return;
  }
  const auto reqs = MakeRequests(seed + 2);
  const Output want = RunEngine(MakeConfig(1, 1), config, seed, reqs);
  const Output got = RunEngine(processes, config, seed, reqs, world, /*release=*/true);
  const std::string name = absl::StrCat("ep", job.ep, " pp", job.pp, " (seed ", seed, ")");
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << name << " request " << i;
    EXPECT_EQ(got.logprobs[i], want.logprobs[i]) << name << " request " << i;
  }
  EXPECT_EQ(got.eplb_failures, 1) << name << ": rank 1's read of other weights";
  // Rank 0's record of each rank's weight bytes (its own, and the workers' from their commit
  // replies) is what loading that rank's shard with its final experts afresh takes: nothing
  // dropped is kept, nothing counted twice.
  CpuBackend fresh;
  for (const RankLayout& l : got.layout) {
    auto w = ModelWeights::Load(config, *GenerateRandomWeights(config, seed, DType::kF32), &fresh, DType::kBF16,
                                WeightShard{l.layer_begin, l.layer_end, l.experts});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(l.weight_bytes, static_cast<double>((*w)->total_bytes())) << name << " rank " << l.rank;
  }
  EXPECT_GE(got.eplb_rearrangements, 1) << name;
  EXPECT_GT(got.eplb_experts_copied, 0) << name;
}

TEST(MpiEngineTest, ALayoutThatIsNotTheJobIsRefusedOnEveryRank) {
  Job& job = TheJob();
  ParallelConfig p;
  p.ep = job.ep * job.pp + 1;
  ModelConfig config = TestModel();
  config.num_local_experts = 64;
  const absl::Status s = p.Validate(config, job.world->size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(absl::StrCat("mpirun started ", job.world->size(), " processes")),
            std::string::npos)
      << s;
  p.ep = job.ep;
  p.pp = job.pp;
  config.num_local_experts = job.ep - 1;
  if (job.ep > 1) {
    EXPECT_EQ(p.Validate(config, job.world->size()).code(), absl::StatusCode::kInvalidArgument)
        << "more EP ranks than experts";
  }
}

}  // namespace
}  // namespace moeserve::mpi_engine

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = moeserve::MpiWorld::Init();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", std::string(world.status().message()).c_str());
    return 1;
  }
  moeserve::mpi_engine::Job& job = moeserve::mpi_engine::TheJob();
  job.world = world->get();
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--ep") job.ep = std::atoll(argv[i + 1]);
    if (std::string(argv[i]) == "--pp") job.pp = std::atoll(argv[i + 1]);
  }
  for (int i = 1; i < argc; ++i) job.deepseek = job.deepseek || std::string(argv[i]) == "--deepseek";
  // Only rank 0 reports; the workers' failures show in its results and in the exit code.
  if (job.world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  world->reset();
  return rc;
}
