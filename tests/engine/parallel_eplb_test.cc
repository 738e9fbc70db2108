// Re-placing the experts while serving (--eplb-interval; ParallelExecutor::ReplaceExperts): a
// step after a re-placement gives the logits one rank gives for the same two steps (its KV
// written before the switch), the placement is the balanced one wherever that lightens a
// layer's busiest rank, a device too small for the new experts changes nothing, and the engine
// re-placing every few steps answers token for token as one rank. (Instantiated for every
// model in parallel_test.cc.)
#include <cstring>

#include "engine/expert_rebalancer.h"
#include "kernels/weight_layout.h"
#include "tests/engine/parallel_fixture.h"

namespace moeserve::parallel_test {
namespace {

// `in` cut in two steps over the same blocks: every sequence's tokens but its last (the
// sequences of one token are absent from it), then each sequence's last token alone.
std::pair<ForwardInput, ForwardInput> TwoSteps(const ForwardInput& in) {
  std::pair<ForwardInput, ForwardInput> out;
  for (ForwardInput* f : {&out.first, &out.second}) f->max_blocks_per_seq = in.max_blocks_per_seq;
  for (int64_t j = 0; j < in.num_seqs; ++j) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < in.num_tokens(); ++t) {
      if (in.token_seq[t] == j) tokens.push_back(t);
    }
    const std::vector<int64_t> parts[2] = {std::vector<int64_t>(tokens.begin(), tokens.end() - 1), {tokens.back()}};
    for (int k = 0; k < 2; ++k) {
      if (parts[k].empty()) continue;
      ForwardInput& f = k == 0 ? out.first : out.second;
      const auto row = in.block_tables.begin() + j * in.max_blocks_per_seq;
      f.block_tables.insert(f.block_tables.end(), row, row + in.max_blocks_per_seq);
      for (int64_t t : parts[k]) {
        f.token_ids.push_back(in.token_ids[t]);
        f.positions.push_back(in.positions[t]);
        f.token_seq.push_back(static_cast<int32_t>(f.num_seqs));
        f.slots.push_back(in.slots[t]);
      }
      f.logit_rows.push_back(static_cast<int32_t>(f.token_ids.size() - 1));
      ++f.num_seqs;
    }
  }
  return out;
}

// A skewed routing: a few experts of each MoE layer take most tokens, experts 0 and 1 (one
// rank's under the contiguous start, wherever ranks hold two or more) the most.
ExpertLoad SkewedLoad(const ModelConfig& c, uint32_t seed) {
  std::mt19937 gen(seed);
  ExpertLoad load{c.num_hidden_layers, c.num_local_experts, {}};
  for (int64_t i = 0; i < load.layers * load.experts; ++i) {
    const double u = std::uniform_real_distribution<double>(0, 1)(gen);
    const bool dense = c.dense_layer(i / load.experts);  // routes nothing, as a recorded window
    const int64_t hot = i % load.experts < 2 ? 20000 : 0;
    load.tokens.push_back(dense ? 0 : hot + static_cast<int64_t>(1 + 10000 * u * u * u * u));
  }
  return load;
}

// What each rank's shard would hold if copied afresh with the experts its layout names.
std::vector<double> FreshShardBytes(const ParallelExecutor& x, const ModelWeights& full, Backend* from) {
  std::vector<double> out;
  for (const RankLayout& l : x.layout()) {
    CpuBackendOptions o;
    o.num_threads = 1;
    CpuBackend to(o);
    auto w = ModelWeights::Shard(full, from, WeightShard{l.layer_begin, l.layer_end, l.experts}, &to);
    out.push_back(w.ok() ? static_cast<double>((*w)->total_bytes()) : -1);
  }
  return out;
}

std::vector<double> WeightBytes(const ParallelExecutor& x) {
  std::vector<double> out;
  for (const RankLayout& l : x.layout()) out.push_back(l.weight_bytes);
  return out;
}

// What the re-placement must be: per layer, the balanced placement of `load` where it lowers
// that layer's busiest rank, else the current one.
ExpertHolderTable Expected(const ExpertHolderTable& now, const ExpertLoad& load, const ParallelConfig& p) {
  const ExpertHolderTable best = ExpertHolders(load.layers, load.experts, p.ep, ExpertPlacement::kBalanced, &load,
                                               p.expert_replicas, p.EpDomainSize());
  const auto a = RankImbalance(now, load, p.ep), b = RankImbalance(best, load, p.ep);
  ExpertHolderTable out = now;
  for (size_t l = 0; l < out.size(); ++l) {
    if (b[l] < a[l] * (1 - kEplbMinGain)) out[l] = best[l];  // a dense layer's rows are 1 and 1
  }
  return out;
}

