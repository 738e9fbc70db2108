// Expert parallelism and pipeline stages against one rank: the executor's logits for a random
// mixed batch equal the single-rank forward's (max-abs and relative error reported), and a
// batch of mixed requests through the engine gives token for token the same greedy output
// with --ep 2, --ep 4, --pp 2, --ep 2 --pp 2 (and round-robin, balanced and replicated placements,
// uneven stages, more micro-batches, a shared expert) as on one rank, and over NCCL where GPUs
// exist. parallel_layout_test.cc has the placement and sharding tests, parallel_tiers_test.cc
// KV tiers and failures under every layout.
#include "tests/engine/parallel_fixture.h"

namespace moeserve::parallel_test {
namespace {

// One forward of a random batch: 5 sequences mixing prefill chunks and decodes.
TEST_P(ParallelTest, ExecutorLogitsEqualOneRank) {
  std::mt19937 gen(seed_);
  const int64_t block = 8, blocks = 64;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  std::vector<int64_t> lens(5);
  for (auto& len : lens) len = 1 + static_cast<int64_t>(gen() % 40);
  const int64_t experts = config_.num_local_experts;
  auto Copies = [&](int64_t ep) { return FewestCopies(experts, ep); };
  for (const Layout& l : std::vector<Layout>{{2, 1},
                                             {4, 1},
                                             {1, 2},
                                             {2, 2},
                                             {4, 1, ExpertPlacement::kRoundRobin},
                                             {4, 1, ExpertPlacement::kBalanced},
                                             {2, 2, ExpertPlacement::kBalanced},
                                             {2, 2, ExpertPlacement::kContiguous, 3},
                                             {4, 1, ExpertPlacement::kBalanced, 0, Copies(4)},
                                             {2, 2, ExpertPlacement::kBalanced, 0, Copies(2)},
                                             {4, 1, ExpertPlacement::kBalanced, 0, Copies(4), 2},
                                             {4, 1, ExpertPlacement::kContiguous, 0, 0, 2},
                                             {2, 2, ExpertPlacement::kContiguous, 0, 0, 2}}) {
    // The same tokens, blocks placed in the segments of this layout's EP ranks; the oracle is
    // one rank on the same step.
    const ForwardInput in = MakeStep(config_, blocks, block, l.ep, lens, seed_);
    ForwardStats one;
    const std::vector<float> want = OneRankLogits(in, layout, &one);
    ASSERT_FALSE(want.empty());
    auto x = ParallelExecutor::Create(ToConfig(l, &config_), weights_.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(x.ok()) << x.status();
    std::vector<float> got;
    ForwardStats fs;
    ParallelStepStats ps;
    const absl::Status st = (*x)->Forward(in, &got, &fs, &ps);
    ASSERT_TRUE(st.ok()) << Name(l) << ": " << st;
    ASSERT_EQ(got.size(), want.size());
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i]) && std::isfinite(want[i])) << Name(l) << " logit " << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - want[i]));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    }
    // Same kernels, same order per row: equal up to float rounding (in practice bit for bit).
    EXPECT_LE(max_abs, 1e-5 * std::max(1.0, max_ref))
        << Name(l) << ": max-abs " << max_abs << ", relative " << max_abs / max_ref << " (seed "
        << seed_ << ")";
    if (l.ep > 1) {
      int64_t rows = 0;
      for (int64_t r : ps.expert_tokens) rows += r;
      // Every (token, slot) assignment of every layer was computed by exactly one expert.
      EXPECT_EQ(rows, in.num_tokens() * config_.num_experts_per_tok *
                          (config_.num_hidden_layers - config_.num_dense_layers()))
          << Name(l);
      EXPECT_GE(ps.expert_imbalance, 1.0);
      // The ranks' routing adds up to one rank's, and the EP imbalance is each layer's busiest
      // rank under this layout's placement, from that one-rank routing.
      EXPECT_EQ(fs.layer_expert_rows, one.layer_expert_rows) << Name(l);
      // (A replicated layout splits an expert's rows by sender, which the one-rank counts do not
      // show: its rows add up above.)
      if (l.replicas == 0) {
        const ExpertHolderTable holders = ToConfig(l, &config_).Holders(config_);
        double busiest = 0, mean = 0, busiest_hits = 0, mean_hits = 0;
        for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
          std::vector<double> per_rank(static_cast<size_t>(l.ep), 0.0), hits(static_cast<size_t>(l.ep), 0.0);
          for (int64_t e = 0; e < experts; ++e) {
            const int64_t rows = one.layer_expert_rows[layer * experts + e];
            const int32_t owner = holders[layer][e][0];
            per_rank[static_cast<size_t>(owner)] += static_cast<double>(rows);
            hits[static_cast<size_t>(owner)] += rows > 0 ? 1.0 : 0.0;
          }
          busiest += *std::max_element(per_rank.begin(), per_rank.end());
          busiest_hits += *std::max_element(hits.begin(), hits.end());
          for (double x : per_rank) mean += x / static_cast<double>(l.ep);
          for (double x : hits) mean_hits += x / static_cast<double>(l.ep);
        }
        EXPECT_NEAR(ps.rank_imbalance, busiest / mean, 1e-12) << Name(l);
        // The experts each rank computed (the weights it read), the same way.
        EXPECT_NEAR(ps.rank_hit_imbalance, busiest_hits / mean_hits, 1e-12) << Name(l);
      }
      EXPECT_GT(ps.a2a_bytes, 0);
      // Every rank spends some time in the all-to-alls; the least-waiting one no more than the slowest.
      EXPECT_GT(ps.comm_min_seconds, 0) << Name(l);
      EXPECT_LE(ps.comm_min_seconds, ps.comm_seconds) << Name(l);
      // The exchanges once every rank had arrived: some time, and no more than all the ranks'
      // time in collectives together.
      EXPECT_GT(ps.comm_after_last_seconds, 0) << Name(l);
      EXPECT_LE(ps.comm_after_last_seconds, ps.comm_seconds * static_cast<double>(l.ep * l.pp)) << Name(l);
    }
    if (l.pp > 1) {
      EXPECT_GT(ps.pp_bytes, 0) << Name(l);
    }
    // Domains of 2 ranks: at ep 4 the all-to-all crosses between the two domains (but not all of
    // it); at ep 2 x pp 2 each stage's EP group is one domain and every hand-off crosses.
    if (l.domain == 2 && l.ep == 4) {
      EXPECT_GT(ps.a2a_outside_bytes, 0) << Name(l);
      EXPECT_LT(ps.a2a_outside_bytes, ps.a2a_bytes) << Name(l);
    } else if (l.domain == 2) {
      EXPECT_EQ(ps.a2a_outside_bytes, 0) << Name(l);
      EXPECT_EQ(ps.pp_outside_bytes, ps.pp_bytes) << Name(l);
    } else {
      EXPECT_EQ(ps.a2a_outside_bytes + ps.pp_outside_bytes, 0) << Name(l) << ": one domain";
    }
  }
}

