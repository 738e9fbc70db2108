// The step messages between rank 0 and worker processes: random sub-steps and results survive
// the round trip field for field; truncated, padded or foreign messages are refused with the
// field named, never read past their end.
#include "runner/rank_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace moeserve {
namespace {

template <typename T>
std::vector<T> RandomVector(std::mt19937& gen, size_t max_len) {
  std::vector<T> v(gen() % (max_len + 1));
  for (auto& x : v) x = static_cast<T>(gen() % 100000);
  return v;
}

// Decodes a message meant to be a step or the shutdown; false for the shutdown.
absl::StatusOr<bool> DecodeStep(const std::string& bytes, std::vector<SubStep>* subs) {
  KvPieceOp kv;
  ReplaceOp replace;
  auto kind = DecodeWorkerMessage(bytes, subs, &kv, &replace);
  if (!kind.ok()) return kind.status();
  EXPECT_NE(*kind, WorkerMessage::kKvPieces);
  return *kind == WorkerMessage::kStep;
}

std::vector<SubStep> RandomSubs(std::mt19937& gen) {
  std::vector<SubStep> subs(1 + gen() % 4);
  for (SubStep& s : subs) {
    s.in.token_ids = RandomVector<int32_t>(gen, 50);
    s.in.positions = RandomVector<int32_t>(gen, 50);
    s.in.token_seq = RandomVector<int32_t>(gen, 50);
    s.in.slots = RandomVector<int64_t>(gen, 50);
    s.in.block_tables = RandomVector<int32_t>(gen, 80);
    s.in.num_seqs = gen() % 9;
    s.in.max_blocks_per_seq = gen() % 17;
    s.in.logit_rows = RandomVector<int32_t>(gen, 10);
    s.logit_dest = RandomVector<int64_t>(gen, 0);
    s.logit_dest.resize(s.in.logit_rows.size(), static_cast<int64_t>(gen() % 100));
    for (size_t i = 0; i < s.in.logit_rows.size() && gen() % 2; ++i) {
      SampleSpec spec;
      spec.u = std::uniform_real_distribution<double>(0, 1)(gen);
      spec.temperature = 0.5f;
      spec.top_p = 0.9f;
      spec.top_k = static_cast<int32_t>(gen() % 50);
      s.in.sample.push_back(spec);
    }
    s.in.logits_to_host = gen() % 2;
  }
  return subs;
}

TEST(RankStepTest, StepsRoundTrip) {
  std::mt19937 gen(std::random_device{}());
  for (int round = 0; round < 50; ++round) {
    const auto subs = RandomSubs(gen);
    std::vector<SubStep> back;
    auto step = DecodeStep(EncodeRankStep(subs), &back);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_TRUE(*step);
    ASSERT_EQ(back.size(), subs.size());
    for (size_t i = 0; i < subs.size(); ++i) {
      const ForwardInput &a = subs[i].in, &b = back[i].in;
      EXPECT_EQ(a.token_ids, b.token_ids);
      EXPECT_EQ(a.positions, b.positions);
      EXPECT_EQ(a.token_seq, b.token_seq);
      EXPECT_EQ(a.slots, b.slots);
      EXPECT_EQ(a.block_tables, b.block_tables);
      EXPECT_EQ(a.num_seqs, b.num_seqs);
      EXPECT_EQ(a.max_blocks_per_seq, b.max_blocks_per_seq);
      EXPECT_EQ(a.logit_rows, b.logit_rows);
      EXPECT_EQ(a.logits_to_host, b.logits_to_host);
      EXPECT_EQ(subs[i].logit_dest, back[i].logit_dest);
      ASSERT_EQ(a.sample.size(), b.sample.size());
      for (size_t j = 0; j < a.sample.size(); ++j) {
        EXPECT_EQ(a.sample[j].u, b.sample[j].u);
        EXPECT_EQ(a.sample[j].top_k, b.sample[j].top_k);
      }
    }
  }
  std::vector<SubStep> none;
  auto shutdown = DecodeStep(EncodeShutdown(), &none);
  ASSERT_TRUE(shutdown.ok());
  EXPECT_FALSE(*shutdown);
}

TEST(RankStepTest, ResultsRoundTripWithTheRanksStatus) {
  std::mt19937 gen(std::random_device{}());
  RankStepResult r;
  r.stats.tokens = 17;
  r.stats.expert_rows = RandomVector<int64_t>(gen, 8);
  r.stats.moe_seconds = 0.25;
  r.stats.collective_spans = {100.25, 100.5, 101.0, 101.125};
  r.stats.comm_bytes = 4242;
  r.stats.comm_bytes_outside = 2121;
  r.a2a_bytes = 123456;
  r.pp_bytes = 789;
  r.comm_seconds = 0.5;
  r.clock_id = 0x1234567890abcdefu;
  r.logits.resize(3 * 7);
  for (auto& x : r.logits) x = std::normal_distribution<float>()(gen);
  r.sampled = RandomVector<int32_t>(gen, 3);
  RankStepResult back;
  ASSERT_TRUE(DecodeRankResult(EncodeRankResult(absl::OkStatus(), r), &back).ok());
  EXPECT_EQ(back.stats.tokens, 17);
  EXPECT_EQ(back.stats.expert_rows, r.stats.expert_rows);
  EXPECT_EQ(back.stats.moe_seconds, 0.25);
  EXPECT_EQ(back.stats.collective_spans, r.stats.collective_spans);
  EXPECT_EQ(back.stats.comm_bytes, 4242);
  EXPECT_EQ(back.stats.comm_bytes_outside, 2121);
  EXPECT_EQ(back.a2a_bytes, 123456);
  EXPECT_EQ(back.pp_bytes, 789);
  EXPECT_EQ(back.comm_seconds, 0.5);
  EXPECT_EQ(back.clock_id, r.clock_id);
  EXPECT_EQ(back.logits, r.logits);
  EXPECT_EQ(back.sampled, r.sampled);
  const absl::Status failed = absl::ResourceExhaustedError("rank 3 KV arena: out of memory");
  RankStepResult ignored;
  EXPECT_EQ(DecodeRankResult(EncodeRankResult(failed, {}), &ignored), failed);
}

// The KV tiers' piece copies under mpirun: the operation and the worker's answer.
TEST(RankStepTest, KvPieceCopiesRoundTripAndRefuseTruncation) {
  std::mt19937 gen(std::random_device{}());
  KvPieceOp op;
  op.write = gen() % 2 == 0;
  op.blocks = RandomVector<int32_t>(gen, 20);
  for (size_t i = 0; i < 3000; ++i) op.data.push_back(static_cast<char>(gen()));
  const std::string bytes = EncodeKvPieceOp(op);
  std::vector<SubStep> subs;
  KvPieceOp back;
  ReplaceOp replace;
  auto kind = DecodeWorkerMessage(bytes, &subs, &back, &replace);
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_EQ(*kind, WorkerMessage::kKvPieces);
  EXPECT_EQ(back.write, op.write);
  EXPECT_EQ(back.blocks, op.blocks);
  EXPECT_EQ(back.data, op.data);
  for (size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 30) {
    auto s = DecodeWorkerMessage(bytes.substr(0, cut), &subs, &back, &replace);
    ASSERT_FALSE(s.ok()) << "cut at " << cut;
    EXPECT_NE(s.status().message().find("truncated at"), std::string::npos) << s.status();
  }
  std::string data;
  ASSERT_TRUE(DecodeKvPieceReply(EncodeKvPieceReply(absl::OkStatus(), op.data), &data).ok());
  EXPECT_EQ(data, op.data);
  const absl::Status failed = absl::InvalidArgumentError("KV piece copy: block 99 outside the arena's 12");
  EXPECT_EQ(DecodeKvPieceReply(EncodeKvPieceReply(failed, ""), &data), failed);
  EXPECT_EQ(DecodeKvPieceReply(bytes, &data).code(), absl::StatusCode::kInvalidArgument);
}

// A re-placement's phases under mpirun and the worker's answer: round trips of random layers
// and holders, truncation refused, a worker's own failure told apart from a malformed reply.
TEST(RankStepTest, ReplacementMessagesRoundTripAndRefuseTruncation) {
  std::mt19937 gen(std::random_device{}());
  for (ReplaceOp::Phase phase : {ReplaceOp::Phase::kStage, ReplaceOp::Phase::kCommit, ReplaceOp::Phase::kDrop}) {
    ReplaceOp op;
    op.phase = phase;
    op.layer = static_cast<int64_t>(gen() % 60);
    if (phase == ReplaceOp::Phase::kStage) {
      for (int e = 0; e < 1 + static_cast<int>(gen() % 16); ++e) op.row.push_back(RandomVector<int32_t>(gen, 4));
    }
    const std::string bytes = EncodeReplaceOp(op);
    std::vector<SubStep> subs;
    KvPieceOp kv;
    ReplaceOp back;
    auto kind = DecodeWorkerMessage(bytes, &subs, &kv, &back);
    ASSERT_TRUE(kind.ok()) << kind.status();
    EXPECT_EQ(*kind, WorkerMessage::kReplace);
    EXPECT_EQ(back.phase, op.phase);
    EXPECT_EQ(back.layer, op.layer);
    EXPECT_EQ(back.row, op.row);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      EXPECT_FALSE(DecodeWorkerMessage(bytes.substr(0, cut), &subs, &kv, &back).ok()) << "cut at " << cut;
    }
  }
  const ReplaceReply reply{static_cast<int64_t>(gen() % 100), static_cast<double>(gen())};
  absl::Status theirs;
  ReplaceReply back;
  ASSERT_TRUE(DecodeReplaceReply(EncodeReplaceReply(absl::OkStatus(), reply), &theirs, &back).ok());
  EXPECT_TRUE(theirs.ok());
  EXPECT_EQ(back.experts, reply.experts);
  EXPECT_EQ(back.bytes, reply.bytes);
  const absl::Status full = absl::ResourceExhaustedError("rank 3: device full");
  ASSERT_TRUE(DecodeReplaceReply(EncodeReplaceReply(full, {}), &theirs, &back).ok());
  EXPECT_EQ(theirs, full);
  EXPECT_EQ(DecodeReplaceReply(EncodeShutdown(), &theirs, &back).code(), absl::StatusCode::kInvalidArgument);
}