TEST_P(ParallelTest, ReplacingExpertsBetweenStepsKeepsTheOutput) {
  std::mt19937 gen(seed_);
  const int64_t block = 8, blocks = 64, experts = config_.num_local_experts;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  std::vector<int64_t> lens(6);
  for (auto& len : lens) len = 2 + static_cast<int64_t>(gen() % 30);
  auto Copies = [&](int64_t ep) { return FewestCopies(experts, ep); };
  for (const Layout& l : std::vector<Layout>{{2, 1}, {4, 1}, {2, 2}, {4, 1, ExpertPlacement::kContiguous, 0, Copies(4)},
                                             {4, 1, ExpertPlacement::kContiguous, 0, Copies(4), 2}}) {
    const auto [first, second] = TwoSteps(MakeStep(config_, blocks, block, l.ep, lens, seed_));
    std::vector<float> want1, want2;
    ASSERT_TRUE(OneRankTwoSteps(first, second, layout, &want1, &want2)) << Name(l);

    ParallelConfig p = ToConfig(l, &config_);
    p.eplb_interval = 1;
    // The ranks are cut from a staging copy that is then freed, as serve and bench do: the
    // experts a rank gains come from the ranks that hold them.
    std::unique_ptr<ModelWeights> staged =
        *ModelWeights::Load(config_, *GenerateRandomWeights(config_, seed_, DType::kF32), &backend_, storage_);
    auto x = ParallelExecutor::Create(p, staged.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(x.ok()) << x.status();
    staged->ReleaseTensors();
    std::vector<float> got;
    ForwardStats fs;
    ParallelStepStats ps;
    ASSERT_TRUE((*x)->Forward(first, &got, &fs, &ps).ok()) << Name(l);
    ExpectLogitsClose(got, want1, Name(l) + " before");

    const ExpertLoad load = SkewedLoad(config_, seed_ + 7);
    const ExpertHolderTable expected = Expected((*x)->holders(), load, p);
    int64_t changes = 0;  // none where every rank holds one expert: no placement is lighter
    for (size_t k = 0; k < expected.size(); ++k) changes += expected[k] != (*x)->holders()[k] ? 1 : 0;
    auto r = (*x)->ReplaceExperts(load);
    ASSERT_TRUE(r.ok()) << Name(l) << ": " << r.status();
    // Two hot experts on one rank can always be split, where ranks hold two or more (with
    // copies, every expert may already be everywhere it can be).
    if (experts / l.ep >= 2 && l.replicas == 0) EXPECT_GT(changes, 0) << Name(l);
    EXPECT_EQ(r->layers_changed, changes) << Name(l) << " (seed " << seed_ << ")";
    EXPECT_EQ(r->experts_copied > 0, changes > 0) << Name(l);
    if (changes > 0) EXPECT_LT(r->imbalance_after, r->imbalance_before) << Name(l);
    EXPECT_EQ((*x)->holders(), expected) << Name(l) << " (seed " << seed_ << ")";
    for (const RankLayout& rl : (*x)->layout()) {
      EXPECT_EQ(rl.experts, ExpertsOfRank(expected, rl.ep_rank, rl.layer_begin, rl.layer_end)) << Name(l);
    }
    // The experts dropped are freed: each rank holds what a fresh copy of its new shard holds.
    EXPECT_EQ(WeightBytes(**x), FreshShardBytes(**x, *weights_, &backend_)) << Name(l);
    got.clear();
    ASSERT_TRUE((*x)->Forward(second, &got, &fs, &ps).ok()) << Name(l);
    ExpectLogitsClose(got, want2, Name(l) + " after the re-placement (seed " + std::to_string(seed_) + ")");
    // The same load again: nothing left to gain, nothing copied.
    auto again = (*x)->ReplaceExperts(load);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->layers_changed, 0) << Name(l);
    EXPECT_EQ(again->experts_copied, 0) << Name(l);
    EXPECT_EQ(WeightBytes(**x), FreshShardBytes(**x, *weights_, &backend_)) << Name(l);
  }
}

