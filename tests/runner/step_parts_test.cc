// Writing a step into its ranks' sub-steps: random flat steps cut by random layouts keep every
// token, slot, logit row, sampling spec and edit, each in its own rank's part in that arena's
// block ids; one device's cut is the flat step itself; a sequence whose blocks leave its
// rank's segment, or whose tokens reach past its blocks, is refused by name.
#include "runner/step_parts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

namespace moeserve {
namespace {

constexpr int64_t kBlock = 4;

StepCut Cut(int64_t ranks, int64_t micro, int64_t num_blocks) {
  StepCut c;
  c.block_size = kBlock;
  c.micro_batches = micro;
  for (int64_t e = 0; e < ranks; ++e) c.segment_begin.push_back(e * (num_blocks / ranks));
  c.segment_begin.push_back(num_blocks);
  return c;
}

// Sequence j (on rank j % ranks, its blocks drawn from that rank's segment) computes
// positions [start, start + n); token ids j * 1000 + position identify each token. Some tokens
// have logit rows, each with a spec (or none has), and some rows have edits.
ForwardInput RandomStep(std::mt19937& gen, const StepCut& cut, bool sampling) {
  ForwardInput in;
  in.num_seqs = 1 + gen() % 12;
  in.max_blocks_per_seq = 6;
  in.logits_to_host = gen() % 2 == 0;
  std::vector<std::vector<int32_t>> free(cut.ranks());
  for (int64_t e = 0; e < cut.ranks(); ++e) {
    for (int64_t b = cut.segment_begin[e]; b < cut.segment_begin[e + 1]; ++b) free[e].push_back(static_cast<int32_t>(b));
    std::shuffle(free[e].begin(), free[e].end(), gen);
  }
  for (int64_t j = 0; j < in.num_seqs; ++j) {
    const int64_t e = j % cut.ranks();
    const int64_t start = gen() % 12, n = 1 + gen() % (in.max_blocks_per_seq * kBlock - start);
    const int64_t reach = (start + n - 1) / kBlock + 1;
    for (int64_t b = 0; b < in.max_blocks_per_seq; ++b) {
      in.block_tables.push_back(b < reach ? free[e].back() : 0);
      if (b < reach) free[e].pop_back();
    }
    for (int64_t p = start; p < start + n; ++p) {
      const int64_t b = p / kBlock;
      in.token_ids.push_back(static_cast<int32_t>(j * 1000 + p));
      in.positions.push_back(static_cast<int32_t>(p));
      in.token_seq.push_back(static_cast<int32_t>(j));
      in.slots.push_back(in.block_tables[j * in.max_blocks_per_seq + b] * kBlock + p % kBlock);
      if (p + 1 == start + n || gen() % 5 == 0) {
        const int32_t row = static_cast<int32_t>(in.logit_rows.size());
        in.logit_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
        if (sampling) in.sample.push_back(SampleSpec{(gen() % 1000) / 1000.0, 0.5f, 1.0f, static_cast<int32_t>(p), 0});
        for (int k = gen() % 3; k > 0; --k) in.logit_edits.push_back(LogitEdit{row, static_cast<int32_t>(gen() % 50), 0.5f});
      }
    }
  }
  return in;
}

TEST(StepPartsTest, EveryTokenRowAndEditLandsInItsRanksPartInThatArenasBlocks) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 gen(seed);
  for (int round = 0; round < 200; ++round) {
    const int64_t ranks = 1 + gen() % 3, micro = 1 + gen() % 3;
    const StepCut cut = Cut(ranks, micro, 90);
    const ForwardInput flat = RandomStep(gen, cut, gen() % 2 == 0);
    auto parts = CutStep(flat, cut);
    ASSERT_TRUE(parts.ok()) << parts.status() << " seed " << seed;
    ASSERT_EQ(parts->parts.size(), static_cast<size_t>(ranks));
    EXPECT_EQ(parts->num_seqs, flat.num_seqs);
    EXPECT_EQ(parts->num_tokens, flat.num_tokens());
    EXPECT_EQ(parts->num_logit_rows, static_cast<int64_t>(flat.logit_rows.size()));
    EXPECT_EQ(parts->sampling, !flat.sample.empty());
    EXPECT_EQ(parts->logits_to_host, flat.logits_to_host);
    std::vector<int> dest_seen(flat.logit_rows.size(), 0);
    int64_t tokens = 0;
    for (int64_t e = 0; e < ranks; ++e) {
      ASSERT_EQ(parts->parts[e].size(), static_cast<size_t>(micro));
      std::vector<int64_t> seqs_of_rank, sizes;  // the original sequences, in micro-batch order
      for (const SubStep& sub : parts->parts[e]) {
        const ForwardInput& in = sub.in;
        sizes.push_back(in.num_seqs);
        EXPECT_EQ(in.logits_to_host, flat.logits_to_host);
        ASSERT_EQ(in.block_tables.size(), static_cast<size_t>(in.num_seqs * in.max_blocks_per_seq));
        std::vector<int64_t> original(in.num_seqs, -1);
        for (int64_t i = 0; i < in.num_tokens(); ++i) {
          const int64_t j = in.token_ids[i] / 1000, p = in.positions[i];
          ASSERT_EQ(j % ranks, e) << "sequence " << j << " in rank " << e << "'s part, seed " << seed;
          ASSERT_EQ(in.token_ids[i] % 1000, p);
          const int32_t local = in.token_seq[i];
          if (original[local] < 0) {
            original[local] = j;
            seqs_of_rank.push_back(j);
          }
          ASSERT_EQ(original[local], j) << "one local sequence, one original, seed " << seed;
          // The slot in the rank's arena, through its translated block table.
          const int32_t arena_block = in.block_tables[local * in.max_blocks_per_seq + p / kBlock];
          EXPECT_EQ(in.slots[i], arena_block * kBlock + p % kBlock);
          EXPECT_EQ(in.slots[i], flat.slots[std::find(flat.token_ids.begin(), flat.token_ids.end(), in.token_ids[i]) -
                                            flat.token_ids.begin()] - cut.segment_begin[e] * kBlock);
          ++tokens;
        }
        ASSERT_EQ(sub.logit_dest.size(), in.logit_rows.size());
        ASSERT_EQ(in.sample.size(), flat.sample.empty() ? 0 : in.logit_rows.size());
        for (size_t r = 0; r < in.logit_rows.size(); ++r) {
          const int64_t d = sub.logit_dest[r];
          ASSERT_TRUE(d >= 0 && d < static_cast<int64_t>(flat.logit_rows.size()));
          ++dest_seen[d];
          EXPECT_EQ(in.token_ids[in.logit_rows[r]], flat.token_ids[flat.logit_rows[d]]) << "seed " << seed;
          if (!flat.sample.empty()) EXPECT_EQ(in.sample[r].top_k, flat.sample[d].top_k);
          std::vector<std::pair<int32_t, float>> want, got;
          for (const LogitEdit& x : flat.logit_edits) if (x.row == d) want.push_back({x.token, x.bias});
          for (const LogitEdit& x : in.logit_edits) if (x.row == static_cast<int32_t>(r)) got.push_back({x.token, x.bias});
          EXPECT_EQ(got, want) << "row " << d << " seed " << seed;
        }
        EXPECT_TRUE(std::is_sorted(in.logit_edits.begin(), in.logit_edits.end(),
                                   [](const LogitEdit& a, const LogitEdit& b) { return a.row < b.row; }));
      }
      // The rank's sequences in their order, cut into micro-batches that differ by one at most.
      EXPECT_TRUE(std::is_sorted(seqs_of_rank.begin(), seqs_of_rank.end())) << "seed " << seed;
      EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()) - *std::min_element(sizes.begin(), sizes.end()), 1);
      EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), (flat.num_seqs + ranks - 1 - e) / ranks);
    }
    EXPECT_EQ(tokens, flat.num_tokens());
    EXPECT_TRUE(std::all_of(dest_seen.begin(), dest_seen.end(), [](int n) { return n == 1; })) << "seed " << seed;
  }
}