// Against a brute-force reading of random spans: per stage and call, the last arrival to the last
// exit; a stage whose ranks logged different numbers of calls is left out.
TEST(RankStepTest, AfterLastArrivalSumsEachCallFromItsLastArrivalToItsLastExit) {
  std::mt19937 gen(std::random_device{}());
  std::uniform_real_distribution<double> u(0, 1);
  const std::vector<int64_t> stage = {0, 0, 0, 1, 1, 1};
  std::vector<RankStepResult> results(stage.size());
  for (RankStepResult& r : results) r.clock_id = MachineClockId();
  ASSERT_NE(MachineClockId(), 0u) << "this machine's boot id cannot be read";
  const int calls = 5;
  double want = 0;
  for (int64_t s = 0; s < 2; ++s) {
    for (int k = 0; k < calls; ++k) {
      double last_in = 0, last_out = 0;
      for (size_t r = 0; r < stage.size(); ++r) {
        if (stage[r] != s) continue;
        const double in = 10.0 * k + u(gen), out = in + u(gen);
        results[r].stats.collective_spans.push_back(in);
        results[r].stats.collective_spans.push_back(out);
        last_in = std::max(last_in, in);
        last_out = std::max(last_out, out);
      }
      want += last_out - last_in;
    }
  }
  EXPECT_NEAR(AfterLastArrival(stage, results), want, 1e-9);
  // A rank of stage 1 that logged one call more: stage 1 is left out, stage 0 stays.
  double stage0 = 0;
  {
    std::vector<RankStepResult> only0(results.begin(), results.begin() + 3);
    stage0 = AfterLastArrival({0, 0, 0}, only0);
  }
  results[4].stats.collective_spans.push_back(99);
  results[4].stats.collective_spans.push_back(100);
  EXPECT_NEAR(AfterLastArrival(stage, results), stage0, 1e-9);
  EXPECT_GT(stage0, 0);
  // Ranks on another machine's clock (another boot id), or on an unknown one: nothing is read.
  results[1].clock_id ^= 2;
  EXPECT_EQ(AfterLastArrival(stage, results), 0);
  results[1].clock_id = 0;
  EXPECT_EQ(AfterLastArrival(stage, results), 0);
}

TEST(RankStepTest, MalformedMessagesAreRefusedNamingTheField) {
  std::mt19937 gen(std::random_device{}());
  const std::string step = EncodeRankStep(RandomSubs(gen));
  std::vector<SubStep> subs;
  for (size_t cut = 0; cut < step.size(); cut += 1 + step.size() / 40) {
    auto s = DecodeStep(step.substr(0, cut), &subs);
    ASSERT_FALSE(s.ok()) << "cut at " << cut;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("truncated at"), std::string::npos) << s.status();
  }
  EXPECT_NE(DecodeStep(step + "x", &subs).status().message().find("left over"),
            std::string::npos);
  EXPECT_NE(DecodeStep("JUNKJUNK", &subs).status().message().find("bad magic"),
            std::string::npos);
  // A length beyond the message is refused, not allocated.
  std::string huge = step.substr(0, 12);
  huge.append(8, '\xff');
  EXPECT_FALSE(DecodeStep(huge, &subs).ok());
  RankStepResult r;
  EXPECT_EQ(DecodeRankResult(step, &r).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve
