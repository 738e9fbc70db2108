// Where the pieces of a parallel layout go: weights sharded to fit capacity-limited devices,
// cache-aware and load-balanced placement of sequences on EP ranks, released and partial weight
// copies, and the refusal of bad layouts. (Instantiated for every model in parallel_test.cc.)
#include "tests/engine/parallel_fixture.h"

namespace moeserve::parallel_test {
namespace {

// Capacity-limited virtual devices: weights that do not fit one device fit when ep4 x pp2
// ranks each hold their shard, and a device too small even for a shard is refused by name.
TEST_P(ParallelTest, ShardsFitDevicesTheWholeModelDoesNot) {
  const size_t total = weights_->total_bytes();
  const KvLayout layout = KvLayoutFor(config_, 16, 8, DType::kF32);
  auto ranks_with = [](size_t capacity) -> BackendFactory {
    return [capacity](int, int) -> std::unique_ptr<Backend> {
      CpuBackendOptions o;
      o.num_threads = 1;
      o.capacity_bytes = capacity;
      return std::make_unique<CpuBackend>(o);
    };
  };
  const size_t capacity = total * 6 / 10;
  {
    CpuBackendOptions o;
    o.capacity_bytes = capacity;
    CpuBackend one(o);
    auto whole = ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32),
                                    &one, storage_);
    EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted)
        << "the whole model fits one device";
  }
  auto x = ParallelExecutor::Create(ToConfig({4, 2}), weights_.get(), &backend_, layout,
                                    ranks_with(capacity));
  ASSERT_TRUE(x.ok()) << x.status();
  double sum = 0;
  for (const RankLayout& l : (*x)->layout()) {
    EXPECT_LT(l.weight_bytes, static_cast<double>(capacity)) << "rank " << l.rank;
    sum += l.weight_bytes;
  }
  EXPECT_GE(sum, static_cast<double>(total) * 0.99) << "every weight is held somewhere";
  for (auto [used, cap] : (*x)->device_bytes()) EXPECT_LE(used, cap);
  auto tiny = ParallelExecutor::Create(ToConfig({2, 1}), weights_.get(), &backend_, layout,
                                       ranks_with(total / 20));
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(tiny.status().message()).find("rank 0"), std::string::npos)
      << tiny.status();
}

// Cache-aware placement: requests that share their first KV block go to the same EP rank, so a
// later one hits the prefix the earlier one left in that rank's pool segment.
TEST_P(ParallelTest, SharedPrefixesMeetOnOneRankAndHitItsCache) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.block_size = 8;
  ec.parallel = ToConfig({2, 1});
  auto e = MakeEngine(ec, weights_.get(), &backend_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::mt19937 gen(seed_);
  std::vector<int32_t> prefix(24);
  for (auto& t : prefix) t = static_cast<int32_t>(gen() % 256);
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    r.prompt = prefix;
    r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 2;
    RequestEvent last;
    ASSERT_TRUE((*e)->Submit(r,
                             [&](const RequestEvent& ev) {
                               if (ev.finished) last = ev;
                             })
                    .ok());
    ASSERT_TRUE((*e)->RunUntilIdle().ok());
    EXPECT_EQ(last.usage.cached_prompt_tokens, i == 0 ? 0 : 24) << "request " << i;
  }
  EXPECT_TRUE((*e)->CheckAccounting());
}


