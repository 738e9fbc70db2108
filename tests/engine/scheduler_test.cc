// engine/Scheduler with a fake runner (no model): token budget, chunked prefill, no
// starvation, priorities, the fast-lane cap, the queue bound, removal of waiting and running
// sequences, prefix-cache hits and preemption, with exact pool accounting after each.
#include <memory>
#include <random>

#include "engine/shared_prefix.h"
#include "tests/engine/scheduler_fixture.h"

namespace moeserve {
namespace {

TEST_F(SchedulerTest, RespectsTokenBudgetAndChunksLongPrompts) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 10;
  Make(cfg, 100);
  Sequence* a = NewSeq(25, 3);
  Sequence* b = NewSeq(3, 3);
  ASSERT_TRUE(sched_->Add(a).ok());
  ASSERT_TRUE(sched_->Add(b).ok());
  auto out = Step();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 10);
  EXPECT_FALSE(out.chunks[0].wants_logits);
  for (int i = 0; i < 20; ++i) {
    out = Step();
    EXPECT_LE(out.num_tokens, 10);
  }
  Drain();
}

TEST_F(SchedulerTest, WithoutChunkingAPromptWaitsForRoom) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 8;
  cfg.chunked_prefill = false;
  Make(cfg, 100);
  Sequence* a = NewSeq(6, 4);
  Sequence* b = NewSeq(5, 2, Priority::kNormal, /*first_token=*/100);  // no shared prefix
  ASSERT_TRUE(sched_->Add(a).ok());
  ASSERT_TRUE(sched_->Add(b).ok());
  auto out = Step();  // a's whole prompt fits; b's does not fit the rest of the budget
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, a);
  EXPECT_EQ(out.chunks[0].num_tokens, 6);
  out = Step();  // a decodes (1) and b's prompt (5) fits
  EXPECT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.num_tokens, 6);
  Drain();
}

TEST_F(SchedulerTest, RunningSequencesAreNotStarvedByArrivals) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 16;
  cfg.max_num_seqs = 8;
  Make(cfg, 200);
  std::vector<Sequence*> early;
  for (int i = 0; i < 3; ++i) {
    early.push_back(NewSeq(4, 30));
    ASSERT_TRUE(sched_->Add(early.back()).ok());
  }
  Step();  // all three prefill
  for (int step = 0; step < 20; ++step) {
    ASSERT_TRUE(sched_->Add(NewSeq(12, 5)).ok());  // a flood of long prompts
    auto out = Step();
    for (Sequence* e : early) {
      if (e->state != Sequence::State::kRunning) continue;
      bool scheduled = false;
      for (const auto& c : out.chunks) scheduled |= c.seq == e;
      EXPECT_TRUE(scheduled) << "running sequence " << e->id << " starved at step " << step;
    }
  }
  Drain();
}

TEST_F(SchedulerTest, PriorityClassesThenFcfs) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 1;
  Make(cfg, 100);
  Sequence* low = NewSeq(3, 1, Priority::kLow);
  Sequence* n1 = NewSeq(3, 1, Priority::kNormal);
  Sequence* n2 = NewSeq(3, 1, Priority::kNormal);
  Sequence* high = NewSeq(3, 1, Priority::kHigh);
  for (Sequence* s : {low, n1, n2, high}) ASSERT_TRUE(sched_->Add(s).ok());
  std::vector<Sequence*> order;
  for (int i = 0; i < 4; ++i) {
    auto out = Step();
    ASSERT_EQ(out.chunks.size(), 1u);
    order.push_back(out.chunks[0].seq);
  }
  EXPECT_EQ(order, (std::vector<Sequence*>{high, n1, n2, low}));
  Drain();
}

// vLLM's integer priority within a lane: lower first, ties by arrival; lanes still first.
TEST_F(SchedulerTest, IntegerRanksOrderALaneLowerFirst) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 1;
  Make(cfg, 100);
  Sequence* late = NewSeq(3, 1);
  Sequence* early = NewSeq(3, 1);
  Sequence* tie = NewSeq(3, 1);
  Sequence* high = NewSeq(3, 1, Priority::kHigh);
  late->rank = 5;
  early->rank = -2;
  tie->rank = 5;
  high->rank = 100;
  for (Sequence* s : {late, early, tie, high}) ASSERT_TRUE(sched_->Add(s).ok());
  std::vector<Sequence*> order;
  for (int i = 0; i < 4; ++i) {
    auto out = Step();
    ASSERT_EQ(out.chunks.size(), 1u);
    order.push_back(out.chunks[0].seq);
  }
  EXPECT_EQ(order, (std::vector<Sequence*>{high, early, late, tie}));
  Drain();
}