TEST(StepPartsTest, OneDevicesCutIsTheFlatStep) {
  std::mt19937 gen(std::random_device{}());
  const StepCut cut = StepCut::One(90, kBlock);
  const ForwardInput flat = RandomStep(gen, cut, true);
  auto parts = CutStep(flat, cut);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->parts.size(), 1u);
  ASSERT_EQ(parts->parts[0].size(), 1u);
  const SubStep& sub = parts->parts[0][0];
  EXPECT_EQ(sub.in.token_ids, flat.token_ids);
  EXPECT_EQ(sub.in.positions, flat.positions);
  EXPECT_EQ(sub.in.token_seq, flat.token_seq);
  EXPECT_EQ(sub.in.slots, flat.slots);
  EXPECT_EQ(sub.in.block_tables, flat.block_tables);
  EXPECT_EQ(sub.in.logit_rows, flat.logit_rows);
  EXPECT_EQ(sub.in.logit_edits.size(), flat.logit_edits.size());
  std::vector<int64_t> identity(flat.logit_rows.size());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sub.logit_dest, identity);
}

TEST(StepPartsTest, BlocksOutsideTheRanksSegmentOrTokensPastTheTableAreRefused) {
  const StepCut cut = Cut(2, 1, 20);  // segments [0, 10) and [10, 20)
  const std::vector<int32_t> spans = {3, 12};
  StepWriter w(cut, {0});
  w.BeginSequence(spans);
  for (int32_t p = 0; p < 6; ++p) w.AddToken(p, p);
  auto refused = w.Finish();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("sequence 0 runs on EP rank 0 but its block 1 is 12"),
            std::string::npos)
      << refused.status();

  StepWriter past(cut, {1});
  const std::vector<int32_t> one = {11};
  past.BeginSequence(one);
  for (int32_t p = 0; p < 5; ++p) past.AddToken(p, p);
  auto short_table = past.Finish();
  ASSERT_EQ(short_table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(short_table.status().message()).find("sequence 0's tokens reach block 1"), std::string::npos)
      << short_table.status();
}

TEST(StepPartsTest, CallsOutOfOrderAreRefusedByFinish) {
  const StepCut cut = StepCut::One(8, kBlock);
  const std::vector<int32_t> blocks = {0, 1};
  const SampleSpec spec;
  auto message = [](StepWriter& w) { return std::string(w.Finish().status().message()); };
  StepWriter early(cut, {0});
  early.AddToken(1, 0);
  EXPECT_NE(message(early).find("a token before any sequence"), std::string::npos);
  StepWriter extra(cut, {0});
  extra.BeginSequence(blocks);
  extra.AddToken(1, 0);
  extra.BeginSequence(blocks);
  EXPECT_NE(message(extra).find("sequence 2 of 1 announced"), std::string::npos);
  StepWriter row(cut, {0});
  row.BeginSequence(blocks);
  row.AddLogitRow(0, &spec);
  EXPECT_NE(message(row).find("a logit row before the sequence's first token"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
