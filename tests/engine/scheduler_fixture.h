// The scheduler tests' fixture: a block pool, a scheduler, sequences, and a fake runner; with
// FakeTiers, a stand-in for the KV tiers that runs the planned transfers as bookkeeping.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/scheduler.h"
#include "tests/test_util.h"

namespace moeserve {

constexpr int64_t kBlock = 4;

// Holds block hashes "below the device" and hands out swap slots, as KvTiers would, without
// copying anything. Promotions of hashes in `fail` do not arrive.
class FakeTiers : public KvTierView {
 public:
  std::unordered_map<BlockHash, KvTier, BlockHashHasher> held;
  std::unordered_set<BlockHash, BlockHashHasher> fail;
  bool failed_stay = false;  // a failed promotion leaves its block held (as a DDR copy error does)
  bool swap = true;
  int64_t capacity = 100;
  int64_t slots_in_use = 0;
  std::vector<KvTransfer> ran;  // every transfer run, in order

  std::optional<KvTier> Find(const BlockHash& hash) const override {
    auto it = held.find(hash);
    if (it == held.end()) return std::nullopt;
    return it->second;
  }
  int64_t swap_capacity() const override { return capacity; }

  std::vector<KvTransferOutcome> Run(const std::vector<KvTransfer>& transfers) {
    std::vector<KvTransferOutcome> out(transfers.size());
    for (size_t i = 0; i < transfers.size(); ++i) {
      const KvTransfer& t = transfers[i];
      ran.push_back(t);
      switch (t.kind) {
        case KvTransfer::Kind::kDemote:
          held[t.hash] = KvTier::kHost;
          break;
        case KvTransfer::Kind::kPromote:
          for (const BlockEviction& e : t.evicted) held[e.hash] = KvTier::kHost;
          out[i].ok = held.erase(t.hash) > 0 && fail.count(t.hash) == 0;
          if (!out[i].ok && failed_stay) held[t.hash] = t.planned;
          out[i].tier = t.planned;
          break;
        case KvTransfer::Kind::kSwapOut:
          EXPECT_LE(slots_in_use + static_cast<int64_t>(t.blocks.size()), capacity)
              << "swap space overbooked";
          for (size_t b = 0; b < t.blocks.size(); ++b) out[i].slots.push_back(next_slot_++);
          slots_in_use += static_cast<int64_t>(t.blocks.size());
          break;
        case KvTransfer::Kind::kSwapIn:
        case KvTransfer::Kind::kFreeSwap:
          slots_in_use -= static_cast<int64_t>(t.slots.size());
          break;
      }
    }
    return out;
  }

 private:
  int64_t next_slot_ = 0;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(SchedulerConfig cfg, int64_t blocks, FakeTiers* tiers = nullptr) {
    pool_ = std::make_unique<BlockPool>(blocks);
    sched_ = std::make_unique<Scheduler>(cfg, pool_.get(), kBlock, /*fingerprint=*/42);
    tiers_ = tiers;
    if (tiers != nullptr) {
      sched_->SetLowerTiers(tiers, std::make_unique<PreemptionPolicy>(tiers->swap ? PreemptionMode::kSwap
                                                                                  : PreemptionMode::kRecompute,
                                                                      /*block_bytes=*/1, /*link=*/0));
    }
  }
  Sequence* NewSeq(int64_t prompt_len, int64_t max_tokens, Priority p = Priority::kNormal,
                   int32_t first_token = 0) {
    auto s = std::make_unique<Sequence>();
    s->id = seqs_.size();
    s->arrival = seqs_.size();
    s->priority = p;
    for (int64_t i = 0; i < prompt_len; ++i)
      s->tokens.push_back(first_token + static_cast<int32_t>(i));
    s->prompt_len = prompt_len;
    s->max_total_tokens = prompt_len + max_tokens;
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }
  // The schedule with its transfers run (by the fake tiers) and booked.
  SchedulerOutput Schedule() {
    SchedulerOutput out = sched_->Schedule();
    if (tiers_ != nullptr) {
      sched_->OnTransfersDone(tiers_->Run(out.transfers), &out);
    } else {
      EXPECT_TRUE(out.transfers.empty()) << "transfers planned without tiers";
    }
    return out;
  }
  // The fake runner: marks chunks computed and appends a token to sequences that sampled;
  // removes sequences that reached their length.
  SchedulerOutput Step() {
    SchedulerOutput out = Schedule();
    sched_->OnStepComputed(out);
    for (const auto& c : out.chunks) {
      if (!c.wants_logits) continue;
      c.seq->tokens.push_back(1000 + static_cast<int32_t>(c.seq->tokens.size()));
      if (c.seq->num_tokens() >= c.seq->max_total_tokens) sched_->Remove(c.seq);
    }
    EXPECT_TRUE(pool_->CheckInvariants());
    return out;
  }
  void Drain() {
    for (int i = 0; i < 10000 && (sched_->num_running() > 0 || sched_->num_waiting() > 0); ++i)
      Step();
    EXPECT_EQ(sched_->num_running() + sched_->num_waiting(), 0);
    EXPECT_EQ(pool_->num_used(), 0) << "blocks leaked";
    EXPECT_TRUE(pool_->CheckInvariants());
    if (tiers_ != nullptr) {
      Schedule();  // runs what the last removals planned (freed swap slots)
      EXPECT_EQ(tiers_->slots_in_use, 0) << "swap slots leaked";
    }
  }

  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Scheduler> sched_;
  FakeTiers* tiers_ = nullptr;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

}  // namespace moeserve