// The preemption victim is the highest rank of the lowest lane, not the newest.
TEST_F(SchedulerTest, PreemptsTheHighestRankFirst) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  Make(cfg, 8);  // 32 tokens
  Sequence* low_rank = NewSeq(7, 20);
  Sequence* newer = NewSeq(7, 20);
  low_rank->rank = 9;
  newer->rank = 1;
  ASSERT_TRUE(sched_->Add(low_rank).ok());
  ASSERT_TRUE(sched_->Add(newer).ok());
  int preempted = 0;
  for (int i = 0; i < 200 && (sched_->num_running() + sched_->num_waiting()) > 0; ++i) {
    for (Sequence* p : Step().preempted) {
      EXPECT_EQ(p, low_rank) << "rank 9 yields to rank 1";
      ++preempted;
    }
  }
  EXPECT_GT(preempted, 0);
  Drain();
}

TEST_F(SchedulerTest, FastLaneCapsTheBatchItJoins) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 16;
  cfg.fast_lane_max_batch = 3;
  Make(cfg, 400);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(sched_->Add(NewSeq(4, 40)).ok());
  auto out = Step();
  EXPECT_EQ(out.chunks.size(), 10u);
  Sequence* fast = NewSeq(4, 6, Priority::kFast);
  ASSERT_TRUE(sched_->Add(fast).ok());
  while (fast->state != Sequence::State::kFinished) {
    out = Step();
    EXPECT_LE(out.chunks.size(), 3u) << "fast lane must cap the batch";
    bool has_fast = false;
    for (const auto& c : out.chunks) has_fast |= c.seq == fast;
    EXPECT_TRUE(has_fast) << "the fast-lane request must run every step";
  }
  out = Step();
  EXPECT_EQ(out.chunks.size(), 10u) << "the cap lifts when the fast request leaves";
  Drain();
}

TEST_F(SchedulerTest, WaitingQueueIsBounded) {
  SchedulerConfig cfg;
  cfg.max_waiting = 2;
  Make(cfg, 100);
  ASSERT_TRUE(sched_->Add(NewSeq(3, 1)).ok());
  ASSERT_TRUE(sched_->Add(NewSeq(3, 1)).ok());
  absl::Status s = sched_->Add(NewSeq(3, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(s.message()).find("waiting queue is full (2 requests)"), std::string::npos) << s;
  absl::Status too_big = sched_->Add(NewSeq(390, 20));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  Drain();
}

// --max-waiting bounds admissions: while preempted sequences sit in the queue, new requests
// are refused, and the queue never holds more than max_waiting + max_num_seqs sequences.
TEST_F(SchedulerTest, PreemptedSequencesExceedTheWaitingBoundOnlyByTheRunningOnes) {
  SchedulerConfig cfg;
  cfg.max_waiting = 2;
  cfg.max_num_seqs = 4;
  cfg.max_tokens_per_step = 64;
  Make(cfg, 10);  // 40 tokens: four sequences growing to 20 tokens each cannot all stay
  int64_t most_waiting = 0, refused = 0;
  bool refused_with_preempted_waiting = false;
  std::mt19937 gen(std::random_device{}());
  for (int i = 0; i < 400 && (i < 100 || sched_->num_running() + sched_->num_waiting() > 0); ++i) {
    if (i < 100) {
      const absl::Status s = sched_->Add(NewSeq(4 + static_cast<int64_t>(gen() % 4), 12));
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        ++refused;
        for (const auto& q : seqs_) refused_with_preempted_waiting |= q->state == Sequence::State::kWaiting && q->preemptions > 0;
      }
    }
    Step();
    most_waiting = std::max(most_waiting, sched_->num_waiting());
    EXPECT_LE(sched_->num_waiting(), cfg.max_waiting + cfg.max_num_seqs);
  }
  EXPECT_GT(refused, 0);
  EXPECT_TRUE(refused_with_preempted_waiting) << "no admission was refused while a preempted sequence waited";
  Drain();
}

