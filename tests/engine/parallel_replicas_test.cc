// Replicated experts (--expert-replicas, with and without scale-up domains): the EP rank
// imbalance the executor reports against an oracle built outside it. Each sender's tokens are
// run on one rank alone (the kernels are batch-invariant, so they route as in the whole step),
// which gives every sender's rows per (layer, expert); the rule ExpertDispatch states then says
// which holder computes which of them (the copies in the sender's domain where it has any, cut
// into runs in token order, run i to the (i + sender)-th). (Instantiated for every model in
// parallel_test.cc.)
#include "tests/engine/parallel_fixture.h"

namespace moeserve::parallel_test {
namespace {

// The sequences of `in` on EP rank s (sequence j on rank j mod ep, as MakeStep places them), as
// a step of their own with the same tokens, positions and blocks.
ForwardInput SenderPart(const ForwardInput& in, int64_t ep, int64_t s) {
  ForwardInput out;
  out.max_blocks_per_seq = in.max_blocks_per_seq;
  for (int64_t j = s; j < in.num_seqs; j += ep) {
    for (int64_t t = 0; t < in.num_tokens(); ++t) {
      if (in.token_seq[t] != j) continue;
      out.token_ids.push_back(in.token_ids[t]);
      out.positions.push_back(in.positions[t]);
      out.token_seq.push_back(static_cast<int32_t>(out.num_seqs));
      out.slots.push_back(in.slots[t]);
    }
    out.logit_rows.push_back(static_cast<int32_t>(out.token_ids.size() - 1));
    const auto row = in.block_tables.begin() + j * in.max_blocks_per_seq;
    out.block_tables.insert(out.block_tables.end(), row, row + in.max_blocks_per_seq);
    ++out.num_seqs;
  }
  return out;
}

// Each layer's busiest EP rank's rows and experts computed, summed over layers, over the mean
// rank's, from each sender's rows per (layer, expert) and the placement, by the dispatch's rule.
// Sender s is EP rank s of the only stage: the layouts here have pp 1.
std::pair<double, double> Imbalance(const std::vector<std::vector<int64_t>>& sent, const ExpertHolderTable& holders,
                                    int64_t ep, int64_t domain, int64_t experts) {
  const int64_t d = domain > 0 && domain < ep ? domain : ep;
  double busiest = 0, busiest_hits = 0, rows = 0, hits = 0;
  for (size_t l = 0; l < holders.size(); ++l) {
    std::vector<std::vector<int64_t>> got(static_cast<size_t>(ep), std::vector<int64_t>(static_cast<size_t>(experts), 0));
    for (int64_t s = 0; s < ep; ++s) {
      for (int64_t e = 0; e < experts; ++e) {
        const int64_t n = sent[static_cast<size_t>(s)][l * experts + e];
        std::vector<int32_t> to;
        for (int32_t h : holders[l][static_cast<size_t>(e)]) {
          if (h / d == s / d) to.push_back(h);
        }
        if (to.empty()) to = holders[l][static_cast<size_t>(e)];
        const int64_t r = static_cast<int64_t>(to.size());
        for (int64_t i = 0; i < r; ++i) got[to[static_cast<size_t>((i + s) % r)]][static_cast<size_t>(e)] += n * (i + 1) / r - n * i / r;
      }
    }
    double most = 0, most_hits = 0, all = 0;
    for (const auto& g : got) {
      double sum = 0, h = 0;
      for (int64_t x : g) sum += static_cast<double>(x), h += x > 0 ? 1 : 0;
      most = std::max(most, sum), most_hits = std::max(most_hits, h), all += sum, hits += h;
    }
    if (all == 0) continue;  // a dense layer
    busiest += most, busiest_hits += most_hits, rows += all;
  }
  return {busiest / (rows / static_cast<double>(ep)), busiest_hits / (hits / static_cast<double>(ep))};
}

TEST_P(ParallelTest, ReplicatedLayoutsImbalanceFollowsTheSplitRule) {
  std::mt19937 gen(seed_);
  const int64_t block = 8, blocks = 64, experts = config_.num_local_experts;
  const KvLayout layout = KvLayoutFor(config_, blocks, block, DType::kF32);
  std::vector<int64_t> lens(7);
  for (auto& len : lens) len = 1 + static_cast<int64_t>(gen() % 40);
  auto Copies = [&](int64_t ep) { return FewestCopies(experts, ep); };
  for (const Layout& l : std::vector<Layout>{{4, 1, ExpertPlacement::kBalanced, 0, Copies(4)},
                                             {4, 1, ExpertPlacement::kBalanced, 0, Copies(4), 2},
                                             {4, 1, ExpertPlacement::kBalanced, 0, Copies(4), 1},
                                             {2, 1, ExpertPlacement::kBalanced, 0, Copies(2)}}) {
    const ForwardInput in = MakeStep(config_, blocks, block, l.ep, lens, seed_);
    std::vector<std::vector<int64_t>> sent;  // [sender][layer x expert]
    for (int64_t s = 0; s < l.ep; ++s) {
      ForwardStats one;
      ASSERT_FALSE(OneRankLogits(SenderPart(in, l.ep, s), layout, &one).empty()) << Name(l) << " sender " << s;
      sent.push_back(one.layer_expert_rows);
    }
    const ParallelConfig config = ToConfig(l, &config_);
    // The layout must hold copies (else both sides would agree without testing the split), and
    // with domains, copies of one expert in different ones.
    bool copied = false, across = false;
    for (const auto& layer : config.Holders(config_)) {
      for (const auto& h : layer) {
        copied = copied || h.size() >= 2;
        across = across || (l.domain > 0 && h.size() >= 2 && h.front() / l.domain != h.back() / l.domain);
      }
    }
    ASSERT_TRUE(copied) << Name(l);
    if (l.domain > 0) ASSERT_TRUE(across) << Name(l);
    auto x = ParallelExecutor::Create(config, weights_.get(), &backend_, layout, CpuRanks());
    ASSERT_TRUE(x.ok()) << x.status();
    std::vector<float> got;
    ForwardStats fs;
    ParallelStepStats ps;
    ASSERT_TRUE((*x)->Forward(in, &got, &fs, &ps).ok()) << Name(l);
    const auto [rows, hits] = Imbalance(sent, config.Holders(config_), l.ep, l.domain, experts);
    EXPECT_NEAR(ps.rank_imbalance, rows, 1e-12) << Name(l) << " (seed " << seed_ << ")";
    EXPECT_NEAR(ps.rank_hit_imbalance, hits, 1e-12) << Name(l) << " (seed " << seed_ << ")";
  }
}

}  // namespace
}  // namespace moeserve::parallel_test