// A shard stages the experts it gains from the first source that holds each (the bytes that
// source holds), and refuses, naming the layer and expert, one that no source holds.
TEST_P(ParallelTest, StagingCopiesEachExpertFromASourceThatHoldsIt) {
  const int64_t experts = config_.num_local_experts;
  int64_t layer = 0;
  while (config_.dense_layer(layer)) ++layer;  // the first MoE layer
  std::vector<int32_t> low, high, want;
  for (int32_t e = 0; e < experts; ++e) (e < experts / 2 ? low : high).push_back(e);
  want = {low.back(), high.front()};
  auto Cut = [&](const std::vector<int32_t>& held) {
    auto w = ModelWeights::Shard(*weights_, &backend_, WeightShard{layer, layer + 1, {held}}, &backend_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  };
  const std::unique_ptr<ModelWeights> a = Cut(low), b = Cut(high), released = Cut(high);
  ASSERT_TRUE(a && b && released);
  const ModelWeights::ExpertOrigin self{a.get(), &backend_}, peer{b.get(), &backend_};
  const std::vector<ModelWeights::ExpertOrigin> both = {self, peer};
  auto staged = a->StageExperts(both, WeightShard{layer, layer + 1, {want}}, &backend_);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(staged->copies.size(), 1u);
  const StagedExperts::Copy& c = staged->copies[0];
  EXPECT_EQ(c.expert, static_cast<size_t>(high.front()));
  for (const auto& [got, from] : {std::pair{c.w13, b->layer(layer).w13[c.expert]}, {c.w2, b->layer(layer).w2[c.expert]}}) {
    ASSERT_NE(got.data, from.data) << "a copy, not the peer's own buffer";
    const size_t bytes = from.dtype == DType::kF8E4M3
                             ? static_cast<size_t>(from.rows * from.cols)
                             : static_cast<size_t>(WeightStorageElems(from.layout, from.rows, from.cols)) * DTypeSize(from.dtype);
    EXPECT_EQ(0, std::memcmp(got.data, from.data, bytes)) << "expert " << c.expert;
  }
  released->ReleaseTensors();  // a freed staging copy is refused by name, not read
  const std::vector<ModelWeights::ExpertOrigin> freed = {self, {released.get(), &backend_}};
  auto refused = a->StageExperts(freed, WeightShard{layer, layer + 1, {want}}, &backend_);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.status().message()).find("source 1 of 2"), std::string::npos) << refused.status();
  const std::vector<ModelWeights::ExpertOrigin> only_self = {self};
  auto none = a->StageExperts(only_self, WeightShard{layer, layer + 1, {want}}, &backend_);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(none.status().message()).find(absl::StrCat("layer ", layer, "'s expert ", high.front())),
            std::string::npos)
      << none.status();
}

// Every rank's device roomy but the last one's, which has no room for one more expert: the
// re-placement stops at the first layer that gives that rank an expert, naming it, after the
// other rank has staged its copies of the layer; every rank keeps its placement, its memory
// (the other's staged copies freed) and its answers.
TEST_P(ParallelTest, AReplacementThatDoesNotFitChangesNothing) {
  const int64_t block = 8, blocks = 64;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  const auto [first, second] = TwoSteps(MakeStep(config_, blocks, block, 2, {9, 17, 5, 30}, seed_));
  std::vector<float> want1, want2;
  ASSERT_TRUE(OneRankTwoSteps(first, second, layout, &want1, &want2));
  ParallelConfig p = ToConfig(Layout{2, 1}, &config_);
  p.eplb_interval = 1;
  std::vector<size_t> room;  // each rank's bytes in use after both steps, measured on roomy devices
  {
    auto x = ParallelExecutor::Create(p, weights_.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(x.ok()) << x.status();
    std::vector<float> got;
    ForwardStats fs;
    ParallelStepStats ps;
    ASSERT_TRUE((*x)->Forward(first, &got, &fs, &ps).ok());
    ASSERT_TRUE((*x)->Forward(second, &got, &fs, &ps).ok());
    for (const auto& [used, capacity] : (*x)->device_bytes()) room.push_back(used + weights_->expert_bytes() / 2);
  }
  room.front() = 0;  // the default: most of the machine
  BackendFactory tight = [&](int rank, int) -> std::unique_ptr<Backend> {
    CpuBackendOptions o;
    o.num_threads = 1;
    o.capacity_bytes = room[static_cast<size_t>(rank)];
    return std::make_unique<CpuBackend>(o);
  };
  auto x = ParallelExecutor::Create(p, weights_.get(), &backend_, layout, tight);
  ASSERT_TRUE(x.ok()) << x.status();
  std::vector<float> got;
  ForwardStats fs;
  ParallelStepStats ps;
  ASSERT_TRUE((*x)->Forward(first, &got, &fs, &ps).ok());
  ExpectLogitsClose(got, want1, "before");
  const ExpertHolderTable before = (*x)->holders();
  const std::vector<RankLayout> layout_before = (*x)->layout();
  const auto memory_before = (*x)->device_bytes();
  // All tokens to rank 0's experts under the contiguous start: every MoE layer must move some,
  // and rank 0 (ranks stage in order) copies its share of the first before rank 1 fails.
  ExpertLoad load{config_.num_hidden_layers, config_.num_local_experts, {}};
  for (int64_t i = 0; i < load.layers * load.experts; ++i) {
    load.tokens.push_back(config_.dense_layer(i / load.experts) ? 0 : i % load.experts < load.experts / 2 ? 1000 : 1);
  }
  auto r = (*x)->ReplaceExperts(load);
  ASSERT_FALSE(r.ok()) << "every rank gains an expert it has no room for";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("re-placing experts stopped after 0 of"), std::string::npos)
      << r.status();
  EXPECT_NE(std::string(r.status().message()).find(", rank 1: "), std::string::npos) << r.status();
  EXPECT_EQ((*x)->device_bytes(), memory_before) << "staged copies left behind";
  EXPECT_EQ((*x)->holders(), before);
  for (size_t i = 0; i < layout_before.size(); ++i) EXPECT_EQ((*x)->layout()[i].experts, layout_before[i].experts);
  got.clear();
  ASSERT_TRUE((*x)->Forward(second, &got, &fs, &ps).ok());
  ExpectLogitsClose(got, want2, "after the failed re-placement");
}