// Placement under --ep 2 when every prompt shares its first block: pure cache affinity puts
// them all on one rank (every step's attention imbalance 2); balancing sends some to the other rank
// once the first is loaded beyond the ratio. Outputs equal one rank either way.
TEST_P(ParallelTest, LoadBalancingSpreadsAPopularPrefixOverTheRanks) {
  std::mt19937 gen(seed_ + 3);
  std::vector<int32_t> shared(8);
  for (auto& t : shared) t = static_cast<int32_t>(gen() % 256);
  std::vector<GenerateRequest> reqs(16);
  for (auto& r : reqs) {
    r.prompt = shared;
    for (int j = 0; j < 8 + static_cast<int>(gen() % 16); ++j)
      r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    r.max_tokens = 6;
  }
  auto run = [&](const Layout& l, double ratio, double* min_attention_imbalance) {
    EngineConfig ec;
    ec.num_kv_blocks = 200;
    ec.block_size = 8;
    ec.scheduler.ep_balance_ratio = ratio;
    ec.parallel = ToConfig(l);
    auto e = MakeEngine(ec, weights_.get(), &backend_);
    EXPECT_TRUE(e.ok()) << e.status();
    std::map<uint64_t, std::vector<int32_t>> out;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {  // all queued before the first step
      auto id = (*e)->Submit(r, [&](const RequestEvent& ev) {
        auto& v = out[ev.request_id];
        v.insert(v.end(), ev.tokens.begin(), ev.tokens.end());
      });
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    EXPECT_TRUE((*e)->RunUntilIdle().ok());
    *min_attention_imbalance = 1e9;
    for (const auto& st : (*e)->GetStats().recent_steps) {
      if (st.num_tokens > 0 && l.ep > 1)
        *min_attention_imbalance = std::min(*min_attention_imbalance, st.attention_imbalance);
    }
    std::vector<std::vector<int32_t>> result;
    for (uint64_t id : ids) result.push_back(out[id]);
    return result;
  };
  double unused = 0, affinity = 0, balanced = 0;
  const auto want = run({1, 1}, 2.0, &unused);
  EXPECT_EQ(run({2, 1}, 0.0, &affinity), want) << "seed " << seed_;
  EXPECT_EQ(run({2, 1}, 2.0, &balanced), want) << "seed " << seed_;
  EXPECT_DOUBLE_EQ(affinity, 2.0) << "pure affinity: every step on one rank";
  EXPECT_LT(balanced, 1.5) << "balancing should bring the second rank in";
}

// A released copy keeps its config and shapes but refuses to run a forward pass.
TEST_P(ParallelTest, ReleasedWeightsRefuseToForward) {
  auto copy = *ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32),
                                  &backend_, storage_);
  copy->ReleaseTensors();
  EXPECT_EQ(copy->config().hidden_size, config_.hidden_size);
  EXPECT_EQ(copy->embed().rows, config_.vocab_size);
  EXPECT_EQ(copy->embed().data, nullptr);
  EXPECT_EQ(copy->total_bytes(), 0u);
  const KvLayout layout = KvLayoutFor(config_, 4, 8, DType::kF32);
  auto kv = KvStorage::Create(&backend_, layout);
  ASSERT_TRUE(kv.ok());
  ForwardInput in;
  in.token_ids = {1};
  in.positions = {0};
  in.token_seq = {0};
  in.slots = {0};
  in.num_seqs = 1;
  in.max_blocks_per_seq = 1;
  in.block_tables = {0};
  in.logit_rows = {0};
  MoeModel model(copy.get(), &backend_);
  std::vector<float> logits;
  const absl::Status s = model.Forward(in, layout, kv->data(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("released"), std::string::npos) << s;
}

// A rank that reads only its shard (process ranks, RankWeightShard) holds the same bytes as the
// shard cut from the whole model, and nothing of the layers and experts of other ranks.
TEST_P(ParallelTest, PartialLoadsReadWhatTheShardHolds) {
  for (const Layout& l :
       std::vector<Layout>{{2, 1}, {1, 2}, {2, 2}, {4, 1, ExpertPlacement::kRoundRobin}, {2, 2, ExpertPlacement::kBalanced}}) {
    const ParallelConfig p = ToConfig(l, &config_);
    CpuBackend merged_backend;
    auto merged_or =
        ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32),
                           &merged_backend, storage_, RankWeightShard(p, config_, 0));
    ASSERT_TRUE(merged_or.ok()) << merged_or.status();
    ModelWeights& merged = **merged_or;
    for (int64_t r = 0; r < l.ep * l.pp; ++r) {
      const WeightShard shard = RankWeightShard(p, config_, r);
      CpuBackend mine;
      auto partial = ModelWeights::Load(
          config_, *GenerateRandomWeights(config_, seed_, DType::kF32), &mine, storage_, shard);
      ASSERT_TRUE(partial.ok()) << partial.status();
      CpuBackend cut_to;
      auto cut = ModelWeights::Shard(*weights_, &backend_, shard, &cut_to);
      ASSERT_TRUE(cut.ok()) << cut.status();
      EXPECT_LT((*partial)->total_bytes(), weights_->total_bytes()) << Name(l) << " rank " << r;
      for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
        const bool in_stage = layer >= shard.layer_begin && layer < shard.layer_end;
        EXPECT_EQ((*partial)->layer(layer).o.data != nullptr, in_stage)
            << Name(l) << " rank " << r << " layer " << layer;
        ASSERT_EQ((*partial)->layer(layer).w13.size(), config_.dense_layer(layer) ? 0 : config_.num_local_experts);
        for (int64_t e = 0; e < static_cast<int64_t>((*partial)->layer(layer).w13.size()); ++e) {
          const bool held =
              in_stage && std::count(shard.experts[static_cast<size_t>(layer - shard.layer_begin)].begin(),
                                     shard.experts[static_cast<size_t>(layer - shard.layer_begin)].end(), e) > 0;
          EXPECT_EQ((*partial)->layer(layer).w13[e].data != nullptr, held)
              << Name(l) << " rank " << r << " expert " << e;
          EXPECT_EQ((*partial)->layer(layer).w13[e].rows, 2 * config_.intermediate_size);
        }
      }
      // A shard cut from a partial copy (what a process rank does) holds the same bytes, and
      // the ranks' digests put together give the whole model's.
      CpuBackend again;
      auto recut = ModelWeights::Shard(**partial, &mine, shard, &again);
      ASSERT_TRUE(recut.ok()) << recut.status();
      EXPECT_EQ((*recut)->total_bytes(), (*cut)->total_bytes());
      merged.MergeTensorDigests((*partial)->tensor_digests());
    }
    EXPECT_EQ(ModelWeights::CombineDigests(merged.tensor_digests()), weights_->content_digest())
        << Name(l);
  }
}

