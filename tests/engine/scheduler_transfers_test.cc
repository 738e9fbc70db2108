// The transfer lists the scheduler plans for the KV tiers (FakeTiers runs them as bookkeeping):
// evictions become demotions in eviction order, a prefix found below becomes promotions that
// carry their own allocation's evictions, a victim's KV is swapped out and back into its new
// blocks, a finished swapped sequence frees its slots, and a promotion that does not arrive cuts
// the prefix back without losing the request.
#include "tests/engine/scheduler_fixture.h"

namespace moeserve {
namespace {

class SchedulerTransfersTest : public SchedulerTest {
 protected:
  // A (13 tokens: 3 full blocks) runs and ends, then F (31 tokens) takes the whole 8-block pool,
  // evicting A's three cached blocks. Returns F's step.
  SchedulerOutput EvictAsPrefix() {
    Make(SchedulerConfig(), 8, &tiers_);
    a_ = NewSeq(13, 1);
    EXPECT_TRUE(sched_->Add(a_).ok());
    Step();
    EXPECT_EQ(a_->state, Sequence::State::kFinished);
    for (int b = 0; b < 3; ++b) a_blocks_.push_back(*pool_->Lookup(a_->hashes[b]));
    f_ = NewSeq(31, 1, Priority::kNormal, 500);
    EXPECT_TRUE(sched_->Add(f_).ok());
    return Step();
  }

  FakeTiers tiers_;
  Sequence* a_ = nullptr;
  Sequence* f_ = nullptr;
  std::vector<int32_t> a_blocks_;
};

TEST_F(SchedulerTransfersTest, EvictionsAreDemotedAndAPrefixBelowIsPromoted) {
  const SchedulerOutput f_step = EvictAsPrefix();
  ASSERT_EQ(f_step.transfers.size(), 3u);
  for (int b = 0; b < 3; ++b) {  // least recently released first: A's blocks in order
    const KvTransfer& t = f_step.transfers[b];
    EXPECT_EQ(t.kind, KvTransfer::Kind::kDemote) << b;
    EXPECT_EQ(t.hash, a_->hashes[b]) << b;
    EXPECT_EQ(t.blocks, std::vector<int32_t>{a_blocks_[b]}) << b;
    EXPECT_EQ(f_step.transfer_seqs[b], nullptr);
  }
  EXPECT_EQ(tiers_.held.size(), 3u);
  ASSERT_EQ(f_->state, Sequence::State::kFinished);
  // B has A's prompt: its three blocks come back from DDR. The first takes F's free last block;
  // the next two evict F's cached blocks, copied down between reading and copying in; the block
  // for B's last token evicts one more, as an ordinary demotion after them.
  Sequence* b = NewSeq(13, 1);
  ASSERT_TRUE(sched_->Add(b).ok());
  const SchedulerOutput out = sched_->Schedule();
  ASSERT_EQ(out.transfers.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    const KvTransfer& t = out.transfers[i];
    EXPECT_EQ(t.kind, KvTransfer::Kind::kPromote) << i;
    EXPECT_EQ(t.hash, a_->hashes[i]) << i;
    EXPECT_EQ(t.planned, KvTier::kHost) << i;
    EXPECT_EQ(t.blocks, std::vector<int32_t>{b->blocks[i]}) << i;
    EXPECT_EQ(out.transfer_seqs[i], b) << i;
    EXPECT_EQ(pool_->Lookup(a_->hashes[i]), b->blocks[i])
        << "registered at once, for later lookups";
    ASSERT_EQ(t.evicted.size(), i == 0 ? 0u : 1u) << i;
    if (i > 0) {
      EXPECT_EQ(t.evicted[0].hash, f_->hashes[i - 1]) << i;
    }
  }
  EXPECT_EQ(out.transfers[3].kind, KvTransfer::Kind::kDemote);
  EXPECT_EQ(out.transfers[3].hash, f_->hashes[2]);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start, 12);
  EXPECT_EQ(b->cached_prompt_tokens, 12);
  EXPECT_EQ(b->cached_prompt_tokens_ddr, 12);
  SchedulerOutput done = out;
  sched_->OnTransfersDone(tiers_.Run(out.transfers), &done);
  EXPECT_EQ(done.chunks.size(), 1u);
  EXPECT_FALSE(tiers_.held.count(a_->hashes[0])) << "a promoted block leaves the tier";
  EXPECT_TRUE(tiers_.held.count(f_->hashes[0]));
  sched_->OnStepComputed(done);
  Drain();
}

TEST_F(SchedulerTransfersTest, APromotionThatFailsCutsThePrefixBackAndTheRestIsComputed) {
  EvictAsPrefix();
  tiers_.fail.insert(a_->hashes[1]);  // the middle block does not arrive
  Sequence* b = NewSeq(13, 1);
  ASSERT_TRUE(sched_->Add(b).ok());
  const SchedulerOutput out = Schedule();
  EXPECT_TRUE(out.chunks.empty()) << "b sits this step out";
  EXPECT_EQ(out.num_tokens, 0);
  EXPECT_EQ(b->state, Sequence::State::kRunning);
  EXPECT_EQ(b->num_computed, 4) << "only the block before the gap is kept";
  EXPECT_EQ(b->blocks.size(), 1u);
  EXPECT_EQ(b->cached_prompt_tokens, 4);
  EXPECT_EQ(b->cached_prompt_tokens_ddr, 4);
  EXPECT_FALSE(pool_->Lookup(a_->hashes[1]).has_value()) << "the spoiled block is forgotten";
  EXPECT_TRUE(pool_->CheckInvariants());
  const SchedulerOutput next = Step();
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].seq, b);
  EXPECT_EQ(next.chunks[0].start, 4);
  EXPECT_EQ(next.chunks[0].num_tokens, 9);
  Drain();
  EXPECT_EQ(b->num_tokens(), 14);
}

TEST_F(SchedulerTransfersTest, WhenTheFirstBlockFailsTheSequenceWaitsForAFreshLookup) {
  EvictAsPrefix();
  tiers_.fail.insert(a_->hashes[0]);
  Sequence* b = NewSeq(13, 1);
  ASSERT_TRUE(sched_->Add(b).ok());
  const SchedulerOutput out = Schedule();
  EXPECT_TRUE(out.chunks.empty());
  EXPECT_EQ(b->state, Sequence::State::kWaiting);
  EXPECT_TRUE(b->blocks.empty());
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(sched_->num_running(), 0);
  EXPECT_TRUE(pool_->CheckInvariants());
  // Readmitted: the first block is nowhere now, so the whole prompt is computed.
  const SchedulerOutput next = Step();
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].start, 0);
  EXPECT_EQ(next.chunks[0].num_tokens, 13);
  EXPECT_EQ(b->cached_prompt_tokens, 0);
  Drain();
}

// A tier whose copies keep failing (the block stays below, found again): the sequence sent back
// looks its prefix up on the device only next time, so it always progresses.
TEST_F(SchedulerTransfersTest, ATierThatKeepsFailingCannotHoldASequenceBack) {
  EvictAsPrefix();
  tiers_.fail.insert(a_->hashes[0]);
  tiers_.failed_stay = true;
  Sequence* b = NewSeq(13, 1);
  ASSERT_TRUE(sched_->Add(b).ok());
  Schedule();
  ASSERT_EQ(b->state, Sequence::State::kWaiting);
  ASSERT_TRUE(tiers_.held.count(a_->hashes[0])) << "the fake was meant to keep the failed block";
  const SchedulerOutput next = Step();
  for (const KvTransfer& t : next.transfers) EXPECT_NE(t.kind, KvTransfer::Kind::kPromote);
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].seq, b);
  EXPECT_EQ(next.chunks[0].start, 0);
  Drain();
  EXPECT_EQ(b->num_tokens(), 14);
}

// Two sequences fill an 8-block pool; the newer one is preempted with its KV swapped out.
class SchedulerSwapTest : public SchedulerTransfersTest {
 protected:
  // Steps until `young_` is swapped out; returns that step's swap-out.
  KvTransfer SwapOutYoung() {
    SchedulerConfig cfg;
    cfg.max_tokens_per_step = 64;
    Make(cfg, 8, &tiers_);
    old_ = NewSeq(7, 20, Priority::kHigh);
    young_ = NewSeq(7, 20);
    EXPECT_TRUE(sched_->Add(old_).ok());
    EXPECT_TRUE(sched_->Add(young_).ok());
    for (int i = 0; i < 100; ++i) {
      const int64_t computed = young_->num_computed;
      const std::vector<int32_t> blocks = young_->blocks;
      const SchedulerOutput out = Step();
      if (out.preempted.empty()) continue;
      EXPECT_EQ(out.preempted[0], young_);
      for (size_t t = 0; t < out.transfers.size(); ++t) {
        if (out.transfers[t].kind != KvTransfer::Kind::kSwapOut) continue;
        EXPECT_EQ(out.transfer_seqs[t], young_);
        const int64_t n = (computed + kBlock - 1) / kBlock;
        EXPECT_EQ(out.transfers[t].blocks,
                  std::vector<int32_t>(blocks.begin(), blocks.begin() + n));
        EXPECT_EQ(young_->swapped_blocks, n);
        EXPECT_EQ(young_->swap_slots.size(), static_cast<size_t>(n));
        EXPECT_EQ(young_->num_computed, computed) << "a swapped sequence keeps its progress";
        return out.transfers[t];
      }
      ADD_FAILURE() << "preempted without a swap-out";
      break;
    }
    ADD_FAILURE() << "no preemption";
    return KvTransfer();
  }
  Sequence* old_ = nullptr;
  Sequence* young_ = nullptr;
};

TEST_F(SchedulerSwapTest, AVictimIsSwappedOutAndBackIntoItsNewBlocks) {
  SwapOutYoung();
  const std::vector<int64_t> slots = young_->swap_slots;
  const int64_t computed = young_->num_computed;
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    const SchedulerOutput out = Step();
    for (size_t t = 0; t < out.transfers.size(); ++t) {
      if (out.transfers[t].kind != KvTransfer::Kind::kSwapIn) continue;
      back = true;
      EXPECT_EQ(out.transfers[t].slots, slots);
      EXPECT_EQ(out.transfers[t].blocks,
                std::vector<int32_t>(young_->blocks.begin(),
                                     young_->blocks.begin() + static_cast<int64_t>(slots.size())));
      ASSERT_FALSE(out.chunks.empty());
      for (const ScheduledChunk& c : out.chunks) {
        if (c.seq == young_) {
          EXPECT_EQ(c.start, computed) << "resumes where it was swapped out";
        }
      }
      EXPECT_FALSE(young_->swapped());
    }
  }
  EXPECT_TRUE(back);
  Drain();
  EXPECT_EQ(old_->num_tokens(), 27);
  EXPECT_EQ(young_->num_tokens(), 27);
}

TEST_F(SchedulerSwapTest, ASwappedSequenceThatEndsFreesItsSlots) {
  SwapOutYoung();
  const std::vector<int64_t> slots = young_->swap_slots;
  EXPECT_EQ(tiers_.slots_in_use, static_cast<int64_t>(slots.size()));
  sched_->Remove(young_);  // cancelled while swapped out
  const SchedulerOutput out = Schedule();
  ASSERT_FALSE(out.transfers.empty());
  EXPECT_EQ(out.transfers[0].kind, KvTransfer::Kind::kFreeSwap);
  EXPECT_EQ(out.transfers[0].slots, slots);
  EXPECT_EQ(tiers_.slots_in_use, 0);
  sched_->OnStepComputed(out);
  Drain();
}

TEST_F(SchedulerSwapTest, WithoutSwapSpaceTheVictimIsRecomputed) {
  tiers_.capacity = 0;
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  Make(cfg, 8, &tiers_);
  Sequence* old_seq = NewSeq(7, 20, Priority::kHigh);
  Sequence* young = NewSeq(7, 20);
  ASSERT_TRUE(sched_->Add(old_seq).ok());
  ASSERT_TRUE(sched_->Add(young).ok());
  int preempted = 0;
  for (int i = 0; i < 200 && (sched_->num_running() + sched_->num_waiting()) > 0; ++i) {
    const SchedulerOutput out = Step();
    preempted += static_cast<int>(out.preempted.size());
    for (const KvTransfer& t : out.transfers) {
      EXPECT_NE(t.kind, KvTransfer::Kind::kSwapOut);
      EXPECT_NE(t.kind, KvTransfer::Kind::kSwapIn);
    }
  }
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(sched_->total_swaps(), 0);
  EXPECT_EQ(young->num_tokens(), 27);
  Drain();
}

}  // namespace
}  // namespace moeserve