TEST_P(ParallelTest, EngineRePlacingEveryFewStepsAnswersAsOneRank) {
  std::mt19937 gen(seed_ + 5);
  std::vector<GenerateRequest> reqs(12);
  for (auto& r : reqs) {
    const int n = 1 + static_cast<int>(gen() % 30);
    for (int j = 0; j < n; ++j) r.prompt.push_back(static_cast<int32_t>(gen() % 256));
    // Decodes long enough for a dozen re-placement windows: with 2-11 tokens one seed in a few
    // hundred gave loads already within the planner's minimum gain in all eight (seed 673708265).
    r.max_tokens = 8 + static_cast<int32_t>(gen() % 16);
  }
  std::string layout_at_start, layout_at_end;  // the re-placing run's (Engine::ParallelLayout)
  auto run = [&](const Layout& l, int64_t interval, EngineStats* stats) {
    EngineConfig ec;
    ec.num_kv_blocks = 200;
    ec.block_size = 8;
    ec.scheduler.max_tokens_per_step = 32;
    ec.parallel = ToConfig(l, &config_);
    ec.parallel.eplb_interval = interval;
    ec.parallel.eplb_window = 3;
    auto e = MakeEngine(ec, weights_.get(), &backend_);
    EXPECT_TRUE(e.ok()) << e.status();
    layout_at_start = (*e)->ParallelLayout();
    std::mutex mu;
    std::map<uint64_t, std::vector<int32_t>> out;
    std::vector<uint64_t> ids;
    for (const auto& r : reqs) {
      auto id = (*e)->Submit(r, [&](const RequestEvent& ev) {
        std::lock_guard<std::mutex> lock(mu);
        out[ev.request_id].insert(out[ev.request_id].end(), ev.tokens.begin(), ev.tokens.end());
      });
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    EXPECT_TRUE((*e)->RunUntilIdle().ok());
    EXPECT_TRUE((*e)->CheckAccounting());
    *stats = (*e)->GetStats();
    layout_at_end = (*e)->ParallelLayout();
    if ((*e)->parallel() != nullptr) {  // what GetModelInfo shows: the ranks' experts as they are now
      EXPECT_EQ(layout_at_end, (*e)->parallel()->config().Name() + "\n" + (*e)->parallel()->Describe())
          << "started as:\n" << layout_at_start;
    }
    std::vector<std::vector<int32_t>> result;
    for (uint64_t id : ids) result.push_back(out[id]);
    return result;
  };
  EngineStats one, many;
  const auto want = run({1, 1}, 0, &one);
  EXPECT_FALSE(one.has_eplb);
  const auto got = run({config_.num_local_experts >= 8 ? 4 : 2, 1}, 2, &many);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << " (seed " << seed_ << ")";
  EXPECT_TRUE(many.has_eplb);
  EXPECT_GE(many.eplb_rearrangements, 1) << "no re-placement in " << many.steps << " steps (seed " << seed_ << ")";
  EXPECT_GT(many.eplb_experts_copied, 0);
  EXPECT_GE(many.eplb_rank_imbalance, 1.0);
}

}  // namespace
}  // namespace moeserve::parallel_test