TEST(ParallelConfigTest, BadLayoutsAreRefusedWithTheLimit) {
  const ModelConfig c = *PresetConfig("tiny");
  ParallelConfig p;
  p.ep = 5;
  EXPECT_NE(std::string(p.Validate(c).message()).find("--ep must be in [1, 4]"), std::string::npos);
  p.ep = 1;
  p.pp = 3;
  EXPECT_NE(std::string(p.Validate(c).message()).find("--pp must be in [1, 2]"), std::string::npos);
  p.pp = 2;
  p.nccl_devices = {0, 1, 2};
  EXPECT_NE(std::string(p.Validate(c).message()).find("3 GPUs for 2 NCCL ranks"),
            std::string::npos);
  SchedulerConfig sc;
  sc.ep_balance_ratio = 0.5;
  EXPECT_NE(std::string(sc.Validate().message()).find("--ep-balance"), std::string::npos);
  using L = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(ExpertHolders(2, 8, 2, ExpertPlacement::kContiguous),
            (ExpertHolderTable{L{{0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}}, L{{0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}}}));
  EXPECT_EQ(ExpertHolders(1, 8, 3, ExpertPlacement::kRoundRobin),
            (ExpertHolderTable{L{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}}));
  p.pp = 1;
  p.nccl_devices.clear();
  p.placement = ExpertPlacement::kBalanced;
  EXPECT_NE(std::string(p.Validate(c).message()).find("--expert-placement balanced needs --expert-load"), std::string::npos);
  p.expert_load = std::make_shared<ExpertLoad>(ExpertLoad{c.num_hidden_layers + 1, c.num_local_experts, {}});
  EXPECT_NE(std::string(p.Validate(c).message()).find("--expert-load: recorded for"), std::string::npos)
      << p.Validate(c);
  // Replicas: each expert on at most ep ranks, or with domains once per domain (tiny: 4 experts).
  p.expert_load = std::make_shared<ExpertLoad>(ExpertLoad{
      c.num_hidden_layers, c.num_local_experts, std::vector<int64_t>(static_cast<size_t>(c.num_hidden_layers * c.num_local_experts), 1)});
  p.ep = 4;
  p.expert_replicas = 8;
  EXPECT_TRUE(p.Validate(c).ok()) << p.Validate(c);
  p.domain_size = 2;
  EXPECT_NE(std::string(p.Validate(c).message())
                .find("--expert-replicas must be in [1, 4] (each expert in at most 2 domains of --domain-size 2"),
            std::string::npos)
      << p.Validate(c);
  p.expert_replicas = 4;
  EXPECT_TRUE(p.Validate(c).ok()) << p.Validate(c);
  p.ep = 1, p.domain_size = 0, p.expert_replicas = 0;
  // Re-placing while serving: over EP ranks that are threads; copies then need no recorded load.
  p.eplb_interval = 10;
  EXPECT_NE(std::string(p.Validate(c).message()).find("it needs --ep 2 or more, got --ep 1"), std::string::npos)
      << p.Validate(c);
  p.ep = 2;
  EXPECT_TRUE(p.Validate(c).ok()) << p.Validate(c);
  EXPECT_TRUE(p.Validate(c, 2).ok()) << "under mpirun too: " << p.Validate(c, 2);
  p.placement = ExpertPlacement::kContiguous, p.expert_load = nullptr, p.expert_replicas = 2;
  EXPECT_TRUE(p.Validate(c).ok()) << p.Validate(c);
  // Which start as the balanced placement of even routing.
  const ExpertLoad even{c.num_hidden_layers, c.num_local_experts,
                        std::vector<int64_t>(static_cast<size_t>(c.num_hidden_layers * c.num_local_experts), 1)};
  EXPECT_EQ(p.Holders(c), ExpertHolders(c.num_hidden_layers, c.num_local_experts, 2, ExpertPlacement::kBalanced, &even, 2));
  p.eplb_interval = 0;
  EXPECT_NE(std::string(p.Validate(c).message()).find("--expert-replicas copies the hottest"), std::string::npos);
  p.eplb_interval = -1, p.expert_replicas = 0;
  EXPECT_NE(std::string(p.Validate(c).message()).find("--eplb-interval must be >= 0"), std::string::npos);
  p.ep = 1, p.eplb_interval = 0, p.expert_replicas = 0;
  EXPECT_EQ(StageLayers(5, 2), (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 5}}));
}

}  // namespace
}  // namespace moeserve::parallel_test