// The engine with each layout: 24 mixed requests, greedy, against one rank.
// Where the expert GEMMs round their activations to bf16 (the avx512-bf16 and AMX kernels with
// bf16 or FP8 experts), the rows go to the experts as bf16: the logits are bit for bit the fp32
// wire's (and the one rank's), and the all-to-all carries exactly 2 bytes less per hidden value
// of every row routed to another rank.
TEST_P(ParallelTest, RowsTravelAsBf16WhereTheExpertsRoundThemAnyway) {
  if (!CpuBackend().RoundsActivationsToBf16(storage_)) {
    GTEST_SKIP() << "this CPU's kernels do not round activations to bf16 (cpuid: no avx512_bf16 or amx_bf16)";
  }
  const int64_t block = 8, blocks = 64;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  const ForwardInput in = MakeStep(config_, blocks, block, 2, {9, 17, 4}, seed_);
  const std::vector<float> want = OneRankLogits(in, layout);
  std::vector<float> logits[2];
  int64_t bytes[2] = {0, 0};
  for (int wire = 0; wire < 2; ++wire) {  // 0: fp32 rows (--fp32-dispatch); 1: bf16 rows
    ParallelConfig p = ToConfig({2, 1});
    p.bf16_dispatch = wire == 1;
    auto x = ParallelExecutor::Create(p, weights_.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ((*x)->bf16_dispatch(), wire == 1);
    ForwardStats fs;
    ParallelStepStats ps;
    ASSERT_TRUE((*x)->Forward(in, &logits[wire], &fs, &ps).ok());
    bytes[wire] = ps.a2a_bytes;
  }
  ASSERT_EQ(logits[1].size(), want.size());
  EXPECT_EQ(0, std::memcmp(logits[1].data(), logits[0].data(), want.size() * sizeof(float)))
      << "bf16 rows changed the logits (seed " << seed_ << ")";
  EXPECT_EQ(0, std::memcmp(logits[1].data(), want.data(), want.size() * sizeof(float)))
      << "bf16 rows differ from one rank (seed " << seed_ << ")";
  const int64_t saved = bytes[0] - bytes[1], row = 2 * config_.hidden_size;
  EXPECT_GT(saved, 0);
  EXPECT_EQ(saved % row, 0) << saved << " bytes saved is not a whole number of rows of " << row << " bytes";
  // Of every routed row's 4 + 8h bytes (its expert id, the row out, its result back), 2h.
  const double share = static_cast<double>(saved) / static_cast<double>(bytes[0]);
  EXPECT_GT(share, 0.2) << bytes[1] << " bytes with bf16 rows, " << bytes[0] << " with fp32";
  EXPECT_LE(share, 0.25) << bytes[1] << " bytes with bf16 rows, " << bytes[0] << " with fp32";
}

TEST_P(ParallelTest, EngineGreedyOutputEqualsOneRank) {
  std::mt19937 gen(seed_ + 1);
  std::vector<GenerateRequest> reqs(24);
  std::vector<int32_t> shared(20);
  for (auto& t : shared) t = static_cast<int32_t>(gen() % 256);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 0) reqs[i].prompt = shared;
    const int extra = 1 + static_cast<int>(gen() % 40);
    for (int j = 0; j < extra; ++j) reqs[i].prompt.push_back(static_cast<int32_t>(gen() % 256));
    reqs[i].max_tokens = 1 + static_cast<int32_t>(gen() % 12);
    // Logit edits travel with their rows into each rank's sub-step.
    if (i % 4 == 1) {
      reqs[i].sampling.repetition_penalty = 1.5f;
      reqs[i].sampling.frequency_penalty = 0.7f;
      reqs[i].sampling.presence_penalty = 0.4f;
    } else if (i % 4 == 2) {
      reqs[i].sampling.logit_bias = {{static_cast<int32_t>(gen() % 256), 8.0f}};
      reqs[i].stop_ids = {reqs[i].sampling.logit_bias[0].first};
      reqs[i].min_tokens = reqs[i].max_tokens / 2;
    }
  }
  auto run = [&](const Layout& l) {
    EngineConfig ec;
    ec.num_kv_blocks = 200;
    ec.block_size = 8;
    ec.scheduler.max_tokens_per_step = 48;  // chunked prefill mixes with decodes
    ec.parallel = ToConfig(l, &config_);
    // With several ranks, shard a copy of its own and free it once the ranks hold their
    // shards, as serve and bench do: the engine must not need it afterwards.
    std::unique_ptr<ModelWeights> staged;
    size_t staged_alloc = 0;  // what the copy occupies on the backend, as allocated (rounded)
    if (l.ep * l.pp > 1) {
      const size_t before = backend_.used_bytes();
      staged = *ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32),
                                   &backend_, storage_);
      staged_alloc = backend_.used_bytes() - before;
    }
    auto e = MakeEngine(ec, staged ? staged.get() : weights_.get(), &backend_);
    EXPECT_TRUE(e.ok()) << e.status();
    if (staged) {
      const size_t with_copy = backend_.used_bytes();
      staged->ReleaseTensors();
      EXPECT_EQ(backend_.used_bytes(), with_copy - staged_alloc)
          << Name(l) << ": the staging copy is freed";
      EXPECT_TRUE(staged->released());
      EXPECT_EQ(MakeEngine(ec, staged.get(), &backend_).status().code(),
                absl::StatusCode::kFailedPrecondition)
          << "a released copy cannot start another engine";
    }
    std::mutex mu;
    std::map<uint64_t, std::vector<int32_t>> out;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {
      auto id = (*e)->Submit(r, [&](const RequestEvent& ev) {
        std::lock_guard<std::mutex> lock(mu);
        auto& v = out[ev.request_id];
        v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
      });
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    EXPECT_TRUE((*e)->RunUntilIdle().ok());
    EXPECT_TRUE((*e)->CheckAccounting());
    std::vector<std::vector<int32_t>> result;
    for (uint64_t id : ids) result.push_back(out[id]);
    if (l.ep * l.pp > 1) {
      const auto steps = (*e)->GetStats().recent_steps;
      int64_t comm = 0;
      for (const auto& s : steps) {
        comm += s.comm_bytes_observed;
        if (l.ep > 1) {
          // Every step records its tokens per expert: top-k rows per token and layer in all.
          int64_t rows = 0;
          for (int64_t r : s.expert_tokens) rows += r;
          EXPECT_EQ(rows, s.num_tokens * config_.num_experts_per_tok *
                              (config_.num_hidden_layers - config_.num_dense_layers()))
              << Name(l);
          EXPECT_GE(s.expert_imbalance, 1.0) << Name(l);
        }
      }
      EXPECT_GT(comm, 0) << Name(l) << ": no communication recorded";
    }
    return result;
  };
  const auto want = run({1, 1});
  for (const Layout& l : std::vector<Layout>{{2, 1},
                                             {4, 1},
                                             {1, 2},
                                             {2, 2},
                                             {2, 1, ExpertPlacement::kRoundRobin},
                                             {2, 2, ExpertPlacement::kBalanced},
                                             {2, 1, ExpertPlacement::kBalanced, 0, 2 + config_.num_local_experts % 2},
                                             {1, 2, ExpertPlacement::kContiguous, 4}}) {
    const auto got = run(l);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << Name(l) << " request " << i << " (seed " << seed_ << ")";
    }
  }
}