// The bound counts waiting sequences that were never admitted: a preempted one waits beside
// them without taking a new request's place (Engine::Submit checks the same count, which a step
// can only lower, so a request it accepted is never refused here).
TEST_F(SchedulerTest, TheQueueBoundCountsOnlyNeverAdmittedSequences) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  cfg.max_waiting = 2;
  Make(cfg, 8);  // 32 tokens: two sequences of 27 do not fit together
  Sequence* old_seq = NewSeq(7, 20, Priority::kHigh);
  Sequence* young = NewSeq(7, 20);
  ASSERT_TRUE(sched_->Add(old_seq).ok());
  ASSERT_TRUE(sched_->Add(young).ok());
  for (int i = 0; i < 100 && young->preemptions == 0; ++i) Step();
  ASSERT_EQ(young->state, Sequence::State::kWaiting) << "young was never preempted";
  EXPECT_EQ(sched_->num_waiting(), 1);
  EXPECT_EQ(sched_->num_new_waiting(), 0);
  EXPECT_TRUE(sched_->Add(NewSeq(3, 1)).ok());
  EXPECT_TRUE(sched_->Add(NewSeq(3, 1)).ok()) << "the preempted sequence took a new request's place";
  EXPECT_EQ(sched_->Add(NewSeq(3, 1)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sched_->num_new_waiting(), 2);
  Drain();
  EXPECT_EQ(sched_->num_new_waiting(), 0);
}

TEST_F(SchedulerTest, RemovingWaitingAndRunningSequencesFreesTheirBlocks) {
  Make(SchedulerConfig(), 50);
  Sequence* running = NewSeq(9, 10);
  Sequence* waiting = NewSeq(9, 10);
  ASSERT_TRUE(sched_->Add(running).ok());
  Step();
  ASSERT_TRUE(sched_->Add(waiting).ok());
  EXPECT_GT(pool_->num_used(), 0);
  sched_->Remove(waiting);
  sched_->Remove(running);
  EXPECT_EQ(pool_->num_used(), 0);
  EXPECT_EQ(sched_->num_running() + sched_->num_waiting(), 0);
  EXPECT_TRUE(pool_->CheckInvariants());
}

TEST_F(SchedulerTest, SharedPrefixHitsTheCache) {
  Make(SchedulerConfig(), 100);
  Sequence* a = NewSeq(13, 2);
  ASSERT_TRUE(sched_->Add(a).ok());
  Drain();
  EXPECT_EQ(pool_->num_cached(), 3) << "a's three full blocks stay cached after it finishes";
  Sequence* b = NewSeq(13, 2);  // same tokens
  ASSERT_TRUE(sched_->Add(b).ok());
  auto out = Step();
  EXPECT_EQ(b->cached_prompt_tokens, 12);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start, 12);
  EXPECT_EQ(out.chunks[0].num_tokens, 1);
  // A full-length hit still computes the last token to get logits.
  Sequence* c = NewSeq(12, 2);
  ASSERT_TRUE(sched_->Add(c).ok());
  Step();
  EXPECT_EQ(c->cached_prompt_tokens, 8);
  Drain();
}

// Twins arriving together: the second waits for the first's prompt blocks and takes them from
// the cache; a prompt sharing only its first block of four does not wait; with
// wait_for_shared_prefix off, both compute the whole prompt in the same steps.
TEST_F(SchedulerTest, APromptWaitsForItsTwinsBlocksInsteadOfComputingThemAgain) {
  for (const bool wait : {true, false}) {
    SCOPED_TRACE(wait ? "waiting" : "not waiting");
    SchedulerConfig cfg;
    cfg.max_tokens_per_step = 20;  // room for a whole prompt and the start of another
    cfg.wait_for_shared_prefix = wait;
    Make(cfg, 100);
    Sequence* a = NewSeq(17, 2);
    Sequence* twin = NewSeq(17, 2);  // same tokens
    Sequence* other = NewSeq(17, 2, Priority::kNormal, 0);
    for (int64_t i = 4; i < 17; ++i) other->tokens[i] = 500 + static_cast<int32_t>(i);  // shares block 0 only
    for (Sequence* s : {a, twin, other}) ASSERT_TRUE(sched_->Add(s).ok());
    auto first = Step();
    bool twin_in_first = false, other_in_first = false;
    for (const auto& c : first.chunks) {
      twin_in_first |= c.seq == twin;
      other_in_first |= c.seq == other;
    }
    EXPECT_EQ(twin_in_first, !wait);
    EXPECT_EQ(other_in_first, wait) << "the one that does not wait takes the room";
    Drain();
    EXPECT_EQ(twin->cached_prompt_tokens, wait ? 16 : 0);
    EXPECT_LE(other->cached_prompt_tokens, 4);
  }
}

// A prompt scored for prompt logprobs computes at most kMaxPromptLogitRows positions a step,
// whatever the budget, and skips the prefix cache; once its logprobs are out (prompt_logits
// cleared) a recompute takes whole chunks and cached blocks again.
TEST_F(SchedulerTest, PromptLogitsComeInBoundedChunks) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 4096;
  cfg.chunked_prefill = false;  // the bound applies all the same
  Make(cfg, 400);
  Sequence* s = NewSeq(600, 1);
  s->prompt_logits = true;
  ASSERT_TRUE(sched_->Add(s).ok());
  std::vector<int64_t> chunks;
  for (int i = 0; i < 10 && s->num_computed < s->prompt_len; ++i) {
    auto out = Step();
    ASSERT_EQ(out.chunks.size(), 1u);
    chunks.push_back(out.chunks[0].num_tokens);
    EXPECT_LE(out.chunks[0].prompt_logit_rows(), kMaxPromptLogitRows);
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{256, 256, 88}));
  Drain();
}

TEST(SharedPrefixTest, OnlyAMostlySharedPromptStillBeingComputedIsATwin) {
  auto seq = [](std::vector<int32_t> tokens, int64_t computed, int64_t registered) {
    Sequence s;
    s.tokens = tokens;
    s.prompt_len = static_cast<int64_t>(tokens.size());
    s.num_computed = computed;
    s.registered_blocks = registered;
    s.hashes = {BlockHash{1, 2}};
    return s;
  };
  std::vector<int32_t> p(16);
  for (int i = 0; i < 16; ++i) p[i] = i;
  Sequence running = seq(p, 8, 2), waiting = seq(p, 0, 0);
  std::vector<Sequence*> run = {&running};
  EXPECT_EQ(SharedPrefixTwin(waiting, run, 4), &running);
  running.num_computed = 16;  // its prefill is done: the cache has what it will have
  EXPECT_EQ(SharedPrefixTwin(waiting, run, 4), nullptr);
  running.num_computed = 8;
  std::vector<int32_t> half = p;
  for (int i = 9; i < 16; ++i) half[i] = 100 + i;  // two of four blocks shared, both registered
  Sequence mostly = seq(half, 0, 0);
  EXPECT_EQ(SharedPrefixTwin(mostly, run, 4), nullptr);
  running.registered_blocks = 1;
  EXPECT_EQ(SharedPrefixTwin(mostly, run, 4), &running) << "two shared blocks of four, one not registered yet";
  waiting.segment = 1;  // another EP rank's pool: nothing to share
  EXPECT_EQ(SharedPrefixTwin(waiting, run, 4), nullptr);
  waiting.segment = 0;
  waiting.hashes = {BlockHash{3, 4}};  // another cache namespace (tenant, salt)
  EXPECT_EQ(SharedPrefixTwin(waiting, run, 4), nullptr);
}

TEST_F(SchedulerTest, PreemptsNewestLowestPriorityWhenThePoolIsFull) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  Make(cfg, 8);  // 32 tokens
  Sequence* old_seq = NewSeq(7, 20, Priority::kHigh);
  Sequence* new_seq = NewSeq(7, 20);
  ASSERT_TRUE(sched_->Add(old_seq).ok());
  ASSERT_TRUE(sched_->Add(new_seq).ok());
  int preempted = 0;
  for (int i = 0; i < 200 && (sched_->num_running() + sched_->num_waiting()) > 0; ++i) {
    auto out = Step();
    for (Sequence* p : out.preempted) {
      EXPECT_EQ(p, new_seq) << "the high-priority older sequence must not be the victim";
      ++preempted;
    }
  }
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(old_seq->num_tokens(), 27);
  EXPECT_EQ(new_seq->num_tokens(), 27);
  Drain();
}

TEST_F(SchedulerTest, RandomWorkloadKeepsAccountingExact) {
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 24;
  cfg.max_num_seqs = 6;
  Make(cfg, 30);
  std::mt19937 gen(5);
  for (int step = 0; step < 400; ++step) {
    if (gen() % 3 == 0) {
      Sequence* s = NewSeq(1 + gen() % 30, 1 + gen() % 20, static_cast<Priority>(gen() % 4),
                           static_cast<int32_t>(gen() % 3) * 7);
      (void)sched_->Add(s);
    }
    if (gen() % 17 == 0 && !seqs_.empty()) {
      Sequence* victim = seqs_[gen() % seqs_.size()].get();
      if (victim->state != Sequence::State::kFinished) sched_->Remove(victim);
    }
    Step();
  }
  Drain();
}

}  // namespace
}  // namespace moeserve