#if MOESERVE_HAVE_CUDA
// NCCL ranks, one GPU each (CUDA backends), against one CPU rank on the same step. bf16 weights:
// the GPU rounds activations to bf16 before each GEMM, hence the 3e-2 relative tolerance.
TEST_P(ParallelTest, NcclRanksOnGpusMatchOneCpuRank) {
  const int gpus = static_cast<int>(cuda::ListDevices().size());
  if (gpus < 2) GTEST_SKIP() << "needs two or more GPUs, found " << gpus;
  if (config_.deepseek_moe() || storage_ == DType::kF8E4M3) {
    GTEST_SKIP() << "the CUDA backend does not implement latent attention, grouped routing or FP8 weights";
  }
  std::mt19937 gen(seed_);
  const int64_t block = 8, blocks = 64;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  std::vector<int64_t> lens(5);
  for (auto& len : lens) len = 1 + static_cast<int64_t>(gen() % 40);
  std::vector<Layout> layouts = {{2, 1}, {1, 2}};
  if (gpus >= 4) layouts.push_back({2, 2, ExpertPlacement::kContiguous, 3});
  for (const Layout& l : layouts) {
    const ForwardInput in = MakeStep(config_, blocks, block, l.ep, lens, seed_);
    ForwardStats one;
    const std::vector<float> want = OneRankLogits(in, layout, &one);
    ASSERT_FALSE(want.empty());
    ParallelConfig config = ToConfig(l);
    for (int r = 0; r < l.ep * l.pp; ++r) config.nccl_devices.push_back(r);
    auto x = ParallelExecutor::Create(config, weights_.get(), &backend_, layout, [](int rank, int) {
      CudaBackendOptions o;
      o.device = rank;
      auto b = CudaBackend::Create(o);
      return b.ok() ? std::unique_ptr<Backend>(std::move(*b)) : nullptr;
    });
    ASSERT_TRUE(x.ok()) << Name(l) << ": " << x.status();
    std::vector<float> got;
    ParallelStepStats ps;
    const absl::Status st = (*x)->Forward(in, &got, nullptr, &ps);
    ASSERT_TRUE(st.ok()) << Name(l) << ": " << st;
    ASSERT_EQ(got.size(), want.size());
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << Name(l) << " logit " << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - want[i]));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    }
    EXPECT_LE(max_abs, 3e-2 * std::max(1.0, max_ref))
        << Name(l) << ": max-abs " << max_abs << ", relative " << max_abs / max_ref << " (seed "
        << seed_ << ")";
    EXPECT_GT(ps.comm_bytes, 0) << Name(l);
  }
}
#endif

}  // namespace

INSTANTIATE_TEST_SUITE_P(Models, ParallelTest, ::testing::Range(0, 9),
                         [](const auto& info) { return kModelNames[info.param]; });

}  // namespace moeserve::parallel_test
